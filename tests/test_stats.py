"""llm_diagnose.probes.stats against independent references.

Each function is checked against a brute-force reference written here (exact enumeration of a
bootstrap distribution, binomial coverage from math.comb, ranks by counting) and, where scipy
is installed, against scipy.stats too. scipy is not a dependency of the project: those tests
skip without it, and the brute-force ones always run.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import subprocess
import sys

import numpy as np
import pytest

from llm_diagnose.probes.stats import (
    Interval,
    bootstrap_comparison,
    bootstrap_interval,
    cluster_bootstrap_comparison,
    comparison_of,
    expanded_level,
    median_ci,
    percentile,
    spearman,
    student_t_quantile,
)


class _CountingView:
    """A sorted sequence known only by len() and [rank] that counts its reads (as lengths._SortedView)."""

    def __init__(self, values):
        self._values, self.reads = sorted(values), 0

    def __len__(self):
        return len(self._values)

    def __getitem__(self, rank):
        self.reads += 1
        return self._values[rank]


def _scipy_stats():
    return pytest.importorskip("scipy.stats")


# --- percentile ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_percentile_is_numpys_linear_percentile(n):
    rng = np.random.default_rng(n)
    values = np.sort(np.round(rng.lognormal(0, 1, n), 1))  # rounded: ties
    for q in (0, 1, 5, 25, 50, 62.5, 95, 99, 99.9, 100):
        assert percentile(values.tolist(), q) == pytest.approx(np.percentile(values, q), rel=1e-12, abs=1e-15)


def test_percentile_reads_two_values_of_a_view_and_refuses_what_it_cannot_rank():
    view = _CountingView(range(1000))
    assert percentile(view, 12.34) == pytest.approx(np.percentile(np.arange(1000), 12.34))
    assert view.reads == 2
    assert percentile([7], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    for q in (-1, 100.5, math.nan):
        with pytest.raises(ValueError, match=r"\[0, 100\]"):
            percentile([1.0, 2.0], q)
    with pytest.raises(ValueError, match="NaN"):
        percentile([1.0, math.nan, 3.0], 50)


# --- median_ci -------------------------------------------------------------------------------------
def _coverage(n: int, lo: int, hi: int) -> float:
    """P(x_(lo) <= median <= x_(hi)) for a continuous distribution: P(lo + 1 <= K <= hi), K ~ Bin(n, 1/2)."""
    return sum(math.comb(n, k) for k in range(lo + 1, hi + 1)) / 2**n


def _exact_ranks(n: int, level: float) -> tuple[int, int]:
    """The symmetric order-statistic interval of exact binomial coverage at least `level`."""
    lo, cdf = -1, 0.0
    while cdf + math.comb(n, lo + 1) / 2**n <= (1 - level) / 2:
        lo += 1
        cdf += math.comb(n, lo) / 2**n
    lo = max(lo, 0)
    return lo, n - 1 - lo


@pytest.mark.parametrize("level", [0.8, 0.9, 0.95, 0.99])
def test_median_ci_is_within_a_rank_of_the_exact_binomial_interval(level):
    for n in range(3, 400):
        lo, hi = map(int, median_ci(range(n), level))  # the values are their own ranks
        exact_lo, exact_hi = _exact_ranks(n, level)
        assert 0 <= lo - exact_lo <= 1 and 0 <= exact_hi - hi <= 1, (n, (lo, hi), (exact_lo, exact_hi))
        if n >= 100:  # the normal approximation has converged: coverage within 3.5 points of the level
            assert abs(_coverage(n, lo, hi) - level) < 0.035, (n, _coverage(n, lo, hi))


def test_median_ci_agrees_with_scipys_binomial_interval():
    ss = _scipy_stats()
    for n in (5, 10, 21, 50, 101, 400, 2001):
        x = np.arange(n, dtype=float)
        ci = ss.quantile_test(x, q=(n - 1) / 2, p=0.5).confidence_interval(0.95)
        lo, hi = median_ci(x)
        if math.isnan(ci.low):  # no order-statistic interval reaches 95% (n = 5): ours is the whole range
            assert (lo, hi) == (0, n - 1)
            continue
        assert 0 <= lo - ci.low <= 1 and 0 <= ci.high - hi <= 1, (n, (lo, hi), ci)
        assert ss.binom.cdf(hi, n, 0.5) - ss.binom.cdf(lo, n, 0.5) == pytest.approx(_coverage(n, int(lo), int(hi)))


def test_median_ci_edges():
    assert median_ci([3.0]) == (3.0, 3.0)
    assert median_ci([1.0, 2.0]) == (1.0, 2.0)  # under three values: the range
    assert median_ci([4.0] * 50) == (4.0, 4.0)
    view = _CountingView(range(10_000))
    lo, hi = median_ci(view)
    assert lo < 5000 < hi and view.reads == 2
    with pytest.raises(ValueError, match="no values"):
        median_ci([])
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        median_ci([1.0, 2.0, 3.0], 1.0)
    with pytest.raises(ValueError, match="NaN"):
        median_ci([math.nan] * 5)


# --- the bootstrap ---------------------------------------------------------------------------------
def _exact_bootstrap(sample, statistic) -> np.ndarray:
    """The statistic of every one of the n**n equally likely ordered resamples."""
    return np.array([statistic(r) for r in itertools.product(sample, repeat=len(sample))])


def _cdf(distribution: np.ndarray, x: float) -> float:
    return float(np.mean(distribution <= x + 1e-12))


@pytest.mark.parametrize("statistic, reference", [("mean", statistics.fmean), ("median", statistics.median)])
def test_bootstrap_interval_matches_the_exact_bootstrap_distribution(statistic, reference):
    sample = [0.3, 1.1, 1.4, 2.0, 3.7, 9.5]
    exact = _exact_bootstrap(sample, reference)  # 46656 resamples
    iv = bootstrap_interval(sample, statistic, resamples=20_000, level=0.9, seed=1)
    assert iv.point == pytest.approx(reference(sample))
    if statistic == "median":
        # A median's bootstrap distribution is discrete: its ends are the exact distribution's quantiles.
        assert iv.low == np.quantile(exact, 0.05, method="inverted_cdf")
        assert iv.high == np.quantile(exact, 0.95, method="inverted_cdf")
    else:
        # Each end sits where the exact distribution puts 5% (95%) of its mass, to Monte Carlo error.
        assert _cdf(exact, iv.low) == pytest.approx(0.05, abs=0.012)
        assert _cdf(exact, iv.high) == pytest.approx(0.95, abs=0.012)


def test_bootstrap_interval_is_the_row_by_row_bootstrap_vectorised():
    sample = np.random.default_rng(7).lognormal(0, 0.5, 40)
    iv = bootstrap_interval(sample, 90.0, resamples=500, level=0.95, seed=11)
    rows = np.random.default_rng(11).integers(0, 40, size=(500, 40))  # the same draws, one row per resample
    per_row = sorted(percentile(sorted(sample[r]), 90.0) for r in rows)
    assert iv.low == pytest.approx(per_row[math.floor(0.025 * 499)], rel=1e-12)
    assert iv.high == pytest.approx(per_row[math.ceil(0.975 * 499)], rel=1e-12)


def test_bootstrap_interval_agrees_with_scipys_percentile_bootstrap():
    ss = _scipy_stats()
    sample = np.random.default_rng(3).lognormal(0, 0.4, 200)
    for statistic, fn in (("mean", np.mean), ("median", np.median), (95.0, lambda x, axis: np.percentile(x, 95, axis))):
        iv = bootstrap_interval(sample, statistic, resamples=5000, seed=2)
        ref = ss.bootstrap(
            (sample,), fn, n_resamples=5000, method="percentile", rng=np.random.default_rng(2), vectorized=True
        ).confidence_interval
        width = ref.high - ref.low
        assert abs(iv.low - ref.low) < 0.1 * width and abs(iv.high - ref.high) < 0.1 * width, (statistic, iv, ref)


def test_bootstrap_is_seeded_and_deterministic():
    sample = list(np.random.default_rng(0).normal(10, 2, 80))
    assert bootstrap_interval(sample, seed=4) == bootstrap_interval(sample, seed=4)
    assert bootstrap_interval(sample, seed=4) != bootstrap_interval(sample, seed=5)
    a = bootstrap_comparison(sample, sample[:50], "mean", compare="difference", seed=4)
    assert a == bootstrap_comparison(sample, sample[:50], "mean", compare="difference", seed=4)


def test_bootstrap_edges():
    assert bootstrap_interval([2.5], "mean") == Interval(2.5, 2.5, 2.5, 0.95, 2000)  # one value: no spread
    assert bootstrap_interval([4.0] * 30, "median", resamples=100) == Interval(4.0, 4.0, 4.0, 0.95, 100)
    iv = bootstrap_interval([1.0, 2.0, 3.0], lambda v, axis: np.max(v, axis=axis), resamples=200)
    assert iv.point == 3.0 and iv.low in (1.0, 2.0, 3.0) and iv.high == 3.0
    for bad in ([], [1.0, math.nan], [1.0, math.inf]):
        with pytest.raises(ValueError, match="empty|NaN"):
            bootstrap_interval(bad)
        with pytest.raises(ValueError, match="empty|NaN"):
            bootstrap_comparison([1.0, 2.0], bad, compare="ratio")
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval([1.0, 2.0], resamples=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval([1.0, 2.0], level=0.0)
    with pytest.raises(ValueError, match="unknown statistic"):
        bootstrap_interval([1.0, 2.0], "mode")
    with pytest.raises(ValueError, match="unknown comparison"):
        bootstrap_comparison([1.0], [2.0], compare="quotient")  # type: ignore[arg-type]


def test_large_samples_take_the_order_statistic_form_with_the_same_interval():
    sample = np.random.default_rng(5).lognormal(0, 0.5, 6000)
    for q in ("median", 95.0):
        fast = bootstrap_interval(sample, q, resamples=1000)
        full = bootstrap_interval(sample, q, resamples=1000, order_statistic_above=10**9)
        assert fast.point == full.point
        assert abs((fast.high - fast.low) - (full.high - full.low)) < 0.25 * (full.high - full.low), (fast, full)
        assert fast.low < fast.point < fast.high


def _exact_two_sample(base, other, statistic, how) -> np.ndarray:
    b, o = _exact_bootstrap(base, statistic), _exact_bootstrap(other, statistic)
    return np.asarray(comparison_of(b[:, None], o[None, :], how)).ravel()


@pytest.mark.parametrize("how", ["difference", "ratio", "relative_change"])
def test_bootstrap_comparison_matches_the_exact_two_sample_distribution(how):
    base, other = [1.0, 1.3, 2.2, 4.0, 0.6], [1.5, 2.9, 2.1, 6.0, 1.2]
    exact = _exact_two_sample(base, other, statistics.fmean, how)  # 3125 x 3125 pairs
    iv = bootstrap_comparison(base, other, "mean", compare=how, resamples=20_000, level=0.9, seed=3)
    assert iv.point == pytest.approx(float(comparison_of(statistics.fmean(base), statistics.fmean(other), how)))
    assert _cdf(exact, iv.low) == pytest.approx(0.05, abs=0.012)
    assert _cdf(exact, iv.high) == pytest.approx(0.95, abs=0.012)
    assert iv.resamples == 20_000


def _pure_python_ratio_bootstrap(numerator, denominator, statistic, reps, level, seed):
    """The ratio bootstrap experiments/common.py had before this module (random.Random, one call per resample)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(reps):
        num = statistic([numerator[rng.randrange(len(numerator))] for _ in numerator])
        den = statistic([denominator[rng.randrange(len(denominator))] for _ in denominator])
        if den > 0:
            ratios.append(num / den)
    ratios.sort()
    return ratios[math.floor((1 - level) / 2 * (len(ratios) - 1))], ratios[
        math.ceil((1 + level) / 2 * (len(ratios) - 1))
    ]


