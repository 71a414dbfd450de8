"""The gate's judgement on hand-built runs: the bootstrap, each verdict, and the diagnosis rules."""

from __future__ import annotations

import numpy as np
import pytest

from llm_diagnose.diagnose.compare.change import bootstrap_change
from llm_diagnose.diagnose.compare.metric import compare_metric
from llm_diagnose.diagnose.compare.rules import MetricRule
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.compare.statistic import Statistic, statistic_of
from llm_diagnose.diagnose.gate.judge import compare, compare_diagnoses
from llm_diagnose.diagnose.gate.result import RunData
from llm_diagnose.diagnose.gate.rules import DiagnosisRules, GateRules
from llm_diagnose.diagnose.tree import diagnose
from tests.evidence_builders import build, sampled

RULES = GateRules()
SETTINGS = CompareSettings()


def _lognormal(n: int, median: float, sigma: float, seed: int) -> list[float]:
    return list(np.random.default_rng(seed).lognormal(np.log(median), sigma, n))


def _outcome(base_values, cur_values, rule=MetricRule("latency.ttft_p50_s", "lower", 0.10), settings=SETTINGS):
    key = rule.key
    base = build({key: sampled(base_values, "s") if isinstance(base_values, list) else base_values})
    cur = build({key: sampled(cur_values, "s") if isinstance(cur_values, list) else cur_values})
    return compare_metric(rule, base, cur, settings)


def test_the_statistic_is_the_one_the_key_names():
    assert statistic_of("latency.ttft_p99_s") == Statistic("p99", 99.0) and statistic_of("latency.ttft_p99_s").tail
    assert statistic_of("kv.usage_p95").name == "p95"
    assert statistic_of("decode.itl_p50_s") == Statistic("median", 50.0)
    assert statistic_of("kv.usage_mean") == Statistic("mean", None)
    assert statistic_of("throughput.generation_tokens_per_s").name == "median"
    assert statistic_of("latency.ttft_p99_s", "median").name == "median"


MEDIAN = Statistic("median", 50.0)


def test_bootstrap_is_seeded_and_its_interval_covers_the_truth():
    base, cur = _lognormal(200, 1.0, 0.3, 1), _lognormal(200, 1.2, 0.3, 2)
    first = bootstrap_change(base, cur, MEDIAN, relative=True, seed=5)
    assert first == bootstrap_change(base, cur, MEDIAN, relative=True, seed=5)
    point, lo, hi = first
    assert lo < point < hi and lo < 0.2 < hi  # the true change is +20%
    _, lo0, hi0 = bootstrap_change(base, _lognormal(200, 1.0, 0.3, 3), MEDIAN, relative=True)
    assert lo0 < 0 < hi0


def test_large_samples_take_the_order_statistic_form_with_the_same_interval():
    import llm_diagnose.diagnose.compare.change as change

    base, cur = np.array(_lognormal(6000, 1.0, 0.5, 1)), np.array(_lognormal(6000, 1.05, 0.5, 2))
    for stat in (MEDIAN, Statistic("p95", 95.0)):
        fast = bootstrap_change(base, cur, stat, relative=True, resamples=1000)
        exact_max, change.EXACT_BOOTSTRAP_MAX = change.EXACT_BOOTSTRAP_MAX, 10**9
        try:
            exact = bootstrap_change(base, cur, stat, relative=True, resamples=1000)
        finally:
            change.EXACT_BOOTSTRAP_MAX = exact_max
        assert fast[0] == exact[0]
        assert abs((fast[2] - fast[1]) - (exact[2] - exact[1])) < 0.25 * (exact[2] - exact[1]), (stat, fast, exact)


def test_a_zero_baseline_gives_an_unbounded_relative_change_not_nan():
    point, lo, hi = bootstrap_change([0.0] * 20, [1.0] * 20, MEDIAN, relative=True)
    assert point == lo == hi == np.inf


def test_a_clear_regression_fails():
    o = _outcome(_lognormal(200, 0.10, 0.2, 1), _lognormal(200, 0.14, 0.2, 2))
    assert o.verdict == "regression", o
    assert o.interval[0] > 0.10 and "whole interval is worse" in o.detail
    assert o.change.startswith("+") and "[" in o.change


