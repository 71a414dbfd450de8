"""Sets of 64-bit hashes that grow to hundreds of millions of members in bounded memory.

Two layouts, chosen by the values: block ids that are small non-negative integers (Mooncake
numbers its blocks) live in a bitmap, one bit each; arbitrary 64-bit hashes live in sorted
runs merged as they double (a log-structured set), so adding is amortised O(log n) per value
and a lookup of sorted queries is a few cache-friendly binary searches.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HashSet", "SortedRunSet", "IdBitmapSet"]

_BITMAP_LIMIT = 1 << 31  # ids below this fit a bitmap of at most 256 MiB; above, sorted runs


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


class IdBitmapSet:
    """Non-negative integer ids below 2^31 as a bitmap that grows with the largest id."""

    def __init__(self) -> None:
        self._bits = np.zeros(1 << 16, dtype=np.uint8)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._bits.nbytes

    @staticmethod
    def fits(values: np.ndarray) -> bool:
        return len(values) == 0 or int(values.max()) < _BITMAP_LIMIT

    def contains(self, values: np.ndarray) -> np.ndarray:
        byte = (values >> np.uint64(3)).astype(np.int64)
        inside = byte < len(self._bits)
        out = np.zeros(len(values), dtype=bool)
        b = byte[inside]
        out[inside] = (self._bits[b] >> (values[inside] & np.uint64(7)).astype(np.uint8)) & 1 == 1
        return out

    def add_new(self, sorted_new: np.ndarray) -> None:
        if len(sorted_new) == 0:
            return
        need = (int(sorted_new[-1]) >> 3) + 1
        if need > len(self._bits):
            grown = np.zeros(max(need, 2 * len(self._bits)), dtype=np.uint8)
            grown[: len(self._bits)] = self._bits
            self._bits = grown
        byte = (sorted_new >> np.uint64(3)).astype(np.int64)
        bit = np.left_shift(np.uint8(1), (sorted_new & np.uint64(7)).astype(np.uint8))
        np.bitwise_or.at(self._bits, byte, bit)
        self._count += len(sorted_new)

    def values(self) -> np.ndarray:
        return np.flatnonzero(np.unpackbits(self._bits, bitorder="little")).astype(np.uint64)


class HashSet:
    """A set of uint64 values: a bitmap while they are small ids, sorted runs otherwise."""

    def __init__(self, prefer_bitmap: bool = False) -> None:
        self._impl: SortedRunSet | IdBitmapSet = IdBitmapSet() if prefer_bitmap else SortedRunSet()

    def __len__(self) -> int:
        return len(self._impl)

    @property
    def nbytes(self) -> int:
        return self._impl.nbytes

    def contains(self, sorted_values: np.ndarray) -> np.ndarray:
        return self._impl.contains(sorted_values)

    def add_new(self, sorted_new: np.ndarray) -> None:
        if isinstance(self._impl, IdBitmapSet) and not IdBitmapSet.fits(sorted_new):
            runs = SortedRunSet()
            runs.add_new(self._impl.values())
            self._impl = runs
        self._impl.add_new(sorted_new)
