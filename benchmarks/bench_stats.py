"""The ratio bootstrap experiments use: the pure-Python one it replaced beside llm_diagnose.probes.stats, in one run.

    python benchmarks/bench_stats.py [--rounds 3] [--reps 2000] [--out FILE]

Same inputs for both (lognormal numerator and denominator samples of a few sizes, the median
and the mean), interleaved round by round so machine noise hits them alike; the time is the
median of the rounds. The reference is a copy of `ratio_with_bootstrap_ci`'s resampling loop as
it was (random.Random, one Python call of the statistic per resample); the new one is
`stats.bootstrap_comparison(..., compare="ratio")`, numpy-vectorised and seeded. Both draw
their own random numbers, so their intervals agree only to Monte Carlo error: the table shows
both, and the point estimates, which must be identical.

Writes markdown to stdout and to --out.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np  # noqa: E402

from llm_diagnose.probes.stats import bootstrap_comparison  # noqa: E402

SIZES = ((60, 200), (300, 300), (1000, 1000))  # (numerator, denominator) sample sizes
STATISTICS: tuple[tuple[str, Callable[[Sequence[float]], float]], ...] = (
    ("median", statistics.median),
    ("mean", statistics.fmean),
)


def pure_python_ratio(
    numerator: Sequence[float],
    denominator: Sequence[float],
    statistic: Callable[[Sequence[float]], float],
    reps: int,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """The reference: ratio_with_bootstrap_ci's interval as experiments/common.py computed it before."""
    value = statistic(numerator) / statistic(denominator)
    rng = random.Random(seed)
    n_num, n_den = len(numerator), len(denominator)
    ratios = []
    for _ in range(reps):
        num = statistic([numerator[rng.randrange(n_num)] for _ in range(n_num)])
        den = statistic([denominator[rng.randrange(n_den)] for _ in range(n_den)])
        if den > 0:
            ratios.append(num / den)
    ratios.sort()
    lo = ratios[int(math.floor((1 - level) / 2 * (len(ratios) - 1)))]
    hi = ratios[int(math.ceil((1 + level) / 2 * (len(ratios) - 1)))]
    return value, lo, hi


def vectorised_ratio(
    numerator: Sequence[float],
    denominator: Sequence[float],
    statistic: Callable[[Sequence[float]], float],
    name: str,
    reps: int,
) -> tuple[float, float, float]:
    """What ratio_with_bootstrap_ci does now: the point as before, the interval from stats."""
    value = statistic(numerator) / statistic(denominator)
    iv = bootstrap_comparison(denominator, numerator, name, compare="ratio", resamples=reps, seed=0)
    return value, iv.low, iv.high


def timed(fn: Callable[[], tuple[float, float, float]]) -> tuple[float, tuple[float, float, float]]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (experiments use 2000)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    rng = np.random.default_rng(1)
    vectorised_ratio([1.0, 2.0], [1.0, 2.0], statistics.median, "median", 10)  # numpy imported and warm
    lines = [
        f"Ratio bootstrap, {args.reps} resamples, median of {args.rounds} interleaved rounds; "
        f"Python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs ({platform.machine()}).",
        "",
        "| statistic | n (num / den) | pure Python | stats (numpy) | speed-up | point identical "
        "| interval, pure Python | interval, stats |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, statistic in STATISTICS:
        for n_num, n_den in SIZES:
            num = rng.lognormal(0.7, 0.3, n_num).tolist()
            den = rng.lognormal(0.0, 0.3, n_den).tolist()
            old_t, new_t = [], []
            for _ in range(args.rounds):
                t, old = timed(lambda: pure_python_ratio(num, den, statistic, args.reps))  # noqa: B023
                old_t.append(t)
                t, new = timed(lambda: vectorised_ratio(num, den, statistic, name, args.reps))  # noqa: B023
                new_t.append(t)
            o, v = statistics.median(old_t), statistics.median(new_t)
            same = "yes" if old[0] == new[0] else "NO"
            lines.append(
                f"| {name} | {n_num} / {n_den} | {o * 1e3:.0f} ms | {v * 1e3:.1f} ms | {o / v:.0f}x | {same} "
                f"| [{old[1]:.4f}, {old[2]:.4f}] | [{new[1]:.4f}, {new[2]:.4f}] |"
            )
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
