"""Exposition parsing, the engine mapping, windows (resets, quantiles) and passive evidence.

Pages come from tests/fixtures/metrics/: two real captures (vLLM 0.32.0 CPU, SGLang 0.5.23
CPU) and hand-written pages in the shape of older vLLM releases and TensorRT-LLM's Triton
backend (each file's header says what it imitates and from which source). Windows are
built from pages rendered here with known counter values, so every expected figure is
computed by hand in the test.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_diagnose.probes.http import MalformedMetrics
from llm_diagnose.probes.metrics import (
    ENGINE_METRICS,
    PASSIVE_KEYS,
    Window,
    detect_engine,
    histogram_quantile,
    parse_exposition,
    passive_evidence,
    spearman,
    summary_from_buckets,
)
from llm_diagnose.probes.metrics.window import ScrapeRecord, record_from_text
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def window_of(*texts: str, dt: float = 1.0, source: str = "test") -> Window:
    """A window of pages taken every `dt` seconds."""
    return Window(
        source,
        tuple(
            record_from_text(1_700_000_000 + i * dt, 100.0 + i * dt, t, None, 0.001, source)
            for i, t in enumerate(texts)
        ),
    )


# --- parsing ---------------------------------------------------------------------------------
class TestParse:
    def test_real_vllm_032_page(self):
        s = parse_exposition(page("vllm-0.32.0-cpu-real.txt"))
        assert s.value("vllm:prefix_cache_hits_total") == 12288.0
        assert s.value("vllm:prefix_cache_queries_total") == 13843.0
        # _created timestamps are kept apart, never read as counts.
        assert "vllm:prefix_cache_hits_created" not in s.samples
        assert s.created_at(
            "vllm:prefix_cache_hits", frozenset({("engine", "0"), ("model_name", "tiny-llama")})
        ) == pytest.approx(1.7962168917477672e9)
        (itl,) = s.histogram("vllm:inter_token_latency_seconds")
        assert itl.count == 567.0 and itl.sum == pytest.approx(2.3928977909999958)
        assert math.isinf(itl.buckets[-1][0]) and itl.buckets[-1][1] == 567.0
        # iteration_tokens_total is a histogram despite its _total suffix.
        assert s.histogram("vllm:iteration_tokens_total")[0].count == 239.0
        (info,) = s.series("vllm:cache_config_info")
        assert info.label("block_size") == "128" and info.label("enable_prefix_caching") == "True"
        assert len(info.labels) == 37

    def test_labels_are_a_set(self):
        a = parse_exposition(
            'm_bucket{le="1",engine="0"} 1\nm_bucket{le="+Inf",engine="0"} 2\nm_count{engine="0"} 2\n'
            '# TYPE x gauge\nx{b="2",a="1"} 3\n'
        )
        b = parse_exposition(
            'm_bucket{engine="0",le="1"} 1\nm_bucket{engine="0",le="+Inf"} 2\nm_count{engine="0"} 2\n'
            '# TYPE x gauge\nx{a="1",b="2"} 3\n'
        )
        assert a.series("x") == b.series("x")
        assert a.histogram("m") == b.histogram("m")

    def test_created_without_sibling_is_an_ordinary_metric(self):
        s = parse_exposition("# TYPE jobs_created gauge\njobs_created 5\n")
        assert s.value("jobs_created") == 5.0

    def test_v0_page(self):
        s = parse_exposition(page("vllm-0.6-v0.txt"))
        assert detect_engine(s).version_hint == "V0"
        assert s.value("vllm:gpu_cache_usage_perc") == 0.87
        assert not s.created  # V0 disabled _created samples
        assert s.histogram("vllm:time_per_output_token_seconds")[0].count == 20900.0

    def test_sglang_real_capture(self):
        s = parse_exposition(page("sglang-0.5.23-cpu-real.txt"))
        g = detect_engine(s)
        assert g.engine == "sglang" and g.version_hint == ">=0.5"
        # is_streaming splits the counters; the sum over label sets is the total.
        assert s.value("sglang:prompt_tokens_total") == 2866.0
        assert s.value("sglang:cached_tokens_total") == 1413.0
        assert math.isnan(s.series("sglang:fwd_occupancy")[0].value)  # kept, but skipped by value()
        assert s.value("sglang:fwd_occupancy") is None
        ttft = s.histogram("sglang:time_to_first_token_seconds")
        assert len(ttft) == 2  # streaming and non-streaming

    def test_triton_page(self):
        s = parse_exposition(page("trtllm-triton.txt"))
        g = detect_engine(s)
        assert g.engine == "trtllm" and g.version_hint == "Triton backend"
        assert s.value("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "used"),)) == 1000.0

    @pytest.mark.parametrize(
        "fixture, line_number, fragment",
        [
            ("broken-truncated.txt", 5, 'vllm:kv_cache_usage_perc{engine="0",model_na'),
            ("broken-bad-value.txt", 4, "lots"),
            ("broken-html.txt", 1, "<!DOCTYPE html>"),
        ],
    )
    def test_broken_text_names_the_line(self, fixture, line_number, fragment):
        with pytest.raises(MalformedMetrics) as info:
            parse_exposition(page(fixture), "http://127.0.0.1:9/metrics")
        err = info.value
        assert err.line_number == line_number
        assert fragment in str(err) and f"line {line_number}" in str(err)
        assert "\n" not in str(err)  # one line

    def test_bucket_without_le_is_malformed(self):
        with pytest.raises(MalformedMetrics, match="without an `le` label"):
            parse_exposition('# TYPE h histogram\nh_bucket{a="1"} 3\nh_count 3\nh_sum 1\n')

    def test_empty_page_parses_to_nothing(self):
        s = parse_exposition("")
        assert not s.names() and detect_engine(s).engine is None


# --- engine detection and the mapping -------------------------------------------------------
class TestEngines:
    @pytest.mark.parametrize(
        "fixture, hint",
        [
            ("vllm-0.6-v0.txt", "V0"),
            ("vllm-0.8.5-v1.txt", "V1, 0.8.x"),
            ("vllm-0.10.2-v1.txt", "V1, 0.9-0.11"),
            ("vllm-0.32.0-cpu-real.txt", "V1, >=0.29"),
            ("vllm-0.32-dp2-multiproc.txt", "V1, >=0.20"),
        ],
    )
    def test_vllm_version_hints(self, fixture, hint):
        g = detect_engine(parse_exposition(page(fixture)))
        assert g.engine == "vllm" and g.version_hint == hint

    def test_new_names_win_where_both_exist(self):
        w = window_of(page("vllm-0.10.2-v1.txt"))
        names = ENGINE_METRICS["vllm"]
        assert w.resolve(names["kv_usage"]).name == "vllm:kv_cache_usage_perc"
        assert w.resolve(names["itl"]).name == "vllm:inter_token_latency_seconds"
        assert w.resolve(names["prefix"]).hits.name == "vllm:prefix_cache_hits_total"

    @pytest.mark.parametrize(
        "fixture, concept, name",
        [
            ("vllm-0.6-v0.txt", "kv_usage", "vllm:gpu_cache_usage_perc"),
            ("vllm-0.6-v0.txt", "itl", "vllm:time_per_output_token_seconds"),
            ("vllm-0.8.5-v1.txt", "itl", "vllm:time_per_output_token_seconds"),
            ("vllm-0.32.0-cpu-real.txt", "waiting", "vllm:num_requests_waiting_by_reason"),
        ],
    )
    def test_old_names_are_fallbacks(self, fixture, concept, name):
        assert window_of(page(fixture)).resolve(ENGINE_METRICS["vllm"][concept]).name == name

    def test_old_prefix_counters_pair_with_each_other(self):
        pair = window_of(page("vllm-0.8.5-v1.txt")).resolve(ENGINE_METRICS["vllm"]["prefix"])
        assert (pair.hits.name, pair.queries.name) == (
            "vllm:gpu_prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_queries_total",
        )

    def test_dp_aggregation(self):
        w = window_of(page("vllm-0.32-dp2-multiproc.txt"))
        names = ENGINE_METRICS["vllm"]
        assert w.latest(names["running"][0], "sum") == 8.0  # 3 + 5
        assert w.latest(names["kv_usage"][0], "max") == 0.9  # the fuller engine
        assert w.latest(names["waiting"][0], "sum") == 1.0  # capacity only: the deferred one is not queueing
        ev = passive_evidence(w)
        assert ev["kv.capacity_tokens"].value == 819200.0  # 409600 per engine
        assert "over 2 DP engines" in ev["kv.capacity_tokens"].note
        assert ev["config.kv_cache_dtype"].value == "fp8_e4m3"

    def test_triton_ratio_and_product(self):
        ev = passive_evidence(window_of(page("trtllm-triton.txt")))
        assert ev["kv.usage_p95"].value == pytest.approx(0.25)  # used 1000 / max 4000
        assert ev["kv.capacity_tokens"].value == 4000 * 64
        assert ev["batch.running_mean"].value == 6.0 and ev["queue.waiting_mean"].value == 2.0
        assert ev["engine.name"].value == "trtllm"
        # Triton has no latency histograms: explicit holes that name what was looked for.
        assert isinstance(ev["decode.itl_p50_s"], NotMeasured)
        assert "trtllm_time_per_output_token_seconds" in ev["decode.itl_p50_s"].reason


# --- histogram quantiles, by hand -------------------------------------------------------------
BUCKETS = ((0.01, 10.0), (0.025, 30.0), (0.05, 45.0), (0.1, 50.0), (math.inf, 50.0))


class TestHistogramQuantile:
    def test_interpolates_inside_the_bucket(self):
        # p50: rank 25 of 50 falls in (0.01, 0.025], which holds ranks 10..30:
        # 0.01 + 0.015 * (25 - 10) / 20 = 0.02125.
        est = histogram_quantile(0.5, BUCKETS)
        assert est.value == pytest.approx(0.02125)
        assert (est.lower, est.upper) == (0.01, 0.025) and not est.in_first_bucket
        # p99: rank 49.5 in (0.05, 0.1] holding 45..50: 0.05 + 0.05 * 4.5 / 5 = 0.095.
        assert histogram_quantile(0.99, BUCKETS).value == pytest.approx(0.095)

    def test_first_bucket_reports_its_upper_edge(self):
        est = histogram_quantile(0.1, BUCKETS)  # rank 5: first bucket
        assert est.value == pytest.approx(0.005)  # what Prometheus says (interpolated from 0)
        assert est.in_first_bucket and est.honest_value == 0.01
        assert "at most 0.01" in est.bound_note

    def test_overflow_bucket_reports_the_last_finite_edge(self):
        est = histogram_quantile(0.5, ((0.01, 0.0), (0.1, 1.0), (math.inf, 10.0)))
        assert est.in_overflow_bucket and est.value == 0.1 and est.honest_value == 0.1
        assert "at least 0.1" in est.bound_note

    def test_empty_and_no_inf(self):
        assert histogram_quantile(0.5, ((1.0, 0.0), (math.inf, 0.0))) is None
        assert histogram_quantile(0.5, ((1.0, 5.0),)) is None

    def test_non_monotonic_buckets_are_clamped(self):
        # A scrape racing with an observation: Prometheus' ensureMonotonic.
        est = histogram_quantile(0.5, ((1.0, 6.0), (2.0, 5.0), (math.inf, 10.0)))
        assert est.value == pytest.approx(5 / 6)  # (2.0, 5.0) read as (2.0, 6.0); rank 5 of 6 in the first

    def test_summary_from_buckets(self):
        s = summary_from_buckets(BUCKETS, total_sum=1.1)
        assert s.n == 50 and s.mean == pytest.approx(0.022)  # exact: _sum / _count
        assert s.median == pytest.approx(0.02125) and s.p99 == pytest.approx(0.095)
        assert s.min == 0.0 and s.max == 0.1
        assert s.ci_low <= s.median <= s.ci_high

    @given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.floats(0, 1), st.floats(0, 1))
    @settings(max_examples=200, deadline=None)
    def test_quantile_is_monotonic_and_inside_its_bucket(self, counts, q1, q2):
        edges = [0.01 * 2**i for i in range(len(counts))] + [math.inf]
        cum, running = [], 0
        for c in counts + [0]:
            running += c
            cum.append(float(running))
        buckets = tuple(zip(edges, cum))
        a, b = histogram_quantile(min(q1, q2), buckets), histogram_quantile(max(q1, q2), buckets)
        if running == 0:
            assert a is None and b is None
            return
        assert a.value <= b.value + 1e-12
        assert a.lower <= a.value <= a.upper


# --- windows: counters, resets, histograms ----------------------------------------------------
def vllm_page(
    prompt=0.0,
    gen=0.0,
    hits=0.0,
    queries=0.0,
    preempt=0.0,
    running=0.0,
    waiting=0.0,
    usage=0.0,
    itl=(0, 0, 0, 0),
    itl_sum=0.0,
    created=1.7e9,
    success=0.0,
) -> str:
    """A minimal vLLM V1 page with the given lifetime values (ITL: cumulative 0.01/0.025/0.05/+Inf)."""
    lab = 'engine="0",model_name="m"'
    b = itl
    return f"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{lab}}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{lab}}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{lab}}} {usage}
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{lab}}} {prompt}
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{{lab}}} {created}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{lab}}} {gen}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{lab}}} {hits}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{lab}}} {queries}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{lab}}} {preempt}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{lab},finished_reason="stop"}} {success}
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{{lab},le="0.01"}} {b[0]}
vllm:inter_token_latency_seconds_bucket{{{lab},le="0.025"}} {b[1]}
vllm:inter_token_latency_seconds_bucket{{{lab},le="0.05"}} {b[2]}
vllm:inter_token_latency_seconds_bucket{{{lab},le="+Inf"}} {b[3]}
vllm:inter_token_latency_seconds_count{{{lab}}} {b[3]}
vllm:inter_token_latency_seconds_sum{{{lab}}} {itl_sum}
# TYPE vllm:inter_token_latency_seconds_created gauge
vllm:inter_token_latency_seconds_created{{{lab}}} {created}
"""


