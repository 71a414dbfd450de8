"""Experiments the plan left out run in what the planned ones left unused (issue 26).

Measured on a slow server (55 ms a token): the plan's time caps left spec out of a 60 s budget,
yet the four experiments that ran were over at 41 s. After the planned steps, run_experiments now
sizes the left-out ones again by the same fit (sizing.size_experiments) in the time and requests
really left, and runs those that now fit; the others keep "did not run" with a true hint.

The whole of run_experiments runs here, with stand-ins where it meets the server: the calibration
(it reports the speed the slow server measured), POST /tokenize and the experiments themselves.
Each stand-in experiment takes a share of its own time cap on the budget's clock (the guard's
`clock`, real time plus what the stand-ins say they took) and a share of its planned requests
from the budget. Stand-ins, not an engine: a real engine cannot be made to finish an experiment
early, or use exactly its whole cap, on demand and deterministically, and a test that waited out
a 60 s budget in real time would take a minute. Nothing is sent anywhere: the target's address is
never connected to.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import replace

import pytest

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import runner as E
from llm_diagnose.probes.experiments.common import ExperimentContext, ExperimentOutcome
from llm_diagnose.probes.experiments.plan import SETUP_RESERVE_S, SpecPlan, StepPlan
from llm_diagnose.probes.experiments.sizing import Calibration, EngineLimits, plan_experiments, size_experiments
from llm_diagnose.probes.load.budget import ActiveBudget, BudgetGuard
from llm_diagnose.probes.load.health import ClientHealth
from llm_diagnose.probes.load.prompts import PromptMaker
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result

PROV = Provenance(method="test", source="stand-in")
TARGET = "http://127.0.0.1:9"  # never connected to: every call that would reach it is a stand-in
MAX_MODEL_LEN = 2048
KV_TOKENS = 43_648  # the slow server's (tiny-llama on vLLM CPU)
LIMITS = EngineLimits(max_model_len=MAX_MODEL_LEN, kv_capacity_tokens=KV_TOKENS)
CALIBRATION_S = 2.0  # set-up and the calibration request on the slow server took about this
# The slow server: 55 ms per output token, 1.95 ms per prompt token (vLLM on a busy 2-core CPU).
SLOW = Calibration(0.055, 0.00195, "stand-in: the slow server's speed", spent_s=CALIBRATION_S)
# A fast one (2 ms a token), where the request budget is what leaves experiments out.
FAST = Calibration(0.002, 0.00002, "stand-in: a small model's speed", spent_s=CALIBRATION_S)


class _Clock:
    """The budget's clock: real time, plus the seconds the stand-in experiments say they took."""

    def __init__(self) -> None:
        self.taken = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.taken


class _Run:
    """One run_experiments over stand-ins: what each experiment was given, and what the run wrote."""

    def __init__(self, time_share: float, request_share: float, sends: dict[str, int] | None = None) -> None:
        self.time_share = time_share  # of its time cap, each stand-in experiment takes this much
        self.request_share = request_share  # ... and this share of its planned requests
        self.sends = sends or {}  # ... or, for these experiments, this many requests
        self.clock = _Clock()
        self.given: list[tuple[str, StepPlan]] = []

    def stand_in(self, name: str):  # noqa: ANN201 - an experiment runner
        async def run(ctx: ExperimentContext, step: StepPlan, deadline: float) -> ExperimentOutcome:
            """An experiment that ends early (or uses its whole cap) on the budget's clock."""
            self.given.append((name, step))
            for _ in range(self.sends.get(name, round(self.request_share * step.requests))):
                assert await ctx.driver.guard.admit()
            self.clock.taken += self.time_share * step.time_cap_s
            return ExperimentOutcome({k: Measurement(1.0, "ratio", PROV) for k in E.EXPERIMENT_KEYS[name]})

        return run

    def go(self, monkeypatch, tmp_path, budget: ActiveBudget, calibration: Calibration) -> dict[str, Result]:
        async def calibrate(ctx: ExperimentContext, until: float, started: float) -> Calibration:
            """The calibration request takes its budget slot and reports the speed it measured."""
            assert await ctx.driver.guard.admit()
            self.clock.taken += CALIBRATION_S
            return calibration

        async def tokenize(*_: object) -> tuple[PromptMaker, None]:
            return PromptMaker(), None

        for name in E.EXPERIMENT_KEYS:
            monkeypatch.setitem(E._RUNNERS, name, self.stand_in(name))
        monkeypatch.setattr(E, "calibrate", calibrate)
        monkeypatch.setattr(E, "calibrate_prompts", tokenize)
        monkeypatch.setattr(E, "BudgetGuard", lambda b: BudgetGuard(b, clock=self.clock))
        # A busy host's stall would repeat a stand-in (its own tests cover that) and change what is left.
        monkeypatch.setattr(ClientHealth, "starved", lambda health, scale: None)
        plan = plan_experiments(budget, max_model_len=MAX_MODEL_LEN, target=TARGET, model="stand-in")
        facts: dict[str, Result] = {Q.KV_CAPACITY_TOKENS: Measurement(float(KV_TOKENS), "tokens", PROV)}
        return asyncio.run(E.run_experiments(TARGET, "stand-in", budget, tmp_path, plan=plan, engine_facts=facts))

    @property
    def ran(self) -> list[str]:
        return [name for name, _ in self.given]


