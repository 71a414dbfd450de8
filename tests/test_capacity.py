"""Capacity planning without a server: the simulator's arithmetic, the fit, the search, the plan.

The simulator and the fit are checked against each other: records are produced by simulating
a known model, and the fit must find that model again (the fitter is what is tested; the live
agreement with vLLM is tests/test_capacity_live.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_diagnose.diagnose.capacity import (
    EngineLimits,
    SimRequest,
    StepModel,
    at_rate,
    fit_step_model,
    plan_capacity,
    predict_goodput,
    replicas_needed,
    simulate,
)
from llm_diagnose.diagnose.capacity.fit import replay_error
from llm_diagnose.diagnose.capacity.measured import MeasuredGoodput, live_contradiction
from llm_diagnose.diagnose.capacity.plan import CapacityPlan
from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.report import capacity as report_capacity
from llm_diagnose.diagnose.tree.slo import SLO, Objective
from llm_diagnose.probes.experiments.goodput import GoodputPlan, RateSearch, Trial, plan_goodput
from llm_diagnose.probes.experiments.ramp import RampSearch
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.records import RequestRecord

MODEL = StepModel(fixed_s=0.002, per_seq_s=0.0005, per_prefill_token_s=2e-6, request_overhead_s=0.004)
LIMITS = EngineLimits(max_num_seqs=64, max_batched_tokens=2048, kv_capacity_tokens=None, block_size=16)


def _items(n: int, prompt: int = 256, out: int = 32, groups: int = 0) -> list[SimRequest]:
    items = []
    for i in range(n):
        blocks = tuple((i % groups, b) for b in range(prompt // 16 - 1)) if groups else ()
        items.append(SimRequest(0.0, prompt, out + (i * 7) % 17, blocks))
    return items


# --- the simulator ---------------------------------------------------------------------------
def test_one_request_alone_takes_front_end_then_prefill_then_decode_steps():
    [o] = simulate([SimRequest(1.0, 300, 5)], MODEL, LIMITS).outcomes
    prefill = MODEL.request_overhead_s + MODEL.step_s(1, 300)
    assert o.ttft_s == pytest.approx(prefill)
    assert o.gaps_s == pytest.approx([MODEL.step_s(1, 0)] * 4)
    assert o.e2e_s == pytest.approx(prefill + 4 * MODEL.step_s(1, 0))


def test_front_end_overhead_queues_and_its_latency_overlaps():
    model = replace(MODEL, request_overhead_s=0.001, request_latency_s=0.010)
    limits = EngineLimits(max_num_seqs=8, max_batched_tokens=16, block_size=16)  # one prompt per step
    a, b = simulate([SimRequest(0.0, 16, 1), SimRequest(0.0, 16, 1)], model, limits).outcomes
    assert a.ttft_s == pytest.approx(0.011 + model.step_s(1, 16))
    # b leaves the front end 1 ms after a (queued), not 11 ms after (the latency overlaps); it is
    # prefilled in the step after a's, which has started by then.
    assert b.ttft_s == pytest.approx(a.ttft_s + model.step_s(1, 16))


def test_chunked_prefill_spreads_a_long_prompt_over_steps():
    limits = EngineLimits(max_num_seqs=8, max_batched_tokens=100, block_size=16)
    [o] = simulate([SimRequest(0.0, 250, 2)], MODEL, limits).outcomes
    steps = MODEL.step_s(1, 100) * 2 + MODEL.step_s(1, 50)
    assert o.ttft_s == pytest.approx(MODEL.request_overhead_s + steps)


def test_max_num_seqs_one_serialises_requests():
    limits = EngineLimits(max_num_seqs=1, block_size=16)
    a, b = simulate([SimRequest(0.0, 16, 10), SimRequest(0.0, 16, 10)], MODEL, limits).outcomes
    assert b.ttft_s > a.e2e_s  # b waited for a to finish


def test_prefix_cache_serves_repeated_blocks_and_cuts_ttft():
    items = [SimRequest(i * 0.5, 512, 4, tuple(("p", j) for j in range(30))) for i in range(3)]
    off = simulate(items, MODEL, LIMITS).outcomes
    on = simulate(items, MODEL, EngineLimits(64, 2048, None, 16, prefix_caching=True)).outcomes
    assert [o.cached_tokens for o in off] == [0, 0, 0]
    assert [o.cached_tokens for o in on] == [0, 480, 480]
    assert on[1].ttft_s < off[1].ttft_s


def test_a_small_kv_cache_preempts_and_slows_the_batch():
    items = at_rate(_items(30, prompt=128, out=200), 50.0)
    roomy = simulate(items, MODEL, EngineLimits(64, 2048, None, 16))
    tight = simulate(items, MODEL, EngineLimits(64, 2048, 1024, 16))
    assert roomy.preemptions == 0 and tight.preemptions > 0
    assert max(tight.values()["e2e"]) > max(roomy.values()["e2e"])
    assert tight.unfinished == 0


# --- the fit -----------------------------------------------------------------------------------
def _records_from(result, t0: float = 100.0) -> list[RequestRecord]:
    """RequestRecords as a client would have written them for the simulated requests."""
    out = []
    for i, o in enumerate(result.outcomes):
        times = [o.ttft_s]
        for g in o.gaps_s:
            times.append(times[-1] + g)
        out.append(
            RequestRecord(
                request_id=f"sim-{i}",
                experiment="cal",
                phase="p",
                tag="",
                endpoint="completions",
                t_send=t0 + o.request.arrival_s,
                t_send_wall=0.0,
                event_times=tuple(times),
                t_end=times[-1],
                http_status=200,
                prompt_tokens=o.request.prompt_tokens,
                completion_tokens=o.request.output_tokens,
                finish_reason="length",
            )
        )
    return out


def _mixed(n: int) -> list[SimRequest]:
    return [SimRequest(0.0, 64 + (i * 37) % 900, 8 + (i * 13) % 40) for i in range(n)]


def test_fit_finds_the_model_that_produced_the_records():
    result = simulate(at_rate(_mixed(80), 60.0, seed=3), MODEL, LIMITS)
    records = _records_from(result)
    fitted = fit_step_model(records, LIMITS)
    assert replay_error(fitted, LIMITS, records) < 0.001  # about 3% rms log error: the same distributions
    # The latency it predicts at another rate is the true model's.
    probe = at_rate(_mixed(60), 30.0, seed=9)
    true_e2e = sorted(simulate(probe, MODEL, LIMITS).values()["e2e"])
    fit_e2e = sorted(simulate(probe, fitted, LIMITS).values()["e2e"])
    assert fit_e2e[len(fit_e2e) // 2] == pytest.approx(true_e2e[len(true_e2e) // 2], rel=0.1)


def test_one_level_slowed_by_the_host_does_not_drag_the_fit():
    # Five load levels from the true model; during one of them the "host" ran every request 5x
    # slower (as a shared 2-core machine did now and then). The fit must still predict the
    # true model's latency elsewhere, within the accuracy of an undisturbed fit.
    records: list[RequestRecord] = []
    for k, rate in enumerate((5.0, 10.0, 20.0, 40.0, 80.0)):
        level = _records_from(simulate(at_rate(_mixed(16), rate, seed=k), MODEL, LIMITS), t0=100.0 * (k + 1))
        slow = 5.0 if k == 2 else 1.0
        records += [
            replace(
                r, request_id=f"level{k}-{i}", event_times=tuple(t * slow for t in r.event_times), t_end=r.t_end * slow
            )
            for i, r in enumerate(level)
        ]
    fitted = fit_step_model(records, LIMITS)
    probe = at_rate(_mixed(60), 30.0, seed=9)
    true_e2e = sorted(simulate(probe, MODEL, LIMITS).values()["e2e"])
    fit_e2e = sorted(simulate(probe, fitted, LIMITS).values()["e2e"])
    assert fit_e2e[len(fit_e2e) // 2] == pytest.approx(true_e2e[len(true_e2e) // 2], rel=0.2), fitted.describe()


def test_fit_refuses_too_few_requests():
    records = _records_from(simulate(_items(3), MODEL, LIMITS))
    with pytest.raises(ValueError, match="completed requests"):
        fit_step_model(records, LIMITS)


# --- the search ----------------------------------------------------------------------------------
@given(threshold=st.floats(0.5, 200.0), steps=st.integers(0, 8), retry=st.booleans())
def test_rate_search_brackets_a_monotone_threshold(threshold, steps, retry):
    search = RateSearch(1.0, 100.0, steps, retry_broken_low=retry)
    while (rate := search.next_rate()) is not None:
        search.record(Trial(rate, rate <= threshold))
    assert len(search.trials) <= 2 + steps + (retry and threshold < 1.0)
    if threshold < 1.0:
        assert search.bound == "below-range"
    elif threshold >= 100.0:
        assert search.bound == "at-least"
    else:
        assert search.goodput_rps <= threshold < search.broken_at_rps


def test_a_broken_low_end_is_tried_again_and_one_stall_does_not_end_the_search():
    stalled_once = RateSearch(1.0, 100.0, 3, retry_broken_low=True)
    verdicts = {1.0: [False, True], 100.0: [False]}  # the first trial at the low end met a host stall
    while (rate := stalled_once.next_rate()) is not None:
        stalled_once.record(Trial(rate, verdicts[rate].pop(0) if rate in verdicts else rate <= 20.0))
    assert [t.rate_rps for t in stalled_once.trials][:3] == [1.0, 1.0, 100.0] and len(stalled_once.trials) == 6
    assert stalled_once.bound == "bracketed" and stalled_once.goodput_rps <= 20.0 < stalled_once.broken_at_rps

    broken_twice = RateSearch(1.0, 100.0, 3, retry_broken_low=True)
    while (rate := broken_twice.next_rate()) is not None:
        broken_twice.record(Trial(rate, False))
    assert len(broken_twice.trials) == 2 and broken_twice.bound == "below-range"


def test_a_trial_broken_while_the_client_stalled_is_tried_again_once():
    # CI: bursts read whole-answer-at-once after 1.1-3.7 s while the client's loop stalled 0.8-2.4 s.
    search = RateSearch(1.0, 100.0, 3, retry_broken_low=True, retry_stalled=1)
    first = {100.0: [Trial(100.0, False)], 10.0: [Trial(10.0, False, client_stalled=True), Trial(10.0, True)]}
    while (rate := search.next_rate()) is not None:
        trials = first.get(round(rate, 6))
        search.record(trials.pop(0) if trials else Trial(rate, rate <= 20.0, client_stalled=True))
    rates = [round(t.rate_rps, 6) for t in search.trials]
    assert rates.count(10.0) == 2, rates  # broken in a stall, then held
    # Only once per search: every later break ran in a stall too, and none was tried again.
    assert sum(rates.count(r) > 1 for r in set(rates) if r != 1.0) == 1, rates
    assert search.bound == "bracketed" and search.goodput_rps <= 20.0 < search.broken_at_rps
    # A break without a stall is the server's: not tried again.
    plain = RateSearch(1.0, 100.0, 3, retry_broken_low=True, retry_stalled=1)
    while (rate := plain.next_rate()) is not None:
        plain.record(Trial(rate, rate <= 20.0))
    assert len({t.rate_rps for t in plain.trials}) == len(plain.trials)
    # The offline prediction never retries (no client).
    assert RateSearch(1.0, 100.0, 3).retry_stalled == 0


def test_goodput_plan_fits_the_budget_and_says_what_it_sends():
    # 60 requests hold 3 trials of 20: both ends and the low end's second try, no bisection step
    plan = plan_goodput(ActiveBudget(max_requests=60, max_seconds=100), 2.0, 20.0, requests=20, steps=5)
    assert plan.max_requests <= 60 and plan.steps == 0
    assert "at most 60 requests" in plan.describe()
    with pytest.raises(ValueError, match="needs at least"):
        plan_goodput(ActiveBudget(max_requests=5, max_seconds=100), 2.0, 20.0)
    with pytest.raises(ValueError):
        GoodputPlan(5.0, 2.0)


def test_predicted_goodput_is_where_the_slo_starts_to_break():
    slo = SLO((Objective("e2e", 50, 0.2),), True)
    items = _items(40)
    p = predict_goodput(items, MODEL, LIMITS, slo, low_rps=1, high_rps=1000, steps=12)
    assert p.search.bound == "bracketed"
    below = simulate(at_rate(items, p.goodput_rps), MODEL, LIMITS).values()
    above = simulate(at_rate(items, p.search.broken_at_rps), MODEL, LIMITS).values()
    assert slo.met_by(below) is True and slo.met_by(above) is False


# --- the plan --------------------------------------------------------------------------------------
SLO_TTFT = SLO((Objective("ttft", 90, 0.05),), True)


@settings(max_examples=25, deadline=None)
@given(target=st.floats(0.1, 500.0), factor=st.floats(1.0, 5.0))
def test_replicas_grow_with_the_target_rate_and_cover_it(target, factor):
    g = 7.3
    a, b = replicas_needed(target, g), replicas_needed(target * factor, g)
    assert a <= b
    assert a * g >= target - 1e-9 and (a - 1) * g < target
    assert b <= math.ceil(factor * a)  # k times the rate never needs more than k times the replicas


_PLAN_ITEMS = _items(30, prompt=512, out=16, groups=3)


@settings(max_examples=8, deadline=None)
@given(target=st.floats(1.0, 300.0))
def test_plan_is_monotone_in_the_target_rate(target):
    low = plan_capacity(_PLAN_ITEMS, MODEL, LIMITS, SLO_TTFT, target, tensor_parallel=2, techniques=("prefix-caching",))
    high = plan_capacity(
        _PLAN_ITEMS, MODEL, LIMITS, SLO_TTFT, target * 2, tensor_parallel=2, techniques=("prefix-caching",)
    )
    for s_low, s_high in zip(low.scenarios, high.scenarios):
        assert s_low.goodput_rps == s_high.goodput_rps  # per-replica goodput does not depend on the target
        assert s_low.replicas <= s_high.replicas <= 2 * s_low.replicas
        assert s_high.gpus == 2 * s_high.replicas


def test_plan_projects_prefix_caching_and_kv_quantization_with_their_assumptions():
    limits = EngineLimits(64, 2048, 8192, 16, prefix_caching=False, source="test")
    items = _items(40, prompt=1024, out=64, groups=2)
    plan = plan_capacity(
        items, MODEL, limits, SLO_TTFT, 50.0, techniques=("prefix-caching", "quantization", "speculative-decoding")
    )
    by = {s.name: s for s in plan.scenarios}
    assert set(by) == {"today", "prefix-caching", "kv-quantization"}
    assert by["prefix-caching"].goodput_rps > by["today"].goodput_rps  # shared 1 KiB prefixes, prefill-heavy
    assert by["kv-quantization"].goodput_rps >= by["today"].goodput_rps
    assert "16384" in by["kv-quantization"].assumption.replace(",", "")
    assert any("speculative-decoding" in n and "not projected" in n for n in plan.notes)
    json.dumps(plan.to_dict(), allow_nan=False)


def _ramped(threshold: float, max_rps: float = 100.0, steps: int = 4) -> RampSearch:
    """The ramp from 1/s (doubling, then bisection) against a server that holds the SLO up to `threshold`."""
    search = RampSearch(1.0, steps, max_rps=max_rps)
    while (rate := search.next_rate()) is not None:
        search.record(Trial(rate, rate <= threshold, 24, f"at {rate:g}/s"))
    return search


def _plan_beside(live_threshold: float) -> CapacityPlan:
    """A plan whose live ramp found its edge at live_threshold, where the model's ramp found ~10/s."""
    limits = EngineLimits(64, 2048, 8192, 16, prefix_caching=False, source="test")
    items = _items(40, prompt=1024, out=64, groups=2)
    # The ramp's cap (the engine's ceiling for these requests is ~48/s: KV capacity) at 40/s.
    measured = MeasuredGoodput(_ramped(live_threshold, 40.0), _ramped(10.0), requests=40, start_source="test")
    return plan_capacity(items, MODEL, limits, SLO_TTFT, 50.0, techniques=("prefix-caching",), measured=measured)


