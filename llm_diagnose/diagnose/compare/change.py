"""The change of a statistic between two runs: its bootstrap interval, or a plain difference.

Relative (`(current - baseline) / |baseline|`, unbounded where the baseline is 0) or absolute
(`current - baseline`). The arithmetic and the bootstrap are `llm_diagnose.probes.stats`'
(`comparison_of`, `bootstrap_comparison`): here they are named for what a comparison of two runs
asks, and a change is written as a person reads it.
"""

from __future__ import annotations

import math

import numpy as np

from llm_diagnose.diagnose.compare.statistic import Statistic
from llm_diagnose.probes.stats import ORDER_STATISTIC_ABOVE, bootstrap_comparison, comparison_of

__all__ = ["EXACT_BOOTSTRAP_MAX", "bootstrap_change", "change_of", "format_change"]

# Above this many samples a quantile's bootstrap takes its order-statistic form (read per call: tests lower it).
EXACT_BOOTSTRAP_MAX = ORDER_STATISTIC_ABOVE


def change_of(base: np.ndarray | float, cur: np.ndarray | float, relative: bool):
    """`cur` against `base`: relative change, or difference."""
    return comparison_of(base, cur, "relative_change" if relative else "difference")


def bootstrap_change(
    base, cur, stat: Statistic, *, relative: bool, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(point, low, high): the change of `stat` from `base` to `cur`, with its bootstrap interval.

    llm_diagnose.probes.stats.bootstrap_comparison computes it: the interval takes order
    statistics of the resampled changes (no interpolation, so an infinite change from a zero
    resample stays infinite instead of becoming NaN).
    """
    interval = bootstrap_comparison(
        base,
        cur,
        "mean" if stat.q is None else stat.q,
        compare="relative_change" if relative else "difference",
        resamples=resamples,
        level=confidence,
        seed=seed,
        order_statistic_above=EXACT_BOOTSTRAP_MAX,
    )
    return interval.point, interval.low, interval.high


def format_change(x: float, relative: bool) -> str:
    """ "+12.3%" (relative), "+0.05" (absolute), "+inf"."""
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:+.1%}" if relative else f"{x:+.4g}"
