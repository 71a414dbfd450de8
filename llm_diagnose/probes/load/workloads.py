"""Synthetic workloads: length distributions, random prompts, shared-prefix groups.

A `Workload` is a tuple of RequestSpecs and a pacing (when each starts). Everything is
seeded, so a workload is repeatable; shared prefixes carry a per-run salt at their start,
so a cache warmed by an earlier run of the same workload cannot hit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from llm_diagnose.probes.load.pacing import ClosedLoop, Pacing, describe_pacing
from llm_diagnose.probes.load.prompts import NONCE_TOKENS, PromptMaker
from llm_diagnose.probes.load.records import Endpoint, RequestSpec

__all__ = ["LengthDist", "Workload", "synthetic_workload", "shared_prefix_workload"]


@dataclass(frozen=True)
class LengthDist:
    """A distribution of lengths in tokens: fixed, uniform, or heavy-tailed (log-normal)."""

    kind: Literal["fixed", "uniform", "heavy-tailed"]
    low: int
    high: int
    median: float = 0.0
    cv: float = 0.0

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"lengths must satisfy 1 <= low <= high (got {self.low}, {self.high})")

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        return cls("fixed", n, n, float(n))

    @classmethod
    def uniform(cls, low: int, high: int) -> LengthDist:
        return cls("uniform", low, high, (low + high) / 2)

    @classmethod
    def heavy_tailed(cls, median: float, cv: float, low: int = 1, high: int = 4096) -> LengthDist:
        """Log-normal with this median and coefficient of variation, clipped to [low, high].

        Published traces have output-length CVs from about 0.7 to above 2 (trace-formats.md).
        """
        if median <= 0 or cv <= 0:
            raise ValueError("a heavy-tailed distribution needs a positive median and CV")
        return cls("heavy-tailed", low, high, float(median), float(cv))

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        sigma = math.sqrt(math.log1p(self.cv**2))  # CV^2 = exp(sigma^2) - 1 for a log-normal
        value = self.median * math.exp(rng.gauss(0.0, sigma))
        return int(min(self.high, max(self.low, round(value))))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.low}"
        if self.kind == "uniform":
            return f"uniform {self.low}-{self.high}"
        return f"heavy-tailed (median {self.median:g}, CV {self.cv:g}, {self.low}-{self.high})"


@dataclass(frozen=True)
class Workload:
    """Requests and when they start."""

    name: str
    specs: tuple[RequestSpec, ...]
    pacing: Pacing = ClosedLoop(1)
    description: str = ""

    def describe(self) -> str:
        n = len(self.specs)
        tokens_out = sum(s.max_tokens for s in self.specs)
        return (
            f"{self.name}: {n} requests ({self.description}), up to {tokens_out} output tokens, "
            f"{describe_pacing(self.pacing)}"
        )


def synthetic_workload(
    prompts: PromptMaker,
    n: int,
    input_len: LengthDist,
    output_len: LengthDist,
    *,
    pacing: Pacing = ClosedLoop(1),
    seed: int = 0,
    endpoint: Endpoint = "completions",
    name: str = "synthetic",
    experiment: str = "",
    phase: str = "",
) -> Workload:
    """`n` requests with random prompts and lengths drawn from the two distributions."""
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        n_in, n_out = input_len.sample(rng), output_len.sample(rng)
        specs.append(
            RequestSpec(
                f"{name}-{i}",
                prompts.body(n_in, rng, endpoint),
                n_out,
                endpoint,
                experiment or name,
                phase,
                planned_prompt_tokens=n_in,
            )
        )
    return Workload(
        name, tuple(specs), pacing, f"prompts {input_len.describe()} tokens, outputs {output_len.describe()} tokens"
    )


def shared_prefix_workload(
    prompts: PromptMaker,
    *,
    groups: int,
    per_group: int,
    prefix_tokens: int,
    suffix_len: LengthDist,
    output_len: LengthDist,
    salted: bool = False,
    pacing: Pacing = ClosedLoop(1),
    seed: int | None = None,
    endpoint: Endpoint = "completions",
    name: str = "shared-prefix",
    experiment: str = "",
    phase: str = "",
) -> Workload:
    """`groups` groups of `per_group` requests; requests of a group share a `prefix_tokens` prefix.

    Each group's prefix starts with a nonce from the OS's entropy (whatever `seed` says), so
    only requests of this run can share it; `seed` fixes the rest (bodies, suffixes, lengths).
    With `salted=True` every request gets its own nonce in front as well: the same text, but
    nothing shareable (the control).
    Requests are interleaved across groups (g0, g1, ..., g0, g1, ...).
    """
    rng = random.Random(seed) if seed is not None else random.Random()
    prefixes = [
        prompts.join(prompts.nonce(endpoint), prompts.body(max(0, prefix_tokens - NONCE_TOKENS), rng, endpoint))
        for _ in range(groups)
    ]
    specs = []
    for i in range(per_group):
        for g, prefix in enumerate(prefixes):
            n_suffix, n_out = suffix_len.sample(rng), output_len.sample(rng)
            parts = [prefix, prompts.body(n_suffix, rng, endpoint)]
            if salted:
                parts.insert(0, prompts.nonce(endpoint))
            specs.append(
                RequestSpec(
                    f"{name}-g{g}-{i}",
                    prompts.join(*parts),
                    n_out,
                    endpoint,
                    experiment or name,
                    phase,
                    tag=f"group-{g}",
                    planned_prompt_tokens=prefix_tokens + n_suffix + (NONCE_TOKENS if salted else 0),
                )
            )
    what = (
        f"{groups} groups x {per_group}, shared prefix {prefix_tokens} tokens"
        + (" salted per request (nothing shareable)" if salted else "")
        + f", suffix {suffix_len.describe()}, outputs {output_len.describe()} tokens"
    )
    return Workload(name, tuple(specs), pacing, what)
