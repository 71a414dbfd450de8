"""Goodput against the live server: the highest request rate at which a latency objective holds.

`run_goodput_search` runs a search's trials: `RampSearch` (llm_diagnose.probes.experiments.ramp,
what `plan --active` runs: up from a rate the server meets until the objective breaks, then
bisection) or `RateSearch` here (a bounded bisection over a fixed range). Each trial sends the
same workload shape at one Poisson rate (seeded: the arrival times of every trial are the same
unit-rate draws scaled by 1/rate, so trials differ in rate only), waits for it to drain, and
asks `judge(records)` whether the objective held. In `RateSearch` the first two trials are the
ends of the range (a broken low end or a met high end ends the search: goodput is out of range);
then each trial halves the bracket on a geometric scale. A low end (a ramp's start) that
breaks is tried once more before the search gives up on it, and a rate counts as held if any of
its trials held: a host stall only ever slows a trial down, and one stall (on a shared 2-core
machine, a trial at a tenth of the predicted goodput broke once and held at the next try) must
not end a search with no answer. Likewise,
once per search, a trial at any other rate that broke while the client's own event loop stalled
(`ClientHealth.stall`: the client, not the server, may have been the slow side) is tried again
where the budget has room for a whole trial; where it has not, the search says so. The plan
says what it will send before anything is sent, and every send passes the run's BudgetGuard.

The judge is a plain callable, so this module knows nothing of how objectives are declared
(probes never import diagnose): `llm_diagnose.diagnose.capacity` builds it from an SLO.

`RateSearch` and `RampSearch` are the searches alone, with no I/O, so the offline prediction
walks exactly the same rates by the same rule as the live search and the two can be set side by
side. A trial starts only where the budget has room for the whole of it (its requests, and the
time it may take); where it has not, the search stops and says so.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.health import HealthWindow, TargetHost
from llm_diagnose.probes.load.records import RequestRecord
from llm_diagnose.probes.load.runner import Driver
from llm_diagnose.probes.load.workloads import Workload

__all__ = [
    "GoodputPlan",
    "RateSearch",
    "Trial",
    "TrialJudgement",
    "LiveSearch",
    "SearchPlan",
    "GoodputSearch",
    "plan_goodput",
    "run_goodput_search",
    "SETUP_RESERVE_S",
    "DRAIN_FACTOR",
    "MIN_TRIAL_REQUESTS",
]

SETUP_RESERVE_S = 2.0
DRAIN_FACTOR = 1.5  # a trial may take its arrival span x this, plus the drain allowance, before it is cut


@dataclass(frozen=True)
class GoodputPlan:
    """What the live search will send: `3 + steps` trials at most (the low end may be tried
    twice), each `requests` requests."""

    low_rps: float
    high_rps: float
    steps: int = 3
    requests: int = 24  # per trial
    drain_s: float = 4.0  # allowance past the last arrival for the queue to empty
    seed: int = 0
    workload: str = ""  # what one trial sends, in words

    def __post_init__(self) -> None:
        if not (0 < self.low_rps < self.high_rps and math.isfinite(self.high_rps)):
            raise ValueError("the rate range must satisfy 0 < low < high")
        if self.steps < 0 or self.requests < 1:
            raise ValueError("steps must be >= 0 and requests >= 1")

    @property
    def max_trials(self) -> int:
        return 3 + self.steps  # both ends, the low end again if it broke, then the bisection

    @property
    def max_requests(self) -> int:
        return self.max_trials * self.requests

    def trial_cap_s(self, rate: float) -> float:
        return self.requests / rate * DRAIN_FACTOR + self.drain_s

    @property
    def longest_trial_s(self) -> float:
        return self.trial_cap_s(self.low_rps)

    def new_search(self) -> RateSearch:
        return RateSearch(self.low_rps, self.high_rps, self.steps, retry_broken_low=True, retry_stalled=1)

    @property
    def duration_bound_s(self) -> float:
        # The low end is the longest trial; every other is shorter.
        return SETUP_RESERVE_S + self.max_trials * self.trial_cap_s(self.low_rps)

    def describe(self) -> str:
        what = f" of {self.workload}" if self.workload else ""
        return (
            f"a goodput search between {self.low_rps:g} and {self.high_rps:g} requests/s: at most "
            f"{self.max_trials} trials (both ends, the low end twice if it breaks, then {self.steps} bisection "
            f"steps), each {self.requests} requests{what} at Poisson arrivals (seed {self.seed}), each cut after "
            f"{self.trial_cap_s(self.low_rps):.0f} s at most; at most {self.max_requests} requests within "
            f"{self.duration_bound_s:.0f} s, and one trial more where one broke while the client stalled and "
            "the budget has room for it"
        )


def plan_goodput(
    budget: ActiveBudget,
    low_rps: float,
    high_rps: float,
    *,
    requests: int = 24,
    steps: int = 3,
    drain_s: float = 4.0,
    seed: int = 0,
    workload: str = "",
) -> GoodputPlan:
    """The search fitted into `budget`: fewer bisection steps first, then fewer requests per trial.

    Raises:
        ValueError: not even the two end trials of `MIN_TRIAL_REQUESTS` requests fit (the
            message says what budget would).
    """
    if budget.max_rps is not None and high_rps > budget.max_rps:
        high_rps = budget.max_rps
        if high_rps <= low_rps:
            raise ValueError(f"--max-rps {budget.max_rps:g} is at or below the search's low end {low_rps:g}/s")
    plan = GoodputPlan(low_rps, high_rps, steps, requests, drain_s, seed, workload)
    while plan.steps > 0 and (plan.max_requests > budget.max_requests or plan.duration_bound_s > budget.max_seconds):
        plan = GoodputPlan(low_rps, high_rps, plan.steps - 1, requests, drain_s, seed, workload)
    while plan.requests > MIN_TRIAL_REQUESTS and (
        plan.max_requests > budget.max_requests or plan.duration_bound_s > budget.max_seconds
    ):
        plan = GoodputPlan(low_rps, high_rps, 0, plan.requests - 1, drain_s, seed, workload)
    if plan.max_requests > budget.max_requests or plan.duration_bound_s > budget.max_seconds:
        raise ValueError(
            f"a goodput search needs at least {plan.max_requests} requests and "
            f"{plan.duration_bound_s:.0f} s (two trials of {plan.requests}); the budget allows "
            f"{budget.describe()}"
        )
    return plan


MIN_TRIAL_REQUESTS = 8  # fewer cannot give a p90


@dataclass(frozen=True)
class Trial:
    rate_rps: float
    met: bool | None  # None: the judge could not tell (no completed request)
    requests: int = 0
    detail: str = ""
    client_stalled: bool = False  # the client's event loop stalled during the trial (ClientHealth.stall)


class TrialJudgement:
    """What the trials of a search say, whatever rule chose their rates: the goodput (the highest
    rate that held below the lowest that broke), and which broken trial is tried again.

    A subclass has `trials`, `retry_broken_low`, `retry_stalled` and `first_rate` (the rate
    whose break is retried by its own rule, not the stall rule).
    """

    trials: list[Trial]
    retry_broken_low: bool
    retry_stalled: int

    @property
    def first_rate(self) -> float:
        raise NotImplementedError

    def record(self, trial: Trial) -> None:
        self.trials.append(trial)

    def stalled_retry(self) -> float | None:
        """The last rate again, where its one trial broke while the client stalled and a retry is left."""
        if not self.trials:
            return None
        last, tried = self.trials[-1], [t.rate_rps for t in self.trials]
        if last.met or not last.client_stalled or tried.count(last.rate_rps) > 1:
            return None
        if self.retry_broken_low and last.rate_rps == self.first_rate:
            return None  # the first rate's own retry covers it
        return last.rate_rps if self.stall_retries_used() < self.retry_stalled else None

    def stall_retries_used(self) -> int:
        """Rates tried twice other than a first rate retried by its own rule."""
        tried = [t.rate_rps for t in self.trials]
        return sum(1 for r in set(tried) if tried.count(r) > 1 and not (self.retry_broken_low and r == self.first_rate))

    def _held(self) -> dict[float, bool]:
        """Per rate tried: whether any of its trials met the objective."""
        held: dict[float, bool] = {}
        for t in self.trials:
            held[t.rate_rps] = held.get(t.rate_rps, False) or bool(t.met)
        return held

    @property
    def goodput_rps(self) -> float | None:
        """The highest rate that met the objective below the lowest that broke it; None: none met."""
        broken = self.broken_at_rps
        met = [r for r, ok in self._held().items() if ok and (broken is None or r < broken)]
        return max(met) if met else None

    @property
    def broken_at_rps(self) -> float | None:
        """The lowest rate at which no trial met the objective (an unjudgeable trial counts as broken)."""
        broken = [r for r, ok in self._held().items() if not ok]
        return min(broken) if broken else None

    @property
    def bound(self) -> str:
        """'bracketed' (between goodput and broken_at), 'at-least' (no rate tried broke), 'below-range'."""
        if self.goodput_rps is None:
            return "below-range"
        return "at-least" if self.broken_at_rps is None else "bracketed"


@dataclass
class RateSearch(TrialJudgement):
    """Bisection over rates, assuming the objective holds below some rate and breaks above it."""

    low_rps: float
    high_rps: float
    steps: int
    trials: list[Trial] = field(default_factory=list)
    retry_broken_low: bool = False  # live: a broken low end gets a second trial (see the module docstring)
    retry_stalled: int = 0  # live: this many other rates get a second trial where the first broke in a client stall

    def next_rate(self) -> float | None:
        """The next rate to try; None when the search is over."""
        tried = [t.rate_rps for t in self.trials]
        if self.low_rps not in tried:
            return self.low_rps
        if (again := self.stalled_retry()) is not None:
            return again
        if self.goodput_rps is None:  # the low end broke (or could not be judged): below the range
            return self.low_rps if self.retry_broken_low and tried.count(self.low_rps) == 1 else None
        if self.high_rps not in tried:
            return self.high_rps
        met, broken = self.goodput_rps, self.broken_at_rps
        if broken is None or len(set(tried)) >= 2 + self.steps:
            return None
        return math.sqrt(met * broken)

    @property
    def first_rate(self) -> float:
        return self.low_rps

    def describe(self) -> str:
        if self.bound == "below-range":
            return f"below {self.low_rps:g} requests/s (the objective broke at the low end)"
        if self.bound == "at-least":
            return f"at least {self.goodput_rps:.3g} requests/s (the objective held at the high end)"
        return f"{self.goodput_rps:.3g} requests/s (held there; broke at {self.broken_at_rps:.3g})"


class LiveSearch(Protocol):
    """A search `run_goodput_search` can run: a rule for the next rate and the trials' judgement."""

    trials: list[Trial]
    retry_stalled: int

    @property
    def goodput_rps(self) -> float | None: ...
    @property
    def broken_at_rps(self) -> float | None: ...
    @property
    def bound(self) -> str: ...
    def next_rate(self) -> float | None: ...
    def stalled_retry(self) -> float | None: ...
    def stall_retries_used(self) -> int: ...
    def record(self, trial: Trial) -> None: ...


