"""Similar content that an exact-prefix cache cannot use: the dynamic-prefix measurement.

Chained block hashes see only exact prefixes: a prompt that differs from its neighbours in
its first token shares nothing with them, however similar the rest is. To tell "little
overlap" from "much overlap the cache cannot use", prompts are also cut into content
windows (WINDOW_TOKENS tokens starting at content-defined anchors, so a shift does not
hide them) and each window is looked up among the windows of earlier requests:

- seen, and inside the request's cache-hit run: reuse the prefix cache already gets;
- seen, but starting after the block where the request left the shared prefix: similar
  content the cache cannot serve. Its share of the windows estimates the share of prompt
  tokens lost to dynamic content at the front (DYNAMIC_PREFIX_FRACTION).

The block where prompts diverge is excluded (a partly shared block is a block-size matter,
not a dynamic prefix). Memory is bounded by consistent subsampling: past a cap, only windows
whose hash has one more leading zero bit are kept, for all requests alike, which keeps the
estimate unbiased.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm_diagnose.probes.traces.hashing import ANCHOR_ONE_IN, WINDOW_TOKENS, Groups, anchored_window_hashes
from llm_diagnose.probes.traces.hashset import SortedRunSet

__all__ = ["SimilarityStats", "SimilarityTracker"]

_MAX_WINDOWS = 1 << 23  # windows remembered (64 MiB) before the sample is halved
_FLAG_MIN_WINDOWS = 2  # a request counts as dynamic with at least this many ...
_FLAG_MIN_SHARE = 0.25  # ... and this share of its windows similar but unusable
_MAX_DIVERGENCES = 100_000


@dataclass(frozen=True)
class SimilarityStats:
    windows: int  # content windows examined (after subsampling)
    sampling: float  # share of anchored windows tracked (1.0 until the cap is reached)
    seen_fraction: float  # windows whose content an earlier request had
    cached_fraction: float  # ... inside the request's prefix-cache hit run
    dynamic_fraction: float  # ... after the block where the request left the shared prefix
    dynamic_requests: int  # requests with much similar content after their divergence
    divergence_tokens_p50: int | None  # their median shared-prefix length (block-rounded)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class SimilarityTracker:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seen = SortedRunSet()
        self._level = 0  # windows kept: those whose hash has `level` leading zero bits
        self.windows = self.seen = self.cached = self.dynamic = 0
        self.dynamic_requests = 0
        self._divergences: list[int] = []

    def _sampled(self, h: np.ndarray) -> np.ndarray:
        if self._level == 0:
            return np.ones(len(h), dtype=bool)
        return (h >> np.uint64(64 - self._level)) == 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray, hit_blocks: np.ndarray) -> np.ndarray:
        """One batch (the tokens of each prompt's full blocks); returns which requests are dynamic."""
        flagged = np.zeros(len(lengths), dtype=bool)
        h, req, start = anchored_window_hashes(tokens, lengths)
        keep = self._sampled(h)
        h, req, start = h[keep], req[keep], start[keep]
        if len(h) == 0:
            return flagged
        g = Groups(h)
        in_set = self._seen.contains(g.values)
        # Seen earlier: in an earlier batch, or in an earlier request of this one (a window
        # repeated inside one prompt is not reuse across requests).
        first_req = np.repeat(req[g.first], g.sizes)
        earlier_sorted = np.repeat(in_set, g.sizes) | (first_req < req[g.order])
        seen = np.empty(len(h), dtype=bool)
        seen[g.order] = earlier_sorted
        hit_tokens = hit_blocks[req] * self.block_size
        cached = seen & (start + WINDOW_TOKENS <= hit_tokens)
        dynamic = seen & (start >= hit_tokens + self.block_size)
        self.windows += len(h)
        self.seen += int(seen.sum())
        self.cached += int(cached.sum())
        self.dynamic += int(dynamic.sum())
        per_req_dynamic = np.bincount(req, weights=dynamic, minlength=len(lengths))
        per_req_windows = np.bincount(req, minlength=len(lengths))
        flagged = (per_req_dynamic >= _FLAG_MIN_WINDOWS) & (per_req_dynamic >= _FLAG_MIN_SHARE * per_req_windows)
        self.dynamic_requests += int(flagged.sum())
        room = _MAX_DIVERGENCES - len(self._divergences)
        if room > 0:
            self._divergences.extend((hit_blocks[flagged] * self.block_size)[:room].tolist())
        self._seen.add_new(g.values[~in_set])
        while len(self._seen) > _MAX_WINDOWS:
            self._level += 1
            self._seen.keep(self._sampled)
        return flagged

    def result(self) -> SimilarityStats:
        w = self.windows
        return SimilarityStats(
            windows=w,
            sampling=2.0**-self._level,
            seen_fraction=self.seen / w if w else 0.0,
            cached_fraction=self.cached / w if w else 0.0,
            dynamic_fraction=self.dynamic / w if w else 0.0,
            dynamic_requests=self.dynamic_requests,
            divergence_tokens_p50=int(np.median(self._divergences)) if self._divergences else None,
        )


# One window per ANCHOR_ONE_IN positions on average: a prompt of fewer than about
# ANCHOR_ONE_IN * _FLAG_MIN_WINDOWS tokens after its divergence cannot be flagged.
MIN_FLAGGABLE_TOKENS = ANCHOR_ONE_IN * _FLAG_MIN_WINDOWS + WINDOW_TOKENS
