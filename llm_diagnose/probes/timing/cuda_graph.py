"""The CUDA timers: graph replays timed with CUDA events (and eager event timing, to compare).

`CudaGraphTimer` follows triton's `do_bench_cudagraph`, with the repetition counts taken from a
time budget:

    on a side stream (capture is refused on the legacy default stream):
    warm up: a few eager calls (cuBLAS handles, lazy allocations, autotuning happen here,
        never inside the capture)
    estimate: a few eager calls between two events -> seconds per call
    capture: N unrolled calls into one CUDA graph, N chosen so that one replay lasts at
        least MIN_REPLAY_S (events resolve ~0.5 us) and at most MAX_UNROLL calls
    replay: as many replays as the budget holds, each between its own pair of events,
        one synchronize at the end; seconds per call = replay time / N
    L2: a buffer twice the L2 size is zeroed before every replay (not timed), so no replay
        starts with what the previous one left in L2. With l2="cold" the flush is also
        captured before every call and a flush-only graph is subtracted, for kernels whose
        working set would otherwise stay in L2 between calls (where it matters: working
        sets below ~2x L2; a decode step of a real model streams gigabytes and does not care).

Replaying a graph removes the host's launch overhead, so the figure is the device time of the
calls. When capture fails (the callable synchronizes, or allocates in a way capture forbids),
the timer falls back to `EagerCudaTimer` and records why in the provenance.

torch is imported inside functions: importing this module needs neither torch nor a GPU, and
the CUDA path is never taken without one (`cuda_status()` says why not). The device calls go
through a small backend object (`TorchCudaBackend`), which is the seam the CPU tests use to
check the replay arithmetic and the budget logic with a simulated device.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from llm_diagnose.probes.results import Measurement, percentile
from llm_diagnose.probes.timing.core import (
    DEFAULT_BUDGET_S,
    MAX_SAMPLES,
    MIN_SAMPLES,
    TimerUnavailable,
    measurement_from_samples,
)

__all__ = [
    "cuda_status",
    "is_active",
    "CudaBackend",
    "TorchCudaBackend",
    "CudaGraphTimer",
    "EagerCudaTimer",
    "MIN_REPLAY_S",
    "MAX_UNROLL",
]

MIN_REPLAY_S = 1e-3  # 2000x the ~0.5 us resolution of CUDA events
MAX_UNROLL = 256  # calls captured per graph: bounds capture time (~ms per call) and graph memory
_WARMUP_CALLS = 3
_ESTIMATE_CALLS = 5
_FLUSH_DOMINATES = 0.9  # l2="cold": warn when the flush is this share of a replay


def cuda_status() -> tuple[bool, str]:
    """Whether the CUDA timers can run here, and why (or why not) in words."""
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not installed ({exc})"
    if getattr(torch.version, "cuda", None) is None:
        return False, f"torch {torch.__version__} was built without CUDA"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        extra = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return False, f"torch.cuda.is_available() is False: no NVIDIA driver or no visible device{extra}"
    idx = torch.cuda.current_device()
    return True, f"{torch.cuda.get_device_name(idx)} (cuda:{idx}, CUDA {torch.version.cuda})"


def is_active() -> bool:
    """triton's driver seam: True only where the CUDA path may be taken."""
    return cuda_status()[0]


class CudaBackend(Protocol):
    """The device operations the CUDA timers use (torch.cuda, or a simulation in tests)."""

    def status(self) -> tuple[bool, str]: ...
    def synchronize(self) -> None: ...
    def new_stream(self) -> Any: ...
    def stream(self, stream: Any) -> Any: ...  # context manager making `stream` current
    def new_event(self) -> Any: ...  # has .record(stream)
    def elapsed_s(self, start: Any, end: Any) -> float: ...
    def new_graph(self) -> Any: ...  # has .replay()
    def capture(self, graph: Any, stream: Any) -> Any: ...  # context manager
    def flush_l2(self) -> None: ...  # enqueue a write of 2x L2 on the current stream
    def describe(self) -> str: ...


