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


def device_kind(device: object = "auto") -> str:
    """'cpu' or 'cuda' for a device spec ("auto", "cpu", "cuda", "cuda:1", a torch.device)."""
    text = str(getattr(device, "type", device) or "auto").lower()
    if text == "auto":
        return "cuda" if is_active() else "cpu"
    kind = text.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: expected auto, cpu, cuda or cuda:N")
    return kind


def select_timer(device: object = "auto", *, l2: str = "warm") -> Timer:
    """The timer for work on `device`, with the reason for the choice recorded in it.

    "auto": the CUDA-graph timer where `cuda_status()` says CUDA can run, else the CPU clock,
    whose provenance then says why the CUDA path was not taken. "cuda"/"cuda:N" without a
    usable GPU raises TimerUnavailable (an explicit request is never silently downgraded).
    """
    requested = str(getattr(device, "type", device) or "auto").lower()
    ok, why = cuda_status()
    kind = device_kind(device) if requested != "auto" else ("cuda" if ok else "cpu")
    if kind == "cuda":
        if not ok:
            raise TimerUnavailable(f"device {device!r} asked for the CUDA timer, which cannot run here: {why}")
        reason = f"work runs on CUDA: {why}" if requested == "auto" else f"device {device!r} requested: {why}"
        return CudaGraphTimer(l2=l2, why=reason)
    if requested == "auto":
        return CpuTimer(why=f"the CUDA path was not taken: {why}")
    return CpuTimer(why=f"device {device!r} requested (CUDA: {why})")
