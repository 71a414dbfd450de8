"""The plan: exactly what each experiment will send, sized for the server, printed before sending.

Each step plan below says what one experiment sends: counts, token lengths, phase times and
the deadline it runs under (`time_cap_s`). The sizes come from llm_diagnose.probes.experiments.sizing
(`size_experiments`): from one calibration request's time per token and prefill time per prompt
token, the engine's limits and the budget, each with the reason it was chosen (`why`). The
defaults below are a hand-built plan's (the tests build small fixed plans); a run never uses them
as they are. The plan's numbers are upper bounds: the BudgetGuard enforces the budget again at
every send, whatever the plan says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.records import ENDPOINT_PATHS, Endpoint

__all__ = [
    "ALL_EXPERIMENTS",
    "DecodePlan",
    "InterferencePlan",
    "HeterogeneityPlan",
    "PrefixPlan",
    "SpecPlan",
    "StepPlan",
    "ExperimentPlan",
    "describe_plan",
    "QUESTION_OF",
    "SETUP_REQUESTS",
    "CALIBRATION_REQUESTS",
    "SETUP_RESERVE_S",
]

ALL_EXPERIMENTS = ("decode", "interference", "heterogeneity", "prefix", "spec")
QUESTION_OF = {"decode": "Q5", "interference": "Q6", "heterogeneity": "Q3", "prefix": "Q2", "spec": "Q5"}
SETUP_RESERVE_S = 2.0  # GET /v1/models, POST /tokenize, scrapes: kept out of the experiments' time
# The one POST /tokenize that sizes prompts in tokens leaves the client like any other request,
# so it takes a slot of the request budget; the experiments share what is left.
SETUP_REQUESTS = 1
# The one short streamed request that measures the server's speed before anything is sized.
CALIBRATION_REQUESTS = 1


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
    # Seconds kept at the end for those closing requests, from the measured speed; None (a
    # hand-built plan): a fixed share of the time left (decode.BATCH1_AFTER_TIME_SHARE).
    closing_s: float | None = None
    why: tuple[str, ...] = ()

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
    # The streams' own prefills and first steps are not the baseline: gaps ending this long after
    # the phase started are left out of it (sized from the speed: a few steps and their prefills).
    warmup_s: float = 0.3
    # The step token budget the prompt lengths were set against (None: not known to the plan), and
    # where that figure came from: with one prompt under it and one well over it the stall growth
    # tests whether chunking bounds the stall.
    step_tokens: int | None = None
    step_tokens_source: str = ""
    why: tuple[str, ...] = ()

    @property
    def injections(self) -> int:
        return max(self.min_prefills, int(self.injection_s / self.inject_every_s))

    @property
    def requests(self) -> int:
        return self.streams * (1 + self.stream_restarts) + self.injections

    @property
    def tests_chunking(self) -> bool:
        """One prompt fits a step and one must be chunked: the stall growth says whether chunking bounds it."""
        if self.step_tokens is None or len(self.prompt_tokens) < 2:
            return False
        return min(self.prompt_tokens) < self.step_tokens < max(self.prompt_tokens)

    def describe(self) -> str:
        lengths = " or ".join(str(n) for n in self.prompt_tokens)
        return (
            f"{self.streams} steady streams ({self.stream_prompt_tokens} prompt, up to {self.stream_output_tokens} "
            f"output tokens, restarted up to {self.stream_restarts}x) for {self.baseline_s:.1f} s alone, then one "
            f"prompt of {lengths} tokens (1 output token) at a time, at most every {self.inject_every_s:.2g} s, "
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
    why: tuple[str, ...] = ()

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
    why: tuple[str, ...] = ()

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
    why: tuple[str, ...] = ()

    def describe(self) -> str:
        return (
            f"{self.requests} requests of {self.prompt_tokens} prompt + {self.output_tokens} output tokens, "
            f"{self.concurrency} at a time, usage in every chunk (tokens per event)"
        )


StepPlan = DecodePlan | InterferencePlan | HeterogeneityPlan | PrefixPlan | SpecPlan


@dataclass(frozen=True)
class ExperimentPlan:
    """The steps to run, in order, and what did not fit.

    `provisional`: sized before the server's speed was measured (the plan printed before anything
    is sent); run_experiments sizes it again from its calibration request, within the same budget.
    A plan that is not provisional (a hand-built one) is run exactly as it is, with no calibration.
    `skipped` holds (experiment, why, what would let it run).
    """

    budget: ActiveBudget
    steps: tuple[tuple[str, StepPlan], ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    endpoint: Endpoint = "completions"
    max_model_len: int | None = None
    target: str = ""  # redacted URL, for the printout
    model: str = ""
    notes: tuple[str, ...] = field(default=())
    provisional: bool = False
    sized_from: str = ""  # the speed and limits the sizes came from, in words

    @property
    def requests(self) -> int:
        return sum(p.requests for _, p in self.steps)

    @property
    def duration_bound_s(self) -> float:
        return min(self.budget.max_seconds, SETUP_RESERVE_S + sum(p.time_cap_s for _, p in self.steps))

    def step(self, name: str) -> StepPlan | None:
        return dict(self.steps).get(name)


# --- printing ------------------------------------------------------------------------------------
def describe_plan(plan: ExperimentPlan, *, reasons: bool = False) -> str:
    """What will be sent, before anything is: counts, lengths, rates, endpoints, the time bound.

    `reasons`: also each step's reasons for its sizes (events.jsonl carries them; the console
    printout keeps to what is sent)."""
    path = ENDPOINT_PATHS[plan.endpoint]
    who = f" {plan.target}" if plan.target else ""
    model = f" (model {plan.model})" if plan.model else ""
    lines = [
        f"Active probing will send streaming POST {path} requests to{who}{model}:",
        f"  budget: {plan.budget.describe()} - a hard bound: nothing is sent beyond it, and streams still open "
        "at the deadline are cut",
    ]
    if plan.sized_from:
        lines.append(f"  sized from: {plan.sized_from}")
    for i, (name, p) in enumerate(plan.steps, 1):
        lines.append(
            f"  {i}. {name} ({QUESTION_OF[name]}): {p.describe()}; at most {p.requests} requests, "
            f"at most {p.time_cap_s:.0f} s"
        )
        if reasons:
            lines.extend(f"       why: {w}" for w in p.why)
    # A sized plan's caps are upper bounds: what the steps leave unused may still hold a left-out one
    # (runner.run_experiments sizes it again after them). A hand-built plan runs as it is.
    late = bool(plan.skipped and plan.sized_from and plan.steps)
    unless = ", unless the experiments before it end early enough to leave it room: then it is sized again and run last"
    for name, why, hint in plan.skipped:
        lines.append(
            f"  - {name} ({QUESTION_OF[name]}) will not run: {why}"
            + (f" ({hint})" if hint else "")
            + (unless if late else "")
        )
    rate = (
        f"; starts paced to at most {plan.budget.max_rps:g}/s, which may stretch the experiments"
        if plan.budget.max_rps
        else ""
    )
    extra = SETUP_REQUESTS + (CALIBRATION_REQUESTS if plan.provisional else 0)
    if plan.steps:
        lines.append(
            f"  in all: at most {min(plan.requests + extra, plan.budget.max_requests)} requests "
            f"(the POST /tokenize{' and the calibration request' if plan.provisional else ''} below included) "
            f"within {plan.duration_bound_s:.0f} s{rate}"
            + (
                f"; one left out and run last keeps within the budget's {plan.budget.max_requests} requests and "
                f"{plan.budget.max_seconds:g} s"
                if late
                else ""
            )
        )
    else:
        lines.append("  nothing will be sent: no experiment fits the budget")
    first = "one POST /tokenize first (to size prompts in tokens; it counts against the budget)"
    if plan.provisional:
        first += (
            ", then one short streamed calibration request (it counts too) whose time per token and prefill "
            "time per prompt token size every experiment again, within the same budget: the sizes above assume "
            "the speed stated under 'sized from' and are replaced by those measured (events.jsonl has that plan "
            "and why each size was chosen, 'experiments-sized', and any left-out experiment sized again to run "
            "last, 'experiments-resized')"
        )
    lines.append(
        f"  also: {first}; "
        "GET /v1/models and, with metrics, GET /metrics before and after each experiment (read-only, as in "
        "passive mode); a request resent (its connection closed before any answer, or the server rejected "
        "an optional field such as ignore_eos by name) takes a budget slot and waits for the rate limit "
        "like any other"
    )
    lines.extend(f"  note: {n}" for n in plan.notes)
    return "\n".join(lines)