class TestWindow:
    def test_counter_increase_and_rate(self):
        w = window_of(vllm_page(prompt=100), vllm_page(prompt=250), vllm_page(prompt=400), dt=2.0)
        inc = w.counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0])
        assert inc.total == 300.0 and inc.resets == 0
        assert inc.rate == pytest.approx(75.0)  # 300 tokens over 4 s
        assert [i.increase for i in inc.intervals] == [150.0, 150.0]

    def test_counter_reset_like_prometheus_rate(self):
        # 100 -> 250 (+150) -> 30 (restart: +30 since the reset) -> 80 (+50) = 230.
        w = window_of(
            vllm_page(prompt=100),
            vllm_page(prompt=250),
            vllm_page(prompt=30, created=1.8e9),
            vllm_page(prompt=80, created=1.8e9),
        )
        inc = w.counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0])
        assert inc.total == 230.0 and inc.resets == 1

    def test_reset_seen_by_created_even_when_value_grew(self):
        # A restarted server that already counted past the old value: only _created shows it.
        w = window_of(vllm_page(prompt=100), vllm_page(prompt=120, created=1.8e9))
        inc = w.counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0])
        assert inc.total == 120.0 and inc.resets == 1

    def test_series_created_mid_window_counts_from_zero(self):
        a = page("sglang-0.5.23-cpu-real.txt").replace(
            'sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="tiny-llama"} 10.0\n', ""
        )
        w = window_of(a, page("sglang-0.5.23-cpu-real.txt"))
        inc = w.counter(ENGINE_METRICS["sglang"]["prompt_tokens"][0])
        assert inc.total == 10.0  # the streaming series appeared with 10 tokens

    def test_failed_scrapes_are_skipped_not_zero(self):
        recs = list(window_of(vllm_page(prompt=100), vllm_page(prompt=300)).records)
        recs.insert(1, ScrapeRecord(1_700_000_000.5, 100.5, None, "connection refused"))
        w = Window("test", tuple(recs))
        assert w.counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0]).total == 200.0
        assert len(w.failed_records) == 1

    def test_histogram_window_quantile_uses_bucket_increases(self):
        # Lifetime before the window: 1000 fast tokens. In the window: 20 more, all slow.
        w = window_of(
            vllm_page(itl=(1000, 1000, 1000, 1000), itl_sum=5.0), vllm_page(itl=(1000, 1000, 1020, 1020), itl_sum=5.8)
        )
        inc = w.histogram(ENGINE_METRICS["vllm"]["itl"][0])
        assert inc.count == 20.0 and inc.sum == pytest.approx(0.8)
        assert histogram_quantile(0.5, inc.buckets).value == pytest.approx(0.0375)  # 0.025 + 0.025 * 10/20
        # A lifetime quantile would have said "< 10 ms": the window must not.

    def test_histogram_reset(self):
        w = window_of(
            vllm_page(itl=(5, 10, 10, 10), itl_sum=0.1), vllm_page(itl=(1, 2, 2, 2), itl_sum=0.03, created=1.8e9)
        )
        inc = w.histogram(ENGINE_METRICS["vllm"]["itl"][0])
        assert inc.count == 2.0 and inc.resets == 1

    @given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=20))
    @settings(max_examples=100, deadline=None)
    def test_increase_is_never_negative(self, values):
        w = window_of(*(vllm_page(prompt=v) for v in values))
        inc = w.counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0])
        expected = sum(b - a if b >= a else b for a, b in zip(values, values[1:]))
        assert inc.total >= 0 and inc.total == pytest.approx(expected)

    def test_jsonl_round_trip_keeps_bad_lines_as_notes(self, tmp_path):
        import json

        lines = [
            json.dumps({"t_wall": 1.0, "t_mono": 10.0, "text": vllm_page(prompt=1)}),
            json.dumps({"t_wall": 2.0, "t_mono": 11.0, "error": "connection refused"}),
            json.dumps({"t_wall": 3.0, "t_mono": 12.0, "text": "garbage{", "error": None}),
            json.dumps({"t_wall": 4.0, "t_mono": 13.0, "text": vllm_page(prompt=5)}),
            '{"t_wall": 5.0, "t_mono": 14.0, "text": "# TYPE vllm:num_req',
        ]  # killed mid-write
        (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
        w = Window.from_jsonl(tmp_path)
        assert [r.ok for r in w.records] == [True, False, False, True]
        assert "malformed" in w.records[2].error
        assert len(w.notes) == 1 and "line 5" in w.notes[0]
        assert w.counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0]).total == 4.0


