"""Benchmark of the prefix-overlap analysis: vectorised path against the pure-Python reference.

Both run in the same process on the same generated traces, and their per-request answers are
checked equal before any figure is printed. Measured:

- core, token-id input: prompt tokens per second, from token arrays already in memory
  (numpy uint32 arrays for the fast path, as its reader makes them; Python lists for the
  reference, as json.loads makes them), without and with an LRU at a KV capacity;
- core, hash-id input (Mooncake): requests per second, from the parsed trace in memory: the
  column batches the numpy reader makes (`read_hash_id_batches`) for the fast path, the lists
  json.loads makes for the reference; and the fast path from those same Python lists too;
- end to end from a JSONL file (reading and parsing included): `analyze_trace` against
  json.loads + the reference, and for Mooncake also the numpy reader + hits alone;
- peak memory (the child's VmHWM) of `analyze_trace` on a large hash-id trace.

Run it pinned to one core and then two, e.g.
    taskset -c 0 python3 benchmarks/bench_trace_prefix.py
    taskset -c 0,1 python3 benchmarks/bench_trace_prefix.py --memory-trace /tmp/mooncake_10m.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm_diagnose.probes.traces import analyze_trace  # noqa: E402
from llm_diagnose.probes.traces.analysis import BATCH_REQUESTS, BATCH_TOKENS, full_block_ids, hash_id_batch, token_batch  # noqa: E402
from llm_diagnose.probes.traces.hashing import chained_block_hashes  # noqa: E402
from llm_diagnose.probes.traces.prefix import PrefixAnalyzer  # noqa: E402
from llm_diagnose.probes.traces.readers import read_hash_id_batches  # noqa: E402
from llm_diagnose.probes.traces.records import LineLog  # noqa: E402
from tests.trace_reference import reference_prefix_hits  # noqa: E402


def token_trace(total_tokens: int, seed: int = 0) -> list[np.ndarray]:
    """Prompts of 200-6000 tokens: 64 shared system prompts (100-3000 tokens), some multi-turn."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 128_000, rng.integers(100, 3000), dtype=np.uint32) for _ in range(64)]
    prompts: list[np.ndarray] = []
    n = 0
    while n < total_tokens:
        if prompts and rng.random() < 0.2:
            p = np.concatenate(
                [
                    prompts[-int(rng.integers(1, min(50, len(prompts)) + 1))],
                    rng.integers(0, 128_000, int(rng.integers(50, 500)), dtype=np.uint32),
                ]
            )[:8000]
        else:
            p = np.concatenate(
                [
                    prefixes[int(rng.integers(64))],
                    rng.integers(0, 128_000, int(rng.integers(100, 3000)), dtype=np.uint32),
                ]
            )
        prompts.append(p)
        n += len(p)
    return prompts


