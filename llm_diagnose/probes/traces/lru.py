"""An exact LRU cache over block hashes, simulated in vectorised chunks.

An LRU cache of K blocks holds exactly the K most recently used distinct blocks, so an
access hits when fewer than K distinct other blocks were used since the block's last use.
The simulation keeps the cache (its blocks, sorted by hash, with their last-use times) between
chunks of at most K accesses and decides every access of a chunk at once:

- a block used earlier in the same chunk: fewer than K accesses lie between, so it hits;
- a block not in the cache at the chunk's start: it misses;
- a cached block of recency rank r (r blocks used more recently), first used in the chunk
  after f other first uses: the distinct blocks since its last use are r plus those first
  uses whose block is older than it or uncached. r + f < K is a sure hit; otherwise the
  exact count is an inversion count over the few first uses of old blocks.

Prefix-cache semantics: a request uses its blocks last to first (vLLM frees a finished
request's blocks in reverse so the tail is evicted first). Then a block is always more recent
than the block after it, and a request's hits are a leading run of its blocks.
"""

from __future__ import annotations

import numpy as np

from llm_diagnose.probes.traces.hashing import Groups

__all__ = ["LruBlockCache", "count_earlier_greater"]

_MIN_CHUNK = 1 << 18
_UNCACHED = 1 << 62  # the rank of a block not in the cache: older than any cached one


def count_earlier_greater(values: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements are greater (values distinct)."""
    n = len(values)
    out = np.zeros(n, dtype=np.int64)
    if n < 2:
        return out
    ranks = np.empty(n, dtype=np.int64)
    ranks[np.argsort(values, kind="stable")] = np.arange(n)
    # Bottom-up merge sort: `perm` lists the elements so that each block of `width` is sorted.
    perm = np.arange(n)
    width = 1
    slot = np.arange(n)
    while width < n:
        pair = slot // (2 * width)
        merged = np.argsort(pair * n + ranks[perm], kind="stable")  # merges two sorted runs
        new_slot = np.empty(n, dtype=np.int64)
        new_slot[merged] = slot  # where each element lands in the merged order
        in_pair = slot - pair * 2 * width
        right = in_pair >= width
        # A right-half element is preceded in merged order by the left elements smaller than it.
        left_len = np.minimum(width, n - pair * 2 * width)
        smaller_left = (new_slot - pair * 2 * width) - (in_pair - width)
        out[perm[right]] += (left_len - smaller_left)[right]
        perm = perm[merged]
        width *= 2
    return out


class LruBlockCache:
    """LRU over uint64 block hashes with a capacity in blocks."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("an LRU cache needs a capacity of at least one block")
        self.capacity = int(capacity_blocks)
        self._chunk = min(self.capacity, max(_MIN_CHUNK, self.capacity // 4))
        self._keys = np.empty(0, dtype=np.uint64)  # cached blocks, sorted by hash
        self._times = np.empty(0, dtype=np.int64)  # their last-use times, aligned with _keys
        self._clock = 0

    def __len__(self) -> int:
        return len(self._keys)

    def access(self, blocks: np.ndarray) -> np.ndarray:
        """Use the blocks in order; returns whether each use found its block cached."""
        blocks = np.asarray(blocks, dtype=np.uint64)
        hits = np.empty(len(blocks), dtype=bool)
        for lo in range(0, len(blocks), self._chunk):
            hi = min(lo + self._chunk, len(blocks))
            hits[lo:hi] = self._access_chunk(blocks[lo:hi])
        return hits

    def _access_chunk(self, chunk: np.ndarray) -> np.ndarray:
        K = self.capacity
        g = Groups(chunk)
        uniq, first = g.values, g.first
        size = len(self._keys)
        if size:
            idx = np.minimum(np.searchsorted(self._keys, uniq), size - 1)
            cached = self._keys[idx] == uniq
        else:
            idx = np.zeros(len(uniq), dtype=np.int64)
            cached = np.zeros(len(uniq), dtype=bool)
        # Recency rank at the chunk's start: how many cached blocks were used more recently.
        times_sorted = np.sort(self._times)
        rank = np.full(len(uniq), _UNCACHED, dtype=np.int64)
        old_times = self._times[idx[cached]]
        by_old = np.argsort(old_times)  # sorted queries keep the binary searches in cache
        where = np.empty(len(old_times), dtype=np.int64)
        where[by_old] = np.searchsorted(times_sorted, old_times[by_old])
        rank[cached] = size - 1 - where
        # First uses in the order they happen.
        by_time = np.argsort(first)
        rho = rank[by_time]
        f = np.arange(len(uniq), dtype=np.int64)
        is_cached = rho < K
        first_hit = is_cached & (rho + f < K)
        unsure = is_cached & ~first_hit
        if unsure.any():
            uncached_before: np.ndarray = np.cumsum(~is_cached) - ~is_cached
            # Only old blocks (rank >= K - F) can be older than an unsure one and cached.
            tail = is_cached & (rho >= K - len(uniq))
            older_cached_before = np.zeros(len(uniq), dtype=np.int64)
            older_cached_before[tail] = count_earlier_greater(rho[tail])
            distinct = rho + uncached_before + older_cached_before
            first_hit |= unsure & (distinct < K)
        hit_of_group = np.empty(len(uniq), dtype=bool)
        hit_of_group[by_time] = first_hit
        hits_sorted = np.ones(len(chunk), dtype=bool)  # a repeat within the chunk always hits
        hits_sorted[g.starts] = hit_of_group
        hits = np.empty(len(chunk), dtype=bool)
        hits[g.order] = hits_sorted
        self._update(uniq, g, cached, idx)
        self._clock += len(chunk)
        return hits

    def _update(self, uniq: np.ndarray, g: Groups, cached: np.ndarray, idx: np.ndarray) -> None:
        new_times = self._clock + g.last  # last use of each block in the chunk, as a global time
        keep = np.ones(len(self._keys), dtype=bool)
        keep[idx[cached]] = False
        keys, times = self._keys[keep], self._times[keep]
        at = np.searchsorted(keys, uniq)
        keys = np.insert(keys, at, uniq)
        times = np.insert(times, at, new_times)
        if len(keys) > self.capacity:
            threshold = np.partition(times, len(times) - self.capacity)[len(times) - self.capacity]
            recent = times >= threshold
            keys, times = keys[recent], times[recent]
        self._keys, self._times = keys, times