def _events(tmp_path, name: str) -> list[dict]:
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _first_skipped(tmp_path) -> dict[str, tuple[str, str]]:
    (sized,) = _events(tmp_path, "experiments-sized")
    return {s["experiment"]: (s["why"], s["hint"]) for s in sized["skipped"]}


def _measured(results: dict[str, Result], name: str) -> bool:
    return all(isinstance(results[k], Measurement) for k in E.EXPERIMENT_KEYS[name])


# The slow server's 60 s budget (its plan leaves spec out), and a fast server's 30-request budget
# (its plan leaves prefix and spec out): each cut short by one bound.
SLOW_SECONDS = ("seconds", ActiveBudget(200, 60), SLOW)
FEW_REQUESTS = ("requests", ActiveBudget(30, 60), FAST)


# --- (1) what the others left holds a left-out experiment: it runs ------------------------------------
@pytest.mark.parametrize(
    "bound, budget, calibration, share",
    [
        # The four planned experiments take 70% of their caps: over at ~41 s of 60, as measured.
        (*SLOW_SECONDS, (0.7, 1.0)),
        # 85%: over at ~49 s; what is left holds spec, but smaller than its natural size.
        (*SLOW_SECONDS, (0.85, 1.0)),
        # They send half the requests planned (interference's streams need no restart, say).
        (*FEW_REQUESTS, (0.0, 0.5)),
    ],
    ids=["time", "time-smaller", "requests"],
)
def test_a_left_out_experiment_runs_in_what_the_planned_ones_left(
    monkeypatch, tmp_path, bound, budget, calibration, share
):
    run = _Run(*share)
    results = run.go(monkeypatch, tmp_path, budget, calibration)
    first = _first_skipped(tmp_path)
    planned = [n for n in E.EXPERIMENT_KEYS if n not in first]
    assert "spec" in first, first  # the first plan left it out, for lack of this bound
    assert ("per token" if bound == "seconds" else "requests") in first["spec"][0], first["spec"]
    late = [n for n in run.ran if n in first]
    assert run.ran == planned + late and "spec" in late  # after the planned ones, in priority order
    for name in late:
        assert _measured(results, name), {k: results[k] for k in E.EXPERIMENT_KEYS[name]}
    assert not any(isinstance(r, NotMeasured) and "did not run" in r.reason for r in results.values())
    (resized,) = _events(tmp_path, "experiments-resized")  # nothing is left out after it: one re-size
    assert resized["skipped"] == []
    # The same fit as the first plan's, in what the event says was left: nothing else decides the sizes.
    spent = {
        "spent_s": budget.max_seconds - resized["left_s"],
        "spent_requests": budget.max_requests - resized["left_requests"],
    }
    assert run.given[len(planned) :] == list(size_experiments(calibration, LIMITS, budget, tuple(late), **spent).steps)
    if share[0] == 0.85:
        spec = run.given[-1][1]
        assert isinstance(spec, SpecPlan) and spec.requests < size_experiments(SLOW, LIMITS, budget, ("spec",)).requests
    for name, step in run.given[len(planned) :]:
        # sized in what was left (less the set-up reserve kept for the run's end), not the first plan's room
        assert step.requests <= resized["left_requests"]
        assert step.time_cap_s <= resized["left_s"] - SETUP_RESERVE_S
        assert resized["resized"][name]["time_cap_s"] == pytest.approx(step.time_cap_s, abs=1e-3)
    notes = results[Q.ACTIVE_NOTES]
    assert isinstance(notes, Fact) and "spec was left out of the plan, but the planned experiments left" in notes.value


