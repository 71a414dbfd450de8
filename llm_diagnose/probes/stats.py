"""The statistics every probe and judge shares: percentiles, the median's interval, the bootstrap, rank correlation.

One implementation of each, so a p95 or an interval means the same thing in a Measurement's
Summary, an experiment's ratio and the gate's verdict.

- `percentile` and `median_ci` read only the order statistics they need from values already
  sorted, so they run in O(1) on any indexable sorted view (a length histogram never expanded)
  and need no numpy: `llm_diagnose.probes.results`, and the decision tree above it, import
  this module without importing numpy.
- `bootstrap_interval`, `bootstrap_comparison` and `spearman` are vectorised with numpy, which
  they import when first called (for the reason above). The bootstrap draws from
  `numpy.random.default_rng(seed)`: the same inputs and seed give the same interval, bit for bit.
- `cluster_bootstrap_comparison` is the same comparison where values come in groups that share
  a cause (the inter-token gaps one injected prefill stalled): it resamples whole groups, so
  values that move together are not counted as independent evidence.

Every function refuses NaN (ValueError): a NaN has no rank, so any figure it entered would be
meaningless rather than merely noisy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Interval",
    "StatisticSpec",
    "Comparison",
    "SortedValues",
    "BOOTSTRAP_RESAMPLES",
    "ORDER_STATISTIC_ABOVE",
    "percentile",
    "median_ci",
    "bootstrap_interval",
    "bootstrap_comparison",
    "cluster_bootstrap_comparison",
    "expanded_level",
    "student_t_quantile",
    "comparison_of",
    "spearman",
]

BOOTSTRAP_RESAMPLES = 2000
# Above this many values, a quantile's bootstrap draws the resampled quantile's rank instead of
# whole resamples (see _resampled): O(n log n) instead of O(resamples * n), same interval to first order.
ORDER_STATISTIC_ABOVE = 5000
_CHUNK_ELEMENTS = 4_000_000  # resamples are drawn in chunks of at most this many values (bounded memory)

# What a bootstrap computes on each resample: "mean", "median", a percentile in [0, 100]
# (numpy's linear interpolation), or a numpy-style function f(values_2d, axis=1) -> one value per row.
StatisticSpec = Literal["mean", "median"] | float | Callable[..., "np.ndarray | float"]
Comparison = Literal["ratio", "difference", "relative_change"]


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile-bootstrap confidence interval.

    `resamples` is how many resamples the interval was taken from: fewer than asked where a
    ratio's resamples with a non-positive denominator were left out.
    """

    point: float
    low: float
    high: float
    level: float
    resamples: int


# --- order statistics of sorted values (no numpy) --------------------------------------------------
class SortedValues(Protocol):
    """What the order statistics read: len() and [rank] (a list, an array, a histogram's view)."""

    def __len__(self) -> int: ...

    def __getitem__(self, rank: int, /) -> float: ...


def _read(sorted_values: SortedValues, rank: int) -> float:
    value = float(sorted_values[rank])
    if math.isnan(value):
        raise ValueError("NaN among the values: a NaN has no place in an order")
    return value


def percentile(sorted_values: SortedValues, q: float) -> float:
    """The q-th percentile (q in [0, 100]) of values sorted ascending, by linear interpolation.

    Numpy's default ("linear") method: the value at fractional rank (n - 1) * q / 100,
    interpolated between its two neighbours. Reads those two values only, so `sorted_values`
    may be any sequence supporting len() and [rank]; it is not checked to be sorted.

    Raises:
        ValueError: no values, q outside [0, 100], or a NaN among the values read.
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:  # also refuses a NaN q
        raise ValueError(f"a percentile is in [0, 100], got {q!r}")
    if n == 1:
        return _read(sorted_values, 0)
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    low, high = _read(sorted_values, lo), _read(sorted_values, hi)
    return float(low + (high - low) * (pos - lo))


def median_ci(sorted_values: SortedValues, level: float = 0.95) -> tuple[float, float]:
    """(low, high): a distribution-free confidence interval of the median, from order statistics.

    The interval is [x_(lo), x_(hi)] (0-based ranks of the sorted values) with
    lo = floor(n/2 - z*sqrt(n)/2) and hi = ceil(n/2 + z*sqrt(n)/2) - 1, clipped to [0, n - 1],
    z the standard normal quantile at (1 + level) / 2: the normal approximation to the
    binomial(n, 1/2) count of values below the median. No shape of the distribution is
    assumed, which is what latencies (skewed, heavy-tailed) need. Under three values it is
    (min, max). Reads two values only, like `percentile`.

    Raises:
        ValueError: no values, level outside (0, 1), or a NaN among the values read.
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("median interval of no values")
    if not 0 < level < 1:
        raise ValueError(f"a confidence level is in (0, 1), got {level!r}")
    if n < 3:
        return _read(sorted_values, 0), _read(sorted_values, n - 1)
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    half = z * math.sqrt(n) / 2
    lo = max(0, int(math.floor(n / 2 - half)))
    hi = min(n - 1, int(math.ceil(n / 2 + half)) - 1)
    return _read(sorted_values, lo), _read(sorted_values, hi)


