"""Q5 by cause: the served time per token split into the hardware's step, dispatch, the server's
overhead and delivery (llm_diagnose.diagnose.tree.time_per_token), and what each cause calls for."""

from __future__ import annotations

import json

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.diagnose.tree.time_per_token import decompose
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, Provenance
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import build

TH = Thresholds()
DECODE_EXPERIMENT = Provenance(method="active-probe/decode", source="test", taken_at="2026-12-02T00:00:00.000+00:00")


def timed(seconds: float, method: str) -> Measurement:
    return Measurement(seconds, "s", Provenance(method=method, source="test", taken_at="2026-12-02T00:00:00.000+00:00"))


# Measured on the project's tiny model (issue 25): its decode step's roofline floor 0.06 ms, the
# in-process eager step (CPU clock, Python dispatch included) 1.39 ms at batch 1, and vLLM's served
# inter-token gap about 2 ms (the decode experiment's one-at-a-time streams).
TINY = {
    Q.DECODE_BATCH1_ITL_P50: Measurement(0.002, "s", DECODE_EXPERIMENT),
    Q.decode_floor_key(1): timed(0.00006, "roofline"),
    Q.decode_step_latency_key(1): timed(0.00139, "cpu-timer"),
    Q.decode_eager_step_latency_key(1): timed(0.00139, "cpu-timer"),
    Q.MICROBENCH_MODEL: "tiny-llama config.json: random weights of its shapes, float32",
    "config.spec_decode": False,
}


def test_the_tiny_models_served_time_is_split_by_measurement_into_hardware_dispatch_and_server():
    d = decompose(Reading(build(TINY), TH))
    assert d.served_batch == 1.0, "the decode experiment's gaps are at batch 1"
    assert d.step_kind == "roofline floor" and d.step_s == pytest.approx(0.00006)
    shares = {p.name: (p.seconds, p.share) for p in d.parts}
    assert shares["hardware step"] == pytest.approx((0.00006, 0.03))
    # eager step minus the floor: what a compiled or graph-captured step removes (kernels above the floor included)
    assert shares["dispatch and kernels above the floor"] == pytest.approx((0.00133, 0.665))
    assert shares["server overhead"] == pytest.approx((0.00061, 0.305))  # served gap above the eager step
    assert d.over_step == pytest.approx(2.0 / 0.06)
    assert "hardware step 0.06 ms (3%" in d.text() and "server overhead 0.61 ms" in d.text()
    # The split follows the measurements, not a threshold: a floor twenty times higher is most of the time.
    heavier = decompose(Reading(build({**TINY, Q.decode_floor_key(1): timed(0.0012, "roofline")}), TH))
    assert heavier.part("hardware step").share == pytest.approx(0.6)
    assert heavier.part("dispatch and kernels above the floor").seconds == pytest.approx(0.00019)


def test_slow_tokens_far_above_the_step_point_at_the_overhead_not_at_speculative_decoding():
    d = diagnose(build(TINY), TH, slo=SLO.from_flags(["itl:p50:1ms"]))  # 2 ms breaks a 1 ms objective
    spec = d.recommendation("speculative-decoding")
    assert d.answer("Q5").answer == "yes" and spec.status == "not-indicated"
    assert "33.3x the roofline floor" in spec.reason and "the hardware's step is 3%" in spec.reason
    # the overhead's likely sources: dispatch first, since the served gap sits near the eager step
    assert spec.reason.index("1) per-step dispatch") < spec.reason.index("structured output")
    assert "--enforce-eager" in spec.reason
    assert d.recommendation("quantization").status != "recommended"
    assert (d.headline_kind, d.headline_subject) == ("investigate", "Q5")
    step = next(s for s in d.path if s.node == "Q5.served-close-to-step")
    assert step.outcome == "no" and "q5.step_close_ratio" in step.note
    # Within target, the same split is on the path and nothing is to do.
    fine = diagnose(build(TINY), TH)
    assert fine.answer("Q5").answer == "no" and fine.headline_kind != "investigate"
    assert any(s.node == "Q5.served-close-to-step" and s.outcome == "no" for s in fine.path)


def test_close_to_a_memory_bound_graph_step_speculative_decoding_is_the_lever():
    ev = {
        Q.ITL_P50: 0.011,
        Q.RUNNING_MEAN: 1.2,
        Q.decode_step_latency_key(1): timed(0.009, "cuda-graph-replay"),
        Q.decode_floor_key(1): timed(0.0075, "roofline"),
        "config.spec_decode": False,
    }
    d = diagnose(build(ev), TH, slo=SLO.from_flags(["itl:p50:8ms"]))
    spec = d.recommendation("speculative-decoding")
    assert spec.status == "recommended" and "1.22x the graph-replayed step" in spec.reason
    assert (d.headline_kind, d.headline_subject) == ("use", "speculative-decoding")
    # the same served gap at four times the step is overhead
    far = diagnose(build({**ev, Q.ITL_P50: 0.036}), TH, slo=SLO.from_flags(["itl:p50:8ms"]))
    assert far.recommendation("speculative-decoding").status == "not-indicated"


