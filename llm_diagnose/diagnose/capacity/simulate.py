"""A discrete-event simulation of one continuous-batching replica, one scheduler step at a time.

The scheduler is vLLM's (V1) in the parts that set latency under load:

- every step, each running sequence that finished its prefill decodes one token;
- the rest of the step's token budget (`max_batched_tokens`) goes to prefill: first the
  chunks of prompts already started (chunked prefill), then new requests from the FIFO
  queue, while fewer than `max_num_seqs` run and the KV cache has room for their prompt;
- a prompt's leading full blocks already in the prefix cache are not computed again (the
  cache keeps blocks of finished requests, LRU, within the KV capacity);
- when a decode finds the KV cache full, the newest running request is preempted and
  recomputed later (vLLM's default on V1);
- a step takes `StepModel.step_s(sequences, prefill tokens)`; its tokens arrive at its end;
- before the engine, the front end handles one request at a time for `request_overhead_s`,
  and each request then takes `request_latency_s` more to reach the engine, overlapping with
  the others (transport, the API server's hop to the engine).

It is a model: no detokenizer or HTTP queueing beyond the fitted per-request overhead, one
token per step (no speculative decoding). Its error against the live server is measured
(`llm_diagnose.diagnose.capacity.validate`), not assumed.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm_diagnose.diagnose.capacity.model import StepModel

__all__ = ["SimRequest", "EngineLimits", "SimOutcome", "SimResult", "simulate"]

MAX_STEPS = 2_000_000  # a runaway guard: a saturated queue still ends, its requests marked unfinished


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[object, ...] = ()  # chained keys of the prompt's full blocks (prefix caching)
    cached_tokens: int | None = None  # a fixed hit, overriding the cache (replaying what a server reported)


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler's limits; `source` says where each came from (configuration, or a default)."""

    max_num_seqs: int = 256
    max_batched_tokens: int = 2048
    kv_capacity_tokens: int | None = None  # None: unbounded (stated in the plan's assumptions)
    block_size: int = 16
    prefix_caching: bool = False
    source: str = "defaults"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, max_batched_tokens and block_size must be at least 1")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")


@dataclass
class SimOutcome:
    """What one request saw (times from its arrival at the client)."""

    request: SimRequest
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    cached_tokens: int = 0
    preempted: int = 0


@dataclass(frozen=True)
class SimResult:
    outcomes: tuple[SimOutcome, ...]
    steps: int
    preemptions: int
    unfinished: int  # still queued or running when MAX_STEPS ran out
    # The regime the run reached (capacity.regime compares it with the range the model was fitted on).
    max_running: int = 0  # the most sequences in one step
    max_step_tokens: int = 0  # the most tokens (decodes + prefill) in one step

    def values(self) -> dict[str, list[float]]:
        """Latencies by SLO metric; an unfinished request counts as infinitely late."""
        inf = math.inf
        return {
            "ttft": [o.ttft_s if o.ttft_s is not None else inf for o in self.outcomes],
            "itl": [g for o in self.outcomes for g in o.gaps_s],
            "e2e": [o.e2e_s if o.e2e_s is not None else inf for o in self.outcomes],
        }


class _Seq:
    __slots__ = ("req", "out", "arrive", "computed", "target", "emitted", "last", "kv")

    def __init__(self, req: SimRequest, out: SimOutcome, arrive: float) -> None:
        self.req, self.out, self.arrive = req, out, arrive
        self.computed = 0  # prompt tokens in the KV cache (cached or computed)
        self.target = req.prompt_tokens
        self.emitted = 0
        self.last = 0.0
        self.kv = 0


