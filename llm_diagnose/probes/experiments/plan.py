"""The plan: exactly what each experiment will send, fitted into the budget, printed before sending.

Each experiment has a natural size (enough samples for a median with a usable interval on
a small server) and a floor below which its answer would be noise. `plan_experiments`
scales the natural sizes down to the budget, never below the floors; an experiment that
cannot fit even at its floor is skipped, and the plan says so. The plan's numbers are upper
bounds: the BudgetGuard enforces the budget again at every send, whatever the plan says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.records import ENDPOINT_PATHS, Endpoint

__all__ = [
    "ALL_EXPERIMENTS",
    "DecodePlan",
    "InterferencePlan",
    "HeterogeneityPlan",
    "PrefixPlan",
    "SpecPlan",
    "ExperimentPlan",
    "plan_experiments",
    "describe_plan",
    "QUESTION_OF",
]

ALL_EXPERIMENTS = ("decode", "interference", "heterogeneity", "prefix", "spec")
QUESTION_OF = {"decode": "Q5", "interference": "Q6", "heterogeneity": "Q3", "prefix": "Q2", "spec": "Q5"}
SETUP_RESERVE_S = 2.0  # GET /v1/models, POST /tokenize, scrapes: kept out of the experiments' time
# The one POST /tokenize that sizes prompts in tokens leaves the client like any other request,
# so it takes a slot of the request budget; the experiments share what is left.
SETUP_REQUESTS = 1
DEFAULT_MAX_MODEL_LEN = 2048
MIN_TIME_SHARE = 0.4


@dataclass(frozen=True)
class DecodePlan:
    """Per-token latency at batch 1, then under increasing concurrency (Q5)."""

    batch1_requests: int = 8
    prompt_tokens: int = 32
    output_tokens: int = 64
    concurrency_levels: tuple[int, ...] = (2, 4, 8)
    time_cap_s: float = 8.0
    # Batch-1 requests again after the concurrency levels: the baseline brackets them, so a
    # host or engine that changed speed mid-experiment shows as drift instead of as growth
    # (a shared 2-core host once ran batch 1 five times slower than the levels after it).
    batch1_after_requests: int = 2

    @property
    def requests(self) -> int:
        return (
            self.batch1_requests
            + sum(self.concurrency_levels)
            + (self.batch1_after_requests if self.concurrency_levels else 0)
        )

    def describe(self) -> str:
        levels = ", ".join(str(c) for c in self.concurrency_levels)
        return (
            f"{self.batch1_requests} sequential requests of {self.prompt_tokens} prompt + {self.output_tokens} "
            f"output tokens (batch 1)"
            + (
                f", then {levels} concurrent streams of {self.output_tokens} tokens, then "
                f"{self.batch1_after_requests} at batch 1 again"
                if self.concurrency_levels
                else ""
            )
        )


@dataclass(frozen=True)
class InterferencePlan:
    """Steady decode streams, then long prompts injected at known times (Q6)."""

    streams: int = 4
    stream_prompt_tokens: int = 32
    stream_output_tokens: int = 512
    stream_restarts: int = 2  # a stream that finishes early is restarted at most this often
    baseline_s: float = 2.0
    injection_s: float = 3.0
    inject_every_s: float = 0.4
    prompt_tokens: tuple[int, ...] = (768, 1536)  # alternated: does the stall grow with the prompt?
    # Injections go on past `injection_s` until this many prefills have their token (two per
    # prompt length: a stall growth needs both), while the time cap allows. On a quiet 2-core
    # AVX2 host (float32) a 1536-token prefill beside four streams took 1.3-1.4 s and a 768 one
    # 0.55-0.67 s, four in 3.9 s; a fixed 3 s phase on a slower CI host completed a single one.
    min_prefills: int = 4
    # baseline + injections + room for the last prefill, for a slow engine's extra injections
    # and for a late wake-up of the client on a busy host (the phase is timed from its real start).
    time_cap_s: float = 12.0

    @property
    def injections(self) -> int:
        return max(self.min_prefills, int(self.injection_s / self.inject_every_s))

    @property
    def requests(self) -> int:
        return self.streams * (1 + self.stream_restarts) + self.injections

    def describe(self) -> str:
        lengths = " or ".join(str(n) for n in self.prompt_tokens)
        return (
            f"{self.streams} steady streams ({self.stream_prompt_tokens} prompt, up to {self.stream_output_tokens} "
            f"output tokens, restarted up to {self.stream_restarts}x) for {self.baseline_s:.1f} s alone, then one "
            f"prompt of {lengths} tokens (1 output token) at a time, at most every {self.inject_every_s:g} s, "
            f"for {self.injection_s:.1f} s, or until {self.min_prefills} have their token (up to {self.injections} "
            f"injections)"
        )


@dataclass(frozen=True)
class HeterogeneityPlan:
    """A short probe request beside short peers, then beside long ones (Q3)."""

    peers: int = 3
    rounds: int = 4  # of each kind, interleaved: an interval needs evidence.min_live_samples (3) a side
    alone_rounds: int = 2
    prompt_tokens: int = 32
    short_tokens: int = 16
    long_tokens: int = 384
    time_cap_s: float = 15.0
    # One round of each kind first, not analysed: a server's first requests are slow (transformers
    # serve took 0.37 s for 4 tokens, then 0.04 s), and with a few rounds one slow control decides
    # the interval.
    warmup_rounds: int = 1

    @property
    def requests(self) -> int:
        return self.alone_rounds + 2 * (self.warmup_rounds + self.rounds) * (self.peers + 1)

    def describe(self) -> str:
        return (
            f"a {self.short_tokens}-token probe alone ({self.alone_rounds}x), then rounds beside "
            f"{self.peers} peers of {self.short_tokens} tokens and beside {self.peers} of {self.long_tokens} "
            f"tokens, {self.rounds}x each after {self.warmup_rounds} warm-up round(s) of each, alternating "
            f"({self.prompt_tokens}-token prompts)"
        )


@dataclass(frozen=True)
class PrefixPlan:
    """TTFT and cache hits: a prompt salted per request against a repeated prefix (Q2)."""

    prefix_tokens: int = 1024
    suffix_tokens: int = 16
    fresh_requests: int = 4
    repeated_requests: int = 4  # after one warm-up request that puts the prefix in the cache
    output_tokens: int = 4
    time_cap_s: float = 6.0

    @property
    def requests(self) -> int:
        return self.fresh_requests + 1 + self.repeated_requests

    def describe(self) -> str:
        return (
            f"{self.fresh_requests} prompts of {self.prefix_tokens}+{self.suffix_tokens} tokens salted at the "
            f"start (nothing cacheable), then 1 warm-up and {self.repeated_requests} repeats of one prefix "
            f"salted for this run ({self.output_tokens} output tokens each, one at a time)"
        )


@dataclass(frozen=True)
class SpecPlan:
    """Tokens per second and acceptance with the engine's speculative decoding (Q5)."""

    requests: int = 4
    prompt_tokens: int = 64
    output_tokens: int = 128
    concurrency: int = 1
    time_cap_s: float = 5.0

    def describe(self) -> str:
        return (
            f"{self.requests} requests of {self.prompt_tokens} prompt + {self.output_tokens} output tokens, "
            f"{self.concurrency} at a time, usage in every chunk (tokens per event)"
        )


