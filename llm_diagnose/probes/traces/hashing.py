"""Vectorised hashing of prompt blocks: chained block hashes and content windows.

A prefix cache keys each full block by a hash of the block *and everything before it*
(vLLM: hash(parent_hash, block_tokens)), so a block matches only when the whole prefix does.
Here that chain is computed for a whole batch of prompts at once, without a Python loop:

- each full block's content gets a polynomial hash `c = sum_j t_j * P^j` (one uint64 matmul),
  plus a constant (so that a block of zeros still adds to the chain);
- the chain over blocks `H_k = sum_{i<=k} c_i * R^(k-i)` (R = P^B) becomes a prefix sum,
  `H_k = R^k * (S_k - S_{start-1})` with `S = cumsum(c_i * R^-i)` over the whole batch: R is
  odd, so it has an inverse modulo 2^64 and uint64 wrap-around is exactly arithmetic modulo
  2^64. A block key thus stands for its whole prefix: two prefixes of different content or
  length get equal keys only by a collision of the 64-bit polynomial hash.

The hashes are not vLLM's (which are SHA-256 or Python's hash), only equal where vLLM's are
equal, up to 64-bit collisions: for n distinct prefixes about n^2 / 2^65 expected colliding
pairs (one in 10^7 for 10^6 blocks). (A polynomial hash modulo 2^64 also has known
constructed collisions, Thue-Morse sequences of 2^11 tokens and more; prompts are not made
that way. Python's tuple hash, which the reference and vLLM's 'builtin' algorithm use, is a
64-bit hash with the same kind of exposure.) The pure-Python reference
(`reference.py`) uses tuple hashing instead, so the parity tests compare two independent
hash functions through the counts they produce.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "mix64",
    "chained_block_hashes",
    "anchored_window_hashes",
    "Groups",
    "segment_positions",
    "WINDOW_TOKENS",
    "ANCHOR_ONE_IN",
]

_MASK = (1 << 64) - 1
_P = 0x9E3779B97F4A7C15  # odd: every power of it is invertible modulo 2^64
_BLOCK_MARK = np.uint64(0xC2B2AE3D27D4EB4F)

WINDOW_TOKENS = 16  # tokens per content window (dynamic-prefix detection)
ANCHOR_ONE_IN = 8  # one window starts at about one position in this many (content-defined)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (a bijection: distinct in, distinct out)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _row_hashes(rows: np.ndarray, powers: np.ndarray) -> np.ndarray:
    """Polynomial hash of each row of token ids, the same whatever their integer dtype.

    Two tokens make one 64-bit word (t_even + t_odd * 2^32): half the multiply-adds. A uint32
    array on a little-endian machine already is that word in memory, so it is only viewed.
    (uint64 matmul wraps modulo 2^64, which is what a hash wants.)
    """
    width = rows.shape[1]
    if width % 2:
        return rows.astype(np.uint64) @ powers[:width]
    if rows.dtype == np.uint32 and np.little_endian and rows.flags.c_contiguous:
        words = rows.view(np.uint64)
    else:
        wide = rows.astype(np.uint64)
        words = wide[:, 0::2] + (wide[:, 1::2] << np.uint64(32))
    return words @ powers[: width // 2]


def _powers(base: int, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    v = 1
    for i in range(n):
        out[i] = v
        v = (v * base) & _MASK
    return out


class _PowerTable:
    """R^k and R^-k for k = 0.., grown on demand (a prompt of a million blocks is fine)."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._inv = pow(base, -1, 1 << 64)
        self.pos = np.ones(1, dtype=np.uint64)
        self.neg = np.ones(1, dtype=np.uint64)

    def ensure(self, n: int) -> None:
        if n <= len(self.pos):
            return
        n = max(n, 2 * len(self.pos))
        self.pos = _powers(self._base, n)
        self.neg = _powers(self._inv, n)


_block_powers: dict[int, np.ndarray] = {}
_chain_tables: dict[int, _PowerTable] = {}


def segment_positions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments of the given sizes laid end to end: each element's segment and its index in it."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    seg = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    local = np.arange(total, dtype=np.int64) - starts[seg]
    return seg, local


def chained_block_hashes(full_block_tokens: np.ndarray, blocks_per_prompt: np.ndarray, block_size: int) -> np.ndarray:
    """Chained hashes of every full block of a batch of prompts.

    `full_block_tokens`: the tokens of each prompt's full blocks (its first
    `blocks_per_prompt[i] * block_size` tokens), prompts laid end to end.
    Returns one uint64 per block, in prompt order, prompts in order.
    """
    counts = np.asarray(blocks_per_prompt, dtype=np.int64)
    nb = int(counts.sum())
    if nb == 0:
        return np.empty(0, dtype=np.uint64)
    powers = _block_powers.get(block_size)
    if powers is None:
        powers = _block_powers[block_size] = _powers(_P, block_size)
        _chain_tables[block_size] = _PowerTable(pow(_P, block_size, 1 << 64))
    table = _chain_tables[block_size]
    table.ensure(nb)
    content = _row_hashes(np.asarray(full_block_tokens).reshape(nb, block_size), powers)
    content += _BLOCK_MARK
    # S_k = sum_{i<=k} c_i R^-i over the batch's blocks (powers by position in the batch: slices,
    # no gathers); a prompt starting at block s then has H_k = R^k (S_k - S_(s-1)).
    content *= table.neg[:nb]
    chain = np.cumsum(content)
    ends = np.cumsum(counts)
    before = np.zeros(len(counts), dtype=np.uint64)
    later = (counts > 0) & (ends > counts)
    before[later] = chain[ends[later] - counts[later] - 1]
    chain -= np.repeat(before, counts)
    chain *= table.pos[:nb]
    return chain


