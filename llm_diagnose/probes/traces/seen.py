"""What a prefix cache has seen of each block, looked up a batch at a time.

For each block of a batch (requests laid end to end, in trace order) the prefix analysis needs:
was the same block sent before, in an earlier batch or earlier in this one; for multi-turn
reuse, was it an earlier batch's prompt's *last* block, and is it a last block in this batch.
Two layouts give that:

- `SeenIds`: block ids that are small non-negative integers (Mooncake numbers its blocks 0, 1,
  2, ...): one byte of flags per id, read by direct addressing. No hashing and no sorting: a
  batch costs a handful of linear numpy passes. The ids new to the cache are usually
  increasing (Mooncake numbers fresh blocks in order), so all distinct; otherwise each one's
  first position in the batch comes from a scatter into a scratch array over their range.
- `SeenHashes`: arbitrary 64-bit keys (chained block hashes; ids too large, too sparse or
  negative for a table indexed by id): one sort of the batch groups equal keys, and the keys
  seen so far live in sorted runs (hashset.SortedRunSet).

`SeenIds` hands over to `SeenHashes` (carrying what it has seen) when an id does not fit.
"""

from __future__ import annotations

import numpy as np

from llm_diagnose.probes.traces.hashing import Groups
from llm_diagnose.probes.traces.hashset import SortedRunSet

__all__ = ["BatchLookup", "SeenIds", "SeenHashes", "seen_blocks", "first_positions", "DENSE_ID_LIMIT"]

DENSE_ID_LIMIT = 1 << 28  # one byte per id: at most 256 MiB of flags; larger ids are hashed
_SPARSE = 16  # ids spread wider than 16 per id seen (beyond the first 16 M) are hashed too
_SEEN, _LAST, _LAST_HERE = np.uint8(1), np.uint8(2), np.uint8(4)
_NOBODY = np.iinfo(np.int64).max
_NONE = np.empty(0, dtype=np.int64)


class BatchLookup:
    """A batch looked up."""

    __slots__ = ("sent", "repeat_at", "repeat_first", "_was_last", "_last_here")

    def __init__(self, sent, repeat_at=_NONE, repeat_first=_NONE, was_last=None, last_here=None) -> None:
        self.sent = sent  # per block: sent before, in an earlier batch or earlier in this one (bool)
        # Blocks first sent earlier in this batch, and where; for the caller to tell a repeat inside
        # one request (no hit) from one across requests. Empty where a key cannot repeat within a
        # request (chained hashes: equal keys sit at equal depths).
        self.repeat_at, self.repeat_first = repeat_at, repeat_first
        self._was_last, self._last_here = was_last, last_here  # arrays, or functions making them

    @property
    def was_last(self) -> np.ndarray:
        """Per block: an earlier batch's prompt ended with it (bool)."""
        return self._was_last() if callable(self._was_last) else self._was_last

    @property
    def last_here(self) -> np.ndarray:
        """Per block: a prompt of this batch ends with it (bool)."""
        return self._last_here() if callable(self._last_here) else self._last_here


