"""What both timers share: the Timer protocol, budgets, and turning timed samples into a Measurement.

A timer runs a callable many times and returns one `llm_diagnose.probes.results.Measurement`:
`value` is the median seconds per call, `samples` the seconds per call of each timed sample
(one CPU block or one CUDA-graph replay, each covering `calls_per_sample` calls), and the
provenance says which clock was used and why. The measurement judges itself: it carries a
warning when its spread is too wide to trust, so a consumer (a report, a CI gate) never has
to re-derive that rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from llm_diagnose.probes.results import Measurement, Provenance, percentile

__all__ = [
    "Timer",
    "TimerUnavailable",
    "DEFAULT_BUDGET_S",
    "MIN_SAMPLES",
    "MAX_SAMPLES",
    "SPREAD_WARN",
    "SPREAD_GROSS_WARN",
    "relative_iqr",
    "spread_warnings",
    "measurement_from_samples",
    "rate_from_time",
]

DEFAULT_BUDGET_S = 0.5  # wall time one measure() may take, warm-up and calibration included
MIN_SAMPLES = 5  # fewer samples make the median's confidence interval the sample range
MAX_SAMPLES = 2000  # beyond this the CI barely narrows and the sample list bloats the evidence

# torch.utils.benchmark's thresholds for IQR / median: above 10% a figure is noisy, above
# 50% it should not be compared with anything.
SPREAD_WARN = 0.10
SPREAD_GROSS_WARN = 0.50


class TimerUnavailable(RuntimeError):
    """The requested timer cannot run here; the message says why (and what would make it run)."""


@runtime_checkable
class Timer(Protocol):
    """One interface for every clock: `measure(fn)` -> Measurement in seconds per call."""

    @property
    def name(self) -> str: ...

    def measure(
        self, fn: Callable[[], object], *, budget_s: float = DEFAULT_BUDGET_S, label: str = ""
    ) -> Measurement: ...


def relative_iqr(samples: Sequence[float]) -> float | None:
    """(p75 - p25) / median; None when the median is zero (undefined, not zero)."""
    values = sorted(samples)
    median = percentile(values, 50)
    if median == 0:
        return None
    return (percentile(values, 75) - percentile(values, 25)) / abs(median)


def spread_warnings(samples: Sequence[float]) -> tuple[str, ...]:
    """The warnings a set of per-call samples deserves (empty when it can be trusted)."""
    out: list[str] = []
    if len(samples) < MIN_SAMPLES:
        out.append(f"only {len(samples)} samples: the median's confidence interval is the sample range")
    rel = relative_iqr(samples) if samples else None
    if rel is not None and rel > SPREAD_GROSS_WARN:
        out.append(
            f"spread too wide to trust: IQR is {rel:.0%} of the median (> {SPREAD_GROSS_WARN:.0%}); "
            "do not compare this figure, find the noise source first"
        )
    elif rel is not None and rel > SPREAD_WARN:
        out.append(
            f"noisy: IQR is {rel:.0%} of the median (> {SPREAD_WARN:.0%}); "
            "compare medians only with their confidence intervals"
        )
    return tuple(out)


def measurement_from_samples(
    per_call_s: Sequence[float],
    *,
    calls_per_sample: int,
    method: str,
    source: str,
    timer: str,
    elapsed_s: float,
    label: str = "",
    extra_warnings: Sequence[str] = (),
) -> Measurement:
    """The immutable result both timers return: median seconds per call, raw samples, provenance."""
    if not per_call_s:
        raise ValueError("a measurement needs at least one timed sample")
    return Measurement(
        value=percentile(sorted(per_call_s), 50),
        unit="s",
        provenance=Provenance(method=method, source=source, timer=timer, window_s=elapsed_s),
        samples=tuple(per_call_s),
        calls_per_sample=calls_per_sample,
        warnings=spread_warnings(per_call_s) + tuple(extra_warnings),
        note=label,
    )


def rate_from_time(m: Measurement, work: float, unit: str, what: str) -> Measurement:
    """A rate (work per second) from a time per call: each sample becomes work / time.

    The median commutes with a monotone map, so the rate's median is work / median time, and the
    spread warnings (relative IQR) carry over unchanged.
    """
    if m.unit != "s":
        raise ValueError(f"rate_from_time needs a time in seconds, got {m.unit!r}")
    if m.value <= 0 or any(s <= 0 for s in m.samples):
        raise ValueError("a rate needs positive times (a non-positive time means the timer could not resolve it)")
    note = f"{what}: {work:.6g} per call / seconds per call" + (f"; {m.note}" if m.note else "")
    return Measurement(
        value=work / m.value,
        unit=unit,
        provenance=m.provenance,
        samples=tuple(work / s for s in m.samples),
        calls_per_sample=m.calls_per_sample,
        warnings=m.warnings,
        note=note,
    )
