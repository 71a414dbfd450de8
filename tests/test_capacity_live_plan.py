"""Planning `plan --active`'s live goodput search (llm_diagnose.diagnose.capacity.live), which sends nothing,
and the ramp's trials run through `run_goodput_search` with a stand-in driver.

The search itself runs against a real vLLM in tests/test_capacity_live.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from llm_diagnose.diagnose.capacity import SimRequest, at_rate, engine_ceiling, live, simulate
from llm_diagnose.diagnose.capacity.goodput import slo_judge, values_from_records
from llm_diagnose.diagnose.capacity.live import (
    DEFAULT_START_RPS,
    LIGHT_LOAD,
    _fit_at_rate,
    measured_items,
    plan_live_search,
)
from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.tree.slo import SLO, Objective
from llm_diagnose.probes.experiments.goodput import GoodputSearch, Trial, run_goodput_search
from llm_diagnose.probes.experiments.ramp import RampPlan, RampSearch
from llm_diagnose.probes.load.budget import ActiveBudget, BudgetGuard
from llm_diagnose.probes.load.health import ClientHealth
from llm_diagnose.probes.load.records import JsonlWriter, RequestSpec
from llm_diagnose.probes.load.workloads import Workload
from llm_diagnose.probes.traces.records import TraceRequest
from tests.evidence_builders import build
from tests.test_capacity import LIMITS, MODEL, _items, _records_from
from tests.test_capacity_bounds import LIMITS as SERVER_LIMITS
from tests.test_capacity_bounds import TRUE
from tests.test_starved_repeat import _SearchDriver

SLO_E2E = SLO((Objective("e2e", 50, 0.2),), True)
TRACE = tuple(TraceRequest(line=i + 1, input_tokens=256, output_tokens=32) for i in range(30))
ITEMS = _items(30)


def plan(model=MODEL, budget=ActiveBudget(150, 90), records=(), **kw):
    args = {"trial_requests": 40, "steps": 3, "factor": 2.0, **kw}
    return plan_live_search(TRACE, ITEMS, LIMITS, SLO_E2E, model, budget, records=records, **args)


def _level(rate: float, n: int, name: str, t0: float) -> list:
    records = _records_from(simulate(at_rate(ITEMS[:n], rate, seed=1), MODEL, LIMITS), t0=t0)
    return [replace(r, request_id=f"{name}-{i}") for i, r in enumerate(records)]


def _rate(records) -> float:
    return len(records) / (max(r.t_send + r.e2e_s for r in records) - min(r.t_send for r in records))


def test_the_search_starts_at_the_highest_rate_the_evidence_met_the_slo_at():
    held = _level(20.0, 30, "held", 100.0)  # Poisson at 20/s: e2e well under the SLO (the trial's requests)
    burst = _level(2000.0, 30, "burst", 200.0)  # all at once: the queue breaks the SLO
    assert SLO_E2E.met_by(values_from_records(held)) and not SLO_E2E.met_by(values_from_records(burst))
    assert _rate(burst) > _rate(held)  # the broken level completed faster: it must not be the start
    search = plan(records=held + burst)
    assert search.goodput.start_rps == pytest.approx(_rate(held))
    assert "'cal/p/held' met the SLO" in search.goodput.start_source


def test_without_evidence_the_search_starts_at_a_light_rate_and_says_so():
    [alone] = simulate([ITEMS[0]], MODEL, LIMITS).outcomes  # every item is 256 tokens in, ~40 out
    search = plan()
    mean_out = round(sum(it.output_tokens for it in ITEMS) / len(ITEMS))
    [mean_alone] = simulate([replace(ITEMS[0], output_tokens=mean_out)], MODEL, LIMITS).outcomes
    assert search.goodput.start_rps == pytest.approx(LIGHT_LOAD / mean_alone.e2e_s)
    assert alone.e2e_s > 0 and "a light rate" in search.goodput.start_source
    nothing = plan(model=None)
    assert nothing.goodput.start_rps == DEFAULT_START_RPS and nothing.goodput.max_rps is None


def test_the_search_never_goes_above_the_engine_ceiling_and_says_so():
    search = plan()
    ceiling = engine_ceiling(ITEMS[: search.goodput.requests], MODEL, LIMITS)
    assert search.goodput.max_rps == pytest.approx(ceiling.rps)
    assert any("never goes above the engine's ceiling" in n for n in search.notes)
    assert (
        search.goodput.workload
        == f"the trace's first {search.goodput.requests} requests, behind a salt of each trial's own"
    )


def test_the_search_leaves_post_tokenize_its_slot_of_the_budget():
    # 80 requests hold 4 trials of 20; less the slot of POST /tokenize, 79 hold 4 trials of 19.
    search = plan(budget=ActiveBudget(80, 600), trial_requests=20)
    assert (search.goodput.requests, search.goodput.max_trials) == (19, 4)


def test_a_start_too_slow_for_the_budgets_time_is_raised_and_said():
    slow = replace(MODEL, fixed_s=0.5)  # a request alone takes ~20 s: the light rate ~0.025/s
    search = plan(model=slow, budget=ActiveBudget(150, 90))
    assert any("would not fit the budget's time" in n for n in search.notes)
    g = search.goodput
    assert g.trial_cap_s(g.start_rps) + g.trial_cap_s(g.start_rps * g.factor) <= 90


def test_what_will_be_sent_is_said_first():
    text = plan().describe("http://127.0.0.1:8000")
    assert text.startswith(
        "Active goodput search will send streaming POST /v1/completions requests to http://127.0.0.1"
    )
    assert "at most 150 requests within 90 s - a hard bound" in text and "one POST /tokenize first" in text
    assert "x2 until the SLO breaks" in text


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"factor": 1.0}, "--search-span must be above 1"),
        ({"budget": ActiveBudget(5, 90)}, "a goodput search needs at least"),
    ],
)
def test_a_search_that_cannot_be_planned_is_a_usage_error(kw, message):
    with pytest.raises(UsageError, match=message):
        plan(**kw)


# --- the ramp's trials, through the search loop ------------------------------------------------------
def _run(monkeypatch, plan: RampPlan, budget: ActiveBudget, goodput: float) -> GoodputSearch:
    """The ramp against a stand-in driver whose requests complete at once: a real server's goodput
    cannot be chosen, and what is tested is the search loop's rule and its use of the budget."""
    monkeypatch.setattr(ClientHealth, "stall", lambda self: None)

    def judge(records):
        return float(records[0].request_id.split("@")[0]) <= goodput, "judged by the test"

    def make(rate: float, trial: int) -> Workload:
        specs = tuple(RequestSpec(f"{rate}@{trial}-{i}", (1, 2, 3), 4) for i in range(plan.requests))
        return Workload("trial", specs)

    return asyncio.run(run_goodput_search(_SearchDriver(BudgetGuard(budget)), plan, make, judge))