@pytest.mark.parametrize("statistic, name", [(statistics.median, "median"), (statistics.fmean, "mean")])
def test_ratio_interval_agrees_with_the_pure_python_bootstrap_it_replaced(statistic, name):
    rng = random.Random(3)
    num = [rng.lognormvariate(0, 0.3) * 2.0 for _ in range(60)]
    den = [rng.lognormvariate(0, 0.3) for _ in range(200)]
    old_lo, old_hi = _pure_python_ratio_bootstrap(num, den, statistic, 4000, 0.95, 0)
    iv = bootstrap_comparison(den, num, name, compare="ratio", resamples=4000, seed=0)
    assert iv.point == pytest.approx(statistic(num) / statistic(den))
    width = old_hi - old_lo
    assert abs(iv.low - old_lo) < 0.1 * width and abs(iv.high - old_hi) < 0.1 * width, (iv, old_lo, old_hi)


def test_a_ratio_leaves_out_resamples_with_no_positive_base():
    base = [0.0] * 4 + [1.0] * 6  # a resample's median is 0 about a quarter of the time
    iv = bootstrap_comparison(base, [2.0] * 10, "median", compare="ratio", resamples=2000)
    assert 1000 < iv.resamples < 2000 and iv.point == 2.0 and math.isfinite(iv.high)
    with pytest.raises(ValueError, match="positive base"):
        bootstrap_comparison([0.0, 0.0, 1.0], [1.0, 2.0], "median", compare="ratio")


