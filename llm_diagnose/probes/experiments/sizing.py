"""Experiment sizes from the server they meet: its measured speed, its stated limits, the budget.

`size_experiments(calibration, engine_limits, budget)` is pure. `Calibration` is what one short
streamed request measured before anything else was sent (time per output token at batch 1,
prefill time per prompt token); `EngineLimits` is what the engine states (max_num_seqs, the step
token budget, the KV capacity, max_model_len), each possibly unknown. From them every token
length, count, concurrency ladder and phase deadline is derived, with named constants and the
reason for each size in the step's `why`. Where a limit is unknown the assumption is stated.

The fit into the budget, in order:
1. every experiment's natural size (scale 1) and its floor (scale 0), below which its answer
   would be noise; the decode ladder's top moves geometrically from LADDER_START (scale 0) to
   min(max_num_seqs, 256, ...) (scale 1);
2. in priority order (ALL_EXPERIMENTS), what cannot fit even at its floor is skipped, with the
   budget that would let it run;
3. the largest common scale in [0, 1] at which the rest fits both the requests and the seconds;
4. the decode ladder then climbs further towards that top as far as what is left allows.

The phases' deadlines are upper bounds, and experiments often end well before them: after the
planned steps the runner sizes the skipped ones again by the same fit, in the time and requests
the budget really has left (`spent_s`, `spent_requests`), and runs those that now fit.

A phase's deadline is its planned time at the measured speed times DEADLINE_SLACK, so a slow
server gets longer phases (and, the budget being fixed, fewer requests), never a fixed cap that
only a fast one can meet.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.heterogeneity import PROBE_DELAY_S
from llm_diagnose.probes.experiments.plan import (
    ALL_EXPERIMENTS,
    CALIBRATION_REQUESTS,
    SETUP_REQUESTS,
    SETUP_RESERVE_S,
    DecodePlan,
    ExperimentPlan,
    HeterogeneityPlan,
    InterferencePlan,
    PrefixPlan,
    SpecPlan,
    StepPlan,
)
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.records import Endpoint
from llm_diagnose.probes.results import Result

__all__ = [
    "Calibration",
    "EngineLimits",
    "size_experiments",
    "plan_experiments",
    "DEFAULT_MAX_MODEL_LEN",
    "ASSUMED_STEP_TOKENS",
    "ASSUMED_MAX_NUM_SEQS",
    "MAX_LADDER_STREAMS",
    "DEADLINE_SLACK",
    "STEP_SATURATION_BATCH",
    "SHORT_OF_STEP",
    "LONG_OVER_STEP",
    "MIN_OVER_STEP",
    "CALIBRATION_PROMPT_TOKENS",
    "CALIBRATION_OUTPUT_TOKENS",
    "ladder",
]

# --- what is assumed where nothing says ------------------------------------------------------------
DEFAULT_MAX_MODEL_LEN = 2048  # the smallest context in common use: lengths fit it
# The provisional plan (printed before anything is sent) and a failed calibration assume the
# speed of a 70B model on four GPUs (20-40 ms per token, ~4k prompt tokens a second): the middle
# of the range this tool meets, so neither a fast nor a slow server is planned absurdly.
ASSUMED_TIME_PER_TOKEN_S = 0.025
ASSUMED_PREFILL_S_PER_TOKEN = 0.00025
# vLLM's max_num_batched_tokens for its API server on CPUs and on GPUs under 70 GiB (8192 on
# larger ones), and SGLang's default chunked_prefill_size on small GPUs: the common case.
ASSUMED_STEP_TOKENS = 2048
# vLLM's max_num_seqs on most GPUs; the ladder never climbs past MAX_LADDER_STREAMS anyway.
ASSUMED_MAX_NUM_SEQS = 256
# A decode step of B sequences reads the weights once for B tokens: about B FLOP per weight byte
# (bf16). An H100's ridge point is ~295 FLOP/byte (989 TFLOP/s over 3.35 TB/s), so near 256
# sequences the step stops being memory-bound: the ladder climbs that far, and no further.
MAX_LADDER_STREAMS = 256
# The fastest speed planned for: a calibration that measured a stream arriving whole (all gaps
# ~0, the client read late) must not plan zero-length phases.
FASTEST_TOKEN_S = 0.001

# --- the time model ------------------------------------------------------------------------------
# A phase's deadline is its planned time at the measured speed times this: the speed is one
# request's, and a server that serves other traffic varies (the run's budget stays the bound).
DEADLINE_SLACK = 1.5
# Planning's step time at batch B: t * (1 + (B - 1) / STEP_SATURATION_BATCH). A memory-bound GPU
# step grows little with B; a CPU step grows nearly linearly (vLLM CPU: ~2x by 8-16 streams).
# 32 plans a step of 33 sequences at twice batch 1's: generous for a GPU, short for a CPU, whose
# levels are then cut at their share of the time with the gaps they had (decode.run_decode).
STEP_SATURATION_BATCH = 32
SCRAPE_S = 0.25  # one settled /metrics scrape: two reads 50 ms apart, more while others move the counters
# What a phase costs whatever the speed: connections, the client's late wake-ups on a busy host.
PHASE_FIXED_S = 1.0

# --- the calibration request ---------------------------------------------------------------------
# 512 prompt tokens: long enough that the prefill is more than the request's fixed cost, short
# enough for any context; 24 output tokens: 23 gaps, a mean step time within a few percent.
CALIBRATION_PROMPT_TOKENS = 512
CALIBRATION_OUTPUT_TOKENS = 24

# --- decode (Q5) ---------------------------------------------------------------------------------
DECODE_PROMPT_TOKENS = 32  # short: a stream's time is its decode
DECODE_STREAM_S = 1.0  # a stream's output is what decodes in about this long ...
DECODE_MIN_OUTPUT = 16  # ... but at least 15 gaps a stream (decode.MIN_GAPS is 10) ...
DECODE_MAX_OUTPUT = 64  # ... and at most 63 (more gaps of one stream add little)
BATCH1_GAPS = 120  # batch-1 gaps wanted: a p99 needs about 100
BATCH1_MIN_REQUESTS = 3  # the floor: three streams, so one odd stream does not decide the median
BATCH1_MAX_REQUESTS = 8
BATCH1_AFTER_REQUESTS = 2  # the closing bracket that shows drift (plan.DecodePlan)
LADDER_START = 2
# Each level 4x the last (2, 8, 32, 128) then the top: the growth curve over two orders of
# magnitude in few requests (doubling to 256 would cost 510 requests, most of a default budget).
LADDER_FACTOR = 4

# --- interference (Q6) ---------------------------------------------------------------------------
INTERFERENCE_STREAMS = 4  # four gaps a step: enough baseline in a second, little of max_num_seqs taken
STREAM_PROMPT_TOKENS = 32
# The short prompt: 90% of the step budget, so it is prefilled in one step beside the streams'
# decode tokens. The long one: LONG_OVER_STEP budgets, so the engine must chunk it. Chunked, each
# step holds at most one budget of prompt, so the stall grows ~1/0.9 = 1.1x from short to long;
# unchunked, it grows with the prompt, 3/0.9 = 3.3x. BOUNDED_GROWTH (1.4) sits between.
SHORT_OF_STEP = 0.9
LONG_OVER_STEP = 3.0
# Below this many step budgets (the context, the KV cache or the time would not allow more) the
# long prompt is not "well above" the budget: unchunked growth 1.5/0.9 = 1.7 still clears 1.4.
MIN_OVER_STEP = 1.5
# One long prefill may take at most this share of the experiments' time: four injections of it
# then take a third of the budget at most, and the others still run.
INJECT_PREFILL_SHARE = 0.08
BASELINE_MIN_S = 1.0
BASELINE_STEPS = 20  # 20 steps of 4 streams: 80 baseline gaps (interference.MIN_BASELINE_GAPS is 10)
WARMUP_STEPS = 3  # the streams' first steps after their prefills are not the baseline
WARMUP_MIN_S = 0.3
RECOVER_STEPS = 5  # decode steps between two injections, so the streams' gaps between windows are normal
INJECT_EVERY_MIN_S = 0.4
INJECTIONS = 6  # three per prompt length: a median stall per length; 3-7 clusters for the interval
MIN_INJECTIONS = 2  # one per length: the stall growth needs both
STREAM_RESTARTS = 2

# --- heterogeneity (Q3) --------------------------------------------------------------------------
HET_PEERS = 3
HET_PROMPT_TOKENS = 32
HET_SHORT_TOKENS = 16
HET_LONG_S = 2.0  # long peers decode for about this long ...
HET_MIN_LONG = 128  # ... at least 8x the probe: a static batcher's slowdown (~8x) clears q3's 2.0 well
HET_MAX_LONG = 384
# A round is planned at this many times the probe's own time beside its peers, and gets that
# times DEADLINE_SLACK (3x) of the deadline: a probe of a static batcher still waiting when its
# round ends is a lower bound of about 3x its time beside short peers, past q3's 2.0.
HET_WAIT_FACTOR = 2.0
# ... and never less than this: a client on a busy 2-core host has woken up half a second late,
# and a round that short would cut probes for the client's sake, not the server's.
HET_MIN_ROUND_S = 1.0
HET_ROUNDS = 4
HET_ALONE_ROUNDS = 2
HET_WARMUP_ROUNDS = 1

# --- prefix (Q2) ---------------------------------------------------------------------------------
# 1024 tokens: 8 blocks of vLLM CPU's 128, 64 of a GPU's 16; a hit rate in whole blocks reads
# within 2%. Shorter where its prefill would take over PREFIX_PREFILL_MAX_S (never under 256).
PREFIX_TOKENS = 1024
PREFIX_MIN_TOKENS = 256
PREFIX_PREFILL_MAX_S = 1.0
PREFIX_SUFFIX_TOKENS = 16
PREFIX_OUTPUT_TOKENS = 4
PREFIX_REQUESTS = 4  # fresh and repeated each; floor 2

# --- speculative decoding (Q5) -------------------------------------------------------------------
SPEC_PROMPT_TOKENS = 64
SPEC_STREAM_S = 1.0
SPEC_MIN_OUTPUT = 24  # tokens per event needs events: 23 of them per stream at least
SPEC_MAX_OUTPUT = 128
SPEC_REQUESTS = 4  # floor 2


@dataclass(frozen=True)
class Calibration:
    """The server's speed, from one short streamed request (or assumed, and said so).

    `time_per_token_s`: the stream's mean gap between tokens at batch 1 (a decode step);
    `prefill_s_per_token`: (TTFT - one step) / prompt tokens, an upper bound (the request's fixed
    cost is in it); `spent_s`: what the budget's clock had run when sizing started (set-up and the
    calibration itself), or None for an estimate of the calibration request at this speed.
    """

    time_per_token_s: float
    prefill_s_per_token: float
    source: str
    measured: bool = True
    spent_s: float | None = None

    @classmethod
    def assumed(cls, why: str) -> Calibration:
        return cls(
            ASSUMED_TIME_PER_TOKEN_S,
            ASSUMED_PREFILL_S_PER_TOKEN,
            f"assumed, the speed of a 70B model on four GPUs: {why}",
            measured=False,
        )

    @property
    def step_s(self) -> float:
        return max(FASTEST_TOKEN_S, self.time_per_token_s)

    def describe(self) -> str:
        return (
            f"{self.time_per_token_s * 1e3:.3g} ms per output token, {self.prefill_s_per_token * 1e3:.3g} ms "
            f"per prompt token ({self.source})"
        )


@dataclass(frozen=True)
class EngineLimits:
    """What the engine states about its limits; None where it does not say.

    `step_tokens`: the tokens one engine step may take (vLLM max_num_batched_tokens, SGLang
    chunked_prefill_size); `largest_step_seen`: the fullest step vllm:iteration_tokens_total has
    counted, a lower bound on it; `sources` says where each figure came from.
    """

    max_num_seqs: int | None = None
    step_tokens: int | None = None
    kv_capacity_tokens: int | None = None
    max_model_len: int | None = None
    largest_step_seen: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_evidence(cls, items: Mapping[str, Result], max_model_len: int | None = None) -> EngineLimits:
        """The limits evidence items carry (discovery's facts, a scrape's passive evidence)."""
        found: dict[str, int] = {}
        sources: dict[str, str] = {}
        for attr, key in (
            ("max_num_seqs", Q.MAX_NUM_SEQS),
            ("step_tokens", Q.MAX_NUM_BATCHED_TOKENS),
            ("kv_capacity_tokens", Q.KV_CAPACITY_TOKENS),
            ("max_model_len", Q.MAX_MODEL_LEN),
            ("largest_step_seen", Q.STEP_TOKENS_MAX),
        ):
            item = items.get(key)
            value = getattr(item, "value", None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
                found[attr] = int(value)
                prov = getattr(item, "provenance", None)
                sources[attr] = f"{getattr(prov, 'method', 'evidence')} {key}".strip()
        if max_model_len and "max_model_len" not in found:
            found["max_model_len"] = max_model_len
            sources["max_model_len"] = "GET /v1/models"
        return cls(**found, sources=sources)


@dataclass(frozen=True)
class _Server:
    """The figures sizing works from: measured, stated, or assumed (with the note saying so)."""

    t: float  # seconds per output token at batch 1
    p: float  # seconds per prompt token
    step_tokens: int
    step_source: str
    max_num_seqs: int
    max_model_len: int
    kv_tokens: int | None
    room_s: float
    notes: tuple[str, ...]

    def step_s(self, batch: int) -> float:
        return self.t * (1 + (batch - 1) / STEP_SATURATION_BATCH)

    def stream_s(self, prompt: int, output: int, batch: int = 1) -> float:
        """Planned time of one stream: its prefill, then its output at the step time of `batch`."""
        return prompt * self.p + output * self.step_s(batch)

    def prefill_s(self, tokens: int, batch: int = 1) -> float:
        """A prompt's prefill beside `batch` streams: its tokens, and one step per step budget it spans."""
        return tokens * self.p + math.ceil(tokens / self.step_tokens) * self.step_s(batch)

    def tokens_in(self, seconds: float, batch: int = 1) -> int:
        """How many tokens one stream decodes in `seconds` at the step time of `batch`."""
        return int(seconds / self.step_s(batch))


