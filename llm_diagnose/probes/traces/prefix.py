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

from llm_diagnose.probes.traces.hashing import Groups, segment_positions
from llm_diagnose.probes.traces.lru import LruBlockCache
from llm_diagnose.probes.traces.seen import BatchLookup, SeenIds, first_positions, seen_blocks

__all__ = ["PrefixAnalyzer", "PrefixReuse", "PrefixGroup", "BatchHits", "leading_run"]

TOP_GROUPS = 10
_TRACKED_GROUPS = 4096  # heavy-hitter counters kept for the top groups (bounded memory)
_NOBODY = np.iinfo(np.int64).max


def _as_keys(block_keys) -> np.ndarray:
    """Block keys as uint64: hashes as they are, integer ids bit for bit (a negative id becomes a
    huge key, which the dense id table leaves to the hashed layout)."""
    keys = np.asarray(block_keys)
    if keys.dtype == np.uint64:
        return keys
    if keys.dtype.kind == "i":
        return keys.astype(np.int64, copy=False).view(np.uint64)
    return keys.astype(np.uint64)


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


def leading_run(hit: np.ndarray, blocks_per_request: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """Per request: how many of its first blocks are hits before the first miss.

    Usually a request's hits already are a leading run (chained blocks: a block seen before
    means its whole prefix was): then the run is its count of hits, from one running sum,
    and checking that the first that-many blocks are all hits costs one lookup per request.
    Requests where that fails are searched for their first miss.
    """
    counts = np.asarray(blocks_per_request, dtype=np.int64)
    if starts is None:
        starts = np.cumsum(counts) - counts
    running = np.empty(len(hit) + 1, dtype=np.int32 if len(hit) < 1 << 31 else np.int64)
    running[0] = 0
    np.cumsum(hit, out=running[1:])  # (a linear pass: several times quicker than add.reduceat here)
    at_end = running[starts + counts]
    out = at_end - running[starts]
    # All of a request's hits are at its front when the running sum after that many blocks
    # already is the request's total; otherwise a hit follows a miss.
    odd = np.flatnonzero(running[starts + out] != at_end)
    out = out.astype(np.int64)
    if len(odd):
        misses = np.append(np.flatnonzero(~hit), len(hit))
        out[odd] = np.minimum(misses[np.searchsorted(misses, starts[odd])] - starts[odd], counts[odd])
    return out


def _request_of(position: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The request holding each block position (requests without blocks hold none)."""
    return np.searchsorted(starts, position, side="right") - 1


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
            PrefixGroup(
                f"{int(self._keys[i]):016x}",
                int(self._counts[i]),
                int(self._counts[i]) / total if total else 0.0,
                int(self._tokens[i]),
            )
            for i in best
        )


class PrefixAnalyzer:
    """Feed batches of block keys in trace order; read the result at the end."""

    def __init__(
        self,
        block_size: int,
        capacity_tokens: int | None = None,
        *,
        small_ids: bool = False,
        reuse_structure: bool = True,
    ) -> None:
        """`reuse_structure=False` skips the prefix groups and multi-turn counts (hits only)."""
        self.block_size = int(block_size)
        self.reuse_structure = reuse_structure
        self.capacity_tokens = capacity_tokens
        self._seen = seen_blocks(small_ids)
        self._lru = None if capacity_tokens is None else LruBlockCache(max(1, capacity_tokens // self.block_size))
        self._groups = _GroupCounter()
        self.requests = 0
        self.prompt_tokens = 0
        self.hit_blocks = 0
        self.lru_hit_blocks = 0
        self.requests_with_hit = 0
        self.continuations = 0
        self.history_blocks = 0

    def add(self, block_keys: np.ndarray, blocks_per_request: np.ndarray, prompt_tokens: np.ndarray) -> BatchHits:
        """One batch: each request's block keys (full blocks), requests in trace order.

        Keys are chained block hashes (uint64), or block ids (Mooncake) when `small_ids`.
        """
        counts = np.asarray(blocks_per_request, dtype=np.int64)
        keys = _as_keys(block_keys)
        self.requests += len(counts)
        self.prompt_tokens += int(np.sum(prompt_tokens))
        if len(keys) == 0:
            empty = np.zeros(len(counts), dtype=np.int64)
            return BatchHits(empty, None if self._lru is None else empty)
        starts = np.cumsum(counts) - counts
        last = None  # positions of the prompts' last blocks, for multi-turn reuse
        if self.reuse_structure:
            nonempty = np.flatnonzero(counts)
            last = starts[nonempty] + counts[nonempty] - 1

        # Unlimited cache: a block hits when an earlier batch or an earlier request sent it.
        look = self._seen.lookup(keys, last)
        if look is None:  # an id too large (or too sparse) to index by: hashed from now on
            hashed = self._seen.to_hashes() if isinstance(self._seen, SeenIds) else self._seen
            self._seen = hashed
            look = hashed.lookup(keys, last)
        hit = look.sent
        if len(look.repeat_at):  # within one request a repeated id is no hit
            at, first = look.repeat_at, look.repeat_first
            hit[at] = _request_of(first, starts) < _request_of(at, starts)
        hit_blocks = leading_run(hit, counts, starts)
        self.hit_blocks += int(hit_blocks.sum())
        self.requests_with_hit += int(np.count_nonzero(hit_blocks))

        lru_hit_blocks = None
        if self._lru is not None:
            # Each request uses its blocks last to first: reverse the order within requests.
            request, local = segment_positions(counts)
            reversed_order = starts[request] + (counts[request] - 1 - local)
            lru_hit = np.empty(len(keys), dtype=bool)
            lru_hit[reversed_order] = self._lru.access(keys[reversed_order])
            lru_hit_blocks = leading_run(lru_hit, counts, starts)
            self.lru_hit_blocks += int(lru_hit_blocks.sum())

        if self.reuse_structure and last is not None:
            shared = np.flatnonzero(hit_blocks)
            self._groups.add(keys[starts[shared] + hit_blocks[shared] - 1], hit_blocks[shared] * self.block_size)
            self._count_continuations(keys, hit, look, starts, last)
        self._seen.commit(keys, last)
        return BatchHits(hit_blocks, lru_hit_blocks)

    def _count_continuations(
        self, keys: np.ndarray, hit: np.ndarray, look: BatchLookup, starts: np.ndarray, last: np.ndarray
    ) -> None:
        """A request continues an earlier one when it contains an earlier prompt's last block.

        Such a block was sent by an earlier request, so only hits can be; it was either an
        earlier batch's last block, or a last block of this batch at an earlier position.
        """
        matched = np.flatnonzero(hit & look.was_last)
        here = np.flatnonzero(hit & look.last_here & ~look.was_last)
        if len(here):
            # The earliest position at which a prompt of this batch ends with the same block.
            ends_first = first_positions(
                keys[np.concatenate([last, here])], np.concatenate([last, np.full(len(here), _NOBODY, dtype=np.int64)])
            )
            matched = np.union1d(matched, here[ends_first[len(last) :] < here])
        if len(matched):
            request = _request_of(matched, starts)
            deepest = np.full(len(starts), -1, dtype=np.int64)
            np.maximum.at(deepest, request, matched - starts[request])
            continued = deepest >= 0
            self.continuations += int(np.count_nonzero(continued))
            self.history_blocks += int((deepest[continued] + 1).sum())

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