def hash_id_trace(requests: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out, next_id = [], 1_000_000
    groups = rng.integers(0, 1000, requests)
    fresh = rng.integers(1, 9, requests)
    for g, k in zip(groups.tolist(), fresh.tolist()):
        out.append(list(range(g * 4, g * 4 + 4)) + list(range(next_id, next_id + k)))
        next_id += k
    return out


def batches(prompts, cost):
    """Batches as analyze_trace cuts them (same request and work limits)."""
    lo = 0
    while lo < len(prompts):
        hi, work = lo, 0
        while hi < len(prompts) and hi - lo < BATCH_REQUESTS and work < BATCH_TOKENS:
            work += cost(prompts[hi])
            hi += 1
        yield prompts[lo:hi]
        lo = hi


def fast_tokens(prompts: list[np.ndarray], block_size: int, capacity: int | None, structure: bool = False):
    """The analysis's own batching and prefix path (as analyze_trace runs it), without the reader.

    structure=False computes what the reference computes (the hits) and no more; True adds the
    prefix groups and multi-turn counts that analyze_trace also reports.
    """
    an = PrefixAnalyzer(block_size, capacity, reuse_structure=structure)
    hits, lru = [], []
    for part in batches(prompts, len):
        tokens, blocks, lengths = token_batch(part, block_size)
        r = an.add(chained_block_hashes(tokens, blocks, block_size), blocks, lengths)
        hits.append(r.hit_blocks)
        if r.lru_hit_blocks is not None:
            lru.append(r.lru_hit_blocks)
    return np.concatenate(hits), (np.concatenate(lru) if lru else None)


def fast_hash_ids(batches, capacity_blocks: int | None, structure: bool = False):
    """The analysis's prefix path on hash-id batches as the numpy reader makes them (columns)."""
    an = PrefixAnalyzer(
        512, None if capacity_blocks is None else capacity_blocks * 512, small_ids=True, reuse_structure=structure
    )
    hits, lru = [], []
    for b in batches:
        r = an.add(*full_block_ids(b.hash_ids, b.counts, b.input_tokens))
        hits.append(r.hit_blocks)
        if r.lru_hit_blocks is not None:
            lru.append(r.lru_hit_blocks)
    return np.concatenate(hits), (np.concatenate(lru) if lru else None)


def fast_hash_id_lists(prompts: list[list[int]], batch_requests: int):
    """The same, from Python lists (what a caller holding json's lists would pass): flattened first."""
    an = PrefixAnalyzer(512, None, small_ids=True, reuse_structure=False)
    parts = [prompts[lo : lo + batch_requests] for lo in range(0, len(prompts), batch_requests)]
    return np.concatenate([an.add(*hash_id_batch(part, [None] * len(part))).hit_blocks for part in parts])


def write_mooncake(path: Path, prompts: list[list[int]]) -> None:
    """Mooncake's JSONL layout; every id a full block (input_length = 512 per id), as the reference sees them."""
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            row = {"timestamp": i, "input_length": len(p) * 512, "output_length": 10, "hash_ids": p}
            f.write(json.dumps(row) + "\n")


def best_of(repeats: int, fn):
    """(best wall seconds, best CPU seconds of this process, result) over `repeats` runs.

    The machine is shared: CPU time counts only this process's work, so it is the steadier
    figure for single-threaded code; wall time is what a user waits (and what counts for the
    two-thread end-to-end runs).
    """
    wall = cpu = float("inf")
    result = None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, result


def side_by_side(repeats: int, ref_fn, fast_fn):
    """best_of for both sides, their runs taking turns: a change in the machine's load during the
    measurement falls on both alike. Returns (wall, cpu), result of the reference, then of the fast path."""
    ref_times, fast_times = [], []
    for _ in range(repeats):
        *t, ref = best_of(1, ref_fn)
        ref_times.append(t)
        *t, fast = best_of(1, fast_fn)
        fast_times.append(t)
    best = lambda times: (min(w for w, _ in times), min(c for _, c in times))  # noqa: E731
    return best(ref_times), ref, best(fast_times), fast


def check(ref, fast_unlimited, fast_lru) -> None:
    assert [u for u, _ in ref] == fast_unlimited.tolist(), "unlimited-cache hits differ from the reference"
    if fast_lru is not None:
        assert [c for _, c in ref] == fast_lru.tolist(), "LRU hits differ from the reference"


def row(name, unit, work, ref, fast):
    """Rates from (wall, cpu) timings of the reference and the fast path."""
    (ref_wall, ref_cpu), (fast_wall, fast_cpu) = ref, fast
    return {
        "case": name,
        "unit": unit,
        "work": work,
        "reference_per_cpu_s": work / ref_cpu,
        "fast_per_cpu_s": work / fast_cpu,
        "speedup_cpu": ref_cpu / fast_cpu,
        "reference_per_wall_s": work / ref_wall,
        "fast_per_wall_s": work / fast_wall,
        "speedup_wall": ref_wall / fast_wall,
    }


def bench_core(tokens: int, hash_requests: int, capacity_tokens: int, repeats: int) -> list[dict]:
    rows = []
    prompts = token_trace(tokens)
    lists = [p.tolist() for p in prompts]
    ntok = sum(len(p) for p in prompts)
    for cap in (None, capacity_tokens):
        t_ref, ref, t_fast, (u, lru) = side_by_side(
            repeats,
            lambda cap=cap: reference_prefix_hits(lists, 16, None if cap is None else cap // 16),
            lambda cap=cap: fast_tokens(prompts, 16, cap),
        )
        check(ref, u, lru)
        name = "token ids, block 16, unlimited cache" if cap is None else f"token ids, block 16, + LRU of {cap} tokens"
        rows.append(row(name, "prompt tokens/s", ntok, t_ref, t_fast))
        if cap is None:
            *t_full, _ = best_of(repeats, lambda: fast_tokens(prompts, 16, None, structure=True))
            rows.append(
                row(
                    "  ... vectorised with groups and multi-turn too (reference: hits only)",
                    "prompt tokens/s",
                    ntok,
                    t_ref,
                    t_full,
                )
            )
    # vLLM on CPU uses 128-token blocks: fewer blocks per token for both implementations.
    t_ref, ref, t_fast, (u, _) = side_by_side(
        repeats, lambda: reference_prefix_hits(lists, 128, None), lambda: fast_tokens(prompts, 128, None)
    )
    check(ref, u, None)
    rows.append(row("token ids, block 128, unlimited cache", "prompt tokens/s", ntok, t_ref, t_fast))
    ids = hash_id_trace(hash_requests)
    cap_blocks = capacity_tokens // 512
    with tempfile.TemporaryDirectory() as tmp:  # the fast path's input: what its reader makes of the file
        path = Path(tmp) / "core_mooncake.jsonl"
        write_mooncake(path, ids)
        columns = list(read_hash_id_batches(str(path), LineLog(str(path), False)))
    per_batch = max(b.requests for b in columns)
    for cap in (None, cap_blocks):
        t_ref, ref, t_fast, (u, lru) = side_by_side(
            repeats,
            lambda cap=cap: reference_prefix_hits(ids, 512, cap, hash_ids=True),
            lambda cap=cap: fast_hash_ids(columns, cap),
        )
        check(ref, u, lru)
        name = "hash ids (Mooncake), unlimited cache" if cap is None else f"hash ids, + LRU of {cap * 512} tokens"
        rows.append(row(name, "requests/s", len(ids), t_ref, t_fast))
        if cap is None:
            *t_full, _ = best_of(repeats, lambda: fast_hash_ids(columns, None, structure=True))
            rows.append(
                row(
                    "  ... vectorised with groups and multi-turn too (reference: hits only)",
                    "requests/s",
                    len(ids),
                    t_ref,
                    t_full,
                )
            )
            *t_lists, u = best_of(repeats, lambda: fast_hash_id_lists(ids, per_batch))
            check(ref, u, None)
            rows.append(
                row(
                    "  ... vectorised from the same Python lists as the reference (flattened first)",
                    "requests/s",
                    len(ids),
                    t_ref,
                    t_lists,
                )
            )
    return rows


def bench_files(tokens: int, hash_requests: int, repeats: int = 3) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok_path = Path(tmp) / "tokens.jsonl"
        prompts = token_trace(tokens, seed=1)
        with open(tok_path, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_token_ids": p.tolist(), "output_length": 100}) + "\n")
        ntok = sum(len(p) for p in prompts)

        def ref_file(path, key, **kw):
            with open(path, "rb") as f:
                return reference_prefix_hits(
                    (json.loads(line)[key] for line in f), 16 if key != "hash_ids" else 512, **kw
                )

        t_ref, _, t_fast, _ = side_by_side(
            repeats, lambda: ref_file(tok_path, "prompt_token_ids"), lambda: analyze_trace(tok_path)
        )
        rows.append(
            row(
                "file, token-id JSONL: analyze_trace, all statistics (reference: json + hits only)",
                "prompt tokens/s",
                ntok,
                t_ref,
                t_fast,
            )
        )
        mc_path = Path(tmp) / "mooncake.jsonl"
        write_mooncake(mc_path, hash_id_trace(hash_requests, seed=1))
        t_ref, ref, t_fast, (u, _) = side_by_side(
            repeats,
            lambda: ref_file(mc_path, "hash_ids", hash_ids=True),
            lambda: fast_hash_ids(read_hash_id_batches(str(mc_path), LineLog("", False)), None),
        )
        check(ref, u, None)
        rows.append(
            row(
                "file, Mooncake JSONL: numpy reader + hits (reference: json + hits)",
                "requests/s",
                hash_requests,
                t_ref,
                t_fast,
            )
        )
        *t_fast, _ = best_of(repeats, lambda: analyze_trace(mc_path))
        rows.append(
            row(
                "file, Mooncake JSONL: analyze_trace, all statistics (reference: json + hits only)",
                "requests/s",
                hash_requests,
                t_ref,
                t_fast,
            )
        )
    return rows


def bench_memory(path: str, capacity_tokens: int | None) -> dict:
    # The child reports its own peak (VmHWM): a forked child's rusage would also count the pages
    # of this process (its in-memory traces) that it shared until exec.
    root = str(Path(__file__).resolve().parents[1])
    code = (
        f"import sys, time; sys.path.insert(0, {root!r})\n"
        "from llm_diagnose.probes.traces import analyze_trace\n"
        f"t = time.perf_counter(); a = analyze_trace({path!r}, kv_capacity_tokens={capacity_tokens!r})\n"
        "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "print(a.requests, time.perf_counter() - t, a.prefix_reuse.token_fraction, hwm)\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    requests, seconds, fraction, peak_kib = int(out[0]), float(out[1]), float(out[2]), int(out[3])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "trace": path,
        "requests": requests,
        "capacity_tokens": capacity_tokens,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "requests_per_s": requests / seconds,
        "requests_per_cpu_s": requests / cpu,
        "token_fraction": fraction,
        "peak_rss_mib": peak_kib / 1024,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20_000_000, help="prompt tokens in the core token-id trace")
    ap.add_argument("--hash-requests", type=int, default=1_000_000, help="requests in the core hash-id trace")
    ap.add_argument("--file-tokens", type=int, default=4_000_000)
    ap.add_argument("--file-requests", type=int, default=200_000)
    ap.add_argument("--capacity-tokens", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5, help="best of this many runs, each side, in the core cases")
    ap.add_argument("--memory-trace", help="a large hash-id JSONL for the peak-memory run (e.g. 10 M requests)")
    ap.add_argument("--memory-only", action="store_true", help="only the peak-memory runs")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# cpus {cpus}, numpy {np.__version__}, python {sys.version.split()[0]}")
    rows = [] if args.memory_only else bench_core(args.tokens, args.hash_requests, args.capacity_tokens, args.repeats)
    rows += [] if args.memory_only else bench_files(args.file_tokens, args.file_requests, max(1, args.repeats - 2))
    print(f"# load average before: {os.getloadavg()[0]:.1f}")
    print("| case | unit | pure Python (per CPU s) | vectorised (per CPU s) | speedup (CPU) | speedup (wall) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['unit']} | {r['reference_per_cpu_s']:,.0f} | {r['fast_per_cpu_s']:,.0f} | "
            f"{r['speedup_cpu']:.1f}x | {r['speedup_wall']:.1f}x |"
        )
    memory = []
    if args.memory_trace:
        for cap in (None, args.capacity_tokens):
            m = bench_memory(args.memory_trace, cap)
            memory.append(m)
            print(
                f"memory: {m['requests']:,} requests, LRU {cap}: peak RSS {m['peak_rss_mib']:.0f} MiB, "
                f"{m['seconds']:.0f} s wall, {m['cpu_seconds']:.0f} s CPU ({m['requests_per_cpu_s']:,.0f} requests "
                f"per CPU second end to end), unlimited-cache share {m['token_fraction']:.4f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"cpus": cpus, "rows": rows, "memory": memory}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