class SearchPlan(Protocol):
    """What a live search will send: GoodputPlan here, RampPlan (experiments.ramp)."""

    @property
    def requests(self) -> int: ...
    @property
    def max_trials(self) -> int: ...
    @property
    def longest_trial_s(self) -> float: ...
    def trial_cap_s(self, rate: float) -> float: ...
    def new_search(self) -> LiveSearch: ...


@dataclass(frozen=True)
class GoodputSearch:
    """The live search's outcome: the search, every record, and what was not sent."""

    plan: SearchPlan
    search: LiveSearch
    records: tuple[RequestRecord, ...]
    notes: tuple[str, ...] = ()


Judge = Callable[[Sequence[RequestRecord]], "tuple[bool | None, str]"]


async def run_goodput_search(
    driver: Driver, plan: SearchPlan, make_workload: Callable[[float, int], Workload], judge: Judge
) -> GoodputSearch:
    """Run the planned search. `make_workload(rate, trial)` gives one trial's requests (its
    pacing must be PoissonArrivals(rate, plan.seed)); `judge(records)` says (met, why)."""
    search = plan.new_search()
    host = TargetHost.of(driver.client.base_url)
    notes: list[str] = []
    records: list[RequestRecord] = []
    trial = 0
    while (rate := search.next_rate()) is not None:
        reason = driver.guard.exhausted()
        if reason:
            notes.append(f"the search stopped early: {reason}")
            break
        if rate == search.stalled_retry():
            # The retry is beyond the plan: it must leave the trials the plan still holds their budget.
            left = plan.max_trials - (len(search.trials) - search.stall_retries_used())
            need_requests = plan.requests * (1 + left)
            need_s = plan.trial_cap_s(rate) + left * plan.longest_trial_s
            guard = driver.guard
            if guard.remaining_requests < need_requests or guard.remaining_s < need_s:
                notes.append(
                    f"the trial at {rate:g}/s broke while the client stalled and was not tried again: the budget "
                    f"has {guard.remaining_requests} requests and {guard.remaining_s:.0f} s left, and the retry with "
                    f"the {left} trials the plan may still need takes {need_requests} and {need_s:.0f} s"
                )
                search.retry_stalled = 0
                continue
        guard = driver.guard
        if guard.remaining_requests < plan.requests or guard.remaining_s < plan.trial_cap_s(rate):
            # A trial cut by the budget would read as the server breaking the objective.
            notes.append(
                f"the search stopped before a trial at {rate:.3g}/s: the budget has {guard.remaining_requests} "
                f"requests and {guard.remaining_s:.0f} s left, and the trial takes {plan.requests} requests and up "
                f"to {plan.trial_cap_s(rate):.0f} s"
            )
            break
        workload = make_workload(rate, trial)
        specs = workload.specs[: plan.requests]
        workload = Workload(workload.name, specs, workload.pacing, workload.description)
        cap = plan.trial_cap_s(rate)
        async with HealthWindow(driver.client.counters, host) as window:
            task = driver.start_coroutine(driver.run(workload))
            done, _ = await asyncio.wait({task}, timeout=cap)
            cut = not done
            if cut:
                await driver.stop_all(f"goodput trial at {rate:g}/s ran past {cap:.0f} s")
            await asyncio.gather(task, return_exceptions=True)
        mine = [r for r in driver.records if r.request_id in {s.request_id for s in specs}]
        records.extend(mine)
        met, why = judge(mine)
        if cut:
            met, why = False, f"cut after {cap:.0f} s with requests still queued ({why})"
        stall = window.health.stall() if window.health is not None else None
        if stall is not None and not met:
            # A stalled client only ever makes a trial slower: a held one stands, a broken one may be the client's.
            why += f"; but {stall}: the break may be the client's, not the server's"
        search.record(Trial(rate, met, len(mine), why, client_stalled=stall is not None))
        trial += 1
        await asyncio.sleep(0.2)  # let the last streams' statistics settle before the next trial
    return GoodputSearch(plan, search, tuple(records), tuple(notes))