def test_with_a_live_search_the_headline_is_measured_and_close_models_still_project():
    # Changed with issue 24: the headline with --active is the measured goodput (before, the
    # model's, unless the live search contradicted it at an end of a bracket centred on the model).
    plan = _plan_beside(25.0)  # 2.5x the model: within DISAGREEMENT_FACTOR, an error the user sees beside it
    assert live_contradiction(plan.measured) is None
    assert {s.name for s in plan.scenarios} == {"today", "prefix-caching"}
    today = plan.today
    assert today.source == "measured" and today.goodput_rps == plan.measured.search.goodput_rps
    assert "measured live" in today.assumption
    assert plan.scenarios[1].source == "model"


@pytest.mark.parametrize(
    ("live_threshold", "expect_bound", "words"),
    [(1000.0, "at-least", "too low"), (0.3, "bracketed", "too high"), (0.05, "below-range", "below")],
)
def test_a_live_search_far_from_the_model_withholds_its_projections(live_threshold, expect_bound, words):
    # CI: the model said 9.2/s from a calibration with a slow moment; the server met the SLO at
    # 92/s. The plan had said 11 replicas for 100/s, from the model.
    plan = _plan_beside(live_threshold)
    why = live_contradiction(plan.measured)
    assert why is not None and words in why, why
    assert [s.name for s in plan.scenarios] == ["today"]  # no projection from a model that far off
    today = plan.today
    assert today.bound == expect_bound and "measured live" in today.assumption
    if expect_bound == "at-least":
        assert today.goodput_rps == 40.0 and today.replicas == 2  # an upper bound, and it says so
        assert "upper bound" in today.assumption
    elif expect_bound == "below-range":
        assert today.goodput_rps is None and today.replicas is None  # no rate held: no replica count
    assert any("contradicts the model" in n and "To settle it" in n for n in plan.notes)
    json.dumps(plan.to_dict(), allow_nan=False)


