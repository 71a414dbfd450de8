"""The fleet view over hand-built evidence, and the Prometheus answer -> windows step without a server.

Each threshold is tested on both sides; the real-engine path (a real Prometheus scraping real
vLLM servers) is in test_fleet_prometheus.py.
"""

from __future__ import annotations

import argparse
import json

import pytest

from llm_diagnose.diagnose.commands.fleet import folder_names, parse_duration, parse_time, window_of
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.fleet import CACHING_OFF_NOTE, fleet_view, render_text
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.metrics import passive_evidence
from llm_diagnose.probes.metrics.prometheus_api import (
    InvalidSelector,
    MalformedAnswer,
    PrometheusRefused,
    engine_series_query,
    parse_matrix,
    selector_matchers,
    windows_from_matrix,
)
from tests.evidence_builders import build


def replica(hit=0.5, queried=10_000.0, kv=0.3, preempt=0.0, waiting=0.0, prompt_rate=100.0, caching=True, **more):
    items = {
        Q.PREFIX_HIT_RATE: hit,
        Q.PREFIX_QUERIED_TOKENS: queried,
        Q.KV_USAGE_P95: kv,
        Q.PREEMPTIONS: preempt,
        Q.WAITING_MEAN: waiting,
        Q.PROMPT_TOKENS_PER_S: prompt_rate,
        Q.REQUESTS_PER_S: 1.0,
        Q.PREFIX_CACHING: caching,
        Q.BLOCK_SIZE: "128",
        Q.ENGINE_NAME: "vllm",
    }
    items.update(more)
    return build(items)


def divergence(view, key):
    return next(d for d in view.divergences if d.key == key)


