"""The timing core: one interface, two timers, the same immutable Measurement from both.

- `CpuTimer`: a monotonic clock around blocks of calls sized to the clock's resolution.
- `CudaGraphTimer`: N unrolled calls captured in a CUDA graph, replays timed with CUDA events
  on a side stream, L2 flushed between replays, repetitions from a time budget.
  (`EagerCudaTimer`, one event pair per eager call, is its comparison and capture fallback.)

`select_timer(device)` picks one and records why in every measurement's `provenance.timer`,
so a report says how a number was taken and a gate compares like with like. The CUDA path is
never taken without a GPU: `select_timer("auto")` falls back to the CPU clock and says why,
and asking for "cuda" where there is none raises `TimerUnavailable` with the reason.

Importing this package needs neither torch nor a GPU (torch is imported inside functions).
"""

from __future__ import annotations

from llm_diagnose.probes.timing.core import (
    DEFAULT_BUDGET_S,
    SPREAD_GROSS_WARN,
    SPREAD_WARN,
    Timer,
    TimerUnavailable,
    rate_from_time,
    relative_iqr,
    spread_warnings,
)
from llm_diagnose.probes.timing.cpu import CpuTimer
from llm_diagnose.probes.timing.cuda_graph import CudaGraphTimer, EagerCudaTimer, cuda_status, is_active
from llm_diagnose.probes.timing.select import device_kind, select_timer

__all__ = [
    "Timer",
    "TimerUnavailable",
    "CpuTimer",
    "CudaGraphTimer",
    "EagerCudaTimer",
    "select_timer",
    "cuda_status",
    "is_active",
    "device_kind",
    "rate_from_time",
    "relative_iqr",
    "spread_warnings",
    "DEFAULT_BUDGET_S",
    "SPREAD_WARN",
    "SPREAD_GROSS_WARN",
]
