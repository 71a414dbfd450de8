"""The goodput search `plan --active` runs: up from a rate the server meets, then bisection.

    plan = plan_ramp(budget, start_rps=1.5, requests=40, steps=3, factor=2.0, max_rps=160.0)
    print(plan.describe())                                   # nothing has been sent yet
    result = await run_goodput_search(driver, plan, make_workload, judge)   # experiments.goodput

The search starts at `start_rps`, a rate the caller has reason to think the server meets (read
off earlier measurements, or a light one), and multiplies the rate by `factor` until the
objective breaks; then it bisects (geometric) between the highest rate that held and the lowest
that broke, `steps` times. A start that breaks is tried once more (a host stall only slows a
trial down); if it breaks again the rate is divided by `factor`, at most MAX_RAMP_DOWN times.
It never goes above `max_rps` (--max-rps, the engine's ceiling): held there, the goodput is
"at least" that. Nothing in it depends on a prediction, so a wild one cannot put every trial
where the server cannot go (seen: a bracket centred on a prediction of 2,000/s, from 667 to
6,000/s, broke at its low end on a server whose goodput was 4/s, and the answer was nothing).

`RampSearch` is the rule alone, with no I/O: the offline prediction walks it with the simulator
(capacity.goodput.predict_ramp), so predicted and measured come from the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llm_diagnose.probes.experiments.goodput import (
    DRAIN_FACTOR,
    MIN_TRIAL_REQUESTS,
    SETUP_RESERVE_S,
    Trial,
    TrialJudgement,
)
from llm_diagnose.probes.load.budget import ActiveBudget

__all__ = ["RampSearch", "RampPlan", "plan_ramp", "MAX_RAMP_UP", "MAX_RAMP_DOWN", "RAMP_FACTOR"]

RAMP_FACTOR = 2.0  # each step up doubles the rate
MAX_RAMP_UP = 12  # steps up at most: 4096x the start
MAX_RAMP_DOWN = 3  # steps down at most where the start breaks: an eighth of it
RESOLUTION = 1.05  # bisection stops where the broken rate is within 5% of the held one


@dataclass
class RampSearch(TrialJudgement):
    """Up by `factor` from `start_rps` until the objective breaks, then `steps` bisection steps."""

    start_rps: float
    steps: int
    factor: float = RAMP_FACTOR
    max_rps: float | None = None
    max_trials: int | None = None  # trials at most, a stalled trial's retry not counted (the budget's share)
    trials: list[Trial] = field(default_factory=list)
    retry_broken_low: bool = False  # live: a broken start gets a second trial
    retry_stalled: int = 0  # live: this many other rates get a second trial where the first broke in a client stall

    def __post_init__(self) -> None:
        if not (self.start_rps > 0 and math.isfinite(self.start_rps)) or not self.factor > 1:
            raise ValueError("a ramp needs a positive start rate and a factor above 1")
        if self.max_rps is not None:
            self.start_rps = min(self.start_rps, self.max_rps)

    @property
    def first_rate(self) -> float:
        return self.start_rps

    @property
    def min_rps(self) -> float:
        return self.start_rps / self.factor**MAX_RAMP_DOWN

    @property
    def low_rps(self) -> float:
        """The lowest rate tried (the start before any trial)."""
        return min((t.rate_rps for t in self.trials), default=self.start_rps)

    @property
    def high_rps(self) -> float:
        """The highest rate tried (the start before any trial)."""
        return max((t.rate_rps for t in self.trials), default=self.start_rps)

    def bisection_steps_used(self) -> int:
        """New rates tried while a held rate lay below a broken one."""
        held: dict[float, bool] = {}
        used = 0
        for t in self.trials:
            if t.rate_rps not in held:
                broken = [r for r, ok in held.items() if not ok]
                if broken and any(ok and r < min(broken) for r, ok in held.items()):
                    used += 1
            held[t.rate_rps] = held.get(t.rate_rps, False) or bool(t.met)
        return used

    def next_rate(self) -> float | None:
        """The next rate to try; None when the search is over."""
        tried = [t.rate_rps for t in self.trials]
        if not tried:
            return self.start_rps
        if (again := self.stalled_retry()) is not None:
            return again
        if self.max_trials is not None and len(tried) - self.stall_retries_used() >= self.max_trials:
            return None
        met, broken = self.goodput_rps, self.broken_at_rps
        if met is None:  # nothing held yet: the start again, then down
            if self.retry_broken_low and tried.count(self.start_rps) == 1:
                return self.start_rps
            lower = min(tried) / self.factor
            return lower if lower >= self.min_rps * (1 - 1e-9) else None
        if broken is None:  # nothing broke yet: up
            top = self.max_rps if self.max_rps is not None else math.inf
            if met >= top * (1 - 1e-9) or met >= self.start_rps * self.factor**MAX_RAMP_UP * (1 - 1e-9):
                return None
            return min(met * self.factor, top)
        if self.bisection_steps_used() >= self.steps or broken / met <= RESOLUTION:
            return None
        return math.sqrt(met * broken)

    def describe(self) -> str:
        if self.bound == "below-range":
            return f"below {self.low_rps:.3g} requests/s (the objective broke at every rate tried)"
        if self.bound == "at-least":
            return f"at least {self.goodput_rps:.3g} requests/s (the objective held at every rate tried)"
        return f"{self.goodput_rps:.3g} requests/s (held there; broke at {self.broken_at_rps:.3g})"


@dataclass(frozen=True)
class RampPlan:
    """What the ramp will send: at most `max_trials` trials of `requests` requests, within the budget."""

    start_rps: float
    steps: int = 3
    requests: int = 24  # per trial
    factor: float = RAMP_FACTOR
    max_rps: float | None = None
    max_trials: int = 8
    drain_s: float = 4.0
    seed: int = 0
    workload: str = ""
    start_source: str = ""  # where the start rate came from, in words

    def __post_init__(self) -> None:
        if not (self.start_rps > 0 and math.isfinite(self.start_rps)) or not self.factor > 1:
            raise ValueError("a ramp needs a positive start rate and a factor above 1")
        if self.steps < 0 or self.requests < 1 or self.max_trials < 1:
            raise ValueError("steps must be >= 0, requests and max_trials >= 1")

    def trial_cap_s(self, rate: float) -> float:
        return self.requests / rate * DRAIN_FACTOR + self.drain_s

    @property
    def longest_trial_s(self) -> float:
        return self.trial_cap_s(self.start_rps / self.factor**MAX_RAMP_DOWN)

    def new_search(self) -> RampSearch:
        return RampSearch(
            self.start_rps,
            self.steps,
            self.factor,
            self.max_rps,
            self.max_trials,
            retry_broken_low=True,
            retry_stalled=1,
        )

    def describe(self) -> str:
        what = f" of {self.workload}" if self.workload else ""
        start = f"{self.start_rps:.3g} requests/s" + (f" ({self.start_source})" if self.start_source else "")
        top = f", never above {self.max_rps:.3g}/s" if self.max_rps is not None else ""
        return (
            f"a goodput search from {start}: x{self.factor:g} until the SLO breaks{top} (down /{self.factor:g} "
            f"at most {MAX_RAMP_DOWN} times where the start breaks twice), then {self.steps} bisection steps; at "
            f"most {self.max_trials} trials, each {self.requests} requests{what} at Poisson arrivals (seed "
            f"{self.seed}), each cut after {self.trial_cap_s(self.start_rps):.0f} s at the start rate; a trial "
            "starts only where the budget has room for all of it, and one trial more where one broke while the "
            "client stalled"
        )


def plan_ramp(
    budget: ActiveBudget,
    start_rps: float,
    *,
    requests: int = 24,
    steps: int = 3,
    factor: float = RAMP_FACTOR,
    max_rps: float | None = None,
    drain_s: float = 4.0,
    seed: int = 0,
    workload: str = "",
    start_source: str = "",
) -> RampPlan:
    """The ramp fitted into `budget`: fewer requests per trial until its first two trials (the
    start and one step up) fit, at most MIN_TRIAL_REQUESTS fewer than asked.

    Raises:
        ValueError: not even two trials of MIN_TRIAL_REQUESTS fit (the message says what would).
    """
    if budget.max_rps is not None:
        max_rps = budget.max_rps if max_rps is None else min(max_rps, budget.max_rps)
    if max_rps is not None:
        start_rps = min(start_rps, max_rps)

    def two_trials_s(n: int) -> float:
        p = RampPlan(start_rps, steps, n, factor, max_rps, 1, drain_s)
        return SETUP_RESERVE_S + p.trial_cap_s(start_rps) + p.trial_cap_s(start_rps * factor)

    def fits(n: int) -> bool:
        return 2 * n <= budget.max_requests and two_trials_s(n) <= budget.max_seconds

    n = requests
    while n > MIN_TRIAL_REQUESTS and not fits(n):
        n -= 1
    if not fits(n):
        need_s = two_trials_s(n)
        raise ValueError(
            f"a goodput search needs at least {2 * n} requests and {need_s:.0f} s (two trials of {n} from "
            f"{start_rps:.3g}/s); the budget allows {budget.describe()}"
        )
    most = 2 + MAX_RAMP_UP + MAX_RAMP_DOWN + steps  # the start twice, every step up or down, the bisection
    return RampPlan(
        start_rps,
        steps,
        n,
        factor,
        max_rps,
        min(most, budget.max_requests // n),
        drain_s,
        seed,
        workload,
        start_source,
    )
