"""When requests start: arrival processes for open-loop load, or a fixed concurrency.

Open loop (requests start at their times whatever the server does) is how real users
arrive; closed loop (a new request when one finishes) holds a concurrency. Offsets are
seconds from the start of the workload.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "PoissonArrivals",
    "ConstantArrivals",
    "TraceArrivals",
    "ClosedLoop",
    "Pacing",
    "arrival_offsets",
    "describe_pacing",
]


@dataclass(frozen=True)
class PoissonArrivals:
    """Exponential gaps at `rate` requests/s (memoryless arrivals, the usual model of users)."""

    rate: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError("rate must be positive")


@dataclass(frozen=True)
class ConstantArrivals:
    """One request every 1/`rate` s."""

    rate: float

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError("rate must be positive")


@dataclass(frozen=True)
class TraceArrivals:
    """A trace's own arrival times (seconds, any origin), sped up by `speedup` (2.0: twice as fast)."""

    times_s: tuple[float, ...]
    speedup: float = 1.0

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError("speedup must be positive")
        object.__setattr__(self, "times_s", tuple(float(t) for t in self.times_s))


@dataclass(frozen=True)
class ClosedLoop:
    """Keep `concurrency` requests in flight: a new one starts when one ends."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")


Pacing = PoissonArrivals | ConstantArrivals | TraceArrivals | ClosedLoop


def arrival_offsets(pacing: Pacing, n: int) -> tuple[float, ...]:
    """Start offsets of `n` requests for an open-loop pacing (seconds from the first)."""
    if isinstance(pacing, PoissonArrivals):
        rng = random.Random(pacing.seed)
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(pacing.rate)
        return tuple(out)
    if isinstance(pacing, ConstantArrivals):
        return tuple(i / pacing.rate for i in range(n))
    if isinstance(pacing, TraceArrivals):
        times: Sequence[float] = pacing.times_s[:n]
        if len(times) < n:
            raise ValueError(f"the trace has {len(pacing.times_s)} arrival times, {n} requested")
        if not times:
            return ()
        t0 = min(times)
        return tuple((t - t0) / pacing.speedup for t in times)
    raise TypeError(f"{type(pacing).__name__} is not an open-loop pacing")


def describe_pacing(pacing: Pacing) -> str:
    if isinstance(pacing, PoissonArrivals):
        return f"Poisson arrivals at {pacing.rate:g} requests/s"
    if isinstance(pacing, ConstantArrivals):
        return f"one request every {1 / pacing.rate:.3g} s"
    if isinstance(pacing, TraceArrivals):
        return "the trace's own arrival times" + (f", {pacing.speedup:g}x faster" if pacing.speedup != 1 else "")
    return f"{pacing.concurrency} requests in flight (closed loop)"