def test_the_ramp_runs_up_from_its_start_and_bisects(monkeypatch):
    plan = RampPlan(1.0, steps=2, requests=4, max_trials=10, drain_s=0.1)
    out = _run(monkeypatch, plan, ActiveBudget(100, 600), 5.0)
    rates = [round(t.rate_rps, 3) for t in out.search.trials]
    assert rates[:4] == [1.0, 2.0, 4.0, 8.0] and len(rates) == 6 and not out.notes
    assert out.search.bound == "bracketed" and out.search.goodput_rps <= 5.0 < out.search.broken_at_rps


def test_the_ramp_stops_where_the_budget_has_no_room_for_a_whole_trial(monkeypatch):
    # 14 requests: three trials of 4 and not a fourth. A trial cut short would read as a broken SLO.
    plan = RampPlan(1.0, steps=2, requests=4, max_trials=10, drain_s=0.1)
    out = _run(monkeypatch, plan, ActiveBudget(14, 600), 5.0)
    assert [t.rate_rps for t in out.search.trials] == [1.0, 2.0, 4.0]
    assert out.search.bound == "at-least" and any("stopped before a trial at 8/s" in n for n in out.notes)


def test_the_model_is_fitted_without_the_trial_at_the_measured_goodput_and_checked_on_it():
    # Trials recorded as the live search writes them (goodput{trial}-{index}); the fit is on the
    # evidence and the other trials, the error on the held-back one.
    search = RampSearch(10.0, 1)
    trials, records = [(10.0, True), (20.0, True), (40.0, False)], []
    for k, (rate, met) in enumerate(trials):
        search.record(Trial(rate, met, 24))
        level = _level(rate, 24, f"goodput{k}", 100.0 * (k + 1))
        records += [replace(r, experiment="goodput", phase="replay") for r in level]
    evidence = _level(5.0, 12, "decode", 10.0)
    searched = plan(records=evidence)
    result = GoodputSearch(searched.goodput, search, tuple(records))
    model, validation, rate, notes = _fit_at_rate(searched, result, lambda r: ())
    assert rate == 20.0 and {c.group for c in validation.comparisons} == {"trial at 20/s"}
    assert model.observations == len(evidence) + 48  # the evidence and the two other trials
    assert model.fitted_range is not None and model.fitted_range.max_rate_rps > 5.0
    assert any("held back" in n for n in notes)
    # The server's prompt counts replace the trace's for the requests the trials sent.
    counted = [replace(records[0], prompt_tokens=999)]
    assert measured_items(ITEMS, counted)[0].prompt_tokens == 999 and measured_items(ITEMS, counted)[1] == ITEMS[1]


