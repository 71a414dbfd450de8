"""Quantiles and summaries from cumulative histogram buckets (Prometheus `histogram_quantile`).

A histogram only knows how many observations fell between two edges, so every figure here
is an estimate, and this module says how good: each quantile comes with the bucket it fell
in. Two cases are flagged because interpolation would invent precision there:
- the first bucket (Prometheus interpolates from 0, but the observations could all sit at
  its upper edge: the honest statement is "at most <edge>");
- the +Inf bucket (Prometheus returns the highest finite edge: "at least <edge>").
Bucket edges always come from the page, never from a table of defaults: recent vLLM lets
`--custom-histogram-buckets` change them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llm_diagnose.probes.results import Summary

__all__ = [
    "Buckets",
    "QuantileEstimate",
    "histogram_quantile",
    "summary_from_buckets",
    "bucket_mean_stdev",
    "merge_buckets",
]

Buckets = Sequence[tuple[float, float]]  # (upper edge, cumulative count), sorted, +Inf last


@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile read off a histogram, with the bucket that holds it."""

    q: float
    value: float  # Prometheus' histogram_quantile value
    lower: float  # the bucket's lower edge (0 for the first bucket)
    upper: float  # the bucket's upper edge (inf for the overflow bucket)
    in_first_bucket: bool
    in_overflow_bucket: bool

    @property
    def bound_note(self) -> str:
        """A phrase for reports: where the true quantile lies."""
        if self.in_overflow_bucket:
            return f"at least {self.lower:g} (beyond the highest finite bucket edge)"
        if self.in_first_bucket:
            return f"at most {self.upper:g} (inside the first bucket, which the histogram cannot resolve)"
        return f"between {self.lower:g} and {self.upper:g} (linear interpolation inside the bucket)"

    @property
    def honest_value(self) -> float:
        """The value to report: the bound when interpolation would invent precision."""
        if self.in_overflow_bucket:
            return self.lower
        if self.in_first_bucket:
            return self.upper
        return self.value


def _monotonic(buckets: Buckets) -> list[tuple[float, float]]:
    # Prometheus' ensureMonotonic: scrapes racing with observations (multiprocess mode) can
    # show a later bucket one lower than an earlier one; clamp instead of failing.
    out, running = [], 0.0
    for edge, count in sorted(buckets):
        running = max(running, count)
        out.append((float(edge), running))
    return out


def _finite_counts(buckets: Buckets) -> bool:
    # Pages leave out non-finite counts (exposition.BAD_*); buckets built by hand or merged
    # from elsewhere may still carry one, and a quantile over it would be inf or NaN.
    return all(math.isfinite(c) for _, c in buckets)


