"""Arrivals: rate over time, inter-arrival variation, burstiness, implied concurrency.

Trace timestamps can be quantised (one public conversation trace sits on ~3 s ticks), so the
timestamp resolution is detected first (the greatest common step of the distinct timestamps)
and burstiness is measured on counts per bin, with bins no finer than that resolution:
variation below the tick is an artefact of the clock, not of the traffic.

- burstiness: the index of dispersion (variance / mean) of arrivals per bin; a Poisson
  stream gives 1, bursty traffic more. Reported at a base bin (about 10 arrivals per bin on
  average, rounded up to whole ticks) and at 10x and 100x that.
- inter-arrival CV: only where the tick is under a tenth of the mean gap.
- concurrency: where the trace has completion times, mean requests in flight by Little's law
  (the sum of durations over the span) and the peak; otherwise an estimate only if a time
  per output token is assumed, marked as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm_diagnose.probes.traces.hashing import Groups

__all__ = ["ArrivalStats", "arrival_stats", "timestamp_resolution"]

_MAX_RATE_BINS = 240
_BASE_ARRIVALS_PER_BIN = 10
_QUANTUM_US = 1  # timestamps are compared in whole microseconds
_RESOLUTION_SAMPLE = 1 << 22  # timestamps looked at for the tick (in 64 evenly spread runs)


@dataclass(frozen=True)
class ArrivalStats:
    requests: int
    span_s: float
    resolution_s: float | None  # None where all timestamps are equal
    rate_mean_per_s: float | None
    rate_peak_per_s: float | None  # busiest bin of the rate series
    rate_bin_s: float | None
    rate_series_per_s: tuple[float, ...]  # arrivals per second in consecutive bins
    interarrival_cv: float | None
    interarrival_note: str
    dispersion_bin_s: float | None
    dispersion: float | None  # index of dispersion of counts per bin at dispersion_bin_s
    dispersion_by_bin: tuple[tuple[float, float], ...]  # (bin_s, index) at 1x, 10x, 100x
    out_of_order: int  # arrivals earlier than the one before them in the file
    concurrency_mean: float | None
    concurrency_peak: int | None
    concurrency_source: str  # "completion times", "estimate: ...", or "" (not known)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["rate_series_per_s"] = list(self.rate_series_per_s)
        d["dispersion_by_bin"] = [{"bin_s": b, "index": i} for b, i in self.dispersion_by_bin]
        return d


def timestamp_resolution(sorted_ts: np.ndarray) -> float | None:
    """The clock tick of a trace: the greatest common step between distinct timestamps.

    A few off-grid values (rewritten rows, clock adjustments) should not reduce a 3 s tick to
    a fraction of it: going down the steps from the most frequent, the tick is the first
    running gcd that at least 99% of all steps are multiples of.
    """
    if len(sorted_ts) < 2:
        return None
    # Evenly spread windows of consecutive timestamps stand for the whole trace: the tick shows in
    # a few million steps, and memory stays at that whatever the trace's length.
    if len(sorted_ts) > _RESOLUTION_SAMPLE:
        width = _RESOLUTION_SAMPLE // 64
        starts = np.linspace(0, len(sorted_ts) - width, 64).astype(np.int64)
        steps = np.concatenate([_steps_us(sorted_ts[s : s + width], sorted_ts[0]) for s in starts])
    else:
        steps = _steps_us(sorted_ts, sorted_ts[0])
    steps = steps[steps > 0]
    if len(steps) == 0:
        return None
    g = Groups(steps.astype(np.uint64))
    values, counts = g.values.astype(np.int64), g.sizes
    tick = 0
    for step in values[np.argsort(-counts, kind="stable")[:16]].tolist():
        tick = int(np.gcd(tick, step))
        if np.mean(steps % tick == 0) >= 0.99:
            return tick * _QUANTUM_US / 1e6
    return int(np.gcd.reduce(steps)) * _QUANTUM_US / 1e6


def _steps_us(sorted_ts: np.ndarray, t0: float) -> np.ndarray:
    """Steps between consecutive timestamps, in whole microseconds (so steps are comparable)."""
    return np.diff(np.round((sorted_ts - t0) * (1e6 / _QUANTUM_US)).astype(np.int64))


def _dispersion(ts: np.ndarray, t0: float, bin_s: float) -> float | None:
    nbins = int((ts[-1] - t0) // bin_s) + 1
    if nbins < 3:
        return None
    counts = np.bincount(((ts - t0) // bin_s).astype(np.int64), minlength=nbins)
    mean = counts.mean()
    return float(counts.var(ddof=1) / mean) if mean else None


def _ticks(x: float, tick: float) -> float:
    return max(tick, float(np.ceil(x / tick - 1e-9)) * tick)


def arrival_stats(
    starts: np.ndarray,
    ends: np.ndarray | None = None,
    *,
    mean_output_tokens: float | None = None,
    assumed_tpot_s: float | None = None,
) -> ArrivalStats | None:
    """Arrival statistics; None without timestamps. `ends` aligned with `starts`, NaN where unknown."""
    raw = np.asarray(starts, dtype=np.float64)
    if len(raw) == 0:
        return None
    out_of_order = int(np.count_nonzero(raw[1:] < raw[:-1]))
    ts = raw if out_of_order == 0 else np.sort(raw)  # traces are mostly in order: no copy then
    n = len(ts)
    t0 = float(ts[0])
    span = float(ts[-1] - t0)
    tick = timestamp_resolution(ts)
    rate = (n - 1) / span if span > 0 else None

    rate_bin = series = peak = None
    cv, cv_note = None, ""
    disp_bin = disp = None
    by_bin: list[tuple[float, float]] = []
    if rate is not None and tick is not None:
        rate_bin = _ticks(span / _MAX_RATE_BINS, tick)
        counts = np.bincount(((ts - t0) // rate_bin).astype(np.int64))
        series = tuple(float(c) / rate_bin for c in counts)
        peak = max(series)
        gap = span / (n - 1)
        if tick <= gap / 10:
            gaps = np.diff(ts)
            cv = float(gaps.std(ddof=1) / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else None
        else:
            cv_note = (
                f"timestamps tick every {tick:g} s against a mean gap of {gap:.3g} s: "
                "inter-arrival variation below the tick is an artefact; see the dispersion instead"
            )
        disp_bin = _ticks(_BASE_ARRIVALS_PER_BIN * gap, tick)
        disp = _dispersion(ts, t0, disp_bin)
        for k in (1, 10, 100):
            d = _dispersion(ts, t0, disp_bin * k)
            if d is not None:
                by_bin.append((disp_bin * k, d))
    elif rate is None:
        cv_note = "all requests arrive at the same timestamp"

    conc_mean = conc_peak = None
    conc_source = ""
    if ends is not None:
        e = np.asarray(ends, dtype=np.float64)
        known = np.isfinite(e) & (e >= raw)
        if known.sum() >= max(2, n // 2):
            s, f = raw[known], e[known]
            window = float(f.max() - s.min())
            if window > 0:
                conc_mean = float((f - s).sum() / window)
                events = np.concatenate([np.stack([s, np.ones(len(s))], 1), np.stack([f, -np.ones(len(f))], 1)])
                events = events[np.lexsort((events[:, 1], events[:, 0]))]  # ends before starts at ties
                conc_peak = int(np.cumsum(events[:, 1]).max())
                conc_source = "completion times"
    if conc_mean is None and assumed_tpot_s and rate and mean_output_tokens:
        conc_mean = rate * mean_output_tokens * assumed_tpot_s
        conc_source = (
            f"estimate: arrival rate x mean output length x an assumed {assumed_tpot_s * 1e3:g} ms per "
            "output token (prefill and queueing not counted)"
        )
    return ArrivalStats(
        requests=n,
        span_s=span,
        resolution_s=tick,
        rate_mean_per_s=rate,
        rate_peak_per_s=peak,
        rate_bin_s=rate_bin,
        rate_series_per_s=series or (),
        interarrival_cv=cv,
        interarrival_note=cv_note,
        dispersion_bin_s=disp_bin,
        dispersion=disp,
        dispersion_by_bin=tuple(by_bin),
        out_of_order=out_of_order,
        concurrency_mean=conc_mean,
        concurrency_peak=conc_peak,
        concurrency_source=conc_source,
    )