def test_graph_and_eager_steps_split_dispatch_from_the_engine_and_name_cuda_graphs_first():
    ev = {
        Q.ITL_P50: 0.022,
        Q.RUNNING_MEAN: 1.0,
        Q.decode_step_latency_key(1): timed(0.010, "cuda-graph-replay"),
        Q.decode_eager_step_latency_key(1): timed(0.021, "cpu-timer"),
        "config.spec_decode": False,
    }
    d = decompose(Reading(build(ev), TH))
    assert d.step_kind == "graph-replayed step"
    assert d.part("dispatch").seconds == pytest.approx(0.011) and d.part("server overhead").seconds == pytest.approx(
        0.001
    )
    diag = diagnose(build(ev), TH, slo=SLO.from_flags(["itl:p50:15ms"]))
    reason = diag.recommendation("speculative-decoding").reason
    assert "1) per-step dispatch" in reason and "near the eager step (21 ms)" in reason
    # A server well below the eager step does not run eagerly: dispatch is ruled out.
    eager30 = {**ev, Q.ITL_P50: 0.016, Q.decode_eager_step_latency_key(1): timed(0.030, "cpu-timer")}
    assert decompose(Reading(build(eager30), TH)).part("dispatch") is None, "that eager step is not this server's"
    fast = diagnose(build(eager30), TH, slo=SLO.from_flags(["itl:p50:11ms"]))
    assert "not it: eager dispatch" in fast.recommendation("speculative-decoding").reason


def test_without_the_step_the_cause_is_inconclusive_and_says_what_settles_it():
    ev = {Q.ITL_P50: 0.09, Q.RUNNING_MEAN: 2.0, "config.spec_decode": False}
    d = diagnose(build(ev), TH)
    spec = d.recommendation("speculative-decoding")
    assert spec.status == "unknown" and "inconclusive" in spec.reason
    assert "llm-diagnose microbench --config" in spec.reason and "decide RUN mb" in spec.reason
    assert (d.headline_kind, d.headline_subject) == ("investigate", "Q5")


@pytest.mark.parametrize(
    "extra, why",
    [
        ({Q.decode_floor_key(16): timed(0.02, "roofline")}, "the step was measured at batch 16"),
        ({Q.decode_floor_key(2): timed(0.12, "roofline")}, "below what the roofline floor allows"),
        ({Q.decode_step_latency_key(2): timed(0.02, "cpu-timer")}, "only an eager step was measured"),
    ],
    ids=["another-batch", "served-below-the-floor", "eager-only"],
)
def test_a_step_that_does_not_describe_the_served_gap_is_not_used(extra, why):
    ev = build({Q.ITL_P50: 0.09, Q.RUNNING_MEAN: 2.0, "config.spec_decode": False, **extra})
    d = decompose(Reading(ev, TH))
    assert d.over_step is None and why in d.mismatch
    assert diagnose(ev, TH).recommendation("speculative-decoding").status == "unknown"


def test_a_delivery_gap_is_overhead_the_step_cannot_explain():
    # SGLang #12972's figures: the client's ITL 110 ms at batch 96, the scheduler's own 60 ms.
    ev = {
        Q.ITL_P50: 0.110,
        Q.RUNNING_MEAN: 96.0,
        Q.DECODE_CLIENT_SERVER_ITL_RATIO: 110 / 60,
        "config.spec_decode": False,
    }
    d = diagnose(build(ev), TH)
    spec = d.recommendation("speculative-decoding")
    assert spec.status == "not-indicated" and "45% of each token's gap is outside the engine" in spec.reason
    assert "1) the API server's CPU" in spec.reason
    assert (d.headline_kind, d.headline_subject) == ("investigate", "Q5")
    agree = diagnose(build({**ev, Q.DECODE_CLIENT_SERVER_ITL_RATIO: 1.05}), TH)
    assert agree.recommendation("speculative-decoding").status == "unknown"  # the delivery path is not it