def _resolve(cal: Calibration, lim: EngineLimits, room_s: float) -> _Server:
    notes: list[str] = []
    if not cal.measured:
        notes.append(f"speed {cal.describe()}")
    if lim.step_tokens:
        step, source = lim.step_tokens, f"stated ({lim.sources.get('step_tokens', 'server')})"
    elif lim.largest_step_seen and lim.largest_step_seen > ASSUMED_STEP_TOKENS:
        step = lim.largest_step_seen
        source = f"at least the fullest step vllm:iteration_tokens_total counted ({step} tokens)"
        notes.append(f"the step token budget is not stated: {source} is used")
    else:
        step, source = ASSUMED_STEP_TOKENS, f"assumed {ASSUMED_STEP_TOKENS} (vLLM's default)"
        notes.append(
            f"the step token budget (max_num_batched_tokens) is not stated: {ASSUMED_STEP_TOKENS} assumed, vLLM's "
            "default for its API server; the interference prompts are set against it (VLLM_SERVER_DEV_MODE=1 "
            "exposes it)"
        )
    seqs = lim.max_num_seqs or ASSUMED_MAX_NUM_SEQS
    if not lim.max_num_seqs:
        notes.append(
            f"max_num_seqs is not stated: up to {ASSUMED_MAX_NUM_SEQS} assumed; streams past the real cap wait "
            "in the queue, and the top concurrency level measures the cap's batch"
        )
    max_len = lim.max_model_len or DEFAULT_MAX_MODEL_LEN
    if not lim.max_model_len:
        notes.append(f"the server's max_model_len is unknown: lengths assume {DEFAULT_MAX_MODEL_LEN}")
    if not lim.kv_capacity_tokens:
        notes.append("the KV capacity is unknown: the sizes assume it holds them")
    p = max(0.0, cal.prefill_s_per_token)
    return _Server(
        cal.step_s, p, max(1, step), source, max(2, seqs), max_len, lim.kv_capacity_tokens, room_s, tuple(notes)
    )


