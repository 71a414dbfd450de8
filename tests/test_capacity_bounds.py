"""Capacity plans that hold on a real server, without one: the engine's ceiling, the fitted range and
extrapolation, the ramp search, and the error stated where the plan runs.

The "server" here is the simulator driven by a known true model, and the plan's model is a wrong
one (the per-sequence cost fitted to zero on a few sequences, as on the slow vLLM CPU server of
issue 24): a real server's true costs cannot be chosen, and what is tested is what the plan does
with a model that is wrong beyond its range, not the fit.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_diagnose.diagnose.capacity import (
    EngineLimits,
    SimRequest,
    StepModel,
    at_rate,
    engine_ceiling,
    plan_capacity,
    predict_bounded,
    predict_goodput,
    simulate,
)
from llm_diagnose.diagnose.capacity.goodput import items_from_trace, predict_ramp, text_tokens
from llm_diagnose.diagnose.capacity.measured import MeasuredGoodput, live_contradiction
from llm_diagnose.diagnose.capacity.model import FittedRange, fitted_range
from llm_diagnose.diagnose.capacity.regime import OperatingPoint, hidden_per_seq_s, judge_regime
from llm_diagnose.diagnose.capacity.validate import validate_model
from llm_diagnose.diagnose.report import capacity as report_capacity
from llm_diagnose.diagnose.tree.slo import SLO, Objective
from llm_diagnose.probes.experiments.goodput import Trial
from llm_diagnose.probes.experiments.ramp import MAX_RAMP_DOWN, RESOLUTION, RampPlan, RampSearch, plan_ramp
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.traces.records import TraceRequest
from tests.test_capacity import _records_from

# The slow server of issue 24, as a model: 24.5 ms a step at batch 1, a few ms more a sequence,
# 200-token prompts, 64 tokens out; SLO ttft p90 1 s, itl p50 60 ms.
TRUE = StepModel(0.0245, 0.0015, 2e-5, 0.001, request_latency_s=0.002)
# What a run of at most 8 sequences fitted: batching free.
FITTED = replace(TRUE, per_seq_s=0.0, fitted_range=FittedRange(8, 400, 2.0))
LIMITS = EngineLimits(256, 2048, None, 16, source="test")
SLO_ISSUE = SLO((Objective("ttft", 90, 1.0), Objective("itl", 50, 0.060)), True)
ITEMS = [SimRequest(0.0, 200, 64) for _ in range(60)]


def _true_goodput(items, model=TRUE, limits=LIMITS, slo=SLO_ISSUE) -> float:
    return predict_goodput(items, model, limits, slo, low_rps=0.01, high_rps=2000, steps=20).goodput_rps


# --- (a) the engine's ceiling ---------------------------------------------------------------------
def test_the_ceiling_is_the_issues_arithmetic():
    # 256 sequences, each held for 64 steps of at least 24.5 + 1.5 ms: 256 / (64 x 26 ms) = 154/s.
    c = engine_ceiling(ITEMS, TRUE, LIMITS)
    assert c.binding == "sequences" and c.rps == pytest.approx(256 / (64 * 0.026))
    by = {name: rps for name, rps, _ in c.bounds}
    assert by["batched tokens"] == pytest.approx(2048 / (263 * 0.026))  # 200 + 64 - 1 tokens a request
    assert "KV capacity" not in by  # unknown capacity: no bound claimed
    # A KV cache of 4,096 tokens: 256 blocks of 16; a request holds sum(ceil(j / 16), j = 200..263) block-steps.
    small = engine_ceiling(ITEMS, TRUE, replace(LIMITS, kv_capacity_tokens=4096))
    held = sum(math.ceil(j / 16) for j in range(200, 264))
    assert small.binding == "KV capacity" and small.rps == pytest.approx(256 / (held * 0.026))
    assert "4,096 KV tokens" in small.describe()


def test_shared_prefix_blocks_raise_the_ceiling_only_with_prefix_caching():
    shared = [SimRequest(0.0, 512, 16, tuple(("p", b) for b in range(31))) for _ in range(10)]
    off = engine_ceiling(shared, TRUE, replace(LIMITS, kv_capacity_tokens=8192))
    on = engine_ceiling(shared, TRUE, replace(LIMITS, kv_capacity_tokens=8192, prefix_caching=True))
    assert on.rps > off.rps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fixed=st.floats(1e-4, 0.05),
    per_seq=st.floats(0.0, 0.01),
    per_token=st.floats(0.0, 1e-4),
    seqs=st.integers(1, 64),
    budget=st.integers(16, 4096),
    kv=st.one_of(st.none(), st.integers(4096, 40_000)),
    lengths=st.lists(st.tuples(st.integers(1, 2000), st.integers(1, 120)), min_size=5, max_size=40),
)
def test_no_burst_through_the_simulator_passes_the_ceiling(fixed, per_seq, per_token, seqs, budget, kv, lengths):
    # All requests at once: the fastest the engine can possibly serve them. Requests / makespan
    # never passes the ceiling, whatever the model and the limits.
    model = StepModel(fixed, per_seq, per_token)
    limits = EngineLimits(seqs, budget, kv, 16)
    items = [SimRequest(0.0, p, o) for p, o in lengths]
    result = simulate(items, model, limits)
    if result.unfinished:
        return  # a request larger than the whole cache never runs: no throughput to bound
    makespan = max(o.e2e_s for o in result.outcomes)
    assert len(items) / makespan <= engine_ceiling(items, model, limits).rps * (1 + 1e-9)


def test_a_prediction_above_the_ceiling_is_clipped_and_marked():
    # 1-token prompts: a burst of 60 meets the SLO at any rate in a model with batching free
    # (given by hand: no fitted range, so no band; the ceiling alone bounds it).
    free = replace(FITTED, fitted_range=None)
    short = [SimRequest(0.0, 1, 64) for _ in range(60)]
    g = predict_bounded(short, free, LIMITS, SLO_ISSUE, error=0.25, low_rps=0.01, high_rps=2000, steps=16)
    ceiling = engine_ceiling(short, free, LIMITS)
    assert g.clipped and g.bound == "ceiling" and g.goodput_rps == pytest.approx(ceiling.rps)
    assert max(t.rate_rps for t in g.search.trials) <= ceiling.rps  # the search never looked past it
    plan = plan_capacity(short, free, LIMITS, SLO_ISSUE, 1000.0)
    today = plan.to_dict()["scenarios"][0]
    assert today["clipped_to_ceiling"] and today["goodput_per_replica_rps"] <= today["ceiling_rps"] * (1 + 1e-12)
    assert "the engine's ceiling" in report_capacity.console_text(plan.to_dict())


# --- (b) the fitted range and extrapolation ---------------------------------------------------------
def test_the_fit_records_the_range_it_was_fitted_on():
    records = []
    for k, (rate, n) in enumerate(((2.0, 8), (8.0, 12))):
        level = _records_from(simulate(at_rate(ITEMS[:n], rate, seed=k), TRUE, LIMITS), t0=100.0 * (k + 1))
        records += [replace(r, request_id=f"level{k}-{i}") for i, r in enumerate(level)]
    fr = fitted_range(records)
    assert 1 < fr.max_sequences <= 12
    assert fr.max_step_tokens >= 200  # at least one prompt's prefill in a step
    # The faster level completed its requests at a higher rate than the slower one sent them.
    assert fr.max_rate_rps > 2.0
    assert "sequences" in fr.describe()


def test_beyond_the_fitted_range_is_an_extrapolation_with_a_wider_band():
    within = judge_regime(FITTED, OperatingPoint(1.0, 6, 300), 0.25)
    assert not within.extrapolated and within.pessimistic is None
    beyond = judge_regime(FITTED, OperatingPoint(4.0, 40, 300), 0.25)
    assert beyond.extrapolated and any("40 sequences" in b for b in beyond.beyond)
    # A zero per-sequence cost from 1-8 sequences is not trusted: the band's low end prices each
    # sequence at what 25% of a step hides over 7 more sequences.
    hidden = hidden_per_seq_s(FITTED, 8, 0.25)
    assert hidden == pytest.approx(0.0245 * 0.25 / 7)
    assert beyond.pessimistic.per_seq_s == pytest.approx(hidden)
    assert "not known to be free" in beyond.per_seq_note
    # A model given by hand (no fitted range) is not judged.
    assert not judge_regime(TRUE, OperatingPoint(4.0, 40, 300), 0.25).extrapolated


def test_the_issues_plan_is_marked_extrapolated_and_its_band_reaches_down_toward_the_truth():
    # Prefill nearly free here, so the per-sequence cost is what sets the goodput: the case where a
    # model fitted on 8 sequences is most wrong.
    short = [SimRequest(0.0, 20, 64) for _ in range(60)]
    truth = _true_goodput(short)
    plan = plan_capacity(short, FITTED, LIMITS, SLO_ISSUE, 40.0)
    today = plan.today
    assert today.extrapolation and today.per_seq_note
    # The fitted model (batching free) says 17x the truth; its zero per-sequence cost is not
    # trusted beyond 8 sequences, so the plan takes the band's low end, far nearer the truth.
    assert today.goodput_high_rps > 10 * truth
    assert today.goodput_rps == today.goodput_low_rps < today.goodput_high_rps / 5
    assert truth < today.goodput_rps < 3 * truth
    assert today.replicas == today.replicas_at_low
    assert today.goodput_high_rps <= engine_ceiling(short, FITTED, LIMITS).rps
    data = plan.to_dict()
    json.dumps(data, allow_nan=False)
    text = report_capacity.console_text(data)
    assert "extrapolated" in text and "model fitted on: 1-8 sequences" in text


def test_a_plan_within_the_fitted_range_is_not_marked():
    wide = replace(TRUE, fitted_range=FittedRange(256, 100_000, 1000.0))
    plan = plan_capacity(ITEMS, wide, LIMITS, SLO_ISSUE, 10.0)
    assert not plan.today.extrapolation and plan.today.goodput_low_rps is None


def test_text_prompts_are_counted_not_taken_as_one_token():
    words = " ".join(["alpha"] * 200)
    [item] = items_from_trace([TraceRequest(line=1, text=words, output_tokens=64)], 16)
    assert 150 <= item.prompt_tokens <= 250 and item.blocks  # keyed too: prefix caching can be projected
    assert text_tokens([TraceRequest(line=1, text=words), TraceRequest(line=2, input_tokens=5)]) == 1
    [stated] = items_from_trace([TraceRequest(line=1, text=words, input_tokens=7, output_tokens=4)], 16)
    assert stated.prompt_tokens == 7  # a stated length wins


# --- (d) the error where the plan runs --------------------------------------------------------------
def test_validation_says_whether_it_reached_the_plans_regime():
    low = _records_from(simulate(at_rate(ITEMS[:10], 0.5, seed=1), TRUE, LIMITS))
    v = validate_model(FITTED, LIMITS, {"light": low})
    most = max(c.sequences for c in v.comparisons)
    assert "not validated at the plan's regime" in v.describe_at(10 * most)
    assert v.describe_at(most).startswith("at the plan's regime")
    assert v.at_regime(10 * most).comparisons == ()


# --- (c) the ramp ------------------------------------------------------------------------------------
def _walk(search: RampSearch, goodput: float) -> RampSearch:
    while (rate := search.next_rate()) is not None:
        search.record(Trial(rate, rate <= goodput, 10))
    return search


@given(goodput=st.floats(0.05, 5000.0), start=st.floats(0.5, 50.0), steps=st.integers(0, 6))
def test_the_ramp_brackets_any_goodput_it_can_reach(goodput, start, steps):
    search = _walk(RampSearch(start, steps, max_rps=1000.0), goodput)
    if goodput < search.min_rps:
        assert search.bound == "below-range" and min(t.rate_rps for t in search.trials) >= search.min_rps * 0.999
    elif goodput >= 1000.0:
        assert search.bound == "at-least" and search.goodput_rps == 1000.0  # never above max_rps
    else:
        assert search.bound == "bracketed" and search.goodput_rps <= goodput < search.broken_at_rps
        # Doubling then bisection: each step takes the square root of the bracket's ratio, down to RESOLUTION.
        assert search.broken_at_rps / search.goodput_rps <= max(2.0 ** (0.5**steps), RESOLUTION) * (1 + 1e-9)
    assert max(t.rate_rps for t in search.trials) <= 1000.0


def test_the_ramp_starts_where_told_doubles_and_bisects():
    search = _walk(RampSearch(1.0, 2), 5.0)
    five_six = math.sqrt(4 * 8)  # broke too (above 5): the next is between 4 and it
    assert [t.rate_rps for t in search.trials] == pytest.approx([1.0, 2.0, 4.0, 8.0, five_six, math.sqrt(4 * five_six)])
    # A start that breaks twice goes down, MAX_RAMP_DOWN times at most.
    down = _walk(RampSearch(8.0, 2, retry_broken_low=True), 1.5)
    assert [t.rate_rps for t in down.trials][:5] == [8.0, 8.0, 4.0, 2.0, 1.0]  # 1 = 8 / 2^MAX_RAMP_DOWN held
    assert down.bound == "bracketed" and down.goodput_rps <= 1.5 < down.broken_at_rps <= 2.0
    below = _walk(RampSearch(8.0, 2, retry_broken_low=True), 0.9)
    assert below.bound == "below-range" and min(t.rate_rps for t in below.trials) == 8.0 / 2**MAX_RAMP_DOWN
    # max_trials caps the search (the budget's share).
    assert len(_walk(RampSearch(1.0, 5, max_trials=3), 100.0).trials) == 3


def test_a_wild_prediction_does_not_move_the_live_search():
    # Issue 24: the model said 250/s, the server held about 4/s. The ramp from what the evidence met
    # finds the server's goodput; the model, walking the same rule, disagrees and says so.
    truth = _true_goodput(ITEMS)
    plan = RampPlan(1.0, steps=3, requests=60, max_rps=engine_ceiling(ITEMS, FITTED, LIMITS).rps, max_trials=12)
    live = predict_ramp(ITEMS, TRUE, LIMITS, SLO_ISSUE, plan)  # the "server"
    assert live.bound == "bracketed" and live.goodput_rps <= truth * 1.001 and truth / live.goodput_rps < 1.5
    wild = replace(FITTED, per_prefill_token_s=0.0)
    model = predict_ramp(ITEMS, wild, LIMITS, SLO_ISSUE, plan)
    assert model.goodput_rps > 3 * live.goodput_rps
    measured = MeasuredGoodput(live, model, None, None, None, 60, "test")
    why = live_contradiction(measured)
    assert why is not None and "too high" in why
    p = plan_capacity(ITEMS, wild, LIMITS, SLO_ISSUE, 40.0, measured=measured, techniques=("quantization",))
    assert p.today.source == "measured" and p.today.goodput_rps == live.goodput_rps  # the headline is measured
    assert [s.name for s in p.scenarios] == ["today"]  # no projection from a model that far off
    json.dumps(p.to_dict(), allow_nan=False)


def test_a_measured_goodput_above_the_ceiling_is_clipped():
    held = RampSearch(1.0, 0)
    held.record(Trial(1000.0, True, 10))
    ceiling = engine_ceiling(ITEMS, TRUE, LIMITS).rps
    p = plan_capacity(ITEMS, TRUE, LIMITS, SLO_ISSUE, 40.0, measured=MeasuredGoodput(held, None, requests=60))
    assert p.today.clipped and p.today.goodput_rps == pytest.approx(ceiling) and p.today.bound == "ceiling"


def test_the_ramp_plan_fits_the_budget_and_says_what_it_sends():
    plan = plan_ramp(ActiveBudget(150, 90), 2.0, requests=40, steps=3, max_rps=50.0, start_source="the evidence")
    assert plan.max_trials == 150 // plan.requests and plan.max_rps == 50.0
    text = plan.describe()
    assert "from 2 requests/s (the evidence)" in text and "never above 50/s" in text
    # --max-rps below the start: the start is the cap.
    assert plan_ramp(ActiveBudget(150, 90, max_rps=1.0), 2.0).start_rps == 1.0
    with pytest.raises(ValueError, match="needs at least"):
        plan_ramp(ActiveBudget(10, 90), 2.0)
    with pytest.raises(ValueError, match="needs at least"):
        plan_ramp(ActiveBudget(150, 5), 0.1)  # two trials of 8 at 0.1/s take minutes


# --- the command: a plan from evidence of a few sequences -------------------------------------------
def test_plan_from_low_concurrency_evidence_states_its_ceiling_range_and_error_where_it_runs(tmp_path, capsys):
    from llm_diagnose.diagnose.cli import main
    from llm_diagnose.probes.load.records import JsonlWriter
    from tests.evidence_builders import build

    (tmp_path / "evidence.json").write_text(
        build({"engine.name": "vllm", "config.max_num_seqs": 256, "config.max_num_batched_tokens": 1024}).to_json()
    )
    # The default active run's shape: one at a time, then 2, 4 and 8 streams together (the server is TRUE).
    records = []
    for k, (n, together) in enumerate(((6, 1), (4, 2), (8, 4), (16, 8))):
        arrivals = [SimRequest((i // together) * 0.6, 200, 16) for i in range(n)]
        level = _records_from(simulate(arrivals, TRUE, LIMITS), t0=50.0 * (k + 1))
        records += [replace(r, request_id=f"decode-c{together}-{i}") for i, r in enumerate(level)]
    with JsonlWriter(tmp_path / "requests.jsonl") as writer:
        for r in records:
            writer.write(r.to_dict())
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i, "input_length": 200, "output_length": 64, "hash_ids": [i]}) + "\n"
            for i in range(30)
        )
    )
    code = main(
        ["plan", "--evidence", str(tmp_path), "--trace", str(trace), "--target-rps", "40", "--slo", "itl:p50:60ms"]
        + ["--slo", "ttft:p90:1s", "--json"]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    plan = json.loads(out.out)
    assert plan["limits"]["max_batched_tokens"] == 1024  # the server's config, not the default
    fitted = plan["model"]["fitted_range"]
    assert fitted["max_sequences"] <= 8
    today = plan["scenarios"][0]
    assert today["ceiling_rps"] and today["goodput_per_replica_rps"] <= today["ceiling_rps"]
    # A burst of 30 requests at the goodput runs ~30 sequences together: beyond the 8 fitted, and
    # beyond what any held-back level showed, so the error there is said to be unknown.
    assert today["operating_point"]["sequences"] > fitted["max_sequences"]
    assert any("sequences in a step" in why for why in today["extrapolation"])
    assert today["goodput_low_rps"] <= today["goodput_per_replica_rps"] <= today["goodput_high_rps"]
    assert "not validated at the plan's regime" in plan["model_error_at_plan"]
    text = report_capacity.console_text(plan)
    assert "engine ceiling" in text and "model fitted on: 1-" in text