def test_the_same_configuration_passes():
    o = _outcome(_lognormal(400, 0.10, 0.2, 1), _lognormal(400, 0.10, 0.2, 2))
    assert o.verdict == "pass", o


def test_a_noisy_pair_is_inconclusive_not_a_failure():
    o = _outcome(_lognormal(12, 0.10, 0.9, 1), _lognormal(12, 0.11, 0.9, 2))
    assert o.verdict == "inconclusive" and "straddles" in o.detail, o


def test_a_clear_improvement_is_said():
    o = _outcome(_lognormal(200, 0.10, 0.2, 1), _lognormal(200, 0.06, 0.2, 2))
    assert o.verdict == "improvement"


def test_higher_is_better_turns_the_direction_around():
    rule = MetricRule("throughput.generation_tokens_per_s", "higher", 0.10)
    assert _outcome(_lognormal(100, 900, 0.05, 1), _lognormal(100, 600, 0.05, 2), rule).verdict == "regression"
    assert _outcome(_lognormal(100, 900, 0.05, 1), _lognormal(100, 1300, 0.05, 2), rule).verdict == "improvement"


def test_absolute_tolerance_for_fractions():
    rule = MetricRule("kv.usage_mean", "lower", tolerance_abs=0.05)
    base = list(np.random.default_rng(1).uniform(0.40, 0.44, 60))
    assert _outcome(base, [x + 0.02 for x in base], rule).verdict == "pass"
    assert _outcome(base, [x + 0.20 for x in base], rule).verdict == "regression"


def test_too_few_samples_are_inconclusive_and_tails_need_more():
    assert "too few samples" in _outcome([0.1, 0.2, 0.1], [0.5, 0.6, 0.5]).detail
    tail = MetricRule("latency.ttft_p99_s", "lower", 0.2)
    o = _outcome(_lognormal(100, 0.1, 0.2, 1), _lognormal(100, 0.5, 0.2, 2), tail)
    assert o.verdict == "inconclusive" and "needs 300" in o.detail
    assert _outcome(_lognormal(400, 0.1, 0.2, 1), _lognormal(400, 0.5, 0.2, 2), tail).verdict == "regression"


def test_values_without_samples_use_a_plain_tolerance_and_say_so():
    o = _outcome(0.10, 0.13)
    assert o.verdict == "regression" and "plain tolerance" in o.detail and o.change == "+30.0%"
    assert _outcome(0.10, 0.105).verdict == "pass"


def test_missing_measurements():
    rule = MetricRule("latency.ttft_p50_s", "lower")
    assert compare_metric(rule, build(), build(), SETTINGS).verdict == "skipped"
    o = compare_metric(rule, build(latency__ttft_p50_s=0.1), build(latency__ttft_p50_s=None), SETTINGS)
    assert o.verdict == "inconclusive" and "not measured in the current run: not measured in this test" in o.detail


def test_a_zero_baseline_with_a_relative_tolerance_is_inconclusive():
    assert "relative change is undefined" in _outcome(0.0, 0.2).detail


# --- diagnosis rules ----------------------------------------------------------------------------
SHARED = {"prefix.potential_fraction": 0.6, "engine.name": "vllm"}


def test_a_newly_recommended_technique_and_a_changed_answer_are_regressions():
    base = diagnose(build(SHARED, prefix__potential_fraction=0.02, config__prefix_caching=False))
    cur = diagnose(build(SHARED, config__prefix_caching=False))
    by_name = {o.name: o for o in compare_diagnoses(base, cur, RULES)}
    assert by_name["answer:Q2"].verdict == "regression" and "no -> yes" in by_name["answer:Q2"].detail
    assert by_name["technique:prefix-caching"].verdict == "regression"
    assert by_name["technique:prefix-caching"].current == "recommended"
    assert by_name["answer:Q5"].verdict == "pass"


