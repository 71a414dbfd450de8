"""Which timer times work on a device, and why: the choice recorded in every measurement it takes."""

from __future__ import annotations

from llm_diagnose.probes.timing.core import Timer, TimerUnavailable
from llm_diagnose.probes.timing.cpu import CpuTimer
from llm_diagnose.probes.timing.cuda_graph import CudaGraphTimer, cuda_status, is_active

__all__ = ["device_kind", "select_timer"]


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
