"""The CPU timer: a monotonic clock around blocks of calls sized to the clock's resolution.

The method is torch.utils.benchmark's `blocked_autorange`:

    warm up (first calls pay for imports, caches and allocator growth; they are not timed)
    calibrate: how long does one clock read take?
    block size: double the calls per block until one block lasts at least
        max(1000 x clock resolution, 1000 x clock-read overhead, MIN_BLOCK_S)
        so quantization and the two clock reads cost at most 0.1% of a block
    samples: as many blocks as the remaining budget holds (MIN_SAMPLES..MAX_SAMPLES)

A bigger block averages more calls (less noise per sample, fewer samples); a smaller one gives
more samples of a noisier figure. Blocks just long enough to make the clock exact keep the most
samples for the median's confidence interval. The garbage collector is off inside a block
(as in `timeit`), so a collection triggered by earlier code is not billed to `fn`.

`clock_ns` is injectable so tests can drive the logic with a fake clock.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llm_diagnose.probes.results import Measurement
from llm_diagnose.probes.timing.core import DEFAULT_BUDGET_S, MAX_SAMPLES, MIN_SAMPLES, measurement_from_samples

__all__ = ["CpuTimer", "MIN_BLOCK_S"]

MIN_BLOCK_S = 1e-4  # even with a perfect clock, keep blocks above scheduler-tick-scale jitter
_RESOLUTION_FACTOR = 1000
_OVERHEAD_FACTOR = 1000
_WARMUP_CALLS = 1
_MAX_GROWTH = 100  # one estimate may grow the block at most 100x (a first call can be unusually fast)


def _perf_counter_resolution_s() -> float:
    return time.get_clock_info("perf_counter").resolution


@dataclass(frozen=True)
class CpuTimer:
    """Monotonic-clock timer; `why` is recorded in every measurement's provenance."""

    why: str = "chosen explicitly"
    clock_ns: Callable[[], int] = time.perf_counter_ns
    resolution_s: float = field(default_factory=_perf_counter_resolution_s)
    clock_name: str = "perf_counter_ns"
    min_samples: int = MIN_SAMPLES
    max_samples: int = MAX_SAMPLES
    name: str = "cpu"

    def read_overhead_ns(self, reads: int = 21) -> float:
        """Median cost of one clock read (pairs of back-to-back reads)."""
        gaps = []
        for _ in range(reads):
            a = self.clock_ns()
            b = self.clock_ns()
            gaps.append(b - a)
        gaps.sort()
        return float(gaps[len(gaps) // 2])

    def _time_block(self, fn: Callable[[], object], number: int) -> int:
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            start = self.clock_ns()
            for _ in range(number):
                fn()
            return self.clock_ns() - start
        finally:
            if gc_was_enabled:
                gc.enable()

    def block_target_ns(self, overhead_ns: float) -> float:
        return max(_RESOLUTION_FACTOR * self.resolution_s * 1e9, _OVERHEAD_FACTOR * overhead_ns, MIN_BLOCK_S * 1e9)

    def measure(self, fn: Callable[[], object], *, budget_s: float = DEFAULT_BUDGET_S, label: str = "") -> Measurement:
        """Median seconds per call of `fn`, within about `budget_s` of wall time.

        The budget covers warm-up, calibration and sampling. Sampling stops before a block
        would end past the deadline, except that `min_samples` blocks are always taken; when
        that overruns the budget, the measurement says so in a warning.
        """
        if budget_s <= 0:
            raise ValueError("budget_s must be positive")
        begin = self.clock_ns()
        deadline = begin + int(budget_s * 1e9)
        for _ in range(_WARMUP_CALLS):
            fn()
        overhead_ns = self.read_overhead_ns()
        target_ns = self.block_target_ns(overhead_ns)

        number, block_ns = 1, self._time_block(fn, 1)
        while block_ns < target_ns:
            # Jump to the predicted size (x1.2 margin), at least doubling, at most _MAX_GROWTH x.
            predicted = math.ceil(number * 1.2 * target_ns / block_ns) if block_ns > 0 else number * 10
            grown = int(min(max(2 * number, predicted), number * _MAX_GROWTH))
            grown_ns = block_ns * grown / number if block_ns > 0 else target_ns
            if self.clock_ns() + grown_ns * (1 + self.min_samples) > deadline:
                break  # the budget cannot hold min_samples blocks of that size: keep the smaller one
            number, block_ns = grown, self._time_block(fn, grown)
        warnings: list[str] = []
        if block_ns < target_ns:
            warnings.append(
                f"budget too small to size blocks: blocks of {number} calls last "
                f"{block_ns / 1e3:.3g} us, under the {target_ns / 1e3:.3g} us the clock needs"
            )

        remaining = deadline - self.clock_ns()
        planned = int(min(self.max_samples, max(self.min_samples, remaining // max(block_ns, 1))))
        per_call: list[float] = []
        for i in range(planned):
            if i >= self.min_samples and self.clock_ns() + block_ns > deadline:
                break  # the machine slowed down since the estimate: stop at the deadline
            per_call.append(self._time_block(fn, number) / number / 1e9)
        elapsed_s = (self.clock_ns() - begin) / 1e9
        if elapsed_s > budget_s * 1.5:
            warnings.append(
                f"took {elapsed_s:.3g} s for a {budget_s:.3g} s budget: "
                f"{self.min_samples} blocks of {number} calls do not fit in it"
            )
        timer = (
            f"{self.clock_name} (monotonic, resolution {self.resolution_s:.3g} s, read overhead "
            f"{overhead_ns:.0f} ns), blocks of {number} calls sized to >= {target_ns / 1e3:.3g} us; "
            f"why: {self.why}"
        )
        return measurement_from_samples(
            per_call,
            calls_per_sample=number,
            method="cpu-timer",
            source="cpu",
            timer=timer,
            elapsed_s=elapsed_s,
            label=label,
            extra_warnings=warnings,
        )