def test_a_new_pitfall_is_a_regression_and_a_gone_one_an_improvement():
    clean = diagnose(
        build(SHARED, prefix__hit_rate=0.5, prefix__hit_rate_first_requests=0.0, config__prefix_caching=True)
    )
    warm = diagnose(
        build(SHARED, prefix__hit_rate=0.5, prefix__hit_rate_first_requests=0.6, config__prefix_caching=True)
    )
    forward = {o.name: o for o in compare_diagnoses(clean, warm, RULES)}
    assert forward["pitfall:warm-cache-benchmark"].verdict == "regression"
    assert "newly detected" in forward["pitfall:warm-cache-benchmark"].detail
    backward = {o.name: o for o in compare_diagnoses(warm, clean, RULES)}
    assert backward["pitfall:warm-cache-benchmark"].verdict == "improvement"
    same = {o.name: o for o in compare_diagnoses(warm, warm, RULES)}
    assert (
        same["pitfall:warm-cache-benchmark"].verdict == "pass"
        and "not new" in same["pitfall:warm-cache-benchmark"].detail
    )


@pytest.mark.parametrize(
    "setting,verdict", [("warning", "warning"), ("ignore", "pass"), ("inconclusive", "inconclusive")]
)
def test_diagnosis_rules_are_configurable(setting, verdict):
    base = diagnose(build(SHARED, prefix__potential_fraction=0.02, config__prefix_caching=False))
    cur = diagnose(build(SHARED, config__prefix_caching=False))
    rules = GateRules(diagnosis=DiagnosisRules(new_recommendation=setting, changed_answer=setting))
    by_name = {o.name: o for o in compare_diagnoses(base, cur, rules)}
    assert by_name["technique:prefix-caching"].verdict == verdict


def test_an_answer_that_became_unknown_is_inconclusive_by_default():
    base = diagnose(build(SHARED))
    cur = diagnose(build(engine__name="vllm"))
    o = {o.name: o for o in compare_diagnoses(base, cur, RULES)}["answer:Q2"]
    assert (o.baseline, o.current, o.verdict) == ("yes", "unknown", "inconclusive")


def test_compare_puts_it_together_and_picks_the_exit_code():
    ev = build(SHARED, latency__ttft_p50_s=sampled(_lognormal(100, 0.1, 0.2, 1), "s"))
    slow = build(SHARED, latency__ttft_p50_s=sampled(_lognormal(100, 0.2, 0.2, 2), "s"))
    same = compare(RunData(ev, diagnose(ev), "a"), RunData(ev, diagnose(ev), "b"))
    assert same.verdict == "pass" and same.exit_code() == 0
    worse = compare(RunData(ev, diagnose(ev)), RunData(slow, diagnose(slow)))
    assert worse.verdict == "regression" and worse.exit_code() == 1
    assert worse.ordered()[0].name == "latency.ttft_p50_s"
    noisy = build(SHARED, latency__ttft_p50_s=sampled(_lognormal(12, 0.1, 0.9, 3), "s"))
    unsure = compare(RunData(ev, diagnose(ev)), RunData(noisy, diagnose(noisy)))
    assert unsure.verdict == "inconclusive"
    assert unsure.exit_code() == 0 and unsure.exit_code(fail_on_inconclusive=True) == 5


def test_summaries_alone_are_compared_through_their_medians_intervals():
    from llm_diagnose.probes.results import Measurement, Summary
    from tests.evidence_builders import PROV

    def hist(values):
        s = Summary.from_samples(values)
        return Measurement(s.median, "s", PROV, summary=s)  # no samples: as a histogram gives

    rule = MetricRule("latency.ttft_p50_s", "lower", 0.10)
    base = _lognormal(400, 0.10, 0.2, 1)
    o = _outcome(hist(base), hist(_lognormal(400, 0.10, 0.2, 2)), rule)
    assert o.verdict == "pass" and "medians' confidence intervals" in o.detail, o
    assert _outcome(hist(base), hist(_lognormal(400, 0.2, 0.2, 2)), rule).verdict == "regression"
    assert _outcome(hist(base[:20]), hist(_lognormal(20, 0.11, 0.6, 2)), rule).verdict == "inconclusive"
    # A tail quantile has no interval in a summary: plain tolerance, said so.
    tail = MetricRule("latency.ttft_p99_s", "lower", 0.20)
    assert "plain tolerance" in _outcome(hist(base), hist(base), tail).detail