def _blocks_needed(tokens: int, block: int) -> int:
    return -(-tokens // block)


def simulate(requests: Sequence[SimRequest], model: StepModel, limits: EngineLimits) -> SimResult:
    """Run `requests` (any order; by arrival) through one replica."""
    block = limits.block_size
    capacity = None if limits.kv_capacity_tokens is None else limits.kv_capacity_tokens // block
    outcomes = [SimOutcome(r) for r in requests]
    # The front end (HTTP, input processing) takes requests one at a time, `request_overhead_s`
    # each, before the engine sees them: a single asyncio process on vLLM, so it queues too.
    # The hop to the engine (`request_latency_s`) overlaps: it delays a request, not the next one.
    ordered = sorted(zip(requests, outcomes), key=lambda p: p[0].arrival_s)
    ready, free_at = [], 0.0
    for r, o in ordered:
        free_at = max(free_at, r.arrival_s) + model.request_overhead_s
        ready.append((free_at + model.request_latency_s, r, o))
    pending = deque(ready)
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    cache: OrderedDict[object, None] = OrderedDict()  # prefix blocks kept after their request ended
    used = 0  # KV blocks held by running sequences
    t, steps, preemptions = 0.0, 0, 0
    max_running = max_step_tokens = 0

    def cached_tokens(s: _Seq) -> int:
        r = s.req
        if r.cached_tokens is not None:
            return min(r.cached_tokens, r.prompt_tokens - 1)
        if not limits.prefix_caching:
            return 0
        hits = 0
        for key in r.blocks:
            if key not in cache:
                break
            cache.move_to_end(key)
            hits += 1
        return min(hits * block, r.prompt_tokens - 1)  # the last prompt token is always computed

    def free_blocks() -> int:
        if capacity is None:
            return 1 << 60
        # Cached blocks of running requests are the blocks they hold: count the larger of the two.
        return capacity - (max(used, len(cache)) if limits.prefix_caching else used)

    def evict(n: int) -> None:  # make room by dropping least recently used cached blocks
        while n > 0 and cache:
            cache.popitem(last=False)
            n -= 1

    while (pending or waiting or running) and steps < MAX_STEPS:
        while pending and pending[0][0] <= t:
            at, r, o = pending.popleft()
            waiting.append(_Seq(r, o, at))
        if not waiting and not running:
            t = pending[0][0]
            continue
        budget = limits.max_batched_tokens
        decoders = [s for s in running if s.computed >= s.target]
        # Decodes need one more KV slot when their last block is full; preempt the newest if none is free.
        for s in decoders:
            if s not in running:
                continue
            tokens = s.target + s.emitted
            if _blocks_needed(tokens + 1, block) > s.kv:
                if free_blocks() <= 0:
                    evict(1)
                while free_blocks() <= 0 and running:
                    victim = running.pop()
                    used -= victim.kv
                    victim.kv, victim.computed, victim.out.preempted = 0, 0, victim.out.preempted + 1
                    victim.target = victim.req.prompt_tokens + victim.emitted  # recompute what it had
                    waiting.appendleft(victim)
                    preemptions += 1
                if s in running:
                    s.kv += 1
                    used += 1
        decoders = [s for s in running if s.computed >= s.target]
        budget -= len(decoders)
        prefill = 0
        chunks: list[tuple[_Seq, int]] = []
        for s in running:
            if s.computed < s.target and budget > 0:
                n = min(s.target - s.computed, budget)
                chunks.append((s, n))
                budget -= n
        while waiting and budget > 0 and len(running) < limits.max_num_seqs:
            s = waiting[0]
            hit = cached_tokens(s) if s.out.preempted == 0 or s.req.cached_tokens is not None else 0
            need = _blocks_needed(s.target + 1, block) - hit // block
            if need > free_blocks():
                evict(need - free_blocks())
                if need > free_blocks():
                    break
            waiting.popleft()
            if s.out.preempted == 0:
                s.out.cached_tokens = hit
            s.computed = hit
            s.kv = need + hit // block
            used += need
            running.append(s)
            n = min(s.target - s.computed, budget)
            chunks.append((s, n))
            budget -= n
        prefill = sum(n for _, n in chunks)
        if not decoders and not chunks:
            if pending:  # nothing fits now: wait for the next arrival
                t = max(t, pending[0][0])
                continue
            break  # a request larger than the whole cache: it can never run
        t += model.step_s(len(decoders) + len(chunks), prefill)
        steps += 1
        max_running = max(max_running, len(decoders) + len(chunks))
        max_step_tokens = max(max_step_tokens, len(decoders) + prefill)
        done: list[_Seq] = []
        for s, n in chunks:
            s.computed += n
            if s.computed >= s.target:  # the prefill's last chunk yields the first (or next) token
                if limits.prefix_caching and s.emitted == 0:
                    for key in s.req.blocks:  # computed blocks are shareable from now on (vLLM caches at once)
                        cache[key] = None
                        cache.move_to_end(key)
                _emit(s, t)
                if s.emitted >= s.req.output_tokens:
                    done.append(s)
        for s in decoders:
            _emit(s, t)
            if s.emitted >= s.req.output_tokens:
                done.append(s)
        for s in done:
            running.remove(s)
            used -= s.kv
            s.out.e2e_s = t - s.req.arrival_s
            if limits.prefix_caching and capacity is not None and free_blocks() < 0:
                evict(-free_blocks())
    unfinished = len(pending) + len(waiting) + len(running)
    return SimResult(tuple(outcomes), steps, preemptions, unfinished, max_running, max_step_tokens)


def _emit(s: _Seq, t: float) -> None:
    if s.emitted == 0 and s.out.ttft_s is None:
        s.out.ttft_s = t - s.req.arrival_s
    elif s.emitted > 0:
        s.out.gaps_s.append(t - s.last)
    s.emitted += 1
    s.last = t