def test_sharp_growth_with_concurrency_is_a_pathology_whatever_the_batch1_gaps_say():
    ev = {Q.ITL_P50: 0.030, Q.DECODE_ITL_GROWTH: 15.0, "config.spec_decode": False}
    d = diagnose(build(ev), TH)
    assert d.answer("Q5").answer == "no", "one stream at a time is fast"
    assert d.recommendation("speculative-decoding").status == "not-indicated"
    assert (d.headline_kind, d.headline_subject) == ("investigate", "Q5") and "pathology" in d.bottleneck
    mild = diagnose(build({**ev, Q.DECODE_ITL_GROWTH: 3.0}), TH)
    assert mild.headline_kind != "investigate"
    assert next(s for s in mild.path if s.node == "Q5.sharp-growth-with-concurrency").outcome == "no"


def test_gaps_a_starved_client_read_in_bunches_give_way_to_the_engines_own_itl():
    # CI, a 99%-busy host: the client's batch-1 median was 0 (67% of gaps under 50 us); vLLM's own
    # mean ITL over the same phase was 6.4 ms. Zero is no time per token, and a floor above it no mismatch.
    decode = Provenance("active-probe/decode", "test")
    starved = Measurement(
        0.0,
        "s",
        decode,
        warnings=(coded(WarningCode.CLIENT_STARVED, f"{Q.CLIENT_STARVED_WARNING}: its event loop stalled"),),
    )
    ev = {
        Q.DECODE_BATCH1_ITL_P50: starved,
        Q.DECODE_SERVER_ITL_MEAN: 0.0064,
        Q.decode_floor_key(1): timed(0.00006, "roofline"),
        "config.spec_decode": False,
    }
    d = decompose(Reading(build(ev), TH))
    assert d.served_s == 0.0064 and "engine's own mean ITL" in d.served_basis and "starved" in d.served_basis, d
    assert d.step_kind == "roofline floor" and not d.mismatch, d.text()
    bunched = decompose(Reading(build({**ev, Q.DECODE_BATCH1_ITL_P50: Measurement(0.0, "s", decode)}), TH))
    assert bunched.served_s == 0.0064 and "bunched" in bunched.served_basis, bunched.served_basis


def test_a_starved_clients_slow_tokens_stand_where_the_engines_own_itl_says_as_much():
    decode = Provenance("active-probe/decode", "test")
    starved = (coded(WarningCode.CLIENT_STARVED, f"{Q.CLIENT_STARVED_WARNING}: event-loop lag p99 47.8 ms"),)
    ev = {
        Q.DECODE_BATCH1_ITL_P50: Measurement(0.0074, "s", decode, warnings=starved),
        Q.DECODE_SERVER_ITL_MEAN: 0.0078,
        "config.spec_decode": False,
    }
    slo = SLO.from_flags(["itl:p50:3.7ms"])
    q5 = diagnose(build(ev), TH, slo=slo).answer("Q5")
    assert q5.answer == "yes" and "the engine's own mean ITL over the same phase (7.8 ms)" in q5.rationale, q5
    # The engine saw fast tokens: the slowness may be the starved client's own, so no verdict.
    q5 = diagnose(build({**ev, Q.DECODE_SERVER_ITL_MEAN: 0.002}), TH, slo=slo).answer("Q5")
    assert q5.answer == "unknown" and "client starved" in q5.rationale, q5


def test_a_median_of_bunched_gaps_meets_no_objective():
    # CI, a busy host: the client's batch-1 median was 0 over 189 gaps (read in bunches); judged as a
    # time per token it met a 3.4 ms objective. The engine's own mean ITL over the phase (6.8 ms) stands in.
    decode = Provenance("active-probe/decode", "test")
    ev = {
        Q.DECODE_BATCH1_ITL_P50: Measurement(0.0, "s", decode, samples=(0.0,) * 120 + (0.004,) * 69),
        Q.DECODE_SERVER_ITL_MEAN: 0.0068,
        "config.spec_decode": False,
    }
    q5 = diagnose(build(ev), TH, slo=SLO.from_flags(["itl:p50:3.4ms"])).answer("Q5")
    assert q5.answer == "yes", q5.rationale
    fast = diagnose(build(ev), TH, slo=SLO.from_flags(["itl:p50:10ms"])).answer("Q5")
    assert fast.answer == "no", fast.rationale


def test_on_a_ladder_of_tens_of_streams_linear_growth_is_batching_and_a_steep_jump_is_not():
    # The sized decode experiment climbs to ~50 streams on a fast server: a compute-bound step's gap
    # grows about linearly (40x at 48 streams), which the whole-ladder growth alone called a pathology.
    ev = {Q.ITL_P50: 0.030, Q.DECODE_ITL_GROWTH: 40.0, Q.DECODE_ITL_JUMP: 1.1, "config.spec_decode": False}
    batching = diagnose(build(ev), TH)
    assert batching.headline_kind != "investigate"
    step = next(s for s in batching.path if s.node == "Q5.sharp-growth-with-concurrency")
    assert step.outcome == "no" and "decode.itl_superlinear_jump = 1.1" in step.note, step
    # The same growth with a 10x jump from one stream to two (5x steeper than the streams): a pathology.
    jump = diagnose(build({**ev, Q.DECODE_ITL_JUMP: 5.0}), TH)
    assert (jump.headline_kind, jump.headline_subject) == ("investigate", "Q5") and "pathology" in jump.bottleneck