def test_a_technique_that_was_in_place_and_is_not_any_more_is_a_regression():
    on = diagnose(
        build(
            {
                "prefix.hit_rate": 0.9,
                "prefix.queried_tokens": 5000.0,
                "config.prefix_caching": True,
                "engine.name": "vllm",
            }
        )
    )
    off = diagnose(build({"config.prefix_caching": False, "engine.name": "vllm"}))
    assert on.recommendation("prefix-caching").status == "in-place"
    o = {o.name: o for o in compare_diagnoses(on, off, RULES)}["technique:prefix-caching"]
    assert o.verdict == "regression" and o.detail.startswith("in place before, now unknown")
    back = {o.name: o for o in compare_diagnoses(off, on, RULES)}["technique:prefix-caching"]
    assert back.verdict == "pass"


def test_a_technique_still_on_that_the_current_run_could_not_verify_is_inconclusive():
    # CI, two 3-second runs of one server: the second's scrapes all fell between its short
    # requests, so continuous batching read "on-unverified"; it was not switched off.
    seen = {"config.continuous_batching": True, "engine.name": "vllm", "workload.output_len_cv": 0.1}
    busy = diagnose(build({**seen, "load.concurrency_mean": 0.3, "throughput.generation_tokens_per_s": 60.0}))
    unseen = diagnose(build({**seen, "load.concurrency_mean": 0.0, "throughput.generation_tokens_per_s": 60.0}))
    assert busy.recommendation("continuous-batching").status == "in-place"
    assert unseen.recommendation("continuous-batching").status == "on-unverified"
    assert unseen.technique_on("continuous-batching") is True
    o = {o.name: o for o in compare_diagnoses(busy, unseen, RULES)}["technique:continuous-batching"]
    assert o.verdict == "inconclusive" and o.detail.startswith("in place before, now on-unverified")
    # The rule is configurable like the unknown answers it joins.
    strict = GateRules(diagnosis=DiagnosisRules(unknown_answer="regression"))
    o = {o.name: o for o in compare_diagnoses(busy, unseen, strict)}["technique:continuous-batching"]
    assert o.verdict == "regression"


def test_an_answer_that_flips_at_low_confidence_is_inconclusive():
    # Q6 from the passive correlation alone is a weak answer (confidence 0.5 at most).
    weak_yes = diagnose(build({"interference.prompt_itl_correlation": 0.7, "engine.name": "vllm"}))
    weak_no = diagnose(build({"interference.prompt_itl_correlation": 0.1, "engine.name": "vllm"}))
    assert weak_yes.answer("Q6").answer == "yes" and weak_yes.answer("Q6").confidence <= 0.5
    o = {o.name: o for o in compare_diagnoses(weak_no, weak_yes, RULES)}["answer:Q6"]
    assert o.verdict == "inconclusive" and "low confidence" in o.detail
    strict = GateRules(diagnosis=DiagnosisRules(min_confidence=0.4))
    assert {o.name: o for o in compare_diagnoses(weak_no, weak_yes, strict)}["answer:Q6"].verdict == "regression"


# --- client latencies cross-checked with the engine's own histogram ---------------------------------
def _client_and_engine(client_values, engine_values):
    """A run as the gate reads one: the client's per-request TTFTs and the engine's TTFT histogram
    over the same requests (known only by its summary, as a window of /metrics gives it)."""
    from llm_diagnose.probes.results import Measurement, Summary
    from tests.evidence_builders import PROV

    s = Summary.from_samples(engine_values)
    return build(
        {
            "requests.ttft_p50_s": sampled(client_values, "s"),
            "latency.ttft_p50_s": Measurement(s.median, "s", PROV, summary=s),
        }
    )


CLIENT_TTFT = MetricRule("requests.ttft_p50_s", "lower", 0.10)