_window_powers = _powers(_P ^ 0x5555, WINDOW_TOKENS)
_ANCHOR_MULT32 = np.uint32(0x9E3779B1)
_ANCHOR_SHIFT32 = np.uint32(32 - (ANCHOR_ONE_IN.bit_length() - 1))


def anchored_window_hashes(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Content hashes of WINDOW_TOKENS-token windows starting at content-defined anchors.

    An anchor is a position whose token pair hashes into one bucket in ANCHOR_ONE_IN, so the
    same content yields the same windows wherever it sits in a prompt (a shift by a longer user
    id or timestamp does not change them); a pair rather than one token, so that a prompt of
    few distinct tokens still gets anchors. Returns (window hash, prompt index, start position).
    """
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype=np.int64)
    e = np.empty(0, dtype=np.int64)
    if len(tokens) < WINDOW_TOKENS:
        return np.empty(0, dtype=np.uint64), e, e
    # A multiplicative hash of the pair in 32-bit arithmetic (wrap-around is what a hash
    # wants): its top bits pick the anchors.
    # (Only the low 32 bits of each id take part, so the anchors do not depend on the dtype.)
    t = tokens if tokens.dtype == np.uint32 else tokens.astype(np.uint32)
    pair = t[:-1] * _ANCHOR_MULT32
    pair += t[1:]
    pair *= _ANCHOR_MULT32
    candidates = np.flatnonzero((pair >> _ANCHOR_SHIFT32) == 0)
    ends = np.cumsum(lengths)
    prompt = np.searchsorted(ends, candidates, side="right")
    start = candidates - (ends - lengths)[prompt]
    room = start + WINDOW_TOKENS <= lengths[prompt]  # the window must end inside its prompt
    candidates, prompt, start = candidates[room], prompt[room], start[room]
    windows = tokens[candidates[:, None] + np.arange(WINDOW_TOKENS)]
    return mix64(_row_hashes(windows, _window_powers)), prompt, start


class Groups:
    """Equal values of an array, grouped by one sort.

    `values`: the distinct values, sorted; `inverse()`: each element's group; `first`/`last`:
    each group's first and last position; `order`: positions sorted by (value, position);
    `starts`: where each group begins in `order`.

    The fast path sorts value-and-position packed into one uint64 (the position in the low
    bits), which is several times quicker than an argsort. Small values are shifted up whole;
    for hashes only their high bits fit, and two distinct hashes that agree there would
    interleave: that is detected exactly and the argsort path taken instead (about once in a
    few hundred batches of a million blocks).
    """

    __slots__ = ("values", "first", "last", "order", "starts")

    def __init__(self, h: np.ndarray) -> None:
        h = np.asarray(h, dtype=np.uint64)
        n = len(h)
        packed = _packed_sort(h)
        if packed is None:
            order = np.argsort(h, kind="stable")
            hs = h[order]
            new = np.empty(n, dtype=bool)
            if n:
                new[0] = True
                np.not_equal(hs[1:], hs[:-1], out=new[1:])
        else:
            order, hs, new = packed
        starts = np.flatnonzero(new)
        self.values = hs[starts]
        self.first = order[starts]  # positions ascend within a group
        self.last = order[np.append(starts[1:], n) - 1] if n else starts
        self.order = order
        self.starts = starts

    def inverse(self) -> np.ndarray:
        out = np.empty(len(self.order), dtype=np.int64)
        out[self.order] = np.repeat(np.arange(len(self.starts)), self.sizes)
        return out

    def spread(self, per_group: np.ndarray) -> np.ndarray:
        """A per-group value repeated for each element, in `order` (sorted) layout."""
        return np.repeat(per_group, self.sizes)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(np.append(self.starts, len(self.order)))


def _packed_sort(h: np.ndarray):
    """(order, sorted values, group-start flags) from one sort of value|position keys, or None."""
    n = len(h)
    bits = max(1, (n - 1).bit_length())
    if bits > 32:
        return None
    low = np.uint64((1 << bits) - 1)
    small = n > 0 and int(h.max()) < 1 << (64 - bits)
    if small:  # small ids (Mooncake numbers its blocks): value above position, exact
        key = h << np.uint64(bits)
    else:  # hashes: their high bits above position; a shared high part is caught below
        key = h & ~low
    key |= np.arange(n, dtype=np.uint64)
    key.sort()
    order = (key & low).astype(np.int64)
    hs = h[order]
    new = np.empty(n, dtype=bool)
    if n:
        new[0] = True
        np.not_equal(hs[1:], hs[:-1], out=new[1:])
        if not small:
            key >>= np.uint64(bits)
            if np.count_nonzero(key[1:] != key[:-1]) + 1 != np.count_nonzero(new):
                return None  # two distinct values share their high bits: sort exactly instead
    return order, hs, new