# --- passive evidence -----------------------------------------------------------------------
class TestPassive:
    def test_every_passive_key_is_present_and_typed(self):
        ev = passive_evidence(window_of(page("vllm-0.32.0-cpu-real.txt"), page("vllm-0.32.0-cpu-real.txt")))
        for key in PASSIVE_KEYS:
            assert isinstance(ev[key], (Measurement, Fact, NotMeasured)), key

    def test_no_traffic_gives_explicit_holes(self):
        ev = passive_evidence(window_of(page("vllm-0.32.0-cpu-real.txt"), page("vllm-0.32.0-cpu-real.txt")))
        for key in ("latency.e2e_p50_s", "outputs.length_p50", "decode.time_share"):
            assert isinstance(ev[key], NotMeasured)
            assert "no requests finished in the window" in ev[key].reason and "--active" in ev[key].hint
        assert isinstance(ev["prefix.hit_rate"], NotMeasured)
        assert ev["prefix.queried_tokens"].value == 0.0

    def test_config_facts_from_real_page(self):
        ev = passive_evidence(window_of(page("vllm-0.32.0-cpu-real.txt")))
        assert ev["config.block_size"].value == 128
        assert ev["config.prefix_caching"].value is True
        assert ev["config.kv_cache_dtype"].value == "auto"
        assert ev["config.gpu_memory_utilization"].value == 0.92
        assert ev["kv.capacity_tokens"].value == 1048576.0
        assert ev["memory.kv_cache_bytes"].value == 1073741824.0
        assert ev["config.spec_decode"].value is False and "inferred" in ev["config.spec_decode"].note
        assert ev["config.continuous_batching"].value is True
        assert "by design" in ev["config.continuous_batching"].note
        assert ev["config.paged_kv"].provenance.method == "engine-design"
        assert isinstance(ev["memory.weights_bytes"], NotMeasured)
        # One scrape: no counter increase can be formed, and the evidence says so.
        assert "two good scrapes" in ev["kv.preemptions"].reason

    def test_measured_window(self):
        w = window_of(
            vllm_page(prompt=0, gen=0, hits=0, queries=0, itl=(0, 0, 0, 0), running=0, usage=0.1),
            vllm_page(
                prompt=1000,
                gen=100,
                hits=256,
                queries=1000,
                preempt=1,
                itl=(0, 80, 100, 100),
                itl_sum=2.0,
                running=4,
                waiting=2,
                usage=0.9,
                success=2,
            ),
            vllm_page(
                prompt=2000,
                gen=300,
                hits=768,
                queries=2000,
                preempt=3,
                itl=(0, 160, 280, 300),
                itl_sum=7.0,
                running=6,
                waiting=0,
                usage=1.0,
                success=5,
            ),
            dt=2.0,
        )
        ev = passive_evidence(w)
        assert ev["prefix.hit_rate"].value == pytest.approx(768 / 2000)
        assert ev["prefix.queried_tokens"].value == 2000
        assert ev["kv.preemptions"].value == 3 and ev["kv.preemptions_per_s"].value == pytest.approx(0.75)
        assert ev["kv.usage_p95"].value == pytest.approx(0.99)  # percentile of (0.1, 0.9, 1.0)
        assert ev["kv.usage_mean"].value == pytest.approx(2.0 / 3)
        assert ev["batch.running_max"].value == 6 and ev["queue.waiting_mean"].value == pytest.approx(2 / 3)
        assert ev["throughput.generation_tokens_per_s"].value == pytest.approx(75.0)
        assert ev["throughput.requests_per_s"].value == pytest.approx(1.25)
        # ITL in the window: 160 in (0.01, 0.025], 120 in (0.025, 0.05], 20 beyond: p50 = rank 150.
        assert ev["decode.itl_p50_s"].value == pytest.approx(0.01 + 0.015 * 150 / 160)
        assert ev["decode.itl_p99_s"].value == 0.05 and ev["decode.itl_p99_s"].warnings  # overflow: lower bound
        assert ev["decode.itl_p50_s"].n == 300
        assert ev["decode.itl_p50_s"].provenance.window_s == 4.0
        assert ev["live.window_complete"].value is True

    def test_itl_all_in_first_bucket_reports_upper_bound(self):
        w = window_of(vllm_page(itl=(0, 0, 0, 0)), vllm_page(itl=(500, 500, 500, 500), itl_sum=2.0))
        ev = passive_evidence(w)
        r = ev["decode.itl_p99_s"]
        assert r.value == 0.01 and "at most 0.01" in r.note
        assert any("first bucket" in x for x in r.warnings)

    def test_prefix_caching_off_is_the_reason(self):
        text = page("vllm-0.32.0-cpu-real.txt").replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
        ev = passive_evidence(window_of(text, text))
        assert ev["config.prefix_caching"].value is False
        assert "prefix caching is off" in ev["prefix.hit_rate"].reason

    def test_v0_hit_rate_gauge_skips_minus_one(self):
        ev = passive_evidence(window_of(page("vllm-0.6-v0.txt"), page("vllm-0.6-v0.txt")))
        assert isinstance(ev["prefix.hit_rate"], NotMeasured) and "-1" in ev["prefix.hit_rate"].reason
        assert ev["kv.usage_mean"].value == 0.87
        assert ev["config.kv_cache_dtype"].value == "fp8"

    def test_old_prefix_counters_warn_about_preemption_inflation(self):
        a = page("vllm-0.8.5-v1.txt")
        b = (
            a.replace(
                'gpu_prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 1024.0',
                'gpu_prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 1536.0',
            )
            .replace(
                'gpu_prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 4096.0',
                'gpu_prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 5120.0',
            )
            .replace(
                'num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 0.0',
                'num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 4.0',
            )
        )
        ev = passive_evidence(window_of(a, b))
        assert ev["prefix.hit_rate"].value == pytest.approx(512 / 1024)
        assert any("25780" in w for w in ev["prefix.hit_rate"].warnings)

    def test_sglang_window(self):
        a = page("sglang-0.5.23-cpu-real.txt")
        b = a.replace(
            'mode="prefill_cache",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1413.0',
            'mode="prefill_cache",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1913.0',
        ).replace(
            'mode="prefill_compute",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1454.0',
            'mode="prefill_compute",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1954.0',
        )
        ev = passive_evidence(window_of(a, b))
        assert ev["engine.name"].value == "sglang"
        assert ev["prefix.hit_rate"].value == pytest.approx(0.5)  # 500 from cache, 500 computed
        assert "realtime_tokens_total" in ev["prefix.hit_rate"].provenance.source
        assert ev["kv.capacity_tokens"].value == 8192.0
        assert ev["config.block_size"].value == 1
        assert ev["engine.max_model_len"].value == 2048
        assert ev["memory.weights_bytes"].value == pytest.approx(0.002117156982421875 * 2**30)
        assert ev["memory.kv_cache_bytes"].value == pytest.approx(0.007813453674316406 * 2**30)
        assert isinstance(ev["spec.acceptance_rate"], NotMeasured)  # the gauge stayed 0
        assert isinstance(ev["decode.time_share"], NotMeasured) or ev["decode.time_share"].value >= 0

    def test_sglang_older_pages_fall_back_to_tokenizer_counters(self):
        a = "".join(
            line + "\n"
            for line in page("sglang-0.5.23-cpu-real.txt").splitlines()
            if "realtime_tokens_total" not in line
        )
        b = a.replace(
            'cached_tokens_total{cache_source="device",engine_type="unified",model_name="tiny-llama"} 1413.0',
            'cached_tokens_total{cache_source="device",engine_type="unified",model_name="tiny-llama"} 1663.0',
        ).replace(
            'prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="tiny-llama"} 2856.0',
            'prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="tiny-llama"} 3856.0',
        )
        ev = passive_evidence(window_of(a, b))
        assert ev["prefix.hit_rate"].value == pytest.approx(0.25)  # 250 cached of 1000 prompt tokens
        assert ev["prefix.queried_tokens"].value == 1000.0

    def test_spec_decode_counters(self):
        base = page("vllm-0.32.0-cpu-real.txt")
        spec = (
            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
            'vllm:spec_decode_num_drafts_total{{engine="0",model_name="tiny-llama"}} {d}\n'
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="tiny-llama"}} {t}\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny-llama"}} {a}\n'
        )
        ev = passive_evidence(window_of(base + spec.format(d=10, t=30, a=12), base + spec.format(d=110, t=330, a=162)))
        assert ev["spec.acceptance_rate"].value == pytest.approx(150 / 300)
        assert ev["spec.mean_acceptance_length"].value == pytest.approx(1 + 150 / 100)
        assert ev["config.spec_decode"].value is True

    def test_interference_correlation(self):
        # Intervals with more prompt tokens have slower decode steps: rho = +1.
        pages, prompt, count, total = [], 0.0, 0.0, 0.0
        for p_rate, itl_mean in [
            (0, 0.01),
            (500, 0.03),
            (100, 0.015),
            (900, 0.05),
            (300, 0.02),
            (700, 0.04),
            (50, 0.012),
        ]:
            prompt += p_rate
            count += 10
            total += 10 * itl_mean
            pages.append(vllm_page(prompt=prompt, itl=(0, count, count, count), itl_sum=total))
        pages.insert(0, vllm_page())
        ev = passive_evidence(window_of(*pages))
        r = ev["interference.prompt_itl_correlation"]
        assert r.value == pytest.approx(1.0)
        assert any("noisy" in w for w in r.warnings)

    def test_too_few_intervals_for_correlation(self):
        ev = passive_evidence(window_of(vllm_page(), vllm_page(prompt=5, itl=(0, 1, 1, 1), itl_sum=0.02)))
        assert "need 6" in ev["interference.prompt_itl_correlation"].reason

    def test_output_length_from_buckets(self):
        lab = 'engine="0",model_name="m"'

        def gen_hist(cum, total):
            edges = ["1", "2", "5", "10", "20", "50", "100", "200", "500", "+Inf"]
            lines = "".join(
                f'vllm:request_generation_tokens_bucket{{{lab},le="{e}"}} {c}\n' for e, c in zip(edges, cum)
            )
            return (
                f"# TYPE vllm:request_generation_tokens histogram\n{lines}"
                f"vllm:request_generation_tokens_count{{{lab}}} {cum[-1]}\n"
                f"vllm:request_generation_tokens_sum{{{lab}}} {total}\n"
            )

        w = window_of(
            vllm_page() + gen_hist([0] * 10, 0),
            vllm_page() + gen_hist([0, 0, 0, 0, 2, 2, 4, 8, 10, 10], 2 * 15 + 2 * 75 + 4 * 150 + 2 * 350),
        )
        ev = passive_evidence(w)
        assert ev["outputs.length_p50"].value == pytest.approx(125.0)  # rank 5 in (100, 200]: 100 + 100 * 1/4
        assert "estimated from" in ev["outputs.length_p50"].note
        cv = ev["outputs.length_cv"]
        assert 0.5 < cv.value < 1.5 and "estimated from histogram buckets" in cv.note

    def test_partial_window_is_flagged_everywhere(self):
        w = window_of(vllm_page(prompt=1), vllm_page(prompt=5))
        w = Window(w.source, w.records, 30.0, stopped_early="server stopped answering")
        ev = passive_evidence(w)
        assert ev["live.window_complete"].value is False
        assert any("partial window" in x for x in ev["throughput.prompt_tokens_per_s"].warnings)

    def test_no_good_scrape(self):
        w = Window("test", (ScrapeRecord(1.0, 1.0, None, "connection refused"),))
        ev = passive_evidence(w)
        assert all(isinstance(ev[k], NotMeasured) for k in PASSIVE_KEYS if k != "live.window_complete")
        assert ev["live.window_complete"].value is False


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties get average ranks: x ranks (1.5, 1.5, 3), y ranks (1, 2, 3) -> rho = 0.866.
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_real_kv_pressure_pages():
    """Two real pages 0.5 s apart from vLLM 0.32 CPU under KV pressure (16 blocks of 128 tokens,
    prefix caching off, 8 concurrent requests of ~580 prompt + ~440 output tokens)."""
    ev = passive_evidence(
        window_of(
            page("vllm-0.32.0-cpu-kv-pressure-real-a.txt"), page("vllm-0.32.0-cpu-kv-pressure-real-b.txt"), dt=0.5
        )
    )
    assert ev["kv.preemptions"].value == 1.0
    assert ev["kv.usage_p95"].value > 0.93 and ev["queue.waiting_mean"].value == 3.0
    assert ev["kv.capacity_tokens"].value == 2048.0
    assert ev["config.prefix_caching"].value is False
    assert ev["throughput.generation_tokens_per_s"].value == pytest.approx(592 / 0.5)