def histogram_quantile(q: float, buckets: Buckets) -> QuantileEstimate | None:
    """The q-quantile (0 <= q <= 1) of a cumulative histogram, as Prometheus computes it.

    Returns None when the histogram holds no observations, has no +Inf bucket, or a count
    that is not finite.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    b = _monotonic(buckets)
    if len(b) < 1 or not math.isinf(b[-1][0]) or not _finite_counts(b):
        return None
    total = b[-1][1]
    if total <= 0:
        return None
    rank = q * total
    # First bucket whose cumulative count reaches the rank (Prometheus: sort.Search on
    # the buckets but the last; an index equal to len-1 means the +Inf bucket).
    idx = next((i for i, (_, c) in enumerate(b[:-1]) if c >= rank), len(b) - 1)
    if idx == len(b) - 1:
        highest_finite = b[-2][0] if len(b) >= 2 else 0.0
        return QuantileEstimate(q, highest_finite, highest_finite, math.inf, len(b) == 1, True)
    upper, cum = b[idx]
    if idx == 0:
        lower, below = (0.0 if upper > 0 else upper), 0.0
    else:
        lower, below = b[idx - 1]
    in_bucket = cum - below
    value = upper if in_bucket <= 0 else lower + (upper - lower) * ((rank - below) / in_bucket)
    return QuantileEstimate(q, value, lower, upper, idx == 0, False)


def bucket_mean_stdev(buckets: Buckets, total_sum: float | None = None) -> tuple[float, float] | None:
    """Mean and standard deviation estimated from bucket midpoints.

    The mean is exact when `total_sum` (the histogram's `_sum`) is given; the spread is
    computed around it from midpoints (the first bucket's from 0, the overflow bucket's at
    the highest finite edge, which understates a long tail).
    """
    b = _monotonic(buckets)
    if not b or b[-1][1] <= 0 or not _finite_counts(b):
        return None
    total = b[-1][1]
    mids, weights = [], []
    prev_edge, prev_count = 0.0, 0.0
    for i, (edge, cum) in enumerate(b):
        n = cum - prev_count
        if n > 0:
            if math.isinf(edge):
                mid = prev_edge
            elif i == 0:
                mid = edge / 2 if edge > 0 else edge
            else:
                mid = (prev_edge + edge) / 2
            mids.append(mid)
            weights.append(n)
        if not math.isinf(edge):
            prev_edge = edge
        prev_count = cum
    mean = (
        total_sum / total
        if total_sum is not None and math.isfinite(total_sum)
        else math.fsum(m * w for m, w in zip(mids, weights)) / total
    )
    var = math.fsum(w * (m - mean) ** 2 for m, w in zip(mids, weights)) / total
    return mean, math.sqrt(var)


def summary_from_buckets(buckets: Buckets, total_sum: float | None = None) -> Summary | None:
    """A `Summary` of the observations behind a histogram (every field an estimate).

    min/max are the edges of the lowest and highest non-empty buckets; the median's
    confidence interval uses the same order-statistic ranks as `Summary.from_samples`.
    """
    b = _monotonic(buckets)
    p05, p50, p95, p99 = (histogram_quantile(q, b) for q in (0.05, 0.5, 0.95, 0.99))
    if p05 is None or p50 is None or p95 is None or p99 is None:
        return None
    total = b[-1][1]
    n = max(1, int(round(total)))
    mean_sd = bucket_mean_stdev(b, total_sum)
    assert mean_sd is not None  # quantiles exist, so observations exist
    mean, sd = mean_sd
    first_nonempty = next(i for i, (_, c) in enumerate(b) if c > 0)
    lo_edge = 0.0 if first_nonempty == 0 else b[first_nonempty - 1][0]
    last_nonempty = max(i for i in range(len(b)) if b[i][1] > (b[i - 1][1] if i else 0.0))
    hi_edge = b[last_nonempty][0] if not math.isinf(b[last_nonempty][0]) else (b[-2][0] if len(b) > 1 else lo_edge)
    # The median's CI: ranks n/2 -+ z*sqrt(n)/2, read back through the histogram.
    z_half = 1.959963984540054 * math.sqrt(n) / 2
    ci_lo_q = max(0.0, math.floor(n / 2 - z_half)) / n
    ci_hi_q = min(float(n), math.ceil(n / 2 + z_half)) / n
    ci_lo = histogram_quantile(ci_lo_q, b)
    ci_hi = histogram_quantile(min(1.0, ci_hi_q), b)
    assert ci_lo is not None and ci_hi is not None
    return Summary(
        n=n,
        mean=mean,
        median=p50.value,
        stdev=sd,
        min=lo_edge,
        max=hi_edge,
        p05=p05.value,
        p95=p95.value,
        p99=p99.value,
        ci_low=ci_lo.value,
        ci_high=ci_hi.value,
    )


def merge_buckets(parts: Sequence[Buckets]) -> tuple[tuple[float, float], ...]:
    """Sum histograms bucket by bucket (Prometheus `sum by (le)`), over the edges all share.

    Label sets of one histogram normally share their edges; if they do not, only the
    common edges (always including +Inf) can be added without guessing.
    """
    if not parts:
        return ()
    common = set.intersection(*({edge for edge, _ in p} for p in parts))
    out = []
    for edge in sorted(common):
        out.append((edge, math.fsum(dict(p)[edge] for p in parts)))
    return tuple(out)