def first_positions(codes: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For each element, the smallest position among the elements with the same code.

    `positions` ascend (or at least each code's first element has its smallest position).
    Increasing codes are all distinct (new ids in a Mooncake trace are
    numbered in order). Codes in a range not much wider than their number are scattered into a
    scratch array (np.minimum.at: linear); codes spread wider are grouped by a sort.
    """
    if len(codes) < 2 or (codes[1:] > codes[:-1]).all():
        return positions
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo < 16 * len(codes) + (1 << 20):
        rel = codes - lo if codes.dtype == np.int64 else (codes - lo).astype(np.intp)
        scratch = np.full(hi - lo + 1, _NOBODY, dtype=np.int64)
        np.minimum.at(scratch, rel, positions)
        return scratch[rel]
    g = Groups(codes.astype(np.uint64))
    first = np.empty(len(codes), dtype=np.int64)
    first[g.order] = g.spread(positions[g.first])
    return first


class SeenIds:
    """Flags per block id (seen, a prompt's last block), indexed by the id itself."""

    def __init__(self) -> None:
        self._flags = np.zeros(1 << 16, dtype=np.uint8)
        self._count = 0
        self._new: tuple[np.ndarray, bool] | None = None  # the batch's new ids, whether all distinct

    def __len__(self) -> int:
        return self._count

    def lookup(self, ids: np.ndarray, last: np.ndarray | None) -> BatchLookup | None:
        """`ids`: the batch's block ids (uint64); `last`: positions of prompts' last blocks, or None
        where multi-turn reuse is not followed. None when an id does not fit: below the limit,
        and not so sparse that a byte per id would cost far more than sorted runs (8 bytes per
        distinct id)."""
        top = int(ids.max()) + 1 if len(ids) else 0  # (uint64: a negative id is huge)
        if top > DENSE_ID_LIMIT or top > _SPARSE * (self._count + len(ids)) + (1 << 24):
            return None
        if top > len(self._flags):
            grown = np.zeros(max(top, 2 * len(self._flags)), dtype=np.uint8)
            grown[: len(self._flags)] = self._flags
            self._flags = grown
        ids = ids.view(np.int64)  # (below the limit the same values; numpy indexes by intp without a cast)
        flags = self._flags
        if last is not None:
            ends = ids[last]
            flags[ends] |= _LAST_HERE  # (repeated ids write the same value)
        f = flags[ids]
        if last is not None:
            flags[ends] &= ~_LAST_HERE
        sent = (f & _SEEN).view(bool)
        new = np.flatnonzero(~sent)
        new_ids = ids[new]
        first = first_positions(new_ids, new)
        distinct = first is new
        repeat_at = repeat_first = _NONE
        if not distinct:
            repeat = np.flatnonzero(first < new)
            repeat_at, repeat_first = new[repeat], first[repeat]
            sent = sent.copy()
            sent[repeat_at] = True
            self._count += len(new) - len(repeat)
        else:
            self._count += len(new)
        self._new = new_ids, distinct
        # (the multi-turn flags are read only where the analysis asks for them)
        return BatchLookup(
            sent, repeat_at, repeat_first, lambda: (f & _LAST).view(bool), lambda: (f & _LAST_HERE).view(bool)
        )

    def commit(self, ids: np.ndarray, last: np.ndarray | None) -> None:
        """Record the batch looked up last: its new blocks as seen, its prompts' last blocks as such."""
        if self._new is None:
            raise RuntimeError("commit() records the batch lookup() read: call lookup() first")
        new, distinct = self._new
        # A new id had no flags (LAST_HERE is cleared): a plain store, repeated ids storing the same.
        if distinct and len(new) and int(new[-1]) - int(new[0]) + 1 == len(new):
            self._flags[int(new[0]) : int(new[-1]) + 1] = _SEEN  # increasing and consecutive: a range (Mooncake)
        else:
            self._flags[new] = _SEEN
        if last is not None:
            self._flags[ids.view(np.int64)[last]] |= _LAST
        self._new = None

    def to_hashes(self) -> SeenHashes:
        """The same contents in the layout for arbitrary keys (an id beyond the dense range came)."""
        out = SeenHashes(chained=False)
        out.seen.add_new(np.flatnonzero(self._flags & _SEEN).astype(np.uint64))
        out.last.add_new(np.flatnonzero(self._flags & _LAST).astype(np.uint64))
        return out


class SeenHashes:
    """Seen keys and prompts' last keys as sorted runs; a batch is grouped by one sort.

    `chained`: the keys are chained block hashes, which never repeat within one request.
    """

    def __init__(self, chained: bool = True) -> None:
        self.chained = chained
        self.seen = SortedRunSet()
        self.last = SortedRunSet()
        self._batch: tuple[Groups, np.ndarray] | None = None  # the batch looked up: its groups, which were seen

    def __len__(self) -> int:
        return len(self.seen)

    def lookup(self, keys: np.ndarray, last: np.ndarray | None) -> BatchLookup:
        g = Groups(keys)
        in_set = self.seen.contains(g.values)
        self._batch = g, in_set
        # In sorted order a group's first element was sent before only if the set has it; the
        # others were (by the group's first, earlier in this batch).
        sent_sorted = np.ones(len(keys), dtype=bool)
        sent_sorted[g.starts] = in_set
        sent = np.empty(len(keys), dtype=bool)
        sent[g.order] = sent_sorted
        repeat_at = repeat_first = _NONE
        if not self.chained:
            groups = np.flatnonzero(~in_set & (g.sizes > 1))
            if len(groups):
                marked = np.zeros(len(g.values), dtype=bool)
                marked[groups] = True
                repeated = np.repeat(marked, g.sizes)
                repeated[g.starts] = False  # (each group's first is the block first sent)
                repeat_at = g.order[repeated]
                repeat_first = np.repeat(g.first, g.sizes)[repeated]
        if last is None:
            return BatchLookup(sent, repeat_at, repeat_first)
        group = g.inverse()
        was_last = np.zeros(len(g.values), dtype=bool)
        was_last[in_set] = self.last.contains(g.values[in_set])
        last_here = np.zeros(len(g.values), dtype=bool)
        last_here[group[last]] = True
        return BatchLookup(sent, repeat_at, repeat_first, lambda: was_last[group], lambda: last_here[group])

    def commit(self, keys: np.ndarray, last: np.ndarray | None) -> None:
        if self._batch is None:
            raise RuntimeError("commit() records the batch lookup() read: call lookup() first")
        g, in_set = self._batch
        self.seen.add_new(g.values[~in_set])
        if last is not None:
            ends = np.unique(keys[last])
            self.last.add_new(ends[~self.last.contains(ends)])
        self._batch = None


def seen_blocks(small_ids: bool) -> SeenIds | SeenHashes:
    return SeenIds() if small_ids else SeenHashes(chained=True)
