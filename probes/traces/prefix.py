"""Prefix overlap as a prefix cache sees it, streamed over batches of requests.

For each request, in trace order: how many of its full blocks an unlimited exact-prefix
cache would already hold (every earlier request's blocks stay), and how many an LRU cache of
a given capacity would. The gap between the two says whether more KV memory or KV offload
would pay. Alongside, the reuse structure:

- prefix groups: requests grouped by the deepest block they share with earlier requests (the
  point where they branch off). A shared system prompt or template is one large group whose
  shared length is the prompt's length; a conversation turn branches off its own history.
- multi-turn reuse: requests whose shared prefix contains an earlier request's whole prompt
  (chat clients re-send the history every turn).

Only full blocks count: a prefix cache stores and matches whole blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from probes.traces.hashing import Groups, segment_positions
from probes.traces.hashset import HashSet
from probes.traces.lru import LruBlockCache

__all__ = ["PrefixAnalyzer", "PrefixReuse", "PrefixGroup", "BatchHits", "leading_run"]

TOP_GROUPS = 10
_TRACKED_GROUPS = 4096  # heavy-hitter counters kept for the top groups (bounded memory)


@dataclass(frozen=True)
class PrefixGroup:
    """Requests that branch off the same shared prefix (a system prompt, a template)."""

    prefix_hash: str  # hash of the shared prefix's last block, hex (never the text)
    requests: int  # requests that reused this prefix (the one that first sent it not counted)
    share: float  # of all requests
    shared_tokens: int  # length of the shared prefix, in full blocks' tokens

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PrefixReuse:
    block_size: int
    requests: int
    prompt_tokens: int
    hit_tokens: int  # served by an unlimited cache
    token_fraction: float  # hit_tokens / prompt_tokens
    requests_with_hit_fraction: float
    distinct_blocks: int
    capacity_tokens: int | None
    lru_hit_tokens: int | None
    lru_token_fraction: float | None
    top_groups: tuple[PrefixGroup, ...]
    continuation_requests_fraction: float  # requests extending an earlier request's whole prompt
    history_token_fraction: float  # prompt tokens served from such earlier prompts
    groups_exact: bool  # False when more groups existed than counters were kept

    @property
    def capacity_gap(self) -> float | None:
        """Share of prompt tokens an unlimited cache serves but the LRU at capacity does not."""
        return None if self.lru_token_fraction is None else self.token_fraction - self.lru_token_fraction

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "top_groups"}
        d["top_groups"] = [g.to_dict() for g in self.top_groups]
        d["capacity_gap"] = self.capacity_gap
        return d


@dataclass(frozen=True)
class BatchHits:
    hit_blocks: np.ndarray  # per request, unlimited cache
    lru_hit_blocks: np.ndarray | None


def leading_run(hit: np.ndarray, blocks_per_request: np.ndarray, local: np.ndarray | None = None) -> np.ndarray:
    """Per request: how many of its first blocks are hits before the first miss.

    `local`: each block's index within its request, where the caller has it already.
    """
    counts = np.asarray(blocks_per_request, dtype=np.int64)
    out = counts.copy()
    nonempty = np.flatnonzero(counts)
    if len(hit) == 0 or len(nonempty) == 0:
        return out
    if local is None:
        _, local = segment_positions(counts)
    first_miss = np.where(hit, np.iinfo(np.int64).max, local)
    starts = (np.cumsum(counts) - counts)[nonempty]
    out[nonempty] = np.minimum(np.minimum.reduceat(first_miss, starts), counts[nonempty])
    return out


class _GroupCounter:
    """Requests per shared prefix, for the most frequent prefixes only (numpy heavy hitters)."""

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=np.uint64)
        self._counts = np.empty(0, dtype=np.int64)
        self._tokens = np.empty(0, dtype=np.int64)
        self.exact = True

    def add(self, keys: np.ndarray, tokens: np.ndarray) -> None:
        if len(keys) == 0:
            return
        keys = np.concatenate([self._keys, keys])
        counts = np.concatenate([self._counts, np.ones(len(tokens), dtype=np.int64)])
        tokens = np.concatenate([self._tokens, tokens])
        g = Groups(keys)
        self._keys = g.values
        self._counts = np.add.reduceat(counts[g.order], g.starts)
        self._tokens = tokens[g.first]  # one prefix, one length: any member's will do
        if len(self._keys) > 2 * _TRACKED_GROUPS:
            top = np.sort(np.argpartition(-self._counts, _TRACKED_GROUPS)[:_TRACKED_GROUPS])
            self._keys, self._counts, self._tokens = self._keys[top], self._counts[top], self._tokens[top]
            self.exact = False

    def top(self, n: int, total: int) -> tuple[PrefixGroup, ...]:
        best = np.lexsort((-self._tokens, -self._counts))[:n]
        return tuple(
            PrefixGroup(f"{int(self._keys[i]):016x}", int(self._counts[i]),
                        int(self._counts[i]) / total if total else 0.0, int(self._tokens[i]))
            for i in best
        )


class PrefixAnalyzer:
    """Feed batches of chained block hashes in trace order; read the result at the end."""

    def __init__(self, block_size: int, capacity_tokens: int | None = None, *, small_ids: bool = False,
                 reuse_structure: bool = True) -> None:
        """`reuse_structure=False` skips the prefix groups and multi-turn counts (hits only)."""
        self.block_size = int(block_size)
        self.reuse_structure = reuse_structure
        self.capacity_tokens = capacity_tokens
        self._seen = HashSet(prefer_bitmap=small_ids)
        self._last_blocks = HashSet(prefer_bitmap=small_ids)
        self._lru = None if capacity_tokens is None else LruBlockCache(max(1, capacity_tokens // self.block_size))
        self._groups = _GroupCounter()
        self.requests = 0
        self.prompt_tokens = 0
        self.hit_blocks = 0
        self.lru_hit_blocks = 0
        self.requests_with_hit = 0
        self.continuations = 0
        self.history_blocks = 0

    def add(self, block_hashes: np.ndarray, blocks_per_request: np.ndarray, prompt_tokens: np.ndarray) -> BatchHits:
        """One batch: each request's chained block hashes (full blocks), in trace order."""
        counts = np.asarray(blocks_per_request, dtype=np.int64)
        block_hashes = np.asarray(block_hashes, dtype=np.uint64)
        self.requests += len(counts)
        self.prompt_tokens += int(np.sum(prompt_tokens))
        if len(block_hashes) == 0:
            empty = np.zeros(len(counts), dtype=np.int64)
            return BatchHits(empty, None if self._lru is None else empty)
        request, local = segment_positions(counts)
        starts = np.cumsum(counts) - counts

        # Unlimited cache: a block hits when an earlier batch or an earlier request sent it.
        # Within a group of equal hashes the first position is the earliest request (equal
        # chained hashes sit at equal depths, so never twice in one request).
        g = Groups(block_hashes)
        in_set = self._seen.contains(g.values)
        hit_sorted = np.ones(len(block_hashes), dtype=bool)
        hit_sorted[g.starts] = in_set
        hit = np.empty(len(block_hashes), dtype=bool)
        hit[g.order] = hit_sorted
        self._seen.add_new(g.values[~in_set])
        hit_blocks = leading_run(hit, counts, local)
        self.hit_blocks += int(hit_blocks.sum())
        self.requests_with_hit += int(np.count_nonzero(hit_blocks))

        lru_hit_blocks = None
        if self._lru is not None:
            # Each request uses its blocks last to first: reverse the order within requests.
            reversed_order = starts[request] + (counts[request] - 1 - local)
            lru_hit = np.empty(len(block_hashes), dtype=bool)
            lru_hit[reversed_order] = self._lru.access(block_hashes[reversed_order])
            lru_hit_blocks = leading_run(lru_hit, counts, local)
            self.lru_hit_blocks += int(lru_hit_blocks.sum())

        if self.reuse_structure:
            shared = np.flatnonzero(hit_blocks)
            self._groups.add(block_hashes[starts[shared] + hit_blocks[shared] - 1], hit_blocks[shared] * self.block_size)
            self._count_continuations(g, in_set, request, local, counts, starts)
        return BatchHits(hit_blocks, lru_hit_blocks)

    def _count_continuations(self, g: Groups, in_set, request, local, counts, starts) -> None:
        """A request continues an earlier one when it contains an earlier prompt's last block."""
        n = len(request)
        has_blocks = np.flatnonzero(counts)
        is_last = np.zeros(n, dtype=bool)
        is_last[starts[has_blocks] + counts[has_blocks] - 1] = True
        last_sorted = is_last[g.order]
        # An earlier element of the same group that is a prompt's last block (positions ascend).
        before = np.cumsum(last_sorted) - last_sorted
        earlier_last = before > g.spread(before[g.starts])
        was_last = np.zeros(len(g.values), dtype=bool)
        was_last[in_set] = self._last_blocks.contains(g.values[in_set])
        matched = g.order[earlier_last | g.spread(was_last)]
        if len(matched):
            deepest = np.full(len(counts), -1, dtype=np.int64)
            np.maximum.at(deepest, request[matched], local[matched])
            continued = deepest >= 0
            self.continuations += int(np.count_nonzero(continued))
            self.history_blocks += int((deepest[continued] + 1).sum())
        group_has_last = np.add.reduceat(last_sorted, g.starts) > 0
        self._last_blocks.add_new(g.values[group_has_last & ~was_last])

    def result(self) -> PrefixReuse:
        B = self.block_size
        total = self.prompt_tokens
        lru_tokens = None if self._lru is None else self.lru_hit_blocks * B
        return PrefixReuse(
            block_size=B,
            requests=self.requests,
            prompt_tokens=total,
            hit_tokens=self.hit_blocks * B,
            token_fraction=self.hit_blocks * B / total if total else 0.0,
            requests_with_hit_fraction=self.requests_with_hit / self.requests if self.requests else 0.0,
            distinct_blocks=len(self._seen),
            capacity_tokens=self.capacity_tokens,
            lru_hit_tokens=lru_tokens,
            lru_token_fraction=None if lru_tokens is None else (lru_tokens / total if total else 0.0),
            top_groups=self._groups.top(TOP_GROUPS, self.requests),
            continuation_requests_fraction=self.continuations / self.requests if self.requests else 0.0,
            history_token_fraction=self.history_blocks * B / total if total else 0.0,
            groups_exact=self._groups.exact,
        )
