"""Values as a person reads them, and the statuses every verdict groups techniques by."""

from __future__ import annotations

__all__ = ["ACTIVE_STATUSES", "UNSETTLED_STATUSES", "format_value"]

ACTIVE_STATUSES = ("recommended", "not-working")  # what the verdict lists: something to change
UNSETTLED_STATUSES = ("on-unverified", "unknown")  # the diagnosis could not tell whether it is needed or works


def format_value(value: float, unit: str) -> str:
    """A number in its unit, as a person reads it (GiB, ms, %)."""
    if unit == "bytes":
        for factor, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= factor:
                return f"{value / factor:.2f} {name}"
        return f"{value:.0f} B"
    if unit == "s":
        if abs(value) >= 1 or value == 0:
            return f"{value:.3g} s"
        return f"{value * 1e3:.3g} ms" if abs(value) >= 1e-3 else f"{value * 1e6:.3g} µs"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit in ("tokens", "count", "requests", "samples") and float(value).is_integer():
        return f"{int(value):,} {unit}" if unit != "count" else f"{int(value):,}"
    if unit == "1/s":
        return f"{value:.3g}/s"
    if unit in ("ratio", "unit", ""):
        return f"{value:.3g}"
    return f"{value:.4g} {unit}"