class TestDivergence:
    def test_equal_replicas_do_not_diverge(self):
        view = fleet_view({"a": replica(), "b": replica()})
        assert view.diverging == () and view.config_differences == ()
        assert "no divergence beyond the fleet.* thresholds" in render_text(view)

    @pytest.mark.parametrize("low, diverges", [(0.3, False), (0.2999, True)])
    def test_hit_rate_spread_at_the_threshold(self, low, diverges):
        view = fleet_view({"a": replica(hit=0.5), "b": replica(hit=low)})
        d = divergence(view, Q.PREFIX_HIT_RATE)
        assert d.comparison.threshold == "fleet.max_hit_rate_spread" and d.comparison.holds is diverges
        assert (d.high, d.low) == ((("a",), ("b",)) if diverges else ((), ()))

    def test_three_replicas_name_the_odd_one(self):
        view = fleet_view({"a": replica(hit=0.8), "b": replica(hit=0.79), "c": replica(hit=0.1)})
        d = divergence(view, Q.PREFIX_HIT_RATE)
        assert d.comparison.holds
        assert d.low == ("c",) and d.high == ()
        assert "two replicas" not in d.describe()

    def test_prefix_caching_off_is_zero_and_explains(self):
        view = fleet_view({"on": replica(hit=0.7), "off": replica(hit=None, queried=0.0, caching=False)})
        assert view.table["off"][Q.PREFIX_HIT_RATE] == 0.0
        assert view.notes["off"][Q.PREFIX_HIT_RATE] == CACHING_OFF_NOTE
        d = divergence(view, Q.PREFIX_HIT_RATE)
        assert d.comparison.holds and Q.PREFIX_CACHING in d.explained_by
        assert [c.key for c in view.config_differences] == [Q.PREFIX_CACHING]
        assert view.routing.status == "unknown" and "off" in view.routing.reason
        text = render_text(view)
        assert "configuration differs: config.prefix_caching: True on on; False on off" in text
        assert "0.00*" in text

    def test_caching_off_without_traffic_stays_unknown(self):
        view = fleet_view({"on": replica(), "off": replica(hit=None, caching=False, prompt_rate=0.0)})
        assert view.table["off"][Q.PREFIX_HIT_RATE] is None
        assert divergence_or_none(view, Q.PREFIX_HIT_RATE) is None  # one value: nothing to compare

    @pytest.mark.parametrize(
        "counts, diverges", [((3.0, 0.0), True), ((1.0, 0.0), True), ((3.0, 2.0), False), ((0.0, 0.0), False)]
    )
    def test_preemptions_some_against_none(self, counts, diverges):
        view = fleet_view({"a": replica(preempt=counts[0]), "b": replica(preempt=counts[1])})
        assert divergence(view, Q.PREEMPTIONS).comparison.holds is diverges

    def test_load_imbalance_explains_kv_and_queue(self):
        view = fleet_view(
            {
                "busy": replica(kv=0.9, waiting=2.0, prompt_rate=400.0),
                "idle": replica(kv=0.2, waiting=0.0, prompt_rate=100.0),
            }
        )
        load = divergence(view, Q.PROMPT_TOKENS_PER_S)
        assert load.comparison.holds and load.comparison.value == 4.0 and load.high == ("busy",)
        for key in (Q.KV_USAGE_P95, Q.WAITING_MEAN):
            assert divergence(view, key).comparison.holds and "load" in divergence(view, key).explained_by

    @pytest.mark.parametrize("rates, diverges", [((150.0, 100.0), False), ((150.1, 100.0), True)])
    def test_load_ratio_at_the_threshold(self, rates, diverges):
        view = fleet_view({"a": replica(prompt_rate=rates[0]), "b": replica(prompt_rate=rates[1])})
        assert divergence(view, Q.PROMPT_TOKENS_PER_S).comparison.holds is diverges

    def test_waiting_and_kv_spread_thresholds(self):
        view = fleet_view({"a": replica(kv=0.5, waiting=1.0), "b": replica(kv=0.25, waiting=0.0)})
        assert not divergence(view, Q.KV_USAGE_P95).comparison.holds  # 0.25 is not above 0.25
        assert not divergence(view, Q.WAITING_MEAN).comparison.holds
        view = fleet_view({"a": replica(kv=0.5, waiting=1.01), "b": replica(kv=0.2499, waiting=0.0)})
        assert divergence(view, Q.KV_USAGE_P95).comparison.holds and divergence(view, Q.WAITING_MEAN).comparison.holds

    def test_overridden_threshold(self):
        loose = Thresholds.from_mapping({"fleet": {"max_hit_rate_spread": 0.5}})
        pair = {"a": replica(hit=0.7), "b": replica(hit=0.3)}
        assert divergence(fleet_view(pair), Q.PREFIX_HIT_RATE).comparison.holds
        assert not divergence(fleet_view(pair, loose), Q.PREFIX_HIT_RATE).comparison.holds

    def test_config_difference_in_kv_capacity(self):
        view = fleet_view(
            {"a": replica(**{Q.KV_CAPACITY_TOKENS: 2048.0}), "b": replica(**{Q.KV_CAPACITY_TOKENS: 4096.0})}
        )
        assert [c.key for c in view.config_differences] == [Q.KV_CAPACITY_TOKENS]

    def test_one_replica(self):
        view = fleet_view({"only": replica()})
        assert view.divergences == () and "one replica" in view.remarks[0]


def divergence_or_none(view, key):
    return next((d for d in view.divergences if d.key == key), None)


def trace(potential=None, at_capacity=None):
    items = {}
    if potential is not None:
        items[Q.PREFIX_POTENTIAL] = build({Q.PREFIX_POTENTIAL: potential}).items[Q.PREFIX_POTENTIAL]
    if at_capacity is not None:
        items[Q.PREFIX_AT_CAPACITY] = build({Q.PREFIX_AT_CAPACITY: at_capacity}).items[Q.PREFIX_AT_CAPACITY]
    return items


