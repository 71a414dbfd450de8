"""Generated traces whose answers are known by construction (tests and benchmarks).

Each generator writes a file in one of the readers' formats and returns what the analysis
must find in it: the unlimited-cache token share, the length distributions, the tick.
Seeded: the same arguments give the same bytes.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

import numpy as np

__all__ = [
    "shared_prefix_tokens",
    "first_token_differs",
    "dynamic_text_prompts",
    "shuffled_tool_chat",
    "lengths_csv",
    "mooncake_hash_ids",
    "Expected",
]


@dataclass(frozen=True)
class Expected:
    requests: int
    prefix_token_fraction: float | None = None
    note: str = ""


def _write_jsonl(path: Path, rows) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def shared_prefix_tokens(
    path: Path,
    *,
    groups: int = 4,
    per_group: int = 50,
    prefix_blocks: int = 8,
    suffix_tokens: int = 40,
    block_size: int = 16,
    seed: int = 0,
) -> Expected:
    """Groups of prompts sharing a prefix of whole blocks, then a unique suffix (token ids).

    Unlimited cache: every member after a group's first serves the prefix; nothing else hits
    (suffix tokens are drawn from a range no prefix uses, so no accidental block matches).
    """
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000, 2000) for _ in range(prefix_blocks * block_size)] for _ in range(groups)]
    rows, total = [], 0
    order = [g for g in range(groups) for _ in range(per_group)]
    rng.shuffle(order)
    for i, g in enumerate(order):
        toks = prefixes[g] + [rng.randrange(5000, 60000) for _ in range(suffix_tokens)]
        total += len(toks)
        rows.append({"prompt_token_ids": toks, "output_length": 10 + i % 7, "timestamp": i * 0.5})
    _write_jsonl(path, rows)
    hit = groups * (per_group - 1) * prefix_blocks * block_size
    return Expected(len(rows), hit / total)


def first_token_differs(path: Path, *, n: int = 200, length: int = 512, seed: int = 0) -> Expected:
    """Prompts equal except for their first token: no exact-prefix reuse, all content similar."""
    rng = random.Random(seed)
    body = [rng.randrange(1000, 30000) for _ in range(length - 1)]
    _write_jsonl(path, ({"prompt_token_ids": [50000 + i] + body, "output_length": 20} for i in range(n)))
    return Expected(n, 0.0, "dynamic content fraction close to (n-1)/n of the content after block 1")


_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "report",
    "customer",
    "order",
    "status",
    "invoice",
    "shipping",
    "account",
    "balance",
    "support",
    "ticket",
    "priority",
    "summary",
    "analysis",
    "please",
    "review",
    "update",
]


def dynamic_text_prompts(
    path: Path, *, n: int = 120, kind: str = "iso", seed: int = 0, shared_words: int = 400
) -> Expected:
    """Chat requests whose system prompt starts with something that varies, then a long shared text."""
    rng = random.Random(seed)
    shared = " ".join(rng.choice(_WORDS) for _ in range(shared_words))
    rows = []
    for i in range(n):
        if kind == "iso":
            varying = f"2024-03-{1 + i % 28:02d}T{i % 24:02d}:{(7 * i) % 60:02d}:{(13 * i) % 60:02d}Z"
        elif kind == "uuid":
            varying = str(uuid.UUID(int=rng.getrandbits(128)))
        else:
            varying = str(100000 + rng.randrange(900000))
        system = f"Request {varying}. You are a helpful assistant. {shared}"
        rows.append(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {rng.choice(_WORDS)} {i}"},
                ],
                "max_tokens": 64,
                "timestamp": 1_700_000_000 + i,
            }
        )
    _write_jsonl(path, rows)
    return Expected(n)


def shuffled_tool_chat(path: Path, *, n: int = 100, shuffle_every: int = 2, seed: int = 0) -> Expected:
    """Chat requests with the same tool schema, its keys reordered in every `shuffle_every`-th request."""
    rng = random.Random(seed)
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look an order up",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
                "required": ["order_id"],
            },
        },
    }

    def shuffled(obj):
        if isinstance(obj, dict):
            items = list(obj.items())
            rng.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        return obj

    rows = []
    unstable = 0
    for i in range(n):
        t = tool
        if i > 0 and i % shuffle_every == 0:
            t = shuffled(tool)
            while json.dumps(t) == json.dumps(tool):
                t = shuffled(tool)
            unstable += 1
        rows.append(
            {
                "model": "m",
                "tools": [t],
                "messages": [{"role": "user", "content": f"where is order {i}?"}],
                "usage": {"prompt_tokens": 100 + i, "completion_tokens": 5 + i % 3},
            }
        )
    _write_jsonl(path, rows)
    return Expected(n, note=f"{unstable} reordered")


def lengths_csv(
    path: Path,
    *,
    n: int = 2000,
    fmt: str = "azure",
    tick_s: float = 3.0,
    seed: int = 0,
    output_mean: float = 200.0,
    output_cv: float = 1.5,
) -> tuple[Expected, np.ndarray, np.ndarray]:
    """Azure or BurstGPT CSV with lognormal output lengths (known CV) and Poisson arrivals on a tick."""
    rng = np.random.default_rng(seed)
    sigma = np.sqrt(np.log(1 + output_cv**2))
    outputs = np.maximum(1, np.round(rng.lognormal(np.log(output_mean) - sigma**2 / 2, sigma, n))).astype(int)
    inputs = rng.integers(50, 4000, n)
    arrivals = np.cumsum(rng.exponential(1.0, n))
    ticks = np.floor(arrivals / tick_s) * tick_s
    with open(path, "w") as f:
        if fmt == "azure":
            from datetime import datetime, timedelta

            t0 = datetime(2023, 11, 16, 18, 0, 0, tzinfo=UTC)
            f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
            for t, i, o in zip(ticks, inputs, outputs):
                stamp = (t0 + timedelta(seconds=float(t))).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
                f.write(f"{stamp},{i},{o}\n")
        else:
            f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
            for t, i, o in zip(ticks, inputs, outputs):
                f.write(f"{t:g},ChatGPT,{i},{o},{i + o},Conversation log\n")
    return Expected(n), inputs, outputs


def mooncake_hash_ids(
    path: Path, *, n: int, groups: int = 100, shared_blocks: int = 4, unique_blocks: int = 8, seed: int = 0
) -> Expected:
    """A Mooncake-style JSONL: groups share their first blocks, the rest are fresh ids.

    Written with a plain loop so that a 10-million-request file streams to disk.
    """
    rng = np.random.default_rng(seed)
    next_id = groups * shared_blocks
    total_tokens = hit_blocks = 0
    seen_groups: set[int] = set()
    with open(path, "w") as f:
        chunk = 100_000
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            g = rng.integers(0, groups, m)
            u = rng.integers(1, unique_blocks + 1, m)
            out = rng.integers(1, 1000, m)
            lines = []
            for j in range(m):
                gi, ui = int(g[j]), int(u[j])
                ids = list(range(gi * shared_blocks, (gi + 1) * shared_blocks)) + list(range(next_id, next_id + ui))
                next_id += ui
                if gi in seen_groups:
                    hit_blocks += shared_blocks
                seen_groups.add(gi)
                length = len(ids) * 512
                total_tokens += length
                lines.append(
                    f'{{"timestamp": {(lo + j) * 10}, "input_length": {length}, "output_length": {int(out[j])}, '
                    f'"hash_ids": [{", ".join(map(str, ids))}]}}\n'
                )
            f.write("".join(lines))
    return Expected(n, hit_blocks * 512 / total_tokens)
