"""Measured ceilings of the machine: memory-copy bandwidth and matrix-multiply rate.

Both are measured with the timing core on the device the model runs on, at sizes far beyond
the caches (a copy that fits in L2 measures L2). The copy counts its bytes twice (read +
write), which is how a decode step's weight streaming compares with it. The matmul runs at the
model's dtype, since that is the rate a step can reach.

A ceiling must be an upper bound, so the matmul rate is the best of a few sizes, not one size:
how fast a size runs depends on the kernel the dtype gets. Where the CPU has no native bf16
(no AVX512-BF16/AMX; `torch.ops.mkldnn._is_mkldnn_bf16_supported()` is False), a bf16 `mm`
falls back to a generic loop whose rate drops as the matrices outgrow the caches (0.4-0.8
GFLOP/s at n=1024 on a 2-core AVX2 EPYC, 1.3 GFLOP/s at n=128), while a fp32 one gets MKL
and rises with n. Sizes larger than the budget can time `MIN_SAMPLES` of are skipped (a bf16
1024^3 `mm` takes 2.5 s there). On CPU the sweep runs at one thread and at torch's default,
best kept: on a shared machine the thread pool can be the slow part. `llm_diagnose.probes.microbench.run`
further raises the ceiling to the best rate a timed step achieved, if any did better, and
says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from llm_diagnose.probes.results import Measurement
from llm_diagnose.probes.timing import Timer, rate_from_time, select_timer
from llm_diagnose.probes.timing.core import MIN_SAMPLES

__all__ = ["CeilingSizes", "measure_memcpy", "measure_matmul", "default_sizes", "matmul_sweep"]


@dataclass(frozen=True)
class CeilingSizes:
    copy_bytes: int  # bytes of the source buffer
    matmul_n: int  # largest square matmul size
    matmul_min_n: int = 128  # smallest square size of the sweep (sizes double up to matmul_n)

    @property
    def matmul_sweep(self) -> tuple[int, ...]:
        sizes, n = [], self.matmul_min_n
        while n < self.matmul_n:
            sizes.append(n)
            n *= 2
        return (*sizes, self.matmul_n)


def default_sizes(device_kind: str) -> CeilingSizes:
    # GPU: 1 GiB copies (>> 50-60 MB L2) and n=8192 bf16 matmuls (~1 ms on H100-class parts).
    # CPU: 64 MiB (>> the LLC of a shared 2-core VM) and n=128..1024 (fp32 1024: tens of ms per call).
    return CeilingSizes(2**30, 8192, 2048) if device_kind == "cuda" else CeilingSizes(64 * 2**20, 1024, 128)


def measure_memcpy(
    device: Any = "cpu", nbytes: int | None = None, *, timer: Timer | None = None, budget_s: float = 0.5
) -> Measurement:
    """Device memory bandwidth in bytes/s (read + write counted): the faster of two ways to move the bytes.

    `copy_` alone is not enough on a GPU: replayed from a CUDA graph, a device-to-device 1 GiB
    `copy_` read 2.71 TB/s on an H200 against 4.22 TB/s launched eagerly (2026-12-04; triton's
    do_bench_cudagraph read the same 2.71, so it is the graph, most likely a memcpy node run by
    the copy engine), while an elementwise kernel over the same bytes read 4.22 TB/s both ways.
    A decode step streams its weights through SM kernels, so the ceiling is also timed with one
    (`neg` of float32s) and the faster is kept: a ceiling must be an upper bound.
    """
    import torch

    dev = torch.device(device)
    timer = timer or select_timer(dev)
    nbytes = nbytes or default_sizes(dev.type).copy_bytes
    gen = torch.Generator(device=dev).manual_seed(0)
    src = torch.rand(nbytes // 4, dtype=torch.float32, device=dev, generator=gen)  # no denormals: CPUs slow on them
    dst = torch.empty_like(src)
    moved = 2.0 * src.numel() * 4
    what = f"{moved / 2 / 2**20:.0f} MiB (read + write)"
    kernels = {"copy_": lambda: dst.copy_(src), "neg": lambda: torch.neg(src, out=dst)}
    ways = {
        name: rate_from_time(
            timer.measure(fn, budget_s=budget_s / len(kernels), label=f"{name} of {nbytes} bytes"),
            moved,
            "bytes/s",
            f"{name} over {what}",
        )
        for name, fn in kernels.items()
    }
    best = max(ways.values(), key=lambda m: m.value)
    rates = ", ".join(f"{name}: {m.value / 1e9:.4g} GB/s" for name, m in ways.items())
    return replace(best, note=f"faster of copy_ and an elementwise kernel ({rates}); {best.note}")


def _matmul_at(dev: Any, n: int, dtype: Any, timer: Timer, budget_s: float) -> Measurement:
    import torch

    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=dev, dtype=dtype)
    m = timer.measure(lambda: torch.mm(a, b, out=out), budget_s=budget_s, label=f"{n}x{n} {dtype} matmul")
    return rate_from_time(m, 2.0 * n**3, "flop/s", f"{n}x{n}x{n} {str(dtype).replace('torch.', '')} matmul")


def matmul_sweep(
    sizes: tuple[int, ...], budget_s: float, measure_at: Callable[[int, float], Measurement]
) -> Measurement:
    """The best rate over ascending square `sizes`, each measured by `measure_at(n, budget_s)`.

    The budget is split evenly over the sizes. A size is skipped when the last call predicts
    (time grows as n^3) that its warm-up and `MIN_SAMPLES` calls would overrun its share. The
    best size's Measurement is returned, with every size's rate in its note.
    """
    if not sizes:
        raise ValueError("matmul_sweep needs at least one size")
    share = budget_s / len(sizes)
    results: list[tuple[int, Measurement]] = []
    skipped: list[int] = []
    for n in sorted(sizes):
        if results:
            last_n, last = results[-1]
            seconds_per_call = 2.0 * last_n**3 / last.value * (n / last_n) ** 3
            if seconds_per_call * (MIN_SAMPLES + 2) > share:
                skipped.append(n)
                continue
        results.append((n, measure_at(n, share)))
    _, best = max(results, key=lambda r: r[1].value)
    rates = ", ".join(f"n={n}: {m.value / 1e9:.3g}" for n, m in results)
    extra = f"; skipped n={', '.join(map(str, skipped))} (would overrun the budget)" if skipped else ""
    note = f"best of {len(results)} sizes (GFLOP/s {rates}){extra}; {best.note}"
    return replace(best, note=note)


def measure_matmul(
    device: Any = "cpu", n: int | None = None, dtype: Any = None, *, timer: Timer | None = None, budget_s: float = 0.5
) -> Measurement:
    """Dense square matmul rate in FLOP/s (2 n^3 per product) at `dtype` (bf16 by default).

    With `n`, that one size; without, the best of the device's sweep (`default_sizes`), which
    is what a ceiling needs: one size can sit on a slow path of the dtype's kernel.
    """
    import torch

    dev = torch.device(device)
    timer = timer or select_timer(dev)
    dtype = dtype or torch.bfloat16
    if n is not None:
        return _matmul_at(dev, n, dtype, timer, budget_s)
    sizes = default_sizes(dev.type).matmul_sweep
    if dev.type != "cpu":
        return matmul_sweep(sizes, budget_s, lambda size, share: _matmul_at(dev, size, dtype, timer, share))
    # On CPU, also at one thread: torch's intra-op pool spins at barriers when other processes
    # hold the cores, and can run 100x slower than one thread (benchmarks/RESULTS.md, timing core).
    default_threads = torch.get_num_threads()
    best: Measurement | None = None
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        try:
            m = matmul_sweep(
                sizes,
                budget_s / (2 if default_threads > 1 else 1),
                lambda size, share: _matmul_at(dev, size, dtype, timer, share),
            )
        finally:
            torch.set_num_threads(default_threads)
        m = replace(m, note=f"{threads} thread{'s' if threads > 1 else ''}: {m.note}")
        best = m if best is None or m.value > best.value else best
    assert best is not None
    return best