class TestFleetHitRateAndRouting:
    def test_fleet_hit_rate_is_weighted_by_looked_up_tokens(self):
        view = fleet_view({"a": replica(hit=0.9, queried=1000.0), "b": replica(hit=0.1, queried=9000.0)})
        assert view.fleet[Q.PREFIX_HIT_RATE] == pytest.approx(0.18)
        assert view.fleet[Q.PREFIX_QUERIED_TOKENS] == 10_000.0

    def test_no_trace_is_unknown_with_the_hint(self):
        r = fleet_view({"a": replica(), "b": replica()}).routing
        assert r.status == "unknown" and "--trace" in r.hint

    def test_spread_prefixes_are_suspected(self):
        # One cache would serve 80% of the trace's tokens; the fleet serves 30%.
        r = fleet_view({"a": replica(hit=0.3), "b": replica(hit=0.3)}, trace=trace(0.85, 0.8)).routing
        assert r.status == "suspected" and r.reference_key == Q.PREFIX_AT_CAPACITY
        assert r.comparison.value == pytest.approx(0.375) and r.comparison.threshold == "fleet.routing_ratio"
        assert "2 of 2 replicas" in r.reason and "prefix" in r.hint

    @pytest.mark.parametrize("hit, status", [(0.4, "not-indicated"), (0.3999, "suspected")])
    def test_routing_ratio_at_the_threshold(self, hit, status):
        r = fleet_view({"a": replica(hit=hit), "b": replica(hit=hit)}, trace=trace(at_capacity=0.8)).routing
        assert r.status == status

    def test_unlimited_reference_is_a_caveat(self):
        r = fleet_view({"a": replica(hit=0.1), "b": replica(hit=0.1)}, trace=trace(potential=0.8)).routing
        assert r.reference_key == Q.PREFIX_POTENTIAL and any("unlimited" in c for c in r.caveats)

    def test_preemptions_are_a_caveat(self):
        r = fleet_view(
            {"a": replica(hit=0.1, preempt=4.0), "b": replica(hit=0.1)}, trace=trace(at_capacity=0.8)
        ).routing
        assert r.status == "suspected" and any("eviction" in c and "a" in c for c in r.caveats)

    def test_a_trace_without_reuse_is_not_indicated(self):
        r = fleet_view({"a": replica(hit=0.0), "b": replica(hit=0.0)}, trace=trace(at_capacity=0.05)).routing
        assert r.status == "not-indicated" and "q2.min_reuse_fraction" in r.reason

    def test_json_and_text(self):
        view = fleet_view({"a": replica(hit=0.1, preempt=2.0), "b": replica(hit=0.9)}, trace=trace(at_capacity=0.8))
        document = json.loads(json.dumps(view.to_dict(), allow_nan=False))
        assert document["diverging"] == [Q.PREFIX_HIT_RATE, Q.PREEMPTIONS]
        assert document["routing"]["status"] in ("suspected", "not-indicated")
        text = render_text(view)
        assert text.splitlines()[0].split()[:3] == ["replica", "hit", "rate"]
        assert "diverges: prefix-cache hit rate: spread 0.8 > 0.2 (fleet.max_hit_rate_spread)" in text


# --- the Prometheus answer -> windows, no server ---------------------------------------------------
def test_selector_matchers():
    assert selector_matchers('{job="vllm"}') == 'job="vllm"'
    assert selector_matchers("  {}  ") == "" and selector_matchers("") == ""
    assert engine_series_query('{job="vllm", }').endswith(', job="vllm"}')
    assert '"(llmd_torch:|nv_trt_llm_|sglang:|trtllm:|trtllm_|vllm:).*"' in engine_series_query("{}")
    for bad in ('job="vllm"', '{__name__="x"}', '{job="a",__name__=~"x"}'):
        with pytest.raises(InvalidSelector):
            selector_matchers(bad)


def series(name, replica, points, **labels):
    return ({"__name__": name, "instance": replica, "job": "vllm", **labels}, tuple(points))


