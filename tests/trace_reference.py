"""The straightforward pure-Python prefix-cache simulation, kept as the reference.

It is what one would write first: chain each full block's tokens onto its parent's hash with
Python's tuple hash, keep a set for the unlimited cache and an OrderedDict for the LRU. The
vectorised analysis (`prefix.py`) must agree with it request by request (tests/test_trace_prefix.py),
and the benchmark runs both side by side.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["reference_block_hashes", "reference_prefix_hits"]


def reference_block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of one prompt: hash((parent, block tokens))."""
    out = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out


def reference_prefix_hits(
    prompts: Iterable[Sequence[int]],
    block_size: int,
    capacity_blocks: int | None = None,
    *,
    hash_ids: bool = False,
) -> list[tuple[int, int | None]]:
    """Per request: (blocks an unlimited cache serves, blocks an LRU of capacity_blocks serves).

    With hash_ids, each prompt is already a list of chained block ids (Mooncake).
    Hits are the leading run of blocks found; the LRU uses a request's blocks last to first.
    """
    seen: set = set()
    lru: OrderedDict = OrderedDict()
    out: list[tuple[int, int | None]] = []
    for prompt in prompts:
        blocks = list(prompt) if hash_ids else reference_block_hashes(prompt, block_size)
        unlimited = 0
        for h in blocks:
            if h not in seen:
                break
            unlimited += 1
        seen.update(blocks)
        lru_hits = None
        if capacity_blocks is not None:
            present = [False] * len(blocks)
            for i in range(len(blocks) - 1, -1, -1):
                h = blocks[i]
                if h in lru:
                    present[i] = True
                    lru.move_to_end(h)
                else:
                    lru[h] = None
                    if len(lru) > capacity_blocks:
                        lru.popitem(last=False)
            lru_hits = 0
            for p in present:
                if not p:
                    break
                lru_hits += 1
        out.append((unlimited, lru_hits))
    return out
