"""A known CPU workload for checking a timer's error (tests and benchmarks/bench_timer.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


def busy_wait(seconds: float) -> Callable[[], None]:
    """A known CPU workload: a call that spins for `seconds` on the monotonic clock.

    The tests and the timer benchmark measure it to check a timer's error.
    """
    ns = int(seconds * 1e9)

    def fn() -> None:
        end = time.perf_counter_ns() + ns
        while time.perf_counter_ns() < end:
            pass

    return fn