class TorchCudaBackend:
    """torch.cuda behind the CudaBackend seam. Created lazily: nothing touches CUDA at import."""

    def __init__(self, device: Any = None) -> None:
        self._device = device
        self._flush_buffer: Any = None

    def status(self) -> tuple[bool, str]:
        return cuda_status()

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self._device)

    def new_stream(self) -> Any:
        import torch

        return torch.cuda.Stream(self._device)

    def stream(self, stream: Any) -> Any:
        import torch

        return torch.cuda.stream(stream)

    def new_event(self) -> Any:
        import torch

        return torch.cuda.Event(enable_timing=True)

    def elapsed_s(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds

    def new_graph(self) -> Any:
        import torch

        return torch.cuda.CUDAGraph()

    def capture(self, graph: Any, stream: Any) -> Any:
        import torch

        return torch.cuda.graph(graph, stream=stream)

    def flush_l2(self) -> None:
        import torch

        if self._flush_buffer is None:
            props = torch.cuda.get_device_properties(self._device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 256 * 2**20 // 2)
            # int8 zero fill: one write of twice the L2 evicts whatever a timed call left there.
            self._flush_buffer = torch.empty(2 * l2, dtype=torch.int8, device=self._device or "cuda")
        self._flush_buffer.zero_()

    def describe(self) -> str:
        return cuda_status()[1]


def _side_stream(backend: Any, what: str) -> tuple[CudaBackend, Any, float]:
    """The backend (torch.cuda unless injected), a fresh non-default stream, and the start time.

    Raises TimerUnavailable, with the reason, where CUDA cannot run.
    """
    be = backend if backend is not None else TorchCudaBackend()
    ok, why_not = be.status()
    if not ok:
        raise TimerUnavailable(f"the {what} cannot run: {why_not}")
    begin = time.perf_counter()
    stream = be.new_stream()
    be.synchronize()  # inputs made on the default stream must be ready before the side stream reads them
    return be, stream, begin


@dataclass(frozen=True)
class EagerCudaTimer:
    """One event pair per call, L2 flushed before each (triton's `do_bench`).

    Includes the host's launch overhead whenever the device runs ahead of the host, which is
    exactly what the graph timer removes; kept for comparison and as the capture fallback.
    """

    backend: Any = None  # CudaBackend; None means torch.cuda
    flush_l2: bool = True
    why: str = "chosen explicitly"
    min_samples: int = MIN_SAMPLES
    max_samples: int = MAX_SAMPLES
    name: str = "cuda-eager"

    def measure(self, fn: Callable[[], object], *, budget_s: float = DEFAULT_BUDGET_S, label: str = "") -> Measurement:
        be, stream, begin = _side_stream(self.backend, "CUDA timer")
        with be.stream(stream):
            if self.flush_l2:
                be.flush_l2()  # allocate the flush buffer before anything is timed
            for _ in range(_WARMUP_CALLS):
                fn()
            per_call_est = _eager_estimate(be, fn, stream)
            n = _planned(budget_s - (time.perf_counter() - begin), per_call_est, self.min_samples, self.max_samples)
            pairs = [(be.new_event(), be.new_event()) for _ in range(n)]
            for start, end in pairs:
                if self.flush_l2:
                    be.flush_l2()
                start.record(stream)
                fn()
                end.record(stream)
            be.synchronize()
        samples = [be.elapsed_s(s, e) for s, e in pairs]
        timer = (
            "CUDA events around each eager call on a side stream"
            + (", L2 flushed before each call" if self.flush_l2 else "")
            + f"; why: {self.why}"
        )
        return measurement_from_samples(
            samples,
            calls_per_sample=1,
            method="cuda-eager-events",
            source=be.describe(),
            timer=timer,
            elapsed_s=time.perf_counter() - begin,
            label=label,
        )


def _eager_estimate(be: CudaBackend, fn: Callable[[], object], stream: Any) -> float:
    start, end = be.new_event(), be.new_event()
    be.synchronize()
    start.record(stream)
    for _ in range(_ESTIMATE_CALLS):
        fn()
    end.record(stream)
    be.synchronize()
    return max(be.elapsed_s(start, end) / _ESTIMATE_CALLS, 1e-9)


def _planned(remaining_s: float, sample_s: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, remaining_s // max(sample_s, 1e-9))))


@dataclass(frozen=True)
class CudaGraphTimer:
    """N unrolled calls captured in a CUDA graph, replays timed with events on a side stream."""

    backend: Any = None  # CudaBackend; None means torch.cuda
    l2: str = "warm"  # "warm": flush between replays only; "cold": also before every call
    why: str = "chosen explicitly"
    min_samples: int = MIN_SAMPLES
    max_samples: int = MAX_SAMPLES
    max_unroll: int = MAX_UNROLL
    name: str = "cuda-graph"

    def __post_init__(self) -> None:
        if self.l2 not in ("warm", "cold"):
            raise ValueError(f"l2 must be 'warm' or 'cold', not {self.l2!r}")

    def measure(self, fn: Callable[[], object], *, budget_s: float = DEFAULT_BUDGET_S, label: str = "") -> Measurement:
        be, stream, begin = _side_stream(self.backend, "CUDA-graph timer")
        cold = self.l2 == "cold"

        def call() -> None:
            if cold:
                be.flush_l2()
            fn()

        with be.stream(stream):
            be.flush_l2()  # allocates the flush buffer now: an allocation inside the capture would be the graph's
            for _ in range(_WARMUP_CALLS):
                fn()
            per_call_est = _eager_estimate(be, call, stream)
            unroll = int(min(self.max_unroll, max(1, math.ceil(MIN_REPLAY_S / per_call_est))))
            try:
                graph = _capture(be, stream, call, unroll)
                flush_graph = _capture(be, stream, be.flush_l2, unroll) if cold else None
            except Exception as exc:  # noqa: BLE001 - any capture error means: time it eagerly
                be.synchronize()
                fallback = EagerCudaTimer(
                    be,
                    why=f"graph capture failed ({type(exc).__name__}: {exc}); first choice: {self.why}",
                    min_samples=self.min_samples,
                    max_samples=self.max_samples,
                )
                return fallback.measure(fn, budget_s=max(budget_s - (time.perf_counter() - begin), 1e-3), label=label)
            graph.replay()  # the first replay uploads the graph: not timed
            be.synchronize()
            replay_est = _replay_times(be, stream, graph, 1)[0]
            n = _planned(
                budget_s - (time.perf_counter() - begin),
                replay_est * (2 if cold else 1),
                self.min_samples,
                self.max_samples,
            )
            replays = _replay_times(be, stream, graph, n)
            flush_s = percentile(sorted(_replay_times(be, stream, flush_graph, n)), 50) if flush_graph else 0.0
        samples = [(t - flush_s) / unroll for t in replays]
        warnings = []
        if cold and flush_s > _FLUSH_DOMINATES * percentile(sorted(replays), 50):
            warnings.append(
                f"the L2 flush is {flush_s / percentile(sorted(replays), 50):.0%} of each replay: "
                "the per-call figure is a small difference of large numbers; use l2='warm'"
            )
        timer = (
            f"CUDA graph of {unroll} unrolled calls replayed {n} times, CUDA events on a side stream, "
            f"L2 flushed before each {'call (flush graph subtracted)' if cold else 'replay'}; why: {self.why}"
        )
        return measurement_from_samples(
            samples,
            calls_per_sample=unroll,
            method="cuda-graph-replay",
            source=be.describe(),
            timer=timer,
            elapsed_s=time.perf_counter() - begin,
            label=label,
            extra_warnings=warnings,
        )


def _capture(be: CudaBackend, stream: Any, fn: Callable[[], object], unroll: int) -> Any:
    graph = be.new_graph()
    be.synchronize()
    with be.capture(graph, stream):
        for _ in range(unroll):
            fn()
    be.synchronize()
    return graph


def _replay_times(be: CudaBackend, stream: Any, graph: Any, n: int) -> list[float]:
    pairs = [(be.new_event(), be.new_event()) for _ in range(n)]
    for start, end in pairs:
        be.flush_l2()  # between replays, untimed: no replay inherits the previous one's L2
        start.record(stream)
        graph.replay()
        end.record(stream)
    be.synchronize()
    return [be.elapsed_s(s, e) for s, e in pairs]
