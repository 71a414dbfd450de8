"""What a comparison compares: the statistic an evidence key names.

A key ending `_p99_s` (any `_pNN`) names that quantile, one ending `_mean` the mean, any other the
median; a rule may name another (`statistic = "p95"`). Computing a statistic's value and its
bootstrap is `llm_diagnose.probes.stats`' job: `Statistic` only says which one, and how many
samples a tail quantile needs before its bootstrap means anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Statistic", "statistic_name", "statistic_of", "is_tail", "TAIL_MIN", "STATISTIC_NAME"]

TAIL_MIN = 3  # samples needed beyond a tail quantile for its bootstrap to mean anything
STATISTIC_NAME = re.compile(r"^(median|mean|p\d{1,2}(\.\d+)?)$")  # what a rule may name
_QUANTILE_IN_KEY = re.compile(r"_p(\d{1,2}(?:\.\d+)?)(?:_|$)")


def statistic_name(key: str, override: str | None = None) -> str:
    """The statistic a key names: "p99" for `*_p99*`, "mean" for `*_mean`, else "median"."""
    if override:
        return "median" if override == "p50" else override
    m = _QUANTILE_IN_KEY.search(key)
    if m:
        return "median" if float(m.group(1)) == 50 else f"p{m.group(1)}"
    return "mean" if key.endswith("_mean") or "_mean_" in key else "median"


def is_tail(statistic: str) -> bool:
    return statistic.startswith("p") and float(statistic[1:]) > 50


@dataclass(frozen=True)
class Statistic:
    """What is compared: the mean, or a quantile `q` in percent (50: the median)."""

    name: str  # "median", "mean", "p99"
    q: float | None  # None for the mean

    def __call__(self, values, axis=None):
        return np.mean(values, axis=axis) if self.q is None else np.percentile(values, self.q, axis=axis)

    @property
    def tail(self) -> bool:
        return self.q is not None and self.q > 50

    @property
    def beyond_tail(self) -> int:
        """How many samples a run needs for a tail quantile's bootstrap (TAIL_MIN past it); 0 for others."""
        return math.ceil(TAIL_MIN / (1 - self.q / 100)) if self.q is not None and self.tail else 0


def statistic_of(key: str, override: str | None = None) -> Statistic:
    """The statistic a key names (p99 for `*_p99*`, mean for `*_mean`), else the median."""
    name = statistic_name(key, override)
    return Statistic(name, None if name == "mean" else 50.0 if name == "median" else float(name[1:]))