def test_a_client_slowdown_the_engine_did_not_see_is_inconclusive_where_a_client_disagreed():
    # Seen in CI: a starved client read answers 0.5 s late and in bunches while vLLM's own TTFT
    # histogram said 12 ms; the client's +2500% is the path's, not the change's.
    engine = _lognormal(24, 0.015, 0.3, 1)
    base = _client_and_engine(_lognormal(24, 0.020, 0.3, 2), engine)
    cur = _client_and_engine(_lognormal(24, 0.450, 0.5, 3), _lognormal(24, 0.013, 0.3, 4))
    o = compare_metric(CLIENT_TTFT, base, cur, SETTINGS)
    assert o.verdict == "inconclusive", o
    assert "the engine's own latency.ttft_p50_s" in o.detail and "in the current run, ttft: client mean" in o.detail
    assert o.interval is not None and o.interval[0] > 1.0  # the client's interval is still reported


def test_a_client_slowdown_the_engine_saw_too_stands():
    base = _client_and_engine(_lognormal(100, 0.020, 0.2, 2), _lognormal(100, 0.015, 0.2, 1))
    cur = _client_and_engine(_lognormal(100, 0.450, 0.2, 3), _lognormal(100, 0.100, 0.2, 4))
    o = compare_metric(CLIENT_TTFT, base, cur, SETTINGS)
    assert o.verdict == "regression" and "the same way" in o.detail, o


def test_clients_that_agree_with_their_engines_stand_alone():
    # The engine's coarse histogram cannot see +40%, but both clients tracked their engines: the
    # client's finer samples decide.
    base = _client_and_engine(_lognormal(100, 0.100, 0.1, 2), _lognormal(100, 0.100, 0.1, 1))
    cur = _client_and_engine(_lognormal(100, 0.140, 0.1, 3), _lognormal(100, 0.140, 0.1, 4))
    o = compare_metric(CLIENT_TTFT, base, cur, SETTINGS)
    assert o.verdict == "regression" and "engine" not in o.detail, o


def test_an_engine_that_counted_other_traffic_is_no_cross_check():
    base = _client_and_engine(_lognormal(24, 0.020, 0.3, 2), _lognormal(24, 0.015, 0.3, 1))
    cur = _client_and_engine(_lognormal(24, 0.450, 0.3, 3), _lognormal(200, 0.013, 0.3, 4))  # 200 observed vs our 24
    assert compare_metric(CLIENT_TTFT, base, cur, SETTINGS).verdict == "regression"


def _tpot_and_itl(tpot_values, itl_values, decode_tokens: int):
    """A run's per-request TPOTs (the client's), the engine's ITL histogram (one observation per
    token after a request's first) and how many such tokens the client's requests had."""
    from llm_diagnose.probes.results import Measurement, Summary
    from tests.evidence_builders import PROV

    s = Summary.from_samples(itl_values)
    return build(
        {
            "requests.tpot_p50_s": sampled(tpot_values, "s"),
            "requests.decode_tokens": Measurement(float(decode_tokens), "tokens", PROV),
            "decode.itl_p50_s": Measurement(s.median, "s", PROV, summary=s),
        }
    )


def test_bundled_tokens_are_no_faster_decoding_the_engine_counts_tokens_not_requests():
    # Seen on a busy host: the starved client read each answer in one burst, so its per-request
    # time per token fell to 0 (-100%, "better") while vLLM's ITL histogram said 3.5 ms throughout.
    # The histogram holds one observation per token (24 requests x 30 tokens), not one per request.
    itl = _lognormal(720, 0.0035, 0.2, 1)
    base = _tpot_and_itl(_lognormal(24, 0.0035, 0.1, 2), itl, 720)
    cur = _tpot_and_itl([0.0] * 24, _lognormal(720, 0.0036, 0.2, 3), 720)
    o = compare_metric(MetricRule("requests.tpot_p50_s", "lower", 0.10), base, cur, SETTINGS)
    assert o.verdict == "inconclusive" and "itl: client mean 0" in o.detail, o
    # Where the client's requests cannot account for what the engine counted, others shared it: no cross-check.
    other = _tpot_and_itl([0.0] * 24, _lognormal(720, 0.0036, 0.2, 3), 100)
    assert (
        compare_metric(MetricRule("requests.tpot_p50_s", "lower", 0.10), base, other, SETTINGS).verdict == "improvement"
    )