StepPlan = DecodePlan | InterferencePlan | HeterogeneityPlan | PrefixPlan | SpecPlan
_NATURAL: dict[str, StepPlan] = {
    "decode": DecodePlan(),
    "interference": InterferencePlan(),
    "heterogeneity": HeterogeneityPlan(),
    "prefix": PrefixPlan(),
    "spec": SpecPlan(),
}


@dataclass(frozen=True)
class ExperimentPlan:
    budget: ActiveBudget
    steps: tuple[tuple[str, StepPlan], ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (experiment, why)
    endpoint: Endpoint = "completions"
    max_model_len: int | None = None
    target: str = ""  # redacted URL, for the printout
    model: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def requests(self) -> int:
        return sum(p.requests for _, p in self.steps)

    @property
    def duration_bound_s(self) -> float:
        return min(self.budget.max_seconds, SETUP_RESERVE_S + sum(p.time_cap_s for _, p in self.steps))

    def step(self, name: str) -> StepPlan | None:
        return dict(self.steps).get(name)


# --- fitting -----------------------------------------------------------------------------------
def _fit_lengths(p: StepPlan, max_len: int) -> StepPlan:
    """Shrink token lengths so every request fits the server's context."""
    if isinstance(p, DecodePlan):
        return replace(p, output_tokens=min(p.output_tokens, max_len - p.prompt_tokens - 1))
    if isinstance(p, InterferencePlan):
        longest = max(16, max_len - 8)
        lengths = tuple(sorted({min(n, longest) for n in p.prompt_tokens}))
        if len(lengths) == 1 and lengths[0] > 32:
            lengths = (lengths[0] // 2, lengths[0])
        return replace(
            p,
            prompt_tokens=lengths,
            stream_output_tokens=min(p.stream_output_tokens, max_len - p.stream_prompt_tokens - 1),
        )
    if isinstance(p, HeterogeneityPlan):
        return replace(p, long_tokens=min(p.long_tokens, max_len - p.prompt_tokens - 1))
    if isinstance(p, PrefixPlan):
        room = max_len - p.output_tokens - p.suffix_tokens - 16
        return replace(p, prefix_tokens=max(64, min(p.prefix_tokens, room)))
    return replace(p, output_tokens=min(p.output_tokens, max_len - p.prompt_tokens - 1))


def _shrink(p: StepPlan, f: float) -> StepPlan:
    """Scale request counts by f (< 1), never below each experiment's floor."""

    def n(x: int, floor: int) -> int:
        return max(floor, int(math.floor(x * f)))

    if isinstance(p, DecodePlan):
        allowed, levels = sum(p.concurrency_levels) * f, list[int]()
        for c in p.concurrency_levels:  # keep the lowest levels: the highest cost the most requests
            if levels and sum(levels) + c > allowed:
                break
            levels.append(c)
        return replace(p, batch1_requests=n(p.batch1_requests, 3), concurrency_levels=tuple(levels))
    if isinstance(p, InterferencePlan):
        return replace(
            p,
            streams=n(p.streams, 2),
            stream_restarts=p.stream_restarts if f >= 0.7 else 0,
            injection_s=n(p.injections, 3) * p.inject_every_s,
        )
    if isinstance(p, HeterogeneityPlan):
        return replace(p, rounds=n(p.rounds, 1), alone_rounds=n(p.alone_rounds, 1), peers=max(2, n(p.peers, 2)))
    if isinstance(p, PrefixPlan):
        return replace(p, fresh_requests=n(p.fresh_requests, 2), repeated_requests=n(p.repeated_requests, 2))
    return replace(p, requests=n(p.requests, 2))


def plan_experiments(
    budget: ActiveBudget,
    experiments: tuple[str, ...] = ALL_EXPERIMENTS,
    *,
    max_model_len: int | None = None,
    endpoint: Endpoint = "completions",
    target: str = "",
    model: str = "",
) -> ExperimentPlan:
    """Fit the chosen experiments (in priority order) into `budget`.

    Raises:
        ValueError: an unknown experiment name (the message lists the known ones).
    """
    unknown = [e for e in experiments if e not in _NATURAL]
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(unknown)}; known: {', '.join(ALL_EXPERIMENTS)}")
    max_len = max_model_len or DEFAULT_MAX_MODEL_LEN
    notes = [] if max_model_len else [f"the server's max_model_len is unknown: lengths assume {DEFAULT_MAX_MODEL_LEN}"]
    steps = [(name, _fit_lengths(_NATURAL[name], max_len)) for name in dict.fromkeys(experiments)]
    skipped: list[tuple[str, str]] = []

    # Requests: keep, in priority order, what fits at its floor; then grow all of them
    # together towards their natural sizes as far as the budget allows.
    for_experiments = max(0, budget.max_requests - SETUP_REQUESTS)
    if sum(p.requests for _, p in steps) > for_experiments:
        kept, used = [], 0
        for name, p in steps:
            floor = _shrink(p, 0.0)
            if used + floor.requests <= for_experiments:
                kept.append((name, p))
                used += floor.requests
            else:
                skipped.append(
                    (
                        name,
                        f"needs at least {floor.requests} requests; the budget of "
                        f"{budget.max_requests} has {for_experiments - used} left for it after the set-up request",
                    )
                )
        lo, hi = 0.0, 1.0
        for _ in range(30):  # the largest common scale that fits (request counts grow with it)
            mid = (lo + hi) / 2
            if sum(_shrink(p, mid).requests for _, p in kept) <= for_experiments:
                lo = mid
            else:
                hi = mid
        steps = [(name, _shrink(p, lo)) for name, p in kept]

    # Time: the same way. Under MIN_TIME_SHARE of its natural time an experiment is noise.
    room = budget.max_seconds - SETUP_RESERVE_S
    if sum(p.time_cap_s for _, p in steps) > room:
        timed: list[tuple[str, StepPlan]] = []
        seconds = 0.0
        for name, p in steps:
            need = MIN_TIME_SHARE * p.time_cap_s
            if seconds + need <= room:
                timed.append((name, p))
                seconds += need
            else:
                skipped.append(
                    (
                        name,
                        f"needs about {need:.0f} s; the budget of {budget.max_seconds:g} s leaves "
                        f"{max(0.0, room - seconds):.1f} s for it",
                    )
                )
        f = min(1.0, room / sum(p.time_cap_s for _, p in timed)) if timed else 1.0
        steps = [(name, _scale_time(p, f)) for name, p in timed]
    return ExperimentPlan(budget, tuple(steps), tuple(skipped), endpoint, max_model_len, target, model, tuple(notes))


def _scale_time(p: StepPlan, f: float) -> StepPlan:
    if f >= 1.0:
        return p
    if isinstance(p, InterferencePlan):
        return replace(
            p,
            baseline_s=p.baseline_s * f,
            injection_s=max(p.inject_every_s * 3, p.injection_s * f),
            time_cap_s=p.time_cap_s * f,
        )
    return replace(p, time_cap_s=p.time_cap_s * f)


# --- printing ------------------------------------------------------------------------------------
def describe_plan(plan: ExperimentPlan) -> str:
    """What will be sent, before anything is: counts, lengths, rates, endpoints, the time bound."""
    path = ENDPOINT_PATHS[plan.endpoint]
    who = f" {plan.target}" if plan.target else ""
    model = f" (model {plan.model})" if plan.model else ""
    lines = [
        f"Active probing will send streaming POST {path} requests to{who}{model}:",
        f"  budget: {plan.budget.describe()} - a hard bound: nothing is sent beyond it, and streams still open "
        "at the deadline are cut",
    ]
    for i, (name, p) in enumerate(plan.steps, 1):
        lines.append(
            f"  {i}. {name} ({QUESTION_OF[name]}): {p.describe()}; at most {p.requests} requests, "
            f"at most {p.time_cap_s:.0f} s"
        )
    for name, why in plan.skipped:
        lines.append(f"  - {name} ({QUESTION_OF[name]}) will not run: {why}")
    rate = (
        f"; starts paced to at most {plan.budget.max_rps:g}/s, which may stretch the experiments"
        if plan.budget.max_rps
        else ""
    )
    if plan.steps:
        lines.append(
            f"  in all: at most {min(plan.requests + SETUP_REQUESTS, plan.budget.max_requests)} requests "
            f"(the POST /tokenize below included) within "
            f"{plan.duration_bound_s:.0f} s{rate}"
        )
    else:
        lines.append("  nothing will be sent: no experiment fits the budget")
    lines.append(
        "  also: one POST /tokenize first (to size prompts in tokens; it counts against the budget), "
        "GET /v1/models and, with metrics, GET /metrics before and after each experiment (read-only, as in "
        "passive mode); a request resent (its connection closed before any answer, or the server rejected "
        "an optional field such as ignore_eos by name) takes a budget slot and waits for the rate limit "
        "like any other"
    )
    lines.extend(f"  note: {n}" for n in plan.notes)
    return "\n".join(lines)