def _deadline(planned_s: float, scrapes: int) -> float:
    """A phase's deadline: its planned time with slack, its settled scrapes, its fixed cost."""
    return planned_s * DEADLINE_SLACK + scrapes * SCRAPE_S + PHASE_FIXED_S


def _deadline_why(cap: float, planned_s: float) -> str:
    return (
        f"deadline {_s(cap)} s: {_s(planned_s)} s planned at the measured speed x {DEADLINE_SLACK:g}, with its "
        f"scrapes and {PHASE_FIXED_S:g} s of fixed cost"
    )


def _s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds < 10 else f"{seconds:.0f}"


def _clip(x: float, low: int, high: int) -> int:
    return int(max(low, min(high, x)))


def _lerp(floor: int, natural: int, scale: float) -> int:
    """floor at scale 0, natural at 1, never decreasing in between."""
    return floor + int(math.floor((natural - floor) * scale + 1e-9)) if natural > floor else natural


def ladder(top: int) -> tuple[int, ...]:
    """The concurrency levels up to `top`: LADDER_START, then each LADDER_FACTOR times the last, then top."""
    levels = []
    c = LADDER_START
    while c < top:
        levels.append(c)
        c *= LADDER_FACTOR
    return (*levels, max(top, LADDER_START))


# --- one builder per experiment: its plan at a scale in [0, 1] -------------------------------------
def _decode_output(s: _Server) -> int:
    output = _clip(s.tokens_in(DECODE_STREAM_S), DECODE_MIN_OUTPUT, DECODE_MAX_OUTPUT)
    return max(1, min(output, s.max_model_len - DECODE_PROMPT_TOKENS - 1))


