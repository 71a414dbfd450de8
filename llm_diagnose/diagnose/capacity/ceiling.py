"""The engine's own ceiling: the highest request rate one replica's scheduler limits allow for a
workload, whatever the model says about latency.

Three limits, each a bound by Little's law on the workload's mean request (prompt p, less any
block a prefix cache may serve, output o, block size B, a step of at least `floor` seconds: the
model's step at batch 1, which every fit measures, and below which no step of a bigger batch
falls):

- sequences: at most `max_num_seqs` run at once, and a request holds one for at least
  ceil(p / max_num_batched_tokens) + o - 1 steps (its prefill chunks, the last of which yields
  its first token, then one step per further token): rate <= max_num_seqs / (steps x floor);
- batched tokens: a step computes at most `max_num_batched_tokens` tokens, and a request needs
  p + o - 1 of them: rate <= max_num_batched_tokens / ((p + o - 1) x floor);
- KV capacity: the cache holds `kv_capacity_tokens / B` blocks, and while it decodes a request
  holds at least ceil((p + k - 1) / B) blocks at its k-th token: rate <= blocks /
  (floor x sum over k of those).

With prefix caching, every prompt block another request of the workload shares is counted as
served from the cache (computed once, held once), so each bound stays an upper bound.

A finite trial (a burst of a few dozen requests) can meet a latency objective at any rate its
requests fit in one batch; a sustained rate cannot pass these bounds. So a predicted goodput
above the ceiling is impossible and is clipped to it, and marked (`capacity.plan`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from llm_diagnose.diagnose.capacity.model import StepModel
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest

__all__ = ["Ceiling", "engine_ceiling"]


@dataclass(frozen=True)
class Ceiling:
    """The lowest of the bounds (`rps`, inf where none binds) and each bound in words."""

    rps: float
    binding: str  # the name of the lowest bound ("" when none applies)
    bounds: tuple[tuple[str, float, str], ...]  # (name, requests/s, how it was reached)
    step_floor_s: float

    def describe(self) -> str:
        if not self.bounds:
            return "no engine ceiling: no request in the workload"
        name, rps, how = next(b for b in self.bounds if b[0] == self.binding)
        return f"{rps:.3g} requests/s ({name}: {how})"

    def to_dict(self) -> dict:
        return {
            "rps": self.rps if math.isfinite(self.rps) else None,
            "binding": self.binding,
            "step_floor_s": self.step_floor_s,
            "bounds": [{"name": n, "rps": r, "how": h} for n, r, h in self.bounds],
        }


def _block_sum(first: int, last: int, block: int) -> int:
    """sum of ceil(j / block) for j in first..last (0 where last < first)."""

    def upto(n: int) -> int:  # sum of ceil(j / block) for j in 1..n
        if n <= 0:
            return 0
        q, r = divmod(n, block)
        return block * q * (q + 1) // 2 + r * (q + 1)

    return upto(last) - upto(first - 1)


def _uncached(item: SimRequest, shared: Counter, block: int, caching: bool) -> int:
    """The fewest prompt tokens the engine may compute for (and hold alone in the KV cache for) the
    request: a reported hit, or with prefix caching every block another request of the workload
    shares; at least one token (the last one is always computed)."""
    if item.cached_tokens is not None:
        return max(1, item.prompt_tokens - item.cached_tokens)
    if not caching:
        return item.prompt_tokens
    common = sum(1 for key in item.blocks if shared[key] > 1)
    return max(1, item.prompt_tokens - common * block)


def engine_ceiling(items: Sequence[SimRequest], model: StepModel, limits: EngineLimits) -> Ceiling:
    """The engine's ceiling for `items` (see the module docstring)."""
    floor = model.step_s(1, 0)
    if not items:
        return Ceiling(math.inf, "", (), floor)
    budget, block = limits.max_batched_tokens, limits.block_size
    shared = Counter(key for it in items for key in set(it.blocks)) if limits.prefix_caching else Counter()
    prompts = [_uncached(it, shared, block, limits.prefix_caching) for it in items]
    steps = statistics.fmean(-(-p // budget) + it.output_tokens - 1 for p, it in zip(prompts, items))
    tokens = statistics.fmean(p + it.output_tokens - 1 for p, it in zip(prompts, items))
    bounds = [
        (
            "sequences",
            limits.max_num_seqs / (steps * floor),
            f"max_num_seqs {limits.max_num_seqs:,}, each request holding one for {steps:.3g} steps of at least "
            f"{floor * 1e3:.3g} ms",
        ),
        (
            "batched tokens",
            budget / (tokens * floor),
            f"max_num_batched_tokens {budget:,} a step of at least {floor * 1e3:.3g} ms, {tokens:.3g} tokens a request",
        ),
    ]
    if limits.kv_capacity_tokens is not None:
        held = statistics.fmean(_block_sum(p, p + it.output_tokens - 1, block) for p, it in zip(prompts, items))
        blocks = limits.kv_capacity_tokens // block
        bounds.append(
            (
                "KV capacity",
                blocks / (held * floor),
                f"{limits.kv_capacity_tokens:,} KV tokens ({blocks:,} blocks of {block}), each request holding "
                f"{held:.3g} block-steps of at least {floor * 1e3:.3g} ms",
            )
        )
    name, rps, _ = min(bounds, key=lambda b: b[1])
    return Ceiling(rps, name, tuple(bounds), floor)
