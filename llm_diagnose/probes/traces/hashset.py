"""Sets of 64-bit hashes that grow to hundreds of millions of members in bounded memory.

The hashes live in sorted runs merged as they double (a log-structured set), so adding is
amortised O(log n) per value and a lookup of sorted queries is a few cache-friendly binary
searches. (Block ids that are small integers are kept by direct addressing instead: seen.py.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["SortedRunSet"]


class SortedRunSet:
    """Distinct uint64 values kept as a few sorted runs, the newest the smallest."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self._runs)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._runs)

    def contains(self, sorted_values: np.ndarray) -> np.ndarray:
        """Membership of each value; the values must be sorted (searches stay cache-friendly)."""
        found = np.zeros(len(sorted_values), dtype=bool)
        for run in self._runs:
            if len(run) == 0:
                continue
            idx = np.searchsorted(run, sorted_values)
            np.minimum(idx, len(run) - 1, out=idx)
            found |= run[idx] == sorted_values
        return found

    def add_new(self, sorted_new: np.ndarray) -> None:
        """Add sorted distinct values known not to be members."""
        if len(sorted_new) == 0:
            return
        self._runs.append(np.array(sorted_new, dtype=np.uint64))
        while len(self._runs) > 1 and len(self._runs[-2]) <= 2 * len(self._runs[-1]):
            top = self._runs.pop()
            below = self._runs.pop()
            merged = np.concatenate([below, top])
            merged.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
            self._runs.append(merged)

    def keep(self, predicate) -> None:
        """Drop the members for which predicate(values) is False (consistent subsampling)."""
        self._runs = [r[predicate(r)] for r in self._runs]

    def values(self) -> np.ndarray:
        return np.sort(np.concatenate(self._runs)) if self._runs else np.empty(0, dtype=np.uint64)