def test_the_fullest_step_and_the_engine_side_prefill_and_running_times():
    """vllm:iteration_tokens_total, request_prefill_time_seconds and request_inference_time_seconds,
    on the same two real pages: between them the fullest step held 513-1024 tokens (two steps in
    that bucket, none above), and two requests finished."""
    ev = passive_evidence(
        window_of(
            page("vllm-0.32.0-cpu-kv-pressure-real-a.txt"), page("vllm-0.32.0-cpu-kv-pressure-real-b.txt"), dt=0.5
        )
    )
    step = ev["batch.step_tokens_max"]
    assert isinstance(step, Measurement) and step.value == 1024
    assert "between 512 and 1024" in step.note and "vllm:iteration_tokens_total" in step.provenance.source
    for key in ("latency.prefill_time_p50_s", "latency.inference_time_p50_s"):
        assert isinstance(ev[key], Measurement) and ev[key].value > 0, ev[key]
    # An engine that does not count tokens per step: an explicit hole naming what was looked for.
    sglang = passive_evidence(window_of(page("sglang-0.5.23-cpu-real.txt"), page("sglang-0.5.23-cpu-real.txt")))
    assert isinstance(sglang["batch.step_tokens_max"], NotMeasured)
    assert "tokens per engine step" in sglang["batch.step_tokens_max"].reason