def _decode(s: _Server, scale: float, top: int | None = None) -> DecodePlan:
    """At `scale` the ladder's top is LADDER_START x (the engine's top / LADDER_START) ** scale:
    it shrinks with the others, geometrically; `top` sets it instead."""
    prompt = DECODE_PROMPT_TOKENS
    output = _decode_output(s)
    if top is None:
        allowed = _ladder_top(s)[0]
        top = max(LADDER_START, int(LADDER_START * (allowed / LADDER_START) ** scale + 1e-9))
    natural = _clip(math.ceil(BATCH1_GAPS / max(1, output - 1)), BATCH1_MIN_REQUESTS, BATCH1_MAX_REQUESTS)
    batch1 = _lerp(BATCH1_MIN_REQUESTS, natural, scale)
    levels = ladder(top)
    one = s.stream_s(prompt, output)
    planned = (batch1 + BATCH1_AFTER_REQUESTS) * one + sum(c * prompt * s.p + output * s.step_s(c) for c in levels)
    cap = _deadline(planned, 3)  # scrapes: _attempt's first, and two around batch 1
    why = (
        f"{output} output tokens: what decodes in about {DECODE_STREAM_S:g} s at {s.t * 1e3:.3g} ms per token, "
        f"within [{DECODE_MIN_OUTPUT}, {DECODE_MAX_OUTPUT}]",
        f"{batch1} batch-1 requests: about {BATCH1_GAPS} gaps wanted for a p99, at least {BATCH1_MIN_REQUESTS}",
        f"levels {', '.join(map(str, levels))}: x{LADDER_FACTOR} from {LADDER_START} towards min(max_num_seqs "
        f"{s.max_num_seqs}, {MAX_LADDER_STREAMS}, the step budget {s.step_tokens}, the KV cache), as far as the "
        "budget allows",
        _deadline_why(cap, planned)
        + f" (a step of B streams planned at {s.t * 1e3:.3g} ms x (1 + (B - 1)/{STEP_SATURATION_BATCH})); the "
        f"{BATCH1_AFTER_REQUESTS} closing batch-1 requests' time is kept at its end",
    )
    return DecodePlan(
        batch1_requests=batch1,
        prompt_tokens=prompt,
        output_tokens=output,
        concurrency_levels=levels,
        time_cap_s=cap,
        batch1_after_requests=BATCH1_AFTER_REQUESTS,
        closing_s=BATCH1_AFTER_REQUESTS * one * DEADLINE_SLACK,
        why=why,
    )


def _ladder_top(s: _Server) -> tuple[int, str]:
    """The highest concurrency the engine allows for decode streams, and what set it."""
    prompt = DECODE_PROMPT_TOKENS
    output = _decode_output(s)
    caps = {
        f"max_num_seqs {s.max_num_seqs}": s.max_num_seqs,
        f"{MAX_LADDER_STREAMS}, where a step turns compute-bound": MAX_LADDER_STREAMS,
        f"the step budget {s.step_tokens} (one token per stream a step)": s.step_tokens,
    }
    if s.kv_tokens:
        caps[f"the KV cache ({s.kv_tokens} tokens)"] = s.kv_tokens // (prompt + output)
    what = min(caps, key=lambda k: caps[k])
    return max(LADDER_START, caps[what]), what