# --- the bootstrap (numpy) ---------------------------------------------------------------------
def _sample(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: a bootstrap needs at least one value")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds a NaN or an infinity")
    return arr


def _check_settings(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    if not 0 < level < 1:
        raise ValueError(f"a confidence level is in (0, 1), got {level!r}")


def _quantile_of(statistic: StatisticSpec) -> float | None:
    """The percentile a statistic is, or None (the mean, a function)."""
    if isinstance(statistic, str):
        if statistic not in ("mean", "median"):
            raise ValueError(f"unknown statistic {statistic!r} (mean, median, a percentile or a function)")
        return 50.0 if statistic == "median" else None
    if isinstance(statistic, (int, float)):
        if not 0 <= statistic <= 100:
            raise ValueError(f"a percentile is in [0, 100], got {statistic!r}")
        return float(statistic)
    return None


def _apply(statistic: StatisticSpec, values: np.ndarray, axis: int | None) -> np.ndarray | float:
    import numpy as np

    if statistic == "mean":
        return np.mean(values, axis=axis)
    if statistic == "median":
        return np.median(values, axis=axis)
    if isinstance(statistic, (int, float)):
        return np.percentile(values, statistic, axis=axis)
    return statistic(values, axis=axis)


def _resampled(
    values: np.ndarray, statistic: StatisticSpec, resamples: int, rng: np.random.Generator, order_statistic_above: int
) -> np.ndarray:
    """The statistic of `resamples` bootstrap resamples of `values` (drawn with replacement)."""
    import numpy as np

    n = len(values)
    q = _quantile_of(statistic)
    if q is not None and n > order_statistic_above:
        # The order-statistic form: a resample's q-quantile is the original sample's order
        # statistic at a binomial rank (mean (n-1)q, variance ~ n q (1-q)). Same interval to
        # first order, in O(n log n) instead of O(resamples * n).
        ranks = rng.binomial(n - 1, q / 100, size=resamples)
        return np.sort(values)[ranks]
    out = np.empty(resamples)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        out[start : start + k] = _apply(statistic, values[rng.integers(0, n, size=(k, n))], 1)
    return out


def _order_interval(sorted_stats: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` share of sorted bootstrap statistics, as order statistics.

    No interpolation, so an infinite resampled change stays infinite instead of becoming NaN.
    """
    m = len(sorted_stats)
    alpha = (1 - level) / 2
    low = sorted_stats[int(math.floor(alpha * (m - 1)))]
    high = sorted_stats[int(math.ceil((1 - alpha) * (m - 1)))]
    return float(low), float(high)


def bootstrap_interval(
    sample: Sequence[float] | np.ndarray,
    statistic: StatisticSpec = "median",
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
    order_statistic_above: int = ORDER_STATISTIC_ABOVE,
) -> Interval:
    """The statistic of one sample, with its percentile-bootstrap confidence interval.

    `point` is the statistic of the sample itself. The sample is resampled with replacement
    `resamples` times from numpy.random.default_rng(seed); `low` and `high` are the order
    statistics of the resampled statistics at ranks floor(a(R-1)) and ceil((1-a)(R-1)),
    a = (1 - level) / 2, R = resamples. A quantile of more than `order_statistic_above`
    values is resampled in its order-statistic form (see ORDER_STATISTIC_ABOVE).

    Raises:
        ValueError: an empty sample, a NaN or infinity in it, resamples < 1, level outside (0, 1).
    """
    import numpy as np

    values = _sample(sample, "sample")
    _check_settings(resamples, level)
    rng = np.random.default_rng(seed)
    stats = np.sort(_resampled(values, statistic, resamples, rng, order_statistic_above))
    low, high = _order_interval(stats, level)
    return Interval(float(_apply(statistic, values, None)), low, high, level, resamples)


def _check_comparison(compare: str) -> None:
    if compare not in ("ratio", "difference", "relative_change"):
        raise ValueError(f"unknown comparison {compare!r} (ratio, difference, relative_change)")


def comparison_of(base: float | np.ndarray, other: float | np.ndarray, compare: Comparison) -> np.ndarray:
    """How `other` compares with `base`, elementwise on floats or arrays, as in bootstrap_comparison.

    Returns a numpy array (0-d for two floats). A ratio's non-positive base gives inf, -inf
    or NaN here: bootstrap_comparison refuses or leaves out such bases.
    """
    import numpy as np

    _check_comparison(compare)
    base, other = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    if compare == "difference":
        return other - base
    if compare == "ratio":
        with np.errstate(divide="ignore", invalid="ignore"):
            return other / base
    # relative_change: a zero base makes it unbounded: +inf or -inf by its sign, 0 when both are zero.
    fallback = np.where(other > base, np.inf, np.where(other < base, -np.inf, 0.0))
    return np.divide(other - base, np.abs(base), out=fallback, where=base != 0)


def bootstrap_comparison(
    base: Sequence[float] | np.ndarray,
    other: Sequence[float] | np.ndarray,
    statistic: StatisticSpec = "median",
    *,
    compare: Comparison,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
    order_statistic_above: int = ORDER_STATISTIC_ABOVE,
) -> Interval:
    """How the statistic of `other` compares with that of `base`, with a bootstrap interval.

    The two samples are independent: each is resampled with replacement `resamples` times
    (base first, then other, from one numpy.random.default_rng(seed)), the comparison is
    computed per pair of resamples, and the interval is the order statistics of the sorted
    comparisons as in `bootstrap_interval`. So the interval carries the noise of both sides.
    `compare` is, with B and O the statistic of base and of other:

    - "difference": O - B;
    - "relative_change": (O - B) / |B|; where B is 0, +inf or -inf by the sign of O - B, and 0
      when O is 0 too (unbounded, never NaN);
    - "ratio": O / B, defined for B > 0 only: the point's B must be positive, and resamples
      whose B is not are left out of the interval (`Interval.resamples` says how many remain).

    `point` is the comparison of the statistics of the two whole samples.

    Raises:
        ValueError: an empty sample, a NaN or infinity in one, resamples < 1, level outside
            (0, 1); for a ratio, a base statistic that is not positive, or no resample whose is.
    """
    import numpy as np

    b, o = _sample(base, "base"), _sample(other, "other")
    _check_settings(resamples, level)
    _check_comparison(compare)
    b_point, o_point = _apply(statistic, b, None), _apply(statistic, o, None)
    if compare == "ratio" and not b_point > 0:
        raise ValueError(f"a ratio needs a positive base statistic, got {float(b_point)!r}")
    rng = np.random.default_rng(seed)
    b_stats = _resampled(b, statistic, resamples, rng, order_statistic_above)
    o_stats = _resampled(o, statistic, resamples, rng, order_statistic_above)
    if compare == "ratio":
        keep = b_stats > 0
        b_stats, o_stats = b_stats[keep], o_stats[keep]
        if len(b_stats) == 0:
            raise ValueError("no resample of the base has a positive statistic: the ratio has no interval")
    low, high = _order_interval(np.sort(comparison_of(b_stats, o_stats, compare)), level)
    return Interval(float(comparison_of(b_point, o_point, compare)), low, high, level, len(b_stats))


def _groups(groups: Sequence[Sequence[float]], name: str) -> list[np.ndarray]:
    if len(groups) == 0:
        raise ValueError(f"{name} has no groups: a bootstrap needs at least one")
    out = [_sample(g, f"a group of {name}") for g in groups]  # refuses an empty group, NaN, infinity
    return out


def _resampled_groups(
    groups: list[np.ndarray], statistic: StatisticSpec, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """The statistic of `resamples` cluster-bootstrap resamples: len(groups) whole groups drawn with
    replacement, their values pooled. The mean is exact and vectorised (pooled sum / pooled count);
    any other statistic is applied to each pooled resample in turn."""
    import numpy as np

    k = len(groups)
    picks = rng.integers(0, k, size=(resamples, k))
    if statistic == "mean":
        sums = np.array([g.sum() for g in groups])
        counts = np.array([float(len(g)) for g in groups])
        return sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    _quantile_of(statistic)  # refuses an unknown statistic name before the loop
    return np.array([float(_apply(statistic, np.concatenate([groups[i] for i in row]), None)) for row in picks])


def cluster_bootstrap_comparison(
    base_groups: Sequence[Sequence[float]],
    other_groups: Sequence[Sequence[float]],
    statistic: StatisticSpec = "mean",
    *,
    compare: Comparison,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """`bootstrap_comparison` for values that come in groups: each side resamples whole groups.

    Values in one group share a cause, so they are not independent evidence: the gaps of the
    steady streams that one injected prefill stalled are all long together, and four injections
    are four observations of the stall, not forty. Resampling single values would treat them as
    forty and give an interval far too narrow; resampling groups (the cluster bootstrap) draws
    len(groups) whole groups with replacement per side, pools their values and takes the
    statistic of the pool. A side whose values are independent passes each value as its own group.

    With few groups a percentile interval is too narrow still: the bootstrap's spread of a mean
    of K groups is sqrt((K-1)/K) of the true one, and the mean's tails are Student's t with K-1
    degrees of freedom, not normal (three to seven injections: a 95% percentile interval covers
    the truth about 78% of the time at K = 5). So the interval is the expanded percentile
    interval (Hesterberg, "What teachers should know about the bootstrap", 2015): its order
    statistics are taken at the level whose normal quantile is sqrt(K/(K-1)) * t_{K-1}, K the
    fewer groups of the two sides (the side whose few groups carry the uncertainty). With many
    groups the expansion vanishes and this is the plain percentile interval.

    `point` is the comparison of the statistics of the two pooled samples, as in
    `bootstrap_comparison`; `compare` means the same, and so do `level`, `seed` and `resamples`
    (for a ratio, resamples whose base statistic is not positive are left out). With one group
    a side has no spread between groups: its statistic is the same in every resample, and no
    expansion is made.

    Raises:
        ValueError: a side with no groups, an empty group, a NaN or infinity in one, resamples < 1,
            level outside (0, 1); for a ratio, a base statistic that is not positive, or no
            resample whose is.
    """
    import numpy as np

    b, o = _groups(base_groups, "base_groups"), _groups(other_groups, "other_groups")
    _check_settings(resamples, level)
    _check_comparison(compare)
    b_point = _apply(statistic, np.concatenate(b), None)
    o_point = _apply(statistic, np.concatenate(o), None)
    if compare == "ratio" and not b_point > 0:
        raise ValueError(f"a ratio needs a positive base statistic, got {float(b_point)!r}")
    rng = np.random.default_rng(seed)
    b_stats = _resampled_groups(b, statistic, resamples, rng)
    o_stats = _resampled_groups(o, statistic, resamples, rng)
    if compare == "ratio":
        keep = b_stats > 0
        b_stats, o_stats = b_stats[keep], o_stats[keep]
        if len(b_stats) == 0:
            raise ValueError("no resample of the base has a positive statistic: the ratio has no interval")
    expanded = expanded_level(level, min(len(b), len(o)))
    low, high = _order_interval(np.sort(comparison_of(b_stats, o_stats, compare)), expanded)
    return Interval(float(comparison_of(b_point, o_point, compare)), low, high, level, len(b_stats))


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (no scipy: this module must not need it).

    Exact for 1 and 2 degrees of freedom; from 3 on, the Cornish-Fisher expansion in the normal
    quantile (Abramowitz & Stegun 26.7.5, four terms): within 0.2% at df 3 for p = 0.975, closer
    above.

    Raises:
        ValueError: p outside (0, 1), or df < 1.
    """
    if not 0 < p < 1:
        raise ValueError(f"a quantile's probability is in (0, 1), got {p!r}")
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df!r}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def expanded_level(level: float, groups: int) -> float:
    """The level at which to read a percentile interval of a mean of `groups` so that it covers
    at `level` (Hesterberg's expanded percentile interval): normal quantile sqrt(K/(K-1)) * t_{K-1}.
    `level` itself where there is no spread between groups to expand (fewer than two)."""
    if groups < 2:
        return level
    t = student_t_quantile(0.5 + level / 2, groups - 1)
    z = math.sqrt(groups / (groups - 1)) * t
    return 2 * statistics.NormalDist().cdf(z) - 1


# --- rank correlation (numpy) ------------------------------------------------------------------
def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    import numpy as np

    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(starts) - 1  # which run of equal values each sorted position is in
    bounds = np.r_[np.flatnonzero(starts), len(values)]  # run i spans sorted positions [bounds[i], bounds[i+1])
    ranks = np.empty(len(values))
    ranks[order] = (bounds[group] + bounds[group + 1] - 1) / 2 + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation of paired values: the Pearson correlation of their ranks.

    Tied values get the average of the ranks they span. None where it is undefined: the two
    sides differ in length, there are fewer than two pairs, or either side is constant.
    The sums are exactly rounded (math.fsum), so the figure does not depend on the order of
    the pairs beyond the last bit.

    Raises:
        ValueError: a NaN on either side (a NaN has no rank).
    """
    import numpy as np

    if len(xs) != len(ys) or len(xs) < 2:
        return None
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("NaN among the values: a NaN has no rank")
    rx, ry = _average_ranks(x), _average_ranks(y)
    dx, dy = rx - math.fsum(rx) / len(rx), ry - math.fsum(ry) / len(ry)
    sxx, syy = math.fsum(dx * dx), math.fsum(dy * dy)
    if sxx == 0 or syy == 0:
        return None
    return math.fsum(dx * dy) / math.sqrt(sxx * syy)
