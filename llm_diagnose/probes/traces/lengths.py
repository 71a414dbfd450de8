"""Length distributions (input and output tokens): the tail matters more than the mean.

Output lengths in real traces are heavy-tailed (coefficients of variation from about 0.7 to
above 2), so besides percentiles this reports the tail ratio p99/p50 and the share of all
tokens that the longest 1% and 10% of requests carry: with a large share, a few requests
hold the batch (and the KV cache) while the short ones wait (Q3).

Lengths are whole numbers, so they are kept as a histogram (one counter per length seen):
exact statistics in memory bounded by the longest length, not by the number of requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llm_diagnose.probes.results import Summary, _median_ci, percentile

__all__ = ["LengthStats", "LengthHistogram", "length_stats"]

_HISTOGRAM_MAX = 1 << 22  # lengths above this (absurd, but possible in bad data) are kept one by one


@dataclass(frozen=True)
class LengthStats:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    cv: float | None  # sample standard deviation / mean; None where the mean is 0
    tail_ratio: float | None  # p99 / p50; None where p50 is 0
    top1pct_token_share: float  # share of all tokens in the longest 1% of requests
    top10pct_token_share: float
    source: str  # "trace" (the file states it), a tokenizer's name, or the approximation's
    summary: Summary

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "summary"}
        d["median"] = self.p50
        return d


class LengthHistogram:
    """Counts per length, growing with the longest length seen."""

    def __init__(self) -> None:
        self.counts = np.zeros(1024, dtype=np.int64)
        self.overflow: list[int] = []

    def add(self, values) -> None:
        v = np.asarray(values, dtype=np.int64)
        if len(v) == 0:
            return
        big = v > _HISTOGRAM_MAX
        if big.any():
            self.overflow.extend(v[big].tolist())
            v = v[~big]
        if len(v) == 0:
            return
        top = int(v.max())
        if top >= len(self.counts):
            grown = np.zeros(max(top + 1, 2 * len(self.counts)), dtype=np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts += np.bincount(v, minlength=len(self.counts))


class _SortedView:
    """The histogram as the sorted sample it stands for: len() and [rank], nothing stored.

    It lets `llm_diagnose.probes.results.percentile` and the median's confidence interval run unchanged.
    """

    def __init__(self, h: LengthHistogram) -> None:
        self._ends = np.cumsum(h.counts)  # rank just past each length's run
        self._hist_n = int(self._ends[-1])
        self._overflow = sorted(h.overflow)

    def __len__(self) -> int:
        return self._hist_n + len(self._overflow)

    def __getitem__(self, rank: int) -> float:
        if rank < 0:
            rank += len(self)
        if rank >= self._hist_n:
            return float(self._overflow[rank - self._hist_n])
        return float(np.searchsorted(self._ends, rank, side="right"))


def length_stats(h: LengthHistogram, source: str) -> LengthStats | None:
    """Exact statistics of the lengths in a histogram; None for no lengths."""
    values = np.arange(len(h.counts), dtype=np.float64)
    over = np.asarray(h.overflow, dtype=np.float64)
    n = int(h.counts.sum()) + len(over)
    if n == 0:
        return None
    total = float(h.counts @ values + over.sum())
    mean = total / n
    sq = float(h.counts @ (values - mean) ** 2 + ((over - mean) ** 2).sum())
    stdev = math.sqrt(sq / (n - 1)) if n > 1 else 0.0
    view = _SortedView(h)
    p05, p50, p90, p95, p99 = (percentile(view, q) for q in (5, 50, 90, 95, 99))
    lo, hi = _median_ci(view)

    def top_share(q: float) -> float:
        """Tokens in the longest ceil(q * n) requests, over all tokens."""
        k = max(1, math.ceil(n * q))
        big = sorted(over.tolist(), reverse=True)[:k]
        s, k = sum(big), k - len(big)
        if k > 0:
            rev = h.counts[::-1]
            taken = np.minimum(rev, np.maximum(0, k - (np.cumsum(rev) - rev)))
            s += float(taken @ values[::-1])
        return s / total if total else 0.0

    return LengthStats(
        count=n,
        mean=mean,
        p50=p50,
        p90=p90,
        p99=p99,
        max=int(view[n - 1]),
        cv=stdev / mean if mean else None,
        tail_ratio=p99 / p50 if p50 else None,
        top1pct_token_share=top_share(0.01),
        top10pct_token_share=top_share(0.10),
        source=source,
        summary=Summary(
            n=n,
            mean=mean,
            median=p50,
            stdev=stdev,
            min=view[0],
            max=view[n - 1],
            p05=p05,
            p95=p95,
            p99=p99,
            ci_low=lo,
            ci_high=hi,
        ),
    )
