"""Prefix-cache simulation: the vectorised path against the pure-Python reference, and
traces whose reuse is known by construction."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_diagnose.diagnose.trace_findings import trace_findings
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.traces import analyze_trace
from llm_diagnose.probes.traces.hashing import Groups, chained_block_hashes
from llm_diagnose.probes.traces.hashset import SortedRunSet
from llm_diagnose.probes.traces.lru import LruBlockCache, count_earlier_greater
from llm_diagnose.probes.traces.prefix import PrefixAnalyzer, leading_run
from llm_diagnose.probes.traces.seen import SeenHashes, SeenIds, first_positions
from tests import trace_synthetic as synthetic
from tests.trace_reference import reference_prefix_hits


def _fast_hits(
    prompts,
    block_size,
    capacity_blocks,
    batch,
    chunk=None,
    dtype=np.uint32,
    hash_ids=False,
    structure=True,
    analyzer=None,
):
    an = analyzer or PrefixAnalyzer(
        block_size,
        None if capacity_blocks is None else capacity_blocks * block_size,
        small_ids=hash_ids,
        reuse_structure=structure,
    )
    if chunk is not None and an._lru is not None:
        an._lru._chunk = max(1, min(chunk, an._lru.capacity))  # exercise chunk boundaries
    unlimited, lru = [], []
    for lo in range(0, len(prompts), batch):
        part = prompts[lo : lo + batch]
        if hash_ids:
            counts = np.array([len(p) for p in part], dtype=np.int64)
            hashes = np.array([h for p in part for h in p], dtype=np.int64)  # (ids: int64, as the reader's)
        else:
            counts = np.array([len(p) // block_size for p in part])
            toks = np.array([t for p, c in zip(part, counts) for t in p[: c * block_size]], dtype=dtype)
            hashes = chained_block_hashes(toks, counts, block_size)
        r = an.add(hashes, counts, counts * block_size)
        unlimited += r.hit_blocks.tolist()
        lru += [] if r.lru_hit_blocks is None else r.lru_hit_blocks.tolist()
    return unlimited, lru


def _prompts(rng: random.Random, n: int, block_size: int, vocab: int = 6) -> list[list[int]]:
    """Prompts built from a few shared prefixes, re-sent histories and a small vocabulary
    (so equal blocks happen by chance too)."""
    prefixes = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 4 * block_size + 1))] for _ in range(4)]
    out: list[list[int]] = []
    for _ in range(n):
        p = list(rng.choice(prefixes)) + [rng.randrange(vocab) for _ in range(rng.randrange(0, 3 * block_size))]
        if out and rng.random() < 0.3:
            p = list(rng.choice(out)) + p[:block_size]  # a next turn re-sends a whole earlier prompt
        out.append(p)
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    block_size=st.sampled_from([1, 2, 4, 16]),
    capacity=st.sampled_from([1, 2, 3, 7, 30, 500]),
    batch=st.sampled_from([1, 5, 64, 1000]),
    chunk=st.sampled_from([1, 3, 50, None]),
    dtype=st.sampled_from([np.uint32, np.uint64]),
    structure=st.booleans(),
)
def test_fast_path_matches_reference_request_by_request(seed, block_size, capacity, batch, chunk, dtype, structure):
    rng = random.Random(seed)
    prompts = _prompts(rng, rng.randrange(1, 120), block_size)
    ref = reference_prefix_hits(prompts, block_size, capacity)
    unlimited, lru = _fast_hits(prompts, block_size, capacity, batch, chunk, dtype, structure=structure)
    assert unlimited == [u for u, _ in ref]
    assert lru == [c for _, c in ref]


def _hash_id_prompts(rng: random.Random, ids: str) -> list[list[int]]:
    """Mooncake-like prompts: shared prefixes of ids, then fresh ids (numbered in order, as
    Mooncake does), with `ids` choosing how the ids look to the fast path."""
    base = {"dense": 100, "huge": 1 << 40, "negative": -(1 << 20), "wide": 0}[ids]
    next_id = [base]

    def fresh(k):
        out = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k + (rng.randrange(1 << 22) if ids == "wide" else 0)  # gaps: ids spread far
        return out

    shared = [[rng.randrange(0, 40) * 10 + d for d in range(rng.randrange(1, 5))] for _ in range(5)]
    prompts = []
    for _ in range(rng.randrange(1, 150)):
        r = rng.random()
        if r < 0.05:
            p = []  # an empty prompt
        elif r < 0.1 and prompts:
            p = list(rng.choice(prompts)) + [rng.choice(rng.choice(shared))]  # an id twice in a prompt
        elif r < 0.3 and prompts:
            p = list(rng.choice(prompts)) + fresh(rng.randrange(0, 3))  # a next turn: earlier prompt + new
        else:
            p = list(rng.choice(shared)) + fresh(rng.randrange(0, 4))
        prompts.append(p)
    if ids == "huge" and len(prompts) > 2:  # small ids first, then one beyond the dense table
        prompts[len(prompts) // 2] = prompts[len(prompts) // 2] + [1 << 50]
    return prompts


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    capacity=st.sampled_from([None, 1, 4, 20, 200]),
    batch=st.sampled_from([1, 7, 500]),
    ids=st.sampled_from(["dense", "huge", "negative", "wide"]),
    structure=st.booleans(),
)
def test_hash_id_input_matches_reference(seed, capacity, batch, ids, structure):
    rng = random.Random(seed)
    prompts = _hash_id_prompts(rng, ids)
    ref = reference_prefix_hits(prompts, 512, capacity, hash_ids=True)
    unlimited, lru = _fast_hits(prompts, 512, capacity, batch, hash_ids=True, structure=structure)
    assert unlimited == [u for u, _ in ref]
    assert lru == ([] if capacity is None else [c for _, c in ref])


def test_hash_id_edge_cases_match_reference():
    cases = [
        [[]],  # one empty prompt
        [[7]],  # a single request of one block
        [[], [1, 2], [], [1, 2, 3], [1]],
        [[5, 5], [5, 5], [5]],  # an id repeated inside a prompt is no hit there
        [[0, 1], [0, 1], [0, 2]],  # id 0
        [[2**63 - 1, 2**62], [2**63 - 1]],  # beyond the dense table from the start
        [[-1, -2], [-1, -2, -3], [-1]],  # negative ids: hashed, bit for bit
    ]
    for prompts in cases:
        for batch in (1, 2, 10):
            ref = reference_prefix_hits(prompts, 512, 2, hash_ids=True)
            unlimited, lru = _fast_hits(prompts, 512, 2, batch, hash_ids=True)
            assert unlimited == [u for u, _ in ref], (prompts, batch)
            assert lru == [c for _, c in ref], (prompts, batch)


def test_dense_ids_hand_over_to_hashes_with_what_they_saw():
    an = PrefixAnalyzer(512, small_ids=True)
    an.add(np.array([1, 2, 3], dtype=np.int64), np.array([3]), np.array([1536]))
    assert isinstance(an._seen, SeenIds)
    hits = an.add(np.array([1, 2, 1 << 40, 1, 2, 3], dtype=np.int64), np.array([3, 3]), np.array([1536, 1536]))
    assert isinstance(an._seen, SeenHashes)
    assert hits.hit_blocks.tolist() == [2, 3]
    r = an.result()
    assert r.distinct_blocks == 4 and r.continuation_requests_fraction == pytest.approx(1 / 3)


def test_multi_turn_counts_agree_between_layouts():
    """Dense ids and hashed keys give the same groups and multi-turn counts on the same trace."""
    rng = random.Random(3)
    prompts = _hash_id_prompts(rng, "dense")
    dense = PrefixAnalyzer(512, small_ids=True)
    hashed = PrefixAnalyzer(512, small_ids=True)
    hashed._seen = SeenHashes(chained=False)  # the layout ids move to when they do not fit
    _fast_hits(prompts, 512, None, 13, hash_ids=True, analyzer=dense)
    _fast_hits(prompts, 512, None, 13, hash_ids=True, analyzer=hashed)
    a, b = dense.result().to_dict(), hashed.result().to_dict()
    assert a == b and a["continuation_requests_fraction"] > 0


def test_first_positions_against_brute_force():
    rng = np.random.default_rng(2)
    for codes in (
        np.arange(10, 30),
        rng.integers(0, 50, 300),
        rng.integers(0, 1 << 40, 300) * (rng.random(300) < 0.5),
        np.empty(0, dtype=np.int64),
        np.array([5]),
    ):
        codes = codes.astype(np.int64)
        positions = np.sort(rng.choice(10_000, len(codes), replace=False))
        first = {}
        for c, p in zip(codes.tolist(), positions.tolist()):
            first.setdefault(c, p)
        assert first_positions(codes, positions).tolist() == [first[c] for c in codes.tolist()]


def test_leading_run_against_brute_force():
    rng = np.random.default_rng(4)
    for _ in range(50):
        counts = rng.integers(0, 6, rng.integers(1, 30))
        hit = rng.random(int(counts.sum())) < 0.7
        out, pos = [], 0
        for c in counts.tolist():
            run = 0
            while run < c and hit[pos + run]:
                run += 1
            out.append(run)
            pos += c
        assert leading_run(hit, counts).tolist() == out


def test_count_earlier_greater_matches_brute_force():
    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 3, 17, 64, 257):
        v = rng.permutation(n * 3)[:n]
        brute = [sum(1 for j in range(i) if v[j] > v[i]) for i in range(n)]
        assert count_earlier_greater(v).tolist() == brute


def test_lru_capacity_one_and_repeats():
    cache = LruBlockCache(2)
    hits = cache.access(np.array([1, 2, 1, 3, 2, 3, 3], dtype=np.uint64))
    assert hits.tolist() == [False, False, True, False, False, True, True]


def test_groups_agree_with_numpy_unique():
    rng = np.random.default_rng(3)
    h = rng.integers(0, 50, 1000).astype(np.uint64)
    g = Groups(h)
    values, first = np.unique(h, return_index=True)
    assert g.values.tolist() == values.tolist()
    assert g.first.tolist() == first.tolist()
    assert g.sizes.sum() == len(h)


def test_sorted_run_set_membership():
    s = SortedRunSet()
    rng = np.random.default_rng(0)
    added: set[int] = set()
    for _ in range(20):
        batch = np.unique(rng.integers(0, 5000, 200).astype(np.uint64))
        found = s.contains(batch)
        assert found.tolist() == [int(x) in added for x in batch]
        s.add_new(batch[~found])
        added |= set(batch.tolist())
    assert len(s) == len(added)


# --- traces with known answers -----------------------------------------------------------------
def test_shared_prefix_groups_exact_fraction_and_groups(tmp_path):
    path = tmp_path / "groups.jsonl"
    expected = synthetic.shared_prefix_tokens(path, groups=4, per_group=30, prefix_blocks=6)
    a = analyze_trace(path)
    p = a.prefix_reuse
    assert p.token_fraction == pytest.approx(expected.prefix_token_fraction)
    assert [g.shared_tokens for g in p.top_groups[:4]] == [6 * 16] * 4
    assert sorted(g.requests for g in p.top_groups[:4]) == [29] * 4
    assert len(p.top_groups) == 4
    assert p.continuation_requests_fraction == 0.0


def test_block_size_changes_what_counts(tmp_path):
    path = tmp_path / "groups.jsonl"
    synthetic.shared_prefix_tokens(path, groups=2, per_group=10, prefix_blocks=6, block_size=16)  # 96-token prefixes
    assert analyze_trace(path, block_size=16).prefix_reuse.hit_tokens == 2 * 9 * 96
    # 128-token blocks (vLLM on CPU): a 96-token shared prefix never fills a block.
    assert analyze_trace(path, block_size=128).prefix_reuse.hit_tokens == 0


def test_first_token_difference_shares_nothing(tmp_path):
    path = tmp_path / "first.jsonl"
    synthetic.first_token_differs(path, n=50, length=256)
    assert analyze_trace(path).prefix_reuse.token_fraction == 0.0


def test_multi_turn_history_is_counted(tmp_path):
    rng = random.Random(0)
    rows = []
    history: list[int] = []
    for _turn in range(5):
        history = history + [rng.randrange(100, 30000) for _ in range(64)]  # 4 full blocks per turn
        rows.append(history)
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(f'{{"prompt_token_ids": {r}}}\n' for r in rows))
    p = analyze_trace(path).prefix_reuse
    assert p.continuation_requests_fraction == pytest.approx(4 / 5)
    assert p.history_token_fraction == pytest.approx(
        sum(64 * t for t in range(5)) / sum(64 * (t + 1) for t in range(5))
    )


def test_mooncake_unlimited_and_lru(tmp_path):
    path = tmp_path / "mc.jsonl"
    expected = synthetic.mooncake_hash_ids(path, n=3000, groups=20, shared_blocks=3)
    unlimited = analyze_trace(path)
    assert unlimited.content == "hash-ids" and unlimited.block_size == 512
    assert unlimited.prefix_reuse.token_fraction == pytest.approx(expected.prefix_token_fraction)
    small = analyze_trace(path, kv_capacity_tokens=512 * 10)
    big = analyze_trace(path, kv_capacity_tokens=512 * 10**6)
    assert small.prefix_reuse.lru_token_fraction < big.prefix_reuse.lru_token_fraction
    assert big.prefix_reuse.lru_token_fraction == pytest.approx(expected.prefix_token_fraction)
    assert "kv-offload" in [f.id for f in trace_findings(small, Thresholds())]
    assert "kv-offload" not in [f.id for f in trace_findings(big, Thresholds())]


def test_hashes_do_not_depend_on_the_token_dtype():
    from llm_diagnose.probes.traces.hashing import anchored_window_hashes

    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 1 << 31, 16 * 40).astype(np.uint32)
    blocks = np.array([10, 30])
    for B in (16, 1):
        counts = blocks * (16 // B)
        assert (
            chained_block_hashes(tokens, counts, B) == chained_block_hashes(tokens.astype(np.uint64), counts, B)
        ).all()
    a = anchored_window_hashes(tokens, blocks * 16)
    b = anchored_window_hashes(tokens.astype(np.uint64), blocks * 16)
    assert all((x == y).all() for x, y in zip(a, b)) and len(a[0]) > 10


def test_chained_keys_stand_for_the_whole_prefix():
    """Equal keys where the prefixes are equal, wherever a prompt sits in a batch; a leading
    block of zeros (padding) or a shift by one block makes them differ."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 50_000, 16 * 3).astype(np.uint32)
    zeros = np.zeros(16, dtype=np.uint32)
    prompts = [x, np.concatenate([zeros, x]), np.concatenate([x[16:], x]), x]
    counts = np.array([len(p) // 16 for p in prompts])
    h = chained_block_hashes(np.concatenate(prompts), counts, 16)
    first, padded, shifted, again = np.split(h, np.cumsum(counts)[:-1])
    assert (first == again).all()  # the same prompt later in the batch: the same keys
    assert not set(first.tolist()) & set(padded.tolist())
    assert not set(first.tolist()) & set(shifted[2:].tolist())
    assert len(set(h.tolist())) == len(first) + len(padded) + len(shifted)