def _lengths(s: _Server, streams: int) -> tuple[tuple[int, int], tuple[str, ...]]:
    """The two injected prompt lengths (short, long) and why."""
    step = s.step_tokens
    cap_time = int(INJECT_PREFILL_SHARE * s.room_s / s.p) if s.p > 0 else 1 << 30
    # 8 tokens short of the context: room for the one output token and a text prompt's estimate.
    caps = {"max_model_len": s.max_model_len - 8, f"{INJECT_PREFILL_SHARE:.0%} of the time for one prefill": cap_time}
    if s.kv_tokens:
        caps["half the KV cache"] = s.kv_tokens // 2
    limit = min(caps, key=lambda k: caps[k])
    longest = max(32, caps[limit])
    short = min(int(SHORT_OF_STEP * step), step - streams - 1, longest)
    long_ = min(int(LONG_OVER_STEP * step), longest)
    if long_ >= MIN_OVER_STEP * step and 0 < short < step:
        return (short, long_), (
            f"prompts of {short} and {long_} tokens: {SHORT_OF_STEP:.0%} of the step budget ({step} tokens, "
            f"{s.step_source}), prefilled in one step, and "
            + (
                f"{LONG_OVER_STEP:g} budgets, which the engine must chunk"
                if long_ == int(LONG_OVER_STEP * step)
                else f"{long_ / step:.1f} budgets ({limit} allows no more), which the engine must chunk"
            )
            + ": the stall growth tests whether chunking bounds the stall",
        )
    # No prompt well above the budget: both stay within one step (one just over it would be chunked
    # into a full step and a scrap, and its stall would grow against a short one without telling
    # chunked from unchunked), and the growth says how a one-step prefill's stall scales.
    within = max(32, min(long_, step - streams - 1))
    half = max(16, within // 2)
    return (half, within), (
        f"prompts of {half} and {within} tokens: {limit} allows no prompt of {MIN_OVER_STEP:g} step budgets "
        f"({int(MIN_OVER_STEP * step)} tokens, budget {step}: {s.step_source}), so whether chunking bounds the "
        "stall is not tested; both fit one step, and the growth says how a prefill's stall scales with its prompt",
    )


def _interference(s: _Server, scale: float) -> InterferencePlan:
    streams = _lerp(2, min(INTERFERENCE_STREAMS, max(2, s.max_num_seqs - 1)), scale)
    (short, long_), why_lengths = _lengths(s, streams)
    step = s.step_s(streams)
    warmup = max(WARMUP_MIN_S, streams * STREAM_PROMPT_TOKENS * s.p + WARMUP_STEPS * step)
    baseline = max(BASELINE_MIN_S, warmup + BASELINE_STEPS * step)
    prefill = (s.prefill_s(short, streams) + s.prefill_s(long_, streams)) / 2
    every = max(INJECT_EVERY_MIN_S, prefill + RECOVER_STEPS * step)  # due to due: the prefill, then recovery
    injections = _lerp(MIN_INJECTIONS, INJECTIONS, scale)
    injection_s = injections * every
    planned = baseline + injection_s  # each injection's slot holds its prefill: the last one included
    room_out = s.max_model_len - STREAM_PROMPT_TOKENS - 1
    if s.kv_tokens:
        room_out = min(room_out, (s.kv_tokens - long_) // streams - STREAM_PROMPT_TOKENS)
    output = max(16, min(room_out, s.tokens_in(baseline + injection_s, streams) + 1))
    return InterferencePlan(
        streams=streams,
        stream_prompt_tokens=STREAM_PROMPT_TOKENS,
        stream_output_tokens=output,
        stream_restarts=STREAM_RESTARTS,
        baseline_s=baseline,
        injection_s=injection_s,
        inject_every_s=every,
        prompt_tokens=(short, long_),
        min_prefills=injections,
        time_cap_s=_deadline(planned, 1),
        warmup_s=warmup,
        step_tokens=s.step_tokens,
        step_tokens_source=s.step_source,
        why=(
            *why_lengths,
            f"{injections} injections, one every {_s(every)} s (a prefill planned at {_s(prefill)} s, then "
            f"{RECOVER_STEPS} steps for the streams to recover): {INJECTIONS // 2} per length wanted, 1 at least",
            f"baseline {_s(baseline)} s: {BASELINE_STEPS} steps of {streams} streams after {_s(warmup)} s of warm-up",
            f"streams of {output} output tokens: enough to run through the phase (restarted up to "
            f"{STREAM_RESTARTS}x), within the context and the KV cache",
            _deadline_why(_deadline(planned, 1), planned),
        ),
    )


def _heterogeneity(s: _Server, scale: float) -> HeterogeneityPlan:
    peers = _lerp(2, min(HET_PEERS, max(2, s.max_num_seqs - 1)), scale)
    long_ = _clip(s.tokens_in(HET_LONG_S, peers + 1), HET_MIN_LONG, HET_MAX_LONG)
    long_ = max(HET_SHORT_TOKENS + 1, min(long_, s.max_model_len - HET_PROMPT_TOKENS - 1))
    if s.kv_tokens:
        long_ = max(HET_SHORT_TOKENS + 1, min(long_, s.kv_tokens // (peers + 1) - HET_PROMPT_TOKENS))
    rounds = _lerp(1, HET_ROUNDS, scale)
    alone = _lerp(1, HET_ALONE_ROUNDS, scale)
    probe = s.stream_s(HET_PROMPT_TOKENS, HET_SHORT_TOKENS, peers + 1) + peers * HET_PROMPT_TOKENS * s.p
    round_s = max(HET_MIN_ROUND_S, HET_WAIT_FACTOR * probe + PROBE_DELAY_S)
    planned = alone * s.stream_s(HET_PROMPT_TOKENS, HET_SHORT_TOKENS) + 2 * (HET_WARMUP_ROUNDS + rounds) * round_s
    return HeterogeneityPlan(
        peers=peers,
        rounds=rounds,
        alone_rounds=alone,
        prompt_tokens=HET_PROMPT_TOKENS,
        short_tokens=HET_SHORT_TOKENS,
        long_tokens=long_,
        time_cap_s=_deadline(planned, 1),
        warmup_rounds=HET_WARMUP_ROUNDS,
        why=(
            f"long peers of {long_} tokens: about {HET_LONG_S:g} s of decode, within [{HET_MIN_LONG}, "
            f"{HET_MAX_LONG}] (at least {HET_MIN_LONG // HET_SHORT_TOKENS}x the {HET_SHORT_TOKENS}-token probe)",
            f"rounds of about {_s(round_s)} s: {HET_WAIT_FACTOR:g}x the probe's planned {_s(probe)} s (at least "
            f"{HET_MIN_ROUND_S:g} s), so a probe still waiting for long peers is a lower bound past q3's 2x",
            f"{rounds} rounds of each kind ({HET_ROUNDS} wanted, 1 at least), {alone} alone",
            _deadline_why(_deadline(planned, 1), planned),
        ),
    )


def _prefix(s: _Server, scale: float) -> PrefixPlan:
    room = s.max_model_len - PREFIX_OUTPUT_TOKENS - PREFIX_SUFFIX_TOKENS - 16  # 16: the salt and its separator
    by_time = int(PREFIX_PREFILL_MAX_S / s.p) if s.p > 0 else PREFIX_TOKENS
    prefix = max(64, min(PREFIX_TOKENS, room, max(PREFIX_MIN_TOKENS, by_time)))
    fresh = repeated = _lerp(2, PREFIX_REQUESTS, scale)
    one = s.stream_s(prefix + PREFIX_SUFFIX_TOKENS, PREFIX_OUTPUT_TOKENS)
    planned = (fresh + 1 + repeated) * one
    return PrefixPlan(
        prefix_tokens=prefix,
        suffix_tokens=PREFIX_SUFFIX_TOKENS,
        fresh_requests=fresh,
        repeated_requests=repeated,
        output_tokens=PREFIX_OUTPUT_TOKENS,
        time_cap_s=_deadline(planned, 5),
        why=(
            f"a {prefix}-token prefix: {PREFIX_TOKENS} wanted (whole cache blocks), within the context and "
            f"{PREFIX_PREFILL_MAX_S:g} s of prefill",
            f"{fresh} salted and {repeated} repeated requests ({PREFIX_REQUESTS} each wanted, 2 at least)",
            _deadline_why(_deadline(planned, 5), planned),
        ),
    )


def _spec(s: _Server, scale: float) -> SpecPlan:
    output = _clip(s.tokens_in(SPEC_STREAM_S), SPEC_MIN_OUTPUT, SPEC_MAX_OUTPUT)
    output = max(1, min(output, s.max_model_len - SPEC_PROMPT_TOKENS - 1))
    requests = _lerp(2, SPEC_REQUESTS, scale)
    planned = requests * s.stream_s(SPEC_PROMPT_TOKENS, output)
    return SpecPlan(
        requests=requests,
        prompt_tokens=SPEC_PROMPT_TOKENS,
        output_tokens=output,
        concurrency=1,
        time_cap_s=_deadline(planned, 3),
        why=(
            f"{output} output tokens: about {SPEC_STREAM_S:g} s of decode, within [{SPEC_MIN_OUTPUT}, "
            f"{SPEC_MAX_OUTPUT}]",
            f"{requests} requests ({SPEC_REQUESTS} wanted, 2 at least)",
            _deadline_why(_deadline(planned, 3), planned),
        ),
    )


_BUILDERS: dict[str, Callable[[_Server, float], StepPlan]] = {
    "decode": _decode,
    "interference": _interference,
    "heterogeneity": _heterogeneity,
    "prefix": _prefix,
    "spec": _spec,
}


# --- the fit ---------------------------------------------------------------------------------------
def _fits(steps: list[StepPlan], requests: int, seconds: float) -> bool:
    return sum(p.requests for p in steps) <= requests and sum(p.time_cap_s for p in steps) <= seconds


def _keep(s: _Server, room_requests: int, room_s: float, names: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """In priority order, the experiments that fit at their floors, and why each other one does not."""
    kept: list[str] = []
    skipped: list[tuple[str, str]] = []
    used_requests, used_s = 0, 0.0
    for name in names:
        floor = _BUILDERS[name](s, 0.0)
        if used_requests + floor.requests > room_requests:
            skipped.append(
                (
                    name,
                    f"needs at least {floor.requests} requests; the budget has {room_requests - used_requests} left "
                    "for it after the set-up and calibration requests and the experiments before it",
                )
            )
        elif used_s + floor.time_cap_s > room_s:
            skipped.append(
                (
                    name,
                    f"needs about {floor.time_cap_s:.0f} s at {s.t * 1e3:.3g} ms per token; the budget leaves "
                    f"{max(0.0, room_s - used_s):.1f} s for it after the set-up, the calibration and the experiments "
                    "before it",
                )
            )
        else:
            kept.append(name)
            used_requests += floor.requests
            used_s += floor.time_cap_s
    return kept, skipped


MAX_HINT_SECONDS = 24 * 3600  # a hint past a day is no hint: the experiment cannot run against this server
MAX_HINT_REQUESTS = 100_000
# The hint's search downwards takes at most this many steps (each sizes the server again, ~0.4 ms);
# one that runs out stops where it is, and its hint is true, if perhaps not the least.
MAX_HINT_STEPS = 100
ROUNDING_S = 1e-9  # seconds added in another order than _keep's may differ in their last bits


@dataclass(frozen=True)
class _Fit:
    """The fit at one budget: the experiments it keeps, each one's floor as the fit counts it (requests,
    deadline) in priority order, and the room it fits them in (requests, seconds)."""

    kept: tuple[str, ...]
    floors: Mapping[str, tuple[int, float]]
    room: tuple[int, float]


def _fit(s: _Server, room_requests: int, room_s: float, names: list[str]) -> _Fit:
    floors = {n: (p.requests, p.time_cap_s) for n, p in ((n, _BUILDERS[n](s, 0.0)) for n in names)}
    return _Fit(tuple(_keep(s, room_requests, room_s, names)[0]), floors, (room_requests, room_s))


def _kept_between(name: str, lo: _Fit, hi: _Fit) -> bool:
    """Whether every budget from `lo`'s to `hi`'s (at least the one, at most the other in both bounds)
    keeps `name`, argued from the two fits.

    Neither a floor (test_a_floor_never_shrinks_as_the_budget_grows) nor the room shrinks as the budget
    grows. Take what `lo` keeps up to `name`, `name` among them. At a budget between, in _keep's order:
    each of those fits if all of them at `hi`'s floors fit `lo`'s room; each other one is left out if
    at `lo`'s floor, after those before it at theirs, it overflows `hi`'s room in one bound. So the
    same ones are kept, one after the other, `name` too.
    """
    if name not in lo.kept:
        return False
    order = list(lo.floors)
    through = order[: order.index(name) + 1]
    kept = set(lo.kept)
    need_requests = sum(hi.floors[n][0] for n in through if n in kept)
    need_s = sum(hi.floors[n][1] for n in through if n in kept)
    if need_requests > lo.room[0] or need_s > lo.room[1] - ROUNDING_S:
        return False
    used_requests, used_s = 0, 0.0
    for n in through:
        requests, seconds = lo.floors[n]
        if n in kept:
            used_requests, used_s = used_requests + requests, used_s + seconds
        elif used_requests + requests <= hi.room[0] and used_s + seconds <= hi.room[1] + ROUNDING_S:
            return False  # it may fit at some budget between, and take the room
    return True


def _least(low: int, high: int, ok: Callable[[int], bool]) -> int:
    """The least value in [low, high] where `ok` holds, `ok` holding at `high` and at every value above
    one where it holds: steps doubling from `low` (a hint is most often near the budget), then halving."""
    bad, good, step = low - 1, high, 1  # bad: the largest value known to fail (none yet)
    while bad + step < good:
        if ok(bad + step):
            good = bad + step
            break
        bad, step = bad + step, step * 2
    while good - bad > 1:
        mid = (bad + good) // 2
        bad, good = (bad, mid) if ok(mid) else (mid, good)
    return good


def _least_from(low: int, high: int, kept_between: Callable[[int, int], bool]) -> int:
    """The least value in [low, high] from which every value up to `high` keeps an experiment, `high`
    keeping it; `kept_between(a, b)`: every value from a to b does, as _kept_between argues.

    First the least from which it is argued up to `high` (where that holds, it holds above); then
    down in steps that double while each is argued and halve when not; one value that cannot be
    argued from the one above (what is kept before it changes there) is argued alone.
    """
    least = _least(low, high, lambda v: kept_between(v, high))
    step = 1
    for _ in range(MAX_HINT_STEPS):
        if least <= low:
            break
        down = max(low, least - step)
        if kept_between(down, least):
            least, step = down, step * 2
        elif step > 1:
            step //= 2
        elif kept_between(down, down):
            least = down
        else:
            break
    return least


def _least_one(name: str, budget: ActiveBudget, bound: str, fit: Callable[[ActiveBudget], _Fit]) -> int | None:
    """The least value of one bound (`max_seconds`, `max_requests`) from which every larger one, the
    other as it is, keeps `name`; None where the largest (a day, MAX_HINT_REQUESTS) leaves it out."""
    low = math.ceil(getattr(budget, bound))
    high = max(low, MAX_HINT_SECONDS if bound == "max_seconds" else MAX_HINT_REQUESTS)

    def at(v: int) -> _Fit:
        return fit(replace(budget, **{bound: v}))

    if name not in at(high).kept:
        return None
    return _least_from(low, high, lambda a, b: _kept_between(name, at(a), at(b)))


def _least_budget(name: str, budget: ActiveBudget, fit: Callable[[ActiveBudget], _Fit]) -> str:
    """What to raise so that `name` runs, every experiment before it keeping its floor: found by sizing
    the same server again with larger budgets (`fit`), so the figure is the one that works.

    A larger budget does not always keep an experiment: at 55 ms a token spec fits at 51-56 s, not at
    57-62 s (prefix, before it, then fits at its floor and takes the time) and again from 63 s. The
    hint is the least budget from which every larger one, in whole seconds or requests up to a day or
    MAX_HINT_REQUESTS, keeps it: 63 there.
    """
    seconds = _least_one(name, budget, "max_seconds", fit)
    if seconds is not None:
        return f"raise --budget-seconds to at least {seconds}"
    requests = _least_one(name, budget, "max_requests", fit)
    if requests is not None:
        return f"raise --budget-requests to at least {requests}"
    low_s, low_n = math.ceil(budget.max_seconds), budget.max_requests
    top = replace(budget, max_requests=max(MAX_HINT_REQUESTS, low_n), max_seconds=max(MAX_HINT_SECONDS, low_s))
    if name not in fit(top).kept:
        return f"no budget up to {MAX_HINT_REQUESTS} requests and a day lets it run against this server"
    # Both: every budget with at least these requests and at least these seconds keeps it.
    requests = _least(
        low_n, top.max_requests, lambda n: _kept_between(name, fit(replace(top, max_requests=n)), fit(top))
    )
    seconds = _least_from(
        low_s,
        int(top.max_seconds),
        lambda a, b: _kept_between(
            name, fit(replace(top, max_requests=requests, max_seconds=a)), fit(replace(top, max_seconds=b))
        ),
    )
    return f"raise --budget-requests to at least {requests} and --budget-seconds to at least {seconds}"


def size_experiments(
    calibration: Calibration,
    engine_limits: EngineLimits,
    budget: ActiveBudget,
    experiments: tuple[str, ...] = ALL_EXPERIMENTS,
    *,
    spent_requests: int = SETUP_REQUESTS + CALIBRATION_REQUESTS,
    spent_s: float | None = None,
    endpoint: Endpoint = "completions",
    target: str = "",
    model: str = "",
    provisional: bool = False,
    hints: bool = True,
) -> ExperimentPlan:
    """The chosen experiments (in priority order) sized for this server and fitted into `budget`.

    `hints`: give each left-out experiment the budget that would hold it (sizing again at larger
    budgets: the costly part); False where the caller keeps hints of its own (the runner's re-size).

    `spent_requests` and `spent_s`: what the budget has already given. Before the experiments
    that is the POST /tokenize and the calibration request, and the seconds default to
    `calibration.spent_s` (None there too: the calibration request's planned time at its own
    speed). After the planned experiments, the runner sizes those the plan left out again with
    what they really spent (runner.run_experiments): the same fit, in what is left.

    Raises:
        ValueError: an unknown experiment name (the message lists the known ones).
    """
    unknown = [e for e in experiments if e not in _BUILDERS]
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(unknown)}; known: {', '.join(ALL_EXPERIMENTS)}")
    if spent_s is None:
        spent_s = calibration.spent_s
    if spent_s is None:
        spent_s = CALIBRATION_PROMPT_TOKENS * calibration.prefill_s_per_token + (
            CALIBRATION_OUTPUT_TOKENS * calibration.step_s
        )
    names = list(dict.fromkeys(experiments))

    def rooms(b: ActiveBudget) -> tuple[_Server, int, float]:
        room_s = max(0.0, b.max_seconds - SETUP_RESERVE_S - spent_s)
        return _resolve(calibration, engine_limits, room_s), max(0, b.max_requests - spent_requests), room_s

    @functools.cache  # the hints size the same server again at other budgets, some of them more than once
    def fit_at(b: ActiveBudget) -> _Fit:
        return _fit(*rooms(b), names)

    s, room_requests, room_s = rooms(budget)
    # 2. In priority order, what fits at its floor; what does not, with the budget that would let it run.
    kept, left_out = _keep(s, room_requests, room_s, names)
    skipped = [(name, why, _least_budget(name, budget, fit_at) if hints else "") for name, why in left_out]

    # 3. The largest common scale at which the rest fits (counts and times grow with it).
    def at(scale: float) -> list[StepPlan]:
        return [_BUILDERS[n](s, scale) for n in kept]

    lo, hi = 0.0, 1.0
    if _fits(at(1.0), room_requests, room_s):
        lo = 1.0
    else:
        for _ in range(20):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _fits(at(mid), room_requests, room_s) else (lo, mid)
    steps = dict(zip(kept, at(lo)))

    # 4. The decode ladder climbs as far as what is left allows.
    notes = list(s.notes)
    if "decode" in steps:
        others = [p for n, p in steps.items() if n != "decode"]
        rest_requests = room_requests - sum(p.requests for p in others)
        rest_s = room_s - sum(p.time_cap_s for p in others)
        top, what = _ladder_top(s)
        best = _decode(s, lo).concurrency_levels[-1]  # the common scale's top: a floor for the climb
        lo_top, hi_top = best, top
        while lo_top <= hi_top:  # requests and time grow with the top: the highest that fits
            mid_top = (lo_top + hi_top) // 2
            if _fits([_decode(s, lo, mid_top)], rest_requests, rest_s):
                best, lo_top = mid_top, mid_top + 1
            else:
                hi_top = mid_top - 1
        steps["decode"] = _decode(s, lo, best)
        if best < top:
            steps["decode"] = replace(
                steps["decode"],
                why=(
                    *steps["decode"].why,
                    f"the ladder stops at {best} streams, short of {top} ({what}): the budget has no room for more",
                ),
            )
            notes.append(
                f"decode concurrency reaches {best} streams of the {top} the engine allows ({what}): the budget "
                "has no room for more (raise --budget-requests / --budget-seconds to climb further)"
            )
        else:
            steps["decode"] = replace(steps["decode"], why=(*steps["decode"].why, f"the ladder stops at {what}"))
    if lo < 1.0 and kept:
        notes.append(
            f"the budget holds the experiments at {lo:.0%} of the way from their floors to their natural sizes "
            "(raise --budget-requests / --budget-seconds for more samples)"
        )
    sized_from = calibration.describe() + "; " + _describe_limits(s)
    return ExperimentPlan(
        budget,
        tuple((n, steps[n]) for n in kept),
        tuple(skipped),
        endpoint,
        engine_limits.max_model_len,
        target,
        model,
        tuple(notes),
        provisional=provisional,
        sized_from=sized_from,
    )


def _describe_limits(s: _Server) -> str:
    kv = f"KV cache {s.kv_tokens} tokens" if s.kv_tokens else "KV capacity unknown"
    return (
        f"step budget {s.step_tokens} tokens ({s.step_source}), max_num_seqs {s.max_num_seqs}, {kv}, "
        f"max_model_len {s.max_model_len}"
    )


def plan_experiments(
    budget: ActiveBudget,
    experiments: tuple[str, ...] = ALL_EXPERIMENTS,
    *,
    max_model_len: int | None = None,
    endpoint: Endpoint = "completions",
    target: str = "",
    model: str = "",
) -> ExperimentPlan:
    """The provisional plan printed before anything is sent: sized at an assumed speed.

    run_experiments sizes it again from its calibration request (`ExperimentPlan.provisional`).

    Raises:
        ValueError: an unknown experiment name (the message lists the known ones).
    """
    return size_experiments(
        Calibration.assumed("not measured yet: one calibration request measures it first"),
        EngineLimits(max_model_len=max_model_len),
        budget,
        experiments,
        endpoint=endpoint,
        target=target,
        model=model,
        provisional=True,
    )
