"""A live experiment that ran while the client was starved is repeated within the budget, or its
figures carry the starved warning (and the tree gives no verdict from them).

Three layers, each deterministic on a noisy host:
- `ClientHealth.starved` on constructed windows (the rule's thresholds);
- the real HealthWindow seeing a real starvation: a stand-in experiment blocks the client's
  event loop with time.sleep, as another busy process on a 2-core host does (host noise only
  adds lag, so detection cannot flake);
- `_run_one`'s repeat-or-mark logic with the verdict of each attempt fixed by the test (a
  clean attempt cannot be promised on a busy CI host, so it is not left to the clock).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import runner as E
from llm_diagnose.probes.experiments.common import ExperimentContext, ExperimentOutcome
from llm_diagnose.probes.experiments.plan import HeterogeneityPlan
from llm_diagnose.probes.load.budget import ActiveBudget, BudgetGuard
from llm_diagnose.probes.load.health import LAG_FRACTION_OF_GAP, STALL_S, ClientHealth, TargetHost
from llm_diagnose.probes.load.prompts import PromptMaker
from llm_diagnose.probes.load.records import JsonlWriter
from llm_diagnose.probes.load.runner import Driver
from llm_diagnose.probes.results import Measurement, Provenance
from llm_diagnose.probes.warning_codes import WarningCode, coded

PROV = Provenance(method="test", source="test")


def _health(lags: tuple[float, ...]) -> ClientHealth:
    return ClientHealth(10.0, lags, 0.1, 0, 0.0, 1.0, 2, True)


# --- the rule ---------------------------------------------------------------------------------
def test_starved_is_lag_against_the_scale_the_verdict_rests_on_or_a_stall():
    quiet = _health((0.001,) * 1000)
    assert quiet.starved(0.020) is None and quiet.starved(None) is None
    laggy = _health((0.001,) * 980 + (0.030,) * 20)  # p99 30 ms
    assert laggy.starved(0.020).startswith(Q.CLIENT_STARVED_WARNING)  # 150% of a 20 ms gap
    assert laggy.starved(0.030 / LAG_FRACTION_OF_GAP + 0.01) is None  # small beside a long stall
    stalled = _health((0.001,) * 999 + (STALL_S + 0.1,))  # one wake-up: the p99 does not see it
    assert "stalled for up to 0.6 s" in stalled.starved(10.0)


# --- a real starvation is seen ------------------------------------------------------------------
class _Client:
    def counters(self) -> tuple[int, float]:
        return 0, 0.0


def _context(tmp_path, budget: ActiveBudget) -> tuple[ExperimentContext, BudgetGuard, JsonlWriter]:
    events = JsonlWriter(tmp_path / "events.jsonl")
    guard = BudgetGuard(budget)
    return ExperimentContext(Driver(_Client(), guard), PromptMaker(), "test", "completions", events), guard, events


def test_a_blocked_event_loop_is_measured_as_starved(monkeypatch, tmp_path):
    async def blocking(ctx, step, deadline):
        for _ in range(10):
            time.sleep(0.15)  # the loop does not run: a 150 ms late wake-up each time
            await asyncio.sleep(0.005)
        value = Measurement(1.0, "ratio", PROV, samples=(0.9, 1.0, 1.1))
        return ExperimentOutcome({Q.SHORT_WAIT_FOR_LONG: value}, verdict_scale_s=0.4)

    monkeypatch.setitem(E._RUNNERS, "heterogeneity", blocking)
    ctx, guard, events = _context(tmp_path, ActiveBudget(100, 60))
    outcome, health, server = asyncio.run(
        E._attempt("heterogeneity", HeterogeneityPlan(time_cap_s=5.0), ctx, guard, _Client(), TargetHost(True))
    )
    events.close()
    assert health.loop_lag_p99_s >= 0.1, health.describe()
    assert health.starved(outcome.starvation_scale_s) is not None
    assert not server.available  # no metrics reader: nothing to compare the client with


# --- repeat or mark ----------------------------------------------------------------------------
def _run(monkeypatch, tmp_path, starved_attempts: set[int], budget: ActiveBudget, reserve=(0.0, 0)):
    attempts: list[int] = []

    async def stand_in(ctx, step, deadline):
        attempts.append(len(attempts) + 1)
        value = Measurement(1.0, "ratio", PROV, samples=(0.9, 1.0, 1.1))
        return ExperimentOutcome({Q.SHORT_WAIT_FOR_LONG: value}, median_gap_s=0.020)

    def starved(self, scale):  # the verdict of each attempt, fixed by the test
        return (
            coded(WarningCode.CLIENT_STARVED, f"{Q.CLIENT_STARVED_WARNING} event-loop lag p99 30 ms")
            if len(attempts) in starved_attempts
            else None
        )

    monkeypatch.setitem(E._RUNNERS, "heterogeneity", stand_in)
    monkeypatch.setattr(ClientHealth, "starved", starved)
    ctx, guard, events = _context(tmp_path, budget)
    step = HeterogeneityPlan(time_cap_s=2.0)
    out = asyncio.run(E._run_one("heterogeneity", step, ctx, guard, _Client(), TargetHost(True), reserve))
    events.close()
    return out, attempts, ctx.notes, (tmp_path / "events.jsonl").read_text()


def test_a_starved_first_attempt_is_repeated_and_only_the_clean_one_counts(monkeypatch, tmp_path):
    out, attempts, notes, events = _run(monkeypatch, tmp_path, {1}, ActiveBudget(100, 60))
    assert attempts == [1, 2]
    assert '"experiment-repeated"' in events and Q.CLIENT_STARVED_WARNING in events
    m = out[Q.SHORT_WAIT_FOR_LONG]
    assert isinstance(m, Measurement)
    assert not any(w.startswith(Q.CLIENT_STARVED_WARNING) for w in m.warnings), m.warnings
    assert any("was run again" in n for n in notes)


def test_starved_twice_keeps_the_figures_but_marks_them(monkeypatch, tmp_path):
    out, attempts, notes, _ = _run(monkeypatch, tmp_path, {1, 2}, ActiveBudget(100, 60))
    assert attempts == [1, 2]
    m = out[Q.SHORT_WAIT_FOR_LONG]
    assert isinstance(m, Measurement) and m.warnings[0].startswith(Q.CLIENT_STARVED_WARNING), m.warnings
    assert any("in both attempts" in n for n in notes)


@pytest.mark.parametrize(
    "budget, reserve",
    [
        (ActiveBudget(100, 1.5), (0.0, 0)),  # not the time for a second 2 s attempt
        (ActiveBudget(100, 60), (58.0, 0)),  # the later experiments' time is not taken
        (ActiveBudget(30, 60), (0.0, 5)),  # nor their requests (the step plans 26)
    ],
)
def test_no_repeat_without_room_in_the_budget(monkeypatch, tmp_path, budget, reserve):
    out, attempts, notes, events = _run(monkeypatch, tmp_path, {1}, budget, reserve)
    assert attempts == [1] and '"experiment-repeated"' not in events
    assert out[Q.SHORT_WAIT_FOR_LONG].warnings[0].startswith(Q.CLIENT_STARVED_WARNING)
    assert any("no room to repeat" in n for n in notes)


def test_a_client_that_keeps_up_runs_once_without_the_mark(monkeypatch, tmp_path):
    out, attempts, _, events = _run(monkeypatch, tmp_path, set(), ActiveBudget(100, 60))
    assert attempts == [1] and '"experiment-repeated"' not in events
    assert not any(w.startswith(Q.CLIENT_STARVED_WARNING) for w in out[Q.SHORT_WAIT_FOR_LONG].warnings)


# --- the goodput search: a trial broken while the client stalled ---------------------------------
class _SearchDriver:
    """A stand-in for the load driver: each admitted request completes at once (no server)."""

    def __init__(self, guard: BudgetGuard) -> None:
        from types import SimpleNamespace

        self.guard = guard
        self.records: list = []
        self.client = SimpleNamespace(base_url="http://127.0.0.1:9", counters=lambda: (0, 0.0))

    def start_coroutine(self, coro):
        return asyncio.ensure_future(coro)

    async def run(self, workload) -> None:
        from llm_diagnose.probes.load.records import RequestRecord

        for spec in workload.specs:
            if not await self.guard.admit():
                return
            self.records.append(
                RequestRecord(spec.request_id, "goodput", "", "", "completions", 0.0, 0.0, (0.01,), t_end=0.02)
            )

    async def stop_all(self, why: str) -> None:
        pass


def _search(monkeypatch, budget: ActiveBudget):
    from llm_diagnose.probes.experiments.goodput import GoodputPlan, run_goodput_search
    from llm_diagnose.probes.load.records import RequestSpec
    from llm_diagnose.probes.load.workloads import Workload

    plan = GoodputPlan(1.0, 100.0, steps=3, requests=4, drain_s=0.1)
    stalls: list[bool] = []

    def judge(records):  # the objective holds up to 20/s; every break here ran in a client stall
        met = float(records[0].request_id.split("@")[0]) <= 20.0
        stalls.append(not met)
        return met, "judged by the test"

    def make(rate: float, trial: int) -> Workload:
        specs = tuple(RequestSpec(f"{rate}@{trial}-{i}", (1, 2, 3), 4) for i in range(plan.requests))
        return Workload("trial", specs)

    monkeypatch.setattr(
        ClientHealth, "stall", lambda self: "the client's loop stalled for 0.9 s" if stalls[-1] else None
    )
    driver = _SearchDriver(BudgetGuard(budget))
    return asyncio.run(run_goodput_search(driver, plan, make, judge)), plan


def test_a_goodput_trial_broken_in_a_client_stall_is_tried_again_where_the_budget_has_room(monkeypatch):
    # The high end broke in a stall: tried again (and broke again), and the bisection still runs in full.
    out, plan = _search(monkeypatch, ActiveBudget(8 * 4, 60))
    rates = [t.rate_rps for t in out.search.trials]
    assert rates[:3] == [1.0, 100.0, 100.0] and len(set(rates)) == 2 + plan.steps, rates
    assert out.search.bound == "bracketed" and not out.notes
    # A budget that holds the plan and no more: the retry would take a planned trial's requests, so it is not made.
    out, plan = _search(monkeypatch, ActiveBudget(plan.max_requests, 60))
    rates = [t.rate_rps for t in out.search.trials]
    assert rates.count(100.0) == 1 and len(set(rates)) == 2 + plan.steps, rates
    assert any("was not tried again: the budget has" in n for n in out.notes), out.notes
