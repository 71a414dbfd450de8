"""Where the evidence holds a verdict the tree says it (issue 25, part 3): disaggregation judged
from the deployment's shape when the transfer time is missing, pipeline parallelism where tensor
parallelism serves the latency goal, and a prefix-cache hit rate that is the engine's own figure
never read as this workload's hit or miss."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, Provenance
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import PROV, build
from tests.scenarios.engines import setting

TH = Thresholds()


def _pitfall(d, name):
    return next(p for p in d.pitfalls if p.pitfall == name)


# --- disaggregation judged from the deployment's shape ------------------------------------------
def _pd(**items):
    return diagnose(build({"engine.name": "vllm", "config.pd_disaggregation": True, **items}))


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ({"memory.device_count": setting(2), "inputs.length_p50": 1024, "outputs.length_p50": 50}, "2 devices"),
        ({"memory.device_count": setting(8), "inputs.length_p50": 128, "outputs.length_p50": 128}, "1.0:1"),
        ({"config.tensor_parallel_size": setting(1)}, "1 devices"),
    ],
)
def test_disaggregation_below_scale_is_the_pitfall_without_a_transfer_measurement(shape, why):
    d = _pd(**shape)
    pit = _pitfall(d, "disaggregation-overhead")
    assert pit.detected is True and why in pit.explanation and "deployment's shape" in pit.explanation
    assert pit.fix and any(c.threshold.startswith("q6.disagg_min") and c.holds for c in pit.comparisons)
    rec = d.recommendation("pd-disaggregation")
    # A configuration verdict: its own confidence, not Q6's (Q6 is unanswered here).
    assert rec.status == "not-working" and d.answer("Q6").confidence == 0.0
    assert rec.confidence == TH["confidence.config"]
    assert (d.headline_kind, d.headline_subject) == ("pitfall", "disaggregation-overhead")


def test_disaggregation_at_scale_or_unmeasured_shape_stays_unchecked():
    at_scale = _pd(**{"memory.device_count": setting(8), "inputs.length_p50": 2048, "outputs.length_p50": 150})
    unknown = _pd()
    for d in (at_scale, unknown):
        assert _pitfall(d, "disaggregation-overhead").detected is None
        assert d.recommendation("pd-disaggregation").status == "on-unverified"


def test_a_measured_transfer_share_outranks_the_shape():
    small = {"memory.device_count": setting(2), "inputs.length_p50": 1024, "outputs.length_p50": 50}
    d = _pd(**small, **{"pd.kv_transfer_ttft_share": 0.05})
    assert _pitfall(d, "disaggregation-overhead").detected is False
    assert d.recommendation("pd-disaggregation").status == "in-place"
    d = _pd(**small, **{"pd.kv_transfer_ttft_share": 0.4})
    rec = d.recommendation("pd-disaggregation")
    assert rec.status == "not-working" and rec.confidence == d.answer("Q6").confidence  # measured: Q6's


def test_disaggregation_not_seen_on_is_never_judged_by_shape():
    d = diagnose(build({"engine.name": "vllm", "memory.device_count": setting(2), "inputs.length_p50": 1024}))
    assert _pitfall(d, "disaggregation-overhead").detected is None


# --- pipeline parallelism where tensor parallelism serves the latency goal -----------------------
def _pp(tp: int, pp: int, **items):
    base = {
        "engine.name": "vllm",
        "workload.interactive": True,
        "memory.weights_fraction": 0.6,
        "config.tensor_parallel_size": setting(tp),
        "config.pipeline_parallel_size": setting(pp),
        "decode.itl_p50_s": 0.09,
        "decode.itl_p99_s": 0.12,
        "decode.time_share": 0.9,
    }
    return diagnose(build({**base, **items}))


def test_pipeline_on_one_node_with_slow_tokens_is_the_layout_to_fix():
    d = _pp(2, 2)
    assert d.answer("Q5").answer == "yes"
    rec = d.recommendation("parallelism")
    assert rec.status == "not-working" and rec.question == "Q5", rec.reason
    assert "PP 2 x TP 2 on 4 devices" in rec.reason and "TP 4 and PP 1" in rec.reason
    assert "about 45.0 ms" in rec.reason  # the median gap split across the stages, at best
    assert rec.confidence == min(d.answer("Q5").confidence, TH["confidence.config"])
    assert {s.node: s.outcome for s in d.path}["Q1.pipeline-where-tensor-fits"] == "yes"
    assert (d.headline_kind, d.headline_subject) == ("fix", "parallelism")


@pytest.mark.parametrize(
    ("tp", "pp", "items", "status", "outcome"),
    [
        (8, 2, {}, "in-place", "no"),  # 16 devices: stages across nodes are the layout
        (1, 2, {"decode.itl_p50_s": 0.02, "decode.itl_p99_s": 0.03}, "in-place", "no"),  # tokens fast enough
        (1, 2, {"decode.itl_p50_s": 0.02, "decode.itl_p99_s": 0.5}, "in-place", "unknown"),  # only the tail: stalls
        (4, 1, {}, "in-place", None),  # no pipeline stages: nothing to say about them
    ],
)
def test_pipeline_is_left_alone_where_it_is_the_right_layout_or_not_the_cause(tp, pp, items, status, outcome):
    d = _pp(tp, pp, **items)
    assert d.recommendation("parallelism").status == status, d.recommendation("parallelism").reason
    assert {s.node: s.outcome for s in d.path}.get("Q1.pipeline-where-tensor-fits") == outcome


def test_pipeline_judged_by_a_broken_ttft_objective_when_no_token_gaps_were_measured():
    ev = build(
        {
            "engine.name": "trtllm",
            "memory.weights_fraction": 0.6,
            "config.tensor_parallel_size": setting(2),
            "config.pipeline_parallel_size": setting(2),
            "latency.ttft_p50_s": 1.4,
        }
    )
    d = diagnose(ev, slo=SLO.from_flags(["ttft:p50:0.8s"]))
    rec = d.recommendation("parallelism")
    assert rec.status == "not-working" and rec.question == "Q1" and "the SLO breaks" in rec.reason
    assert rec.confidence == min(d.answer("Q1").confidence, TH["confidence.config"])
    met = diagnose(ev, slo=SLO.from_flags(["ttft:p50:2s"]))
    assert met.recommendation("parallelism").status == "in-place"


# --- the engine's own hit-rate figure -----------------------------------------------------------
def _figure(value: float) -> Measurement:
    gauge = Provenance("prometheus-gauge-samples", "sglang:cache_hit_rate", PROV.taken_at)
    return Measurement(
        value,
        "fraction",
        gauge,
        warnings=(coded(WarningCode.ENGINE_GAUGE, f"{Q.ENGINE_HIT_RATE_WARNING}: mean of its readings"),),
    )


def _counted(value: float) -> Measurement:
    return Measurement(value, "fraction", Provenance("prometheus-counter-delta", "vllm:prefix_cache_hits_total"))


def _prefix(hit, **items):
    return diagnose(build({"engine.name": "vllm", "config.prefix_caching": True, "prefix.hit_rate": hit, **items}))


def test_an_engine_figure_below_the_workloads_reuse_is_not_a_broken_cache():
    counted = _prefix(_counted(0.2), **{"prefix.potential_fraction": 0.66})
    assert counted.recommendation("prefix-caching").status == "not-working"  # hits over lookups: a verdict
    figure = _prefix(_figure(0.2), **{"prefix.potential_fraction": 0.66})
    rec = figure.recommendation("prefix-caching")
    assert rec.status == "on-unverified" and "cannot describe this workload" in rec.reason, rec.reason
    assert "counters over the window" in rec.reason and "--active" in rec.reason


def test_an_engine_figure_above_the_workloads_reuse_is_no_warm_cache_pitfall():
    # The pitfall's own reading (the sanity check doubts any rate above the reuse afterwards, in diagnose).
    from llm_diagnose.diagnose.tree.pitfalls import warm_cache_benchmark

    def ev(hit):
        return build({"config.prefix_caching": True, "prefix.hit_rate": hit, "prefix.potential_fraction": 0.05})

    assert warm_cache_benchmark(ev(_counted(0.62)), TH).detected is True
    pit = warm_cache_benchmark(ev(_figure(0.62)), TH)
    assert pit.detected is None and "engine's own figure" in pit.explanation
    assert any(m.evidence == Q.PREFIX_WARM_AT_START for m in pit.missing)


def test_an_engine_figure_does_not_lower_the_traces_confidence_in_q2():
    trace_only = _prefix(None, **{"prefix.potential_fraction": 0.5}).answer("Q2")
    with_figure = _prefix(_figure(0.0), **{"prefix.potential_fraction": 0.5}).answer("Q2")
    with_counted = _prefix(_counted(0.0), **{"prefix.potential_fraction": 0.5}).answer("Q2")
    assert with_figure.confidence == trace_only.confidence
    assert with_counted.confidence < trace_only.confidence  # a counted rate that disagrees is doubt


@pytest.mark.parametrize(
    ("repeated", "salted", "status", "outcome"),
    [
        (0.94, 0.0, "in-place", "yes"),
        (0.05, 0.0, "not-working", "no"),
        (0.94, 0.4, "on-unverified", None),  # salted prompts hit: other traffic in the counters
    ],
)
def test_the_active_experiment_says_whether_the_cache_works(repeated, salted, status, outcome):
    d = _prefix(
        _figure(0.03),
        **{
            "prefix.potential_fraction": 0.5,
            "prefix.active_repeated_hit_rate": repeated,
            "prefix.active_salted_hit_rate": salted,
        },
    )
    rec = d.recommendation("prefix-caching")
    assert rec.status == status, rec.reason
    assert {s.node: s.outcome for s in d.path}.get("Q2.cache-keeps-a-repeated-prefix") == outcome
    if outcome is not None:
        assert rec.confidence == TH["confidence.direct"]


def test_the_active_experiment_judges_the_cache_where_no_live_rate_was_read():
    d = _prefix(None, **{"prefix.active_repeated_hit_rate": 0.9})
    rec = d.recommendation("prefix-caching")
    assert rec.status == "in-place" and "hit 90%" in rec.reason


def test_a_counted_rate_beside_the_active_experiment_keeps_its_own_verdict():
    d = _prefix(_counted(0.6), **{"prefix.potential_fraction": 0.66, "prefix.active_repeated_hit_rate": 0.05})
    assert "Q2.cache-keeps-a-repeated-prefix" not in {s.node for s in d.path}


def test_engine_figure_reads_the_probes_warning_and_method():
    from llm_diagnose.diagnose.tree.prefix_figures import engine_figure

    def ev(m):
        return Evidence(build({}).target, {Q.PREFIX_HIT_RATE: m})

    assert engine_figure(ev(_figure(0.3))) is not None
    by_method = Measurement(0.3, "fraction", Provenance("prometheus-gauge-samples", "vllm:gpu_prefix_cache_hit_rate"))
    assert engine_figure(ev(by_method)) is not None
    assert engine_figure(ev(_counted(0.3))) is None