# --- plan --active end to end, the session replaced -------------------------------------------------
def test_plan_active_reports_the_measured_goodput_and_the_models_error_at_it(monkeypatch, tmp_path, capsys):
    """`plan --active` with the measuring session (`live._measure`) replaced by the simulator
    driven by a known true model: a real server's goodput cannot be chosen, and what is tested
    is what the plan does with what the search measured (the HTTP search runs against a real
    vLLM in tests/test_capacity_live.py)."""
    (tmp_path / "evidence.json").write_text(build({"engine.name": "vllm", "config.max_num_seqs": 256}).to_json())
    evidence = []
    for k, (n, together) in enumerate(((6, 1), (8, 4), (16, 8))):
        arrivals = [SimRequest((i // together) * 0.6, 200, 16) for i in range(n)]
        level = _records_from(simulate(arrivals, TRUE, SERVER_LIMITS), t0=50.0 * (k + 1))
        evidence += [replace(r, request_id=f"decode-c{together}-{i}") for i, r in enumerate(level)]
    with JsonlWriter(tmp_path / "requests.jsonl") as writer:
        for r in evidence:
            writer.write(r.to_dict())
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": i, "input_length": 200, "output_length": 64, "hash_ids": [i]} for i in range(20)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = {}

    async def measure(url, base, plan, requests_out):  # the server: the simulator driving TRUE
        search, records = plan.goodput.new_search(), []
        n, judge = plan.goodput.requests, slo_judge(plan.slo)
        while (rate := search.next_rate()) is not None:
            i = len(search.trials)
            sim = simulate(at_rate(list(plan.items[:n]), rate, plan.goodput.seed), TRUE, SERVER_LIMITS)
            trial = [
                replace(r, request_id=f"goodput{i}-{j}", experiment="goodput", phase="replay")
                for j, r in enumerate(_records_from(sim, t0=1000.0 * (i + 1)))
            ]
            met, why = judge(trial)
            search.record(Trial(rate, met, len(trial), why))
            records += trial
        seen["search"] = search
        return GoodputSearch(plan.goodput, search, tuple(records))

    monkeypatch.setattr(live, "_measure", measure)
    argv = ["plan", "--evidence", str(tmp_path), "--trace", str(trace), "--target-rps", "40", "--json"]
    # ITL p50 40 ms: the steps of TRUE pass it past about 11 sequences, so a trial of 20 breaks it.
    argv += ["--slo", "itl:p50:40ms", "--slo", "ttft:p90:1s", "--active", "--url", "http://127.0.0.1:9"]
    argv += ["--trial-requests", "20", "--budget-requests", "400", "--budget-seconds", "3600"]
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Active goodput search will send" in out.err  # said before anything was sent
    plan = json.loads(out.out)
    live_search = seen["search"]
    assert live_search.bound == "bracketed"
    today = plan["scenarios"][0]
    assert today["source"] == "measured" and today["goodput_per_replica_rps"] == live_search.goodput_rps
    assert today["goodput_per_replica_rps"] <= today["ceiling_rps"]
    m = plan["measured_goodput"]
    assert m["error_at_rate"]["rate_rps"] == live_search.goodput_rps and m["error_at_rate"]["comparisons"]
    assert m["predicted"]["trials"] and m["predicted_before_search"]["trials"]
    # Fitted on the regime the plan runs in: the trials held more sequences than the evidence's 8.
    assert plan["model"]["fitted_range"]["max_sequences"] > 8
    assert f"at {live_search.goodput_rps:.3g}/s" in plan["model_error_at_plan"]


def test_a_trials_prefix_blocks_are_its_own_as_its_salt_makes_them_on_the_server():
    # Every trial's prompts start with the trial's salt (trace_workload's fresh_cache): the
    # replay of the trials for the fit shares blocks within a trial, never across two.
    items = [SimRequest(0.0, 64, 4, ("a", "b")), SimRequest(0.0, 64, 4, ("a", "c"))]
    (record,) = _records_from(simulate(items[:1], MODEL, LIMITS))
    blocks_of = live._blocks_of(items)

    def of(request_id: str, experiment: str = live.TRIAL_PREFIX) -> tuple:
        return blocks_of(replace(record, request_id=request_id, experiment=experiment))

    assert of("goodput0-0")[0] == of("goodput0-1")[0]  # the trace's shared block, within one trial
    assert of("goodput0-0")[1] != of("goodput0-1")[1]
    assert not set(of("goodput0-0")) & set(of("goodput1-0"))  # nothing across trials
    assert of("decode-0", "decode") == ()  # the evidence's own requests index no trace