# --- (2) what is left is still too small: "did not run", with a hint that holds ----------------------
@pytest.mark.parametrize(
    "bound, budget, calibration, share",
    [
        (*SLOW_SECONDS, (1.0, 1.0)),  # the planned experiments use their whole caps ...
        (*FEW_REQUESTS, (0.0, 1.0, {"heterogeneity": 12})),  # ... or all their requests but one
    ],
    ids=["time", "requests"],
)
def test_too_little_left_keeps_did_not_run_with_a_hint_that_holds(
    monkeypatch, tmp_path, bound, budget, calibration, share
):
    run = _Run(*share)
    results = run.go(monkeypatch, tmp_path, budget, calibration)
    first = _first_skipped(tmp_path)
    assert "spec" in first and not set(run.ran) & set(first), (first, run.ran)
    (resized,) = _events(tmp_path, "experiments-resized")  # tried once, nothing fitted
    assert resized["resized"] == {}
    again = {s["experiment"]: s for s in resized["skipped"]}
    assert list(again) == list(first)
    for name, (_, hint) in first.items():
        hole = results[E.EXPERIMENT_KEYS[name][0]]
        assert isinstance(hole, NotMeasured) and hole.reason == f"{name} did not run: {again[name]['why']}"
        # why: what was really left (the second sizing's words), none before it having fitted ...
        if bound == "seconds":
            said = re.search(r"the budget leaves ([0-9.]+) s for it", hole.reason)
            # the sizing clamps a room the real clock overran at 0 (the stand-ins' clock runs on real time too)
            room = max(0.0, resized["left_s"] - SETUP_RESERVE_S)
            assert said and float(said.group(1)) == pytest.approx(room, abs=0.051)
        else:
            assert resized["left_requests"] == 1 and "the budget has 1 left for it" in hole.reason, hole.reason
        # ... and the hint is the first plan's, and holds: a run with that budget plans the experiment,
        # one second or one request less does not
        assert hole.hint == hint == again[name]["hint"]
        field = "max_seconds" if bound == "seconds" else "max_requests"
        assert hint.startswith(f"raise --budget-{bound} to at least "), hint
        least = int(hint.rsplit(" ", 1)[1])
        assert name in _planned(calibration, replace(budget, **{field: least}))
        assert name not in _planned(calibration, replace(budget, **{field: least - 1}))


def test_a_spent_budget_is_not_sized_again_and_the_plans_words_stay(monkeypatch, tmp_path):
    """Every request gone: nothing can run, so there is no second sizing; the plan's reason stays."""
    run = _Run(0.0, 1.0)
    results = run.go(monkeypatch, tmp_path, FEW_REQUESTS[1], FAST)
    first = _first_skipped(tmp_path)
    assert first and not _events(tmp_path, "experiments-resized")
    for name, (why, hint) in first.items():
        hole = results[E.EXPERIMENT_KEYS[name][0]]
        assert isinstance(hole, NotMeasured) and (hole.reason, hole.hint) == (f"{name} did not run: {why}", hint)


def _planned(calibration: Calibration, budget: ActiveBudget) -> list[str]:
    return [n for n, _ in size_experiments(calibration, LIMITS, budget).steps]


# --- (3) the events: the first plan stays, each re-size says what was left and what now runs ---------
def test_each_resize_is_an_event_and_the_first_plan_stays(monkeypatch, tmp_path):
    """30 requests at 2 ms a token: the plan leaves prefix (5 requests at least) and spec (2) out.
    The three planned experiments send 24 of their 28 requests: 4 are left, which hold spec (sized
    up to 4) but not prefix: a left-out experiment that does not fit does not stop a later one that
    does. Spec sends 2 of its 4; prefix is sized again in the 2 left, and still does not fit."""
    run = _Run(0.0, 1.0, sends={"interference": 4, "spec": 2})  # of 8: its streams needed no restart
    results = run.go(monkeypatch, tmp_path, ActiveBudget(30, 60), FAST)
    assert run.ran == ["decode", "interference", "heterogeneity", "spec"]

    (sized,) = _events(tmp_path, "experiments-sized")
    assert [s["experiment"] for s in sized["skipped"]] == ["prefix", "spec"]  # the first plan, as it was
    assert "prefix" not in sized["why"] and "spec" not in sized["why"]
    first, second = _events(tmp_path, "experiments-resized")
    assert first["left_requests"] == 4 and "4 requests" in first["why"] and "unused" in first["why"]
    assert list(first["resized"]) == ["spec"]
    spec = first["resized"]["spec"]
    assert spec["requests"] <= 4 and spec["why"] and spec["plan"]
    assert [s["experiment"] for s in first["skipped"]] == ["prefix"]
    assert "the budget has 4 left" in first["skipped"][0]["why"]
    assert second["left_requests"] == 2 and second["resized"] == {}
    assert "the budget has 2 left" in second["skipped"][0]["why"]
    assert second["skipped"][0]["hint"] == sized["skipped"][0]["hint"]  # the first plan's: it holds
    # In the log's order: the planned experiments, the re-size, spec's start with its new cap, the next re-size.
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = ("experiments-sized", "experiments-resized", "experiment-start")
    order = [e.get("experiment", e["event"]) for e in lines if e["event"] in kinds]
    assert order == [
        "experiments-sized",
        *("decode", "interference", "heterogeneity"),
        "experiments-resized",
        "spec",
        "experiments-resized",
    ]
    start = next(e for e in lines if e["event"] == "experiment-start" and e["experiment"] == "spec")
    assert start["time_cap_s"] == pytest.approx(spec["time_cap_s"], abs=0.01)
    assert _measured(results, "spec")
    hole = results[E.EXPERIMENT_KEYS["prefix"][0]]
    assert isinstance(hole, NotMeasured) and "prefix did not run: needs at least 5 requests" in hole.reason
    assert hole.hint == sized["skipped"][0]["hint"] == "raise --budget-requests to at least 35"