def test_windows_from_matrix_rebuild_pages():
    counter = [(1.0, 100.0), (2.0, 150.0), (3.0, 400.0)]
    matrix = [
        series("vllm:prefix_cache_queries_total", "a:1", counter, engine="0"),
        series("vllm:prefix_cache_hits_total", "a:1", [(1.0, 50.0), (2.0, 50.0), (3.0, 250.0)], engine="0"),
        series("vllm:prefix_cache_queries_created", "a:1", [(1.0, 7.0), (2.0, 7.0), (3.0, 7.0)], engine="0"),
        series("vllm:time_to_first_token_seconds_bucket", "a:1", [(1.0, 0.0), (3.0, 2.0)], engine="0", le="0.1"),
        series("vllm:time_to_first_token_seconds_bucket", "a:1", [(1.0, 0.0), (3.0, 4.0)], engine="0", le="+Inf"),
        series("vllm:time_to_first_token_seconds_count", "a:1", [(1.0, 0.0), (3.0, 4.0)], engine="0"),
        series("vllm:time_to_first_token_seconds_sum", "a:1", [(1.0, 0.0), (3.0, 1.0)], engine="0"),
        series("vllm:num_requests_running", "b:2", [(1.5, 0.0), (2.5, 3.0)], engine="0"),
    ]
    up = [
        series("up", "a:1", [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 0.0)]),
        series("up", "b:2", [(1.5, 1.0), (2.5, 1.0)]),
        series("up", "c:3", [(1.0, 1.0)]),
    ]
    windows, without = windows_from_matrix(matrix, up, replica_label="instance", source_of=lambda r: f"prom {r}")
    assert set(windows) == {"a:1", "b:2"} and without == ("c:3",)
    a = windows["a:1"]
    assert [r.ok for r in a.records] == [True, True, True, False]  # up=0 at t=4: a failed scrape
    assert a.stopped_early and "up=0" in a.stopped_early
    first = a.records[0].scrape
    assert (
        first.created_at(
            "vllm:prefix_cache_queries", frozenset({("instance", "a:1"), ("job", "vllm"), ("engine", "0")})
        )
        == 7.0
    )  # a timestamp, not a counter
    ev = passive_evidence(a)
    assert ev[Q.PREFIX_QUERIED_TOKENS].value == 300.0 and ev[Q.PREFIX_HIT_RATE].value == pytest.approx(200 / 300)
    assert ev[Q.LIVE_WINDOW_COMPLETE].value is False
    assert ev[Q.TTFT_P50].value <= 0.1  # 2 of 4 observations in the first bucket
    b = passive_evidence(windows["b:2"])
    assert b[Q.RUNNING_MAX].value == 3.0 and b[Q.LIVE_WINDOW_S].value == 1.0


def test_parse_matrix_errors_and_warnings():
    ok = {
        "status": "success",
        "warnings": ["partial"],
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"__name__": "up"}, "values": [[1.5, "NaN"], [2, "+Inf"]]}],
        },
    }
    result, warns = parse_matrix(ok, "p")
    assert warns == ("partial",) and result[0][1][1] == (2.0, float("inf"))
    with pytest.raises(PrometheusRefused) as info:
        parse_matrix({"status": "error", "errorType": "bad_data", "error": "parse error"}, "p")
    assert info.value.error_type == "bad_data" and "parse error" in str(info.value)
    for bad, what in (
        ({"status": "success"}, "'data'"),
        ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}}]}}, "lacks"),
        (
            {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"a": 1}, "values": []}]}},
            "not a string",
        ),
        ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1]]}]}}, "pair"),
    ):
        with pytest.raises(MalformedAnswer, match=what):
            parse_matrix(bad, "p")


# --- the command's own parsing ---------------------------------------------------------------------
def test_durations_and_times():
    assert parse_duration("90") == 90 and parse_duration("10m") == 600 and parse_duration("1h30m") == 5400
    assert parse_duration("500ms") == 0.5
    for bad in ("10 minutes", "m", "-5", "0", "5x"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    assert parse_time("2026-12-01T14:00:00Z", "--start") == parse_time("2026-12-01T14:00:00", "--start")
    assert parse_time("1796220000.5", "--end") == 1796220000.5
    with pytest.raises(UsageError, match="--start"):
        parse_time("yesterday", "--start")


def test_window_flags():
    ns = argparse.Namespace
    assert window_of(ns(since="5m", start=None, end=None), now=1000.0) == (700.0, 1000.0)
    assert window_of(ns(since=None, start="100", end="200")) == (100.0, 200.0)
    assert window_of(ns(since=None, start=None, end="1000"))[0] == 400.0  # the default: 10 minutes
    with pytest.raises(UsageError, match="not both"):
        window_of(ns(since="5m", start="1", end=None))
    with pytest.raises(UsageError, match="empty"):
        window_of(ns(since=None, start="200", end="100"))


def test_folder_names_are_safe_and_unique():
    names = folder_names(["10.0.0.7:8000", "10.0.0.7_8000", "vllm-0", "../x"])
    assert names == {
        "10.0.0.7:8000": "10.0.0.7_8000",
        "10.0.0.7_8000": "10.0.0.7_8000-2",
        "vllm-0": "vllm-0",
        "../x": "_x",
    }
