"""The timing core: exact logic on a fake clock and a simulated GPU, then the real CPU clock.

Real-clock tolerances are set for a loaded 2-core machine shared with other jobs: a busy-wait
workload cannot finish early (it spins until the clock says so), and preemption adds to the
tail, which the median ignores; so the median must land within [-1%, +15%] of the known
duration. The CUDA path runs only with a GPU (`@pytest.mark.gpu`); on CPU its selection is
tested here and its arithmetic on a simulated device, and benchmarks/gpu_check.py covers it
for real.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from llm_diagnose.probes.timing import (
    CpuTimer,
    CudaGraphTimer,
    EagerCudaTimer,
    TimerUnavailable,
    cuda_status,
    is_active,
    select_timer,
)
from llm_diagnose.probes.timing.cuda_graph import MIN_REPLAY_S
from tests.busy_wait import busy_wait


class FakeClock:
    """A nanosecond clock that moves only when read (read_ns) or when a fake workload runs."""

    def __init__(self, read_ns: int = 50) -> None:
        self.t = 1_000_000
        self.read_ns = read_ns

    def __call__(self) -> int:
        now = self.t
        self.t += self.read_ns
        return now

    def work(self, ns: int):
        def fn() -> None:
            self.t += ns

        return fn


def _timer(clock: FakeClock) -> CpuTimer:
    return CpuTimer(clock_ns=clock, resolution_s=1e-9, clock_name="fake", why="test")


def test_known_cost_on_a_fake_clock_is_exact_and_blocks_reach_the_clock_target() -> None:
    clock = FakeClock()
    m = _timer(clock).measure(clock.work(2_500), budget_s=0.2)
    assert m.value == pytest.approx(2.5e-6, rel=1e-3)  # two clock reads spread over the block
    assert m.calls_per_sample * 2.5e-6 >= 1e-4  # blocks last >= max(1000 x read overhead, 100 us)
    assert m.n >= 5 and not m.warnings
    assert m.unit == "s" and m.provenance.method == "cpu-timer" and "why: test" in m.provenance.timer


def test_repetitions_respect_the_budget() -> None:
    clock = FakeClock()
    m = _timer(clock).measure(clock.work(7_000_000), budget_s=0.2)  # 7 ms per call
    assert m.calls_per_sample == 1
    assert m.provenance.window_s <= 0.2 + 0.007 + 1e-4  # at most one block past the deadline
    assert m.n == pytest.approx(0.2 / 0.007 - 2, abs=2)  # warm-up and block sizing come out of it
    tiny = _timer(clock).measure(clock.work(7_000_000), budget_s=0.01)
    assert tiny.n == 5 and any("budget" in w for w in tiny.warnings)  # min_samples wins, and says so


def test_spread_warning_fires_on_a_noisy_workload_only() -> None:
    clock, rng = FakeClock(), random.Random(7)
    noisy = _timer(clock).measure(lambda: clock.work(200_000 * rng.choice((1, 1, 3)))(), budget_s=0.2)
    assert any("spread too wide to trust" in w for w in noisy.warnings), noisy.warnings
    assert not _timer(clock).measure(clock.work(200_000), budget_s=0.2).warnings


_spin = busy_wait  # the known workload lives beside the timers


def test_known_cpu_workload_within_tolerance_and_budget_on_the_real_clock() -> None:
    t0 = time.monotonic()
    m = CpuTimer(why="test").measure(_spin(200e-6), budget_s=0.15)
    wall = time.monotonic() - t0
    assert 200e-6 * 0.99 <= m.value <= 200e-6 * 1.15, m
    assert m.summary is not None and m.summary.ci_low <= m.value <= m.summary.ci_high
    assert wall < 0.15 * 2  # budget, plus at most a block and the calibration on a loaded machine


def test_selection_on_cpu_says_why_cuda_was_not_taken() -> None:
    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has CUDA: the selection is covered by the gpu tests")
    timer = select_timer("auto")
    assert isinstance(timer, CpuTimer) and timer.why == f"the CUDA path was not taken: {why}"
    assert why in timer.measure(lambda: None, budget_s=0.01).provenance.timer  # the reason travels with the figure
    with pytest.raises(TimerUnavailable, match="cannot run here"):
        select_timer("cuda:0")
    with pytest.raises(TimerUnavailable, match=re.escape(why)):
        CudaGraphTimer().measure(lambda: None)  # never taken without a GPU, whoever asks


def test_importing_the_timing_core_needs_no_torch() -> None:
    code = (
        "import sys, llm_diagnose.probes.timing, llm_diagnose.probes.microbench.roofline; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class SimulatedGpu:
    """The CudaBackend seam on a simulated device: kernels cost `cost_s`, eager launches add a gap."""

    def __init__(self, cost_s: float, launch_gap_s: float, flush_s: float = 20e-6, capture_error: str = "") -> None:
        self.now, self.cost, self.gap, self.flush_cost = 0.0, cost_s, launch_gap_s, flush_s
        self.capturing: list | None = None
        self.capture_error = capture_error

    def status(self):
        return True, "SimulatedGpu"

    def describe(self) -> str:
        return "SimulatedGpu"

    def synchronize(self) -> None: ...
    def new_stream(self):
        return object()

    @contextmanager
    def stream(self, stream):
        yield

    def new_event(self):
        gpu = self

        class Event:
            t = 0.0

            def record(self, stream=None) -> None:
                self.t = gpu.now

        return Event()

    def elapsed_s(self, start, end) -> float:
        return end.t - start.t

    def kernel(self) -> None:
        if self.capturing is not None:
            self.capturing.append(self.cost)
        else:
            self.now += self.gap + self.cost  # eager: the host's launch gap shows on the device timeline

    def flush_l2(self) -> None:
        if self.capturing is not None:
            self.capturing.append(self.flush_cost)
        else:
            self.now += self.flush_cost

    def new_graph(self):
        gpu = self

        class Graph:
            work: list = []

            def replay(self) -> None:
                gpu.now += sum(self.work)

        return Graph()

    @contextmanager
    def capture(self, graph, stream):
        if self.capture_error:
            raise RuntimeError(self.capture_error)
        self.capturing = []
        yield
        graph.work, self.capturing = self.capturing, None


def test_graph_replays_remove_launch_overhead_and_unroll_to_the_event_resolution() -> None:
    gpu = SimulatedGpu(cost_s=4e-6, launch_gap_s=6e-6)
    graph = CudaGraphTimer(backend=gpu, why="test").measure(gpu.kernel, budget_s=0.1)
    eager = EagerCudaTimer(backend=gpu, flush_l2=False).measure(gpu.kernel, budget_s=0.1)
    assert graph.value == pytest.approx(4e-6) and eager.value == pytest.approx(10e-6)
    assert graph.calls_per_sample == pytest.approx(MIN_REPLAY_S / 10e-6, abs=1)  # from the eager estimate
    assert graph.provenance.method == "cuda-graph-replay" and graph.n >= 5
    cold = CudaGraphTimer(backend=gpu, l2="cold").measure(gpu.kernel, budget_s=0.1)
    assert cold.value == pytest.approx(4e-6)  # flush captured before each call, then subtracted


def test_capture_failure_falls_back_to_eager_events_and_says_why() -> None:
    gpu = SimulatedGpu(cost_s=4e-6, launch_gap_s=6e-6, capture_error="operation not permitted when capturing")
    m = CudaGraphTimer(backend=gpu, why="test").measure(gpu.kernel, budget_s=0.05)
    assert m.provenance.method == "cuda-eager-events" and m.calls_per_sample == 1
    assert "graph capture failed (RuntimeError: operation not permitted" in m.provenance.timer


@pytest.mark.gpu
@pytest.mark.skipif(not is_active(), reason=f"needs a CUDA GPU: {cuda_status()[1]}")
def test_cuda_graph_timer_on_a_real_gpu() -> None:
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    timer = select_timer("auto")
    assert isinstance(timer, CudaGraphTimer)
    graph = timer.measure(lambda: a @ a, budget_s=0.3)
    eager = EagerCudaTimer().measure(lambda: a @ a, budget_s=0.3)
    assert graph.provenance.method == "cuda-graph-replay"
    assert graph.value == pytest.approx(eager.value, rel=0.25)  # compute-bound: launch overhead hidden
    tiny = torch.zeros(1, device="cuda")
    assert (
        timer.measure(lambda: tiny.add_(1), budget_s=0.2).value
        < EagerCudaTimer().measure(lambda: tiny.add_(1), budget_s=0.2).value
    )  # launch-bound: the graph removes the host gap