def test_only_a_real_disagreement_contradicts_the_model():
    model = _ramped(10.0)
    # Stopped before the first trial: nothing measured, nothing contradicted.
    assert live_contradiction(MeasuredGoodput(RampSearch(1.0, 4), model)) is None
    # The budget stopped the ramp after it held at 1 and 2/s: "at least 2/s" is below the model's
    # 10/s, but only a lower bound, so no contradiction.
    stopped = RampSearch(1.0, 4)
    stopped.record(Trial(1.0, True, 24))
    stopped.record(Trial(2.0, True, 24))
    assert stopped.bound == "at-least" and live_contradiction(MeasuredGoodput(stopped, model)) is None
    # Both found no rate: they agree.
    assert live_contradiction(MeasuredGoodput(_ramped(0.01), _ramped(0.01))) is None
    # Within the factor either way.
    assert live_contradiction(MeasuredGoodput(_ramped(4.0), model)) is None
    assert live_contradiction(MeasuredGoodput(_ramped(25.0), model)) is None
    why = live_contradiction(MeasuredGoodput(_ramped(50.0), model))
    assert why is not None and "too low" in why, why


def test_plan_needs_a_latency_slo():
    with pytest.raises(ValueError, match="latency objective"):
        plan_capacity(_PLAN_ITEMS, MODEL, LIMITS, SLO(interactive=True), 10.0)


