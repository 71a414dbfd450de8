"""Measured ceilings of the machine: memory-copy bandwidth and matrix-multiply rate.

Both are measured with the timing core on the device the model runs on, at sizes far beyond
the caches (a copy that fits in L2 measures L2). The copy counts its bytes twice (read +
write), which is how a decode step's weight streaming compares with it. The matmul runs at the
model's dtype, since that is the rate a step can reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from probes.results import Measurement
from probes.timing import Timer, rate_from_time, select_timer

__all__ = ["CeilingSizes", "measure_memcpy", "measure_matmul", "default_sizes"]


@dataclass(frozen=True)
class CeilingSizes:
    copy_bytes: int  # bytes of the source buffer
    matmul_n: int  # square matmul size


def default_sizes(device_kind: str) -> CeilingSizes:
    # GPU: 1 GiB copies (>> 50-60 MB L2) and n=8192 bf16 matmuls (~1 ms on H100-class parts).
    # CPU: 64 MiB (>> the LLC of a shared 2-core VM) and n=1024 (a few ms per call).
    return CeilingSizes(2**30, 8192) if device_kind == "cuda" else CeilingSizes(64 * 2**20, 1024)


def measure_memcpy(device: Any = "cpu", nbytes: int | None = None, *, timer: Timer | None = None,
                   budget_s: float = 0.5) -> Measurement:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    import torch

    dev = torch.device(device)
    timer = timer or select_timer(dev)
    nbytes = nbytes or default_sizes(dev.type).copy_bytes
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    m = timer.measure(lambda: dst.copy_(src), budget_s=budget_s, label=f"copy of {nbytes} bytes")
    return rate_from_time(m, 2.0 * nbytes, "bytes/s", f"memory copy of {nbytes / 2**20:.0f} MiB (read + write)")


def measure_matmul(device: Any = "cpu", n: int | None = None, dtype: Any = None, *,
                   timer: Timer | None = None, budget_s: float = 0.5) -> Measurement:
    """Dense square matmul rate in FLOP/s (2 n^3 per product) at `dtype` (bf16 by default)."""
    import torch

    dev = torch.device(device)
    timer = timer or select_timer(dev)
    n = n or default_sizes(dev.type).matmul_n
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=dev, dtype=dtype)
    m = timer.measure(lambda: torch.mm(a, b, out=out), budget_s=budget_s, label=f"{n}x{n} {dtype} matmul")
    return rate_from_time(m, 2.0 * n**3, "flop/s", f"{n}x{n}x{n} {str(dtype).replace('torch.', '')} matmul")