def test_a_slow_tail_with_a_fine_median_is_stalls_not_the_step():
    ev = {
        Q.ITL_P50: 0.022,
        Q.ITL_P99: 0.310,
        Q.RUNNING_MEAN: 2.0,
        Q.decode_floor_key(2): timed(0.020, "roofline"),
        "config.spec_decode": False,
    }
    d = diagnose(build(ev), TH)
    spec = d.recommendation("speculative-decoding")
    assert d.answer("Q5").answer == "yes" and spec.status == "unknown", "close to the step, but the tail is slow"
    assert "stalls, not the step" in spec.reason and "--active" in spec.reason
    no_prefills = diagnose(build({**ev, Q.ITL_INFLATION: 1.0}), TH)  # Q6 measured: prefills do not stall decode
    assert no_prefills.recommendation("speculative-decoding").status == "not-indicated"


def test_tensor_parallel_puts_the_interconnect_among_the_first_suspects():
    ev = {
        Q.ITL_P50: 0.048,
        Q.RUNNING_MEAN: 1.0,
        Q.decode_floor_key(1): timed(0.0228, "roofline"),
        "config.tensor_parallel_size": 8,
        "config.spec_decode": False,
    }
    reason = diagnose(build(ev), TH, slo=SLO.from_flags(["itl:p50:40ms"])).recommendation("speculative-decoding").reason
    assert reason.index("1) the tensor-parallel interconnect") < reason.index("per-step dispatch")
    single = diagnose(build({**ev, "config.tensor_parallel_size": 1}), TH, slo=SLO.from_flags(["itl:p50:40ms"]))
    assert "not it: the tensor-parallel interconnect (TP 1)" in single.recommendation("speculative-decoding").reason


def test_with_speculative_decoding_on_the_gap_is_not_compared_with_one_plain_step():
    ev = {**TINY, "config.spec_decode": True}
    d = diagnose(build(ev), TH, slo=SLO.from_flags(["itl:p50:1ms"]))
    [step] = [s for s in d.path if s.node == "Q5.step-measured"]
    assert step.outcome == "unknown" and "not compared: speculative decoding is on" in step.note
    assert not any(s.node == "Q5.served-close-to-step" for s in d.path)


def test_decide_joins_a_run_with_a_microbench_keeping_each_items_provenance(tmp_path, capsys):
    run_items = build({**{k: v for k, v in TINY.items() if not Q.is_microbench_key(k)}, "batch.running_mean": 3.0})
    bench_items = build(
        {
            **{k: v for k, v in TINY.items() if Q.is_microbench_key(k)},
            "batch.running_mean": 99.0,  # not the microbenchmark's key: the run's stays
            Q.decode_floor_key(2): timed(0.0007, "roofline"),
        }
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "evidence.json").write_text(run_items.to_json())
    (tmp_path / "mb.json").write_text(bench_items.to_json())
    assert main(["decide", str(tmp_path / "run"), str(tmp_path / "mb.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    step = next(s for s in out["path"] if s["node"] == "Q5.step-measured")
    assert step["outcome"] == "yes" and "roofline floor at batch 1" in step["note"]
    assert main(["decide", str(tmp_path / "run"), "--json"]) == 0  # the run alone: the step is not known
    alone = json.loads(capsys.readouterr().out)
    assert next(s for s in alone["path"] if s["node"] == "Q5.step-measured")["outcome"] == "no"


def test_the_join_keeps_the_runs_item_unless_the_key_is_the_microbenchmarks():
    from llm_diagnose.diagnose.commands.common import join_evidence

    run = build({"batch.running_mean": 3.0, Q.decode_floor_key(1): 0.5, "decode.itl_p50_s": 0.002})
    bench = build({"batch.running_mean": 99.0, Q.decode_floor_key(1): 0.00006, Q.MEMCPY_BYTES_PER_S: 6e9})
    joined = join_evidence(run, bench)
    assert joined.measurement("batch.running_mean").value == 3.0
    assert joined.measurement(Q.decode_floor_key(1)).value == 0.00006
    assert joined.measurement(Q.MEMCPY_BYTES_PER_S).value == 6e9 and joined.target == run.target
    hole = build({Q.decode_floor_key(1): None})
    assert join_evidence(run, hole).measurement(Q.decode_floor_key(1)).value == 0.5, "a hole never replaces a value"