def test_report_sections_escape_and_draw_the_plan():
    plan = plan_capacity(_PLAN_ITEMS, MODEL, LIMITS, SLO_TTFT, 40.0, workload="<script>x</script>")
    data = plan.to_dict()
    html = report_capacity.html_section(data)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in html and "target 40/s" in html
    md = "\n".join(report_capacity.markdown_lines(data))
    assert "| today |" in md and "<script>" not in md
    assert "today" in report_capacity.console_text(data)


def test_every_report_format_carries_the_plan_of_its_run_folder(tmp_path, capsys):
    from llm_diagnose.diagnose.report.capacity import PLAN_FILE
    from tests.evidence_builders import build

    (tmp_path / "evidence.json").write_text(build().to_json())
    plan = plan_capacity(_PLAN_ITEMS, MODEL, LIMITS, SLO_TTFT, 40.0, workload="w.jsonl")
    (tmp_path / PLAN_FILE).write_text(json.dumps(plan.to_dict()))
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity_plan"]["target_rps"] == 40.0 and doc["capacity_plan"]["scenarios"][0]["name"] == "today"
    assert main(["report", str(tmp_path), "--format", "md"]) == 0
    assert "| today |" in capsys.readouterr().out
    (tmp_path / PLAN_FILE).unlink()
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    assert "capacity_plan" not in json.loads(capsys.readouterr().out)


def test_cli_plan_without_slo_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    code = main(["plan", "--evidence", str(tmp_path), "--trace", str(tmp_path / "t.jsonl"), "--target-rps", "5"])
    assert code == 2
    assert "needs a latency SLO" in capsys.readouterr().err


def test_validation_states_zero_error_for_the_true_model_and_more_for_a_wrong_one():
    from llm_diagnose.diagnose.capacity import validate_model

    records = _records_from(simulate(at_rate(_mixed(40), 40.0, seed=5), MODEL, LIMITS))
    exact = validate_model(MODEL, LIMITS, {"trial": records})
    assert exact.max_abs_error == pytest.approx(0.0, abs=1e-9)
    slow = StepModel(MODEL.fixed_s * 2, MODEL.per_seq_s * 2, MODEL.per_prefill_token_s * 2, MODEL.request_overhead_s)
    wrong = validate_model(slow, LIMITS, {"trial": records})
    assert min(wrong.by_statistic().values()) > 0.3  # every statistic is off when every step is twice as long
    json.dumps(wrong.to_dict(), allow_nan=False)
