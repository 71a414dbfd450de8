"""Table-driven tests of every question: each side of each threshold, missing evidence."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.tree.questions.catalogue import ASK
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import LIVE_PROV, PROV, build, live, sampled

TH = Thresholds()

# (question, evidence, expected answer, expected verdict or None)
CASES = [
    # Q1 -- does it fit with room to spare?
    ("Q1", {"memory.weights_fraction": 1.01}, "no", "does-not-fit"),
    ("Q1", {"memory.weights_fraction": 1.0}, "no", "tight"),  # fits the device, but only just
    ("Q1", {"memory.weights_fraction": 0.8001}, "no", "tight"),
    ("Q1", {"memory.weights_fraction": 0.80}, "yes", "fits"),
    # overload while the model fits is a capacity finding ("yes", overloaded), not "does not fit"
    ("Q1", {"kv.usage_p95": 0.90, "kv.preemptions": 1}, "yes", "overloaded"),
    ("Q1", {"kv.usage_p95": 0.80, "kv.preemptions": 5}, "yes", "overloaded"),  # preemptions just under the line
    ("Q1", {"kv.usage_p95": 0.7999, "kv.preemptions": 5}, "yes", "fits"),
    ("Q1", {"kv.usage_p95": 0.95, "kv.preemptions": 0, "queue.waiting_mean": 0.5}, "yes", "overloaded"),
    ("Q1", {"kv.usage_p95": 0.95, "kv.preemptions": 0, "queue.waiting_mean": 0.49}, "yes", "fits"),
    (
        "Q1",
        {
            "memory.weights_fraction": 0.2,
            "kv.capacity_tokens": 400000,
            "inputs.length_p50": 1000,
            "outputs.length_p50": 200,
            "kv.usage_p95": 0.99,
            "queue.waiting_mean": 12,
        },
        "yes",
        "overloaded",
    ),
    # per-device weights: TP x PP divide the share of one device
    ("Q1", {"memory.weights_fraction": 1.6, "config.tensor_parallel_size": 2}, "yes", "fits"),
    ("Q1", {"memory.weights_fraction": 1.7, "config.tensor_parallel_size": 2}, "no", "tight"),
    (
        "Q1",
        {"memory.weights_fraction": 3.0, "config.tensor_parallel_size": 2, "config.pipeline_parallel_size": 2},
        "yes",
        "fits",
    ),
    ("Q1", {"memory.weights_fraction": 1.6, "memory.device_count": 4}, "yes", "fits"),
    # the engine's memory share leaves too little for the KV cache
    ("Q1", {"memory.weights_fraction": 0.5, "config.gpu_memory_utilization": 0.5999}, "no", "tight"),
    ("Q1", {"memory.weights_fraction": 0.5, "config.gpu_memory_utilization": 0.61}, "yes", "fits"),
    # KV capacity in this workload's typical requests
    (
        "Q1",
        {
            "memory.weights_fraction": 0.5,
            "kv.capacity_tokens": 7999,
            "inputs.length_p50": 1500,
            "outputs.length_p50": 500,
        },
        "no",
        "kv-too-small",
    ),
    (
        "Q1",
        {
            "memory.weights_fraction": 0.5,
            "kv.capacity_tokens": 8000,
            "inputs.length_p50": 1500,
            "outputs.length_p50": 500,
        },
        "yes",
        "fits",
    ),
    ("Q1", {"kv.max_concurrency": 2.5, "kv.usage_p95": 0.85}, "no", "kv-too-small"),
    # the engine's figure is at max_model_len, a lower bound: it decides only when the cache fills
    ("Q1", {"kv.max_concurrency": 2.5, "kv.usage_p95": 0.3}, "yes", "fits"),
    # ... and is turned into this workload's requests where max_model_len and the lengths are known
    (
        "Q1",
        {"kv.max_concurrency": 1.3, "engine.max_model_len": 32768, "inputs.length_p50": 32600, "outputs.length_p50": 1},
        "no",
        "kv-too-small",
    ),
    (
        "Q1",
        {
            "kv.max_concurrency": 1.3,
            "engine.max_model_len": 131072,
            "inputs.length_p50": 1000,
            "outputs.length_p50": 200,
            "kv.usage_p95": 0.95,
        },
        "yes",
        "fits",
    ),
    # a near-idle server fits, untested
    (
        "Q1",
        {"memory.weights_fraction": 0.3, "load.concurrency_mean": 0.5, "queue.waiting_mean": 0.0},
        "yes",
        "untested",
    ),
    ("Q1", {"memory.weights_fraction": 0.3, "load.concurrency_mean": 2.0, "queue.waiting_mean": 0.0}, "yes", "fits"),
    ("Q1", {"kv.usage_p95": 0.95}, "unknown", None),  # full, but was anyone turned away?
    ("Q1", {}, "unknown", None),
    ("Q1", {"memory.weights_fraction": None, "kv.usage_p95": None}, "unknown", None),
    # Q2 -- shared prefixes?
    ("Q2", {"prefix.potential_fraction": 0.10}, "yes", None),
    ("Q2", {"prefix.potential_fraction": 0.0999}, "no", None),
    ("Q2", {"config.prefix_caching": True, "prefix.hit_rate": 0.10, "prefix.queried_tokens": 100}, "yes", None),
    ("Q2", {"config.prefix_caching": True, "prefix.hit_rate": 0.0999, "prefix.queried_tokens": 100}, "no", None),
    ("Q2", {"config.prefix_caching": True, "prefix.hit_rate": 0.5, "prefix.queried_tokens": 0}, "unknown", None),
    ("Q2", {"config.prefix_caching": False, "prefix.hit_rate": 0.0}, "unknown", None),
    ("Q2", {}, "unknown", None),
    # the workload's own reuse outranks the live counter (which only shows the current config)
    ("Q2", {"prefix.potential_fraction": 0.5, "config.prefix_caching": True, "prefix.hit_rate": 0.0}, "yes", None),
    # Q3 -- varied output lengths, concurrently?
    ("Q3", {"outputs.length_cv": 0.50, "load.concurrency_mean": 2.0}, "yes", None),
    ("Q3", {"outputs.length_cv": 0.4999, "load.concurrency_mean": 8.0}, "no", None),
    ("Q3", {"outputs.length_cv": 1.2, "load.concurrency_mean": 1.999}, "no", None),
    ("Q3", {"outputs.length_cv": 1.2, "batch.running_mean": 4.0}, "yes", None),  # running as a fallback
    ("Q3", {"outputs.length_cv": 1.2, "batch.running_mean": 1.0, "queue.waiting_mean": 1.0}, "yes", None),
    ("Q3", {"outputs.length_cv": 1.2, "batch.running_mean": 1.0, "queue.waiting_mean": 0.999}, "no", None),
    # Live keys are judged by their interval: the whole interval on one side of the line.
    ("Q3", {"batching.short_request_slowdown": live(2.05, 2.0, 2.1)}, "yes", "short-waits-for-long"),
    ("Q3", {"batching.short_request_slowdown": live(1.95, 1.9, 1.99), "outputs.length_cv": 0.1}, "no", None),
    ("Q3", {"batching.short_request_slowdown": live(2.05, 1.99, 2.1)}, "unknown", "inconclusive"),
    ("Q3", {"outputs.length_cv": 1.2}, "unknown", None),
    # Q4 -- fragmentation caps the batch?
    ("Q4", {"kv.waste_fraction": 0.30}, "yes", None),
    ("Q4", {"kv.waste_fraction": 0.2999}, "no", None),
    ("Q4", {"config.paged_kv": True}, "no", "paged"),
    ("Q4", {"config.paged_kv": False}, "unknown", None),
    ("Q4", {}, "unknown", None),
    # Q5 -- decode latency the complaint?
    ("Q5", {"decode.itl_p50_s": 0.0501}, "yes", None),
    ("Q5", {"decode.itl_p50_s": 0.050}, "no", None),
    ("Q5", {"decode.itl_p99_s": 0.2001}, "yes", None),
    ("Q5", {"decode.itl_p99_s": 0.200}, "no", None),
    ("Q5", {"decode.itl_p50_s": 0.08, "decode.time_share": 0.4999}, "no", None),
    ("Q5", {"decode.itl_p50_s": 0.08, "decode.time_share": 0.50}, "yes", None),
    ("Q5", {}, "unknown", None),
    # Q6 -- prefill/decode contention?
    ("Q6", {"interference.itl_inflation": live(1.55, 1.5, 1.6)}, "yes", None),
    ("Q6", {"interference.itl_inflation": live(1.45, 1.4, 1.4999)}, "no", None),
    ("Q6", {"interference.itl_inflation": live(1.55, 1.4999, 1.6)}, "unknown", "inconclusive"),
    ("Q6", {"interference.prompt_itl_correlation": 0.5}, "yes", None),
    ("Q6", {"interference.prompt_itl_correlation": 0.4999}, "no", None),
    ("Q6", {"interference.itl_inflation": 1.2, "interference.prompt_itl_correlation": 0.9}, "no", None),
    ("Q6", {}, "unknown", None),
    # KV offload
    ("KV", {"prefix.potential_fraction": 0.75, "prefix.lru_fraction_at_capacity": 0.625}, "yes", None),
    ("KV", {"prefix.potential_fraction": 0.75, "prefix.lru_fraction_at_capacity": 0.6875}, "no", None),
    ("KV", {"prefix.potential_fraction": 0.75}, "unknown", None),
    # offline batch
    ("OB", {"workload.interactive": False}, "yes", None),
    ("OB", {"workload.interactive": True}, "no", None),
    ("OB", {}, "unknown", None),
]


@pytest.mark.parametrize("question, items, expected, verdict", CASES)
def test_question(question, items, expected, verdict):
    answer = ASK[question](build(items), TH)
    assert answer.answer == expected, answer.rationale
    if verdict is not None:
        assert answer.verdict == verdict
    assert answer.question == question
    # every comparison names a real threshold and is internally consistent
    for c in answer.comparisons:
        assert c.limit == TH[c.threshold]
    if expected == "unknown":
        assert answer.confidence == 0.0
        assert answer.missing, "an unknown answer must say what is missing"
    else:
        assert 0.0 < answer.confidence <= 1.0


def test_unknown_answer_carries_the_probes_reason_and_hint():
    answer = ASK["Q5"](build({"decode.itl_p50_s": None}), TH)
    assert answer.answer == "unknown"
    missing = {m.evidence: m for m in answer.missing}
    assert missing["decode.itl_p50_s"].reason == "not measured in this test"
    assert missing["decode.itl_p50_s"].hint == "test hint"


def test_comparisons_record_value_limit_and_outcome():
    answer = ASK["Q1"](build({"kv.usage_p95": 0.97, "kv.preemptions": 3}), TH)
    by_threshold = {c.threshold: c for c in answer.comparisons}
    c = by_threshold["q1.kv_saturation"]
    assert (c.evidence, c.value, c.op, c.limit, c.holds) == ("kv.usage_p95", 0.97, ">=", 0.90, True)
    assert "kv.usage_p95" in answer.evidence


def test_thin_evidence_lowers_confidence():
    thick = ASK["Q5"](build({"decode.itl_p50_s": sampled([0.08] * 20)}), TH)
    thin = ASK["Q5"](build({"decode.itl_p50_s": sampled([0.08, 0.09])}), TH)
    assert thick.answer == thin.answer == "yes"
    assert thin.confidence < thick.confidence


def test_idle_window_gives_low_confidence_fit():
    answer = ASK["Q1"](build({"kv.usage_p95": 0.0, "throughput.generation_tokens_per_s": 0.0}), TH)
    assert (answer.answer, answer.verdict) == ("yes", "untested") and answer.confidence <= TH["confidence.idle"]
    assert "no tokens were generated" in answer.rationale


def test_unseen_parallelism_lowers_a_does_not_fit_verdict():
    seen = ASK["Q1"](build({"memory.weights_fraction": 1.6, "config.tensor_parallel_size": 1}), TH)
    unseen = ASK["Q1"](build({"memory.weights_fraction": 1.6}), TH)
    assert seen.verdict == unseen.verdict == "does-not-fit"
    assert unseen.confidence < seen.confidence and "TP/PP were not seen" in unseen.rationale


def test_load_not_measured_caps_a_fit():
    a = ASK["Q1"](build({"memory.weights_fraction": 0.3, "kv.usage_p95": 0.4}), TH)
    assert a.verdict == "fits" and a.confidence <= TH["confidence.load_unknown"]


def test_near_zero_live_hit_rate_without_a_trace_is_unknown_not_no():
    a = ASK["Q2"](build({"config.prefix_caching": True, "prefix.hit_rate": 0.02, "prefix.queried_tokens": 1000}), TH)
    assert a.answer == "unknown" and "--trace" in a.rationale


def test_passive_correlation_at_low_load_says_nothing_and_otherwise_stays_modest():
    idle = ASK["Q6"](build({"interference.prompt_itl_correlation": 0.9, "load.concurrency_mean": 0.4}), TH)
    assert (idle.answer, idle.verdict) == ("unknown", "passive-low-load") and "--active" in idle.rationale
    busy = ASK["Q6"](build({"interference.prompt_itl_correlation": 0.9, "load.concurrency_mean": 20}), TH)
    assert busy.answer == "yes" and busy.verdict == "passive" and busy.confidence <= TH["confidence.passive"]


def test_idle_server_does_not_answer_whether_requests_overlap():
    a = ASK["Q3"](build({"outputs.length_cv": 1.2, "load.concurrency_mean": 0.0}), TH)
    assert a.answer == "unknown"


def test_every_confidence_rule_is_named_and_sourced():
    from llm_diagnose.diagnose.tree.thresholds import DEFAULTS

    rules = [t for n, t in DEFAULTS.items() if n.startswith("confidence.")]
    assert len(rules) >= 10
    for t in rules:
        assert t.meaning and t.source and t.unit and 0.0 < t.default <= 1.0


def test_a_live_interval_across_the_line_is_inconclusive_and_says_what_would_settle_it():
    def measured(values):  # as the interference experiment writes it: an active probe's, with samples
        return Measurement(sorted(values)[len(values) // 2], "ratio", LIVE_PROV, samples=tuple(values))

    noisy = measured([0.7, 1.0, 1.6, 2.4, 3.0])  # median 1.6 over the 1.5 line, but its interval spans it
    clean = measured([1.6] * 9)
    a_noisy = ASK["Q6"](build({"interference.itl_inflation": noisy}), TH)
    a_clean = ASK["Q6"](build({"interference.itl_inflation": clean}), TH)
    assert (a_noisy.answer, a_noisy.verdict, a_noisy.confidence) == ("unknown", "inconclusive", 0.0)
    assert "straddles the threshold q6.min_itl_inflation" in a_noisy.rationale
    assert any(m.evidence == "Q6.verdict" and "--budget-requests" in m.hint for m in a_noisy.missing)
    assert a_clean.answer == "yes" and a_clean.confidence > 0.5


def test_no_live_verdict_from_a_single_probe_or_a_starved_client():
    single = Measurement(3.0, "ratio", LIVE_PROV)  # one probe each side: no interval
    assert single.summary is None
    a = ASK["Q3"](build({"batching.short_request_slowdown": single}), TH)
    assert (a.answer, a.verdict) == ("unknown", "inconclusive") and "too few for an interval" in a.rationale
    starved = live(
        3.0,
        2.8,
        3.2,
        warnings=(coded(WarningCode.CLIENT_STARVED, f"{Q.CLIENT_STARVED_WARNING} event-loop lag p99 444 ms"),),
    )
    a = ASK["Q3"](build({"batching.short_request_slowdown": starved}), TH)
    assert (a.answer, a.verdict) == ("unknown", "inconclusive") and "event-loop lag p99 444 ms" in a.rationale
    # ... and a starved client's measurement is no evidence for "no" either
    a = ASK["Q6"](
        build(
            {
                "interference.itl_inflation": live(
                    1.0, 0.9, 1.1, warnings=(coded(WarningCode.CLIENT_STARVED, Q.CLIENT_STARVED_WARNING),)
                )
            }
        ),
        TH,
    )
    assert a.verdict == "inconclusive"


def test_threshold_override_moves_the_boundary(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("[thresholds.q5]\nmax_itl_p50_s = 0.01\n")
    th = Thresholds.from_toml(f)
    assert ASK["Q5"](build({"decode.itl_p50_s": 0.02}), th).answer == "yes"
    assert ASK["Q5"](build({"decode.itl_p50_s": 0.02}), TH).answer == "no"
    assert th.overridden == {"q5.max_itl_p50_s"}


def test_a_starved_clients_token_gaps_are_no_evidence_of_slow_decode():
    starved = Measurement(
        0.4,
        "s",
        PROV,
        warnings=(coded(WarningCode.CLIENT_STARVED, f"{Q.CLIENT_STARVED_WARNING} event-loop lag p99 300 ms"),),
    )
    a = ASK["Q5"](build({"decode.itl_p50_s": starved, "decode.itl_p99_s": 0.9}), TH)
    assert (a.answer, a.verdict) == ("unknown", "inconclusive") and "lag p99 300 ms" in a.rationale
    assert ASK["Q5"](build({"decode.itl_p50_s": 0.4}), TH).answer == "yes"  # the same figure, believed


def test_a_figure_from_another_probe_is_judged_on_its_value():
    # the in-process PyTorch probe's slowdown (latency over step-time ratio) carries no interval
    probe = Measurement(46.3, "ratio", PROV)
    assert ASK["Q3"](build({"batching.short_request_slowdown": probe}), TH).verdict == "short-waits-for-long"


def test_the_walk_asks_every_question_of_the_diagnosis_once_in_its_order():
    """The ordered tuple of question modules is the diagnosis's list of questions; each answers
    under its own id and title, and only those that take the SLO are handed one."""
    from llm_diagnose.diagnose.tree.diagnosis import QUESTIONS as IDS
    from llm_diagnose.diagnose.tree.questions.catalogue import QUESTIONS, SLO_QUESTIONS, ask_all

    assert tuple(q.id for q in QUESTIONS) == IDS
    assert sorted(SLO_QUESTIONS) == ["OB", "Q5", "Q6"]
    answers = ask_all(build({}), TH)
    assert [(a.question, a.title) for a in answers] == [(q.id, q.title) for q in QUESTIONS]