def test_a_zero_base_gives_an_unbounded_relative_change_not_nan():
    iv = bootstrap_comparison([0.0] * 20, [1.0] * 20, "median", compare="relative_change")
    assert iv.point == iv.low == iv.high == math.inf
    assert bootstrap_comparison([0.0] * 5, [0.0] * 5, "mean", compare="relative_change").point == 0.0
    assert float(comparison_of(0.0, -2.0, "relative_change")) == -math.inf
    assert float(comparison_of(-4.0, -2.0, "relative_change")) == 0.5  # relative to |base|
    assert float(comparison_of(4.0, 1.0, "difference")) == -3.0 and float(comparison_of(4.0, 1.0, "ratio")) == 0.25


# --- spearman --------------------------------------------------------------------------------------
def _brute_ranks(values):
    """Average ranks by counting: 1 + (values below) + (other values equal) / 2."""
    return [1 + sum(w < v for w in values) + (sum(w == v for w in values) - 1) / 2 for v in values]


def _brute_spearman(xs, ys):
    rx, ry = _brute_ranks(xs), _brute_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def _previous_spearman(xs, ys):
    """The hand-written one metrics/passive.py had; stats.spearman must give the same bits."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None

    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxx = math.fsum((a - mx) ** 2 for a in rx)
    syy = math.fsum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry)) / math.sqrt(sxx * syy)


def _paired(rng: random.Random, n: int):
    xs = [rng.choice([rng.random(), float(rng.randint(0, 3))]) for _ in range(n)]  # ties, often
    ys = [x * rng.uniform(0.5, 2) + rng.gauss(0, 0.3) if rng.random() < 0.7 else float(rng.randint(0, 2)) for x in xs]
    return xs, ys


def test_spearman_matches_ranks_counted_by_hand_and_the_version_it_replaced():
    rng = random.Random(9)
    for _ in range(300):
        xs, ys = _paired(rng, rng.choice([2, 3, 5, 8, 30, 120]))
        rho = spearman(xs, ys)
        assert rho == _previous_spearman(xs, ys)
        if rho is not None:
            assert rho == pytest.approx(_brute_spearman(xs, ys), abs=1e-12)


def test_spearman_agrees_with_scipy():
    ss = _scipy_stats()
    rng = random.Random(10)
    for _ in range(100):
        xs, ys = _paired(rng, rng.choice([3, 10, 60]))
        rho = spearman(xs, ys)
        if rho is not None:
            assert rho == pytest.approx(ss.spearmanr(xs, ys).statistic, abs=1e-12)


def test_spearman_without_ties_is_the_squared_rank_difference_formula():
    xs = [0.5, 3.2, 1.1, 9.0, 4.4, 2.0, 7.5]
    ys = [1.0, 2.0, 0.3, 8.0, 9.0, 1.5, 3.0]
    d2 = sum((a - b) ** 2 for a, b in zip(_brute_ranks(xs), _brute_ranks(ys)))
    n = len(xs)
    assert spearman(xs, ys) == pytest.approx(1 - 6 * d2 / (n * (n * n - 1)))
    assert spearman(xs, [math.exp(x) for x in xs]) == pytest.approx(1.0)  # ranks only: any increasing map
    assert spearman(xs, [-x for x in xs]) == pytest.approx(-1.0)


def test_spearman_edges():
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert spearman([], []) is None
    assert spearman([1.0], [2.0]) is None
    assert spearman([1.0, 2.0], [1.0, 2.0, 3.0]) is None
    assert spearman([5.0] * 4, [1.0, 2.0, 3.0, 4.0]) is None  # constant: undefined, not 0
    assert spearman([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) is None
    with pytest.raises(ValueError, match="NaN"):
        spearman([1.0, math.nan, 3.0], [1.0, 2.0, 3.0])


# --- the cluster bootstrap ------------------------------------------------------------------------------
def _clustered_trial(rng: np.random.Generator, injections: int) -> tuple[list[float], list[list[float]]]:
    """Baseline gaps around 10 ms, and the gaps of `injections` prefill windows: each window's gaps
    share its own stall (lognormal around 30 ms, as prefills of different lengths and moments do)."""
    base = list(10 * rng.lognormal(0, 0.2, size=200))
    stalls = 30 * rng.lognormal(0, 0.6, size=injections)
    return base, [list(s * rng.lognormal(0, 0.05, size=10)) for s in stalls]


def test_gaps_clustered_by_injection_get_a_wider_interval_that_covers_the_truth():
    """Issue 26: the interference interval resampled single gaps as if independent, while the gaps of
    one injection move together. Over 100 simulated runs of five injections the per-gap interval
    covers the true ratio about a third of the time; the cluster interval (injections resampled,
    expanded for five of them) is wider in every run and covers it about nine times in ten."""
    rng = np.random.default_rng(5)
    truth = 30 * math.exp(0.6**2 / 2) / (10 * math.exp(0.2**2 / 2))  # the ratio of the two means
    covered_cluster = covered_gap = wider = 0
    trials = 100
    for seed in range(trials):
        base, groups = _clustered_trial(rng, 5)
        pooled = [x for g in groups for x in g]
        cluster = cluster_bootstrap_comparison([[x] for x in base], groups, "mean", compare="ratio", seed=seed)
        per_gap = bootstrap_comparison(base, pooled, "mean", compare="ratio", seed=seed)
        assert cluster.point == pytest.approx(per_gap.point)  # the same figure, a different interval
        covered_cluster += cluster.low <= truth <= cluster.high
        covered_gap += per_gap.low <= truth <= per_gap.high
        wider += cluster.high - cluster.low > per_gap.high - per_gap.low
    assert wider == trials
    assert covered_gap / trials < 0.5 and covered_cluster / trials >= 0.85, (covered_gap, covered_cluster)


def test_cluster_bootstrap_of_single_values_is_the_plain_bootstrap():
    """Groups of one are independent values: about the plain bootstrap's interval (other draws, and
    for 30 groups an expansion of a few percent)."""
    rng = np.random.default_rng(2)
    base, other = list(rng.lognormal(0, 0.3, 40)), list(rng.lognormal(0.5, 0.3, 30))
    plain = bootstrap_comparison(base, other, "mean", compare="ratio", seed=4, resamples=4000)
    grouped = cluster_bootstrap_comparison(
        [[x] for x in base], [[x] for x in other], "mean", compare="ratio", seed=4, resamples=4000
    )
    assert grouped.point == pytest.approx(plain.point)
    assert 1.0 <= (grouped.high - grouped.low) / (plain.high - plain.low) <= 1.15
    median = cluster_bootstrap_comparison([[1.0, 2.0], [3.0]], [[4.0], [6.0, 8.0]], "median", compare="difference")
    assert median.point == pytest.approx(6.0 - 2.0) and median.low <= median.point <= median.high
    with pytest.raises(ValueError, match="empty"):
        cluster_bootstrap_comparison([[1.0], []], [[2.0]], compare="ratio")
    with pytest.raises(ValueError, match="no groups"):
        cluster_bootstrap_comparison([], [[2.0]], compare="ratio")


def test_student_t_quantiles_and_the_expanded_level():
    scipy_stats = _scipy_stats()
    for df in (1, 2, 3, 4, 6, 10, 30):
        for p in (0.9, 0.975, 0.995):
            assert student_t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=0.01), (p, df)
    assert expanded_level(0.95, 1) == 0.95  # nothing to expand
    assert expanded_level(0.95, 5) > 0.995  # five groups: far into the tails
    assert expanded_level(0.95, 10_000) == pytest.approx(0.95, abs=1e-3)  # many groups: the plain level


# --- the import ----------------------------------------------------------------------------------------
def test_the_order_statistics_do_not_import_numpy():
    """results.py, and the decision tree above it, stay free of numpy (the bootstrap imports it when called)."""
    code = (
        "import sys, llm_diagnose.probes.stats, llm_diagnose.probes.results; "
        "assert 'numpy' not in sys.modules, 'numpy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