def _with_e2e(text: str, count: float, total_s: float) -> str:
    lab = 'engine="0",model_name="m"'
    return text + (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="0.1"}} {count}\n'
        f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}} {count}\n'
        f"vllm:e2e_request_latency_seconds_count{{{lab}}} {count}\n"
        f"vllm:e2e_request_latency_seconds_sum{{{lab}}} {total_s}\n"
    )


def test_requests_between_scrapes_give_concurrency_by_littles_law_not_zero():
    # Seen in CI on vLLM CPU: 10 requests of ~85 ms in 3 s and every scrape read 0 running, so
    # Q3 said "no requests ran in the window" while 60 tokens/s flowed.
    pages = [_with_e2e(vllm_page(gen=60.0 * i, success=3 * i), 3 * i, 0.255 * i) for i in range(4)]
    ev = passive_evidence(window_of(*pages, dt=1.0))
    conc = ev["load.concurrency_mean"]
    assert isinstance(conc, Measurement) and conc.value == pytest.approx(0.255)
    assert "Little's law" in conc.note and conc.n == 3
    # Where a scrape did see requests in flight, the gauges are read as before.
    pages = [_with_e2e(vllm_page(gen=60.0 * i, running=i % 2), 3 * i, 0.255 * i) for i in range(4)]
    conc = passive_evidence(window_of(*pages, dt=1.0))["load.concurrency_mean"]
    assert conc.value == pytest.approx(0.5) and "per scrape" in conc.note
