"""The prompt pitfalls a prefix cache suffers from, found in the prompts themselves.

- ``dynamic-prefix``: much content repeats across prompts but sits after something that
  varies per request (a timestamp, a user id, a request id), so a byte-exact prefix cache
  cannot use it. The amount comes from `similarity.py`; here a pair of sample prompts is
  diffed to say where they first diverge and what varies there, as a category
  ("ISO timestamp", "uuid", "integer id"), never the text unless asked for (`show_text`).
- ``unstable-serialization``: a JSON payload (tool schemas, JSON in messages) equal to an
  earlier one but written with its keys in another order: equal meaning, different bytes,
  no prefix match from there on.
- ``kv-offload`` (a technique, not a pitfall): an unlimited prefix cache would serve much
  more than one of the server's KV capacity.

Findings carry stable ids that users' CI matches on.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Finding",
    "DivergenceExample",
    "PromptSample",
    "SerializationStats",
    "SerializationTracker",
    "classify_varying",
    "divergence_example",
    "dynamic_prefix_finding",
    "unstable_serialization_finding",
    "kv_offload_finding",
    "DYNAMIC_PREFIX",
    "UNSTABLE_SERIALIZATION",
    "KV_OFFLOAD",
]

DYNAMIC_PREFIX = "dynamic-prefix"
UNSTABLE_SERIALIZATION = "unstable-serialization"
KV_OFFLOAD = "kv-offload"

DYNAMIC_PREFIX_WARN = 0.10  # share of prompt tokens similar to earlier prompts but not servable
DYNAMIC_PREFIX_CRITICAL = 0.30
UNSTABLE_WARN = 0.01  # share of requests with a reordered payload
KV_OFFLOAD_GAP = 0.10  # unlimited-cache share minus at-capacity share
SNIPPET_CHARS = 40
TOKEN_SPAN = "token span"  # what varies, for token-id prompts (no text to categorise)


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # "info", "warning" or "critical"
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "evidence": dict(self.evidence),
            "fix": self.fix,
        }


# --- what varies: categories, most specific first ------------------------------------------
_CATEGORIES: tuple[tuple[str, re.Pattern], ...] = tuple(
    (name, re.compile(rx))
    for name, rx in (
        ("ISO timestamp", r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
        ("uuid", r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
        ("date", r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}"),
        ("time of day", r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?"),
        ("unix timestamp", r"(?<![\d.])1[4-9]\d{8}(?:\d{3})?(?:\.\d+)?(?![\d])"),
        ("email address", r"[\w.+-]+@[\w-]+\.[\w.-]+"),
        ("hex id", r"(?<![0-9a-zA-Z])(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}(?![0-9a-zA-Z])"),
        ("prefixed id", r"(?<!\w)[A-Za-z]+[-_:]?\d[\w-]*"),
        ("integer id", r"(?<![\d.])\d{3,}(?!\.?\d)"),
        ("number", r"\d+(?:\.\d+)?"),
    )
)
_AROUND = 48  # characters searched on either side of the first difference


def classify_varying(text: str, start: int, end: int) -> tuple[str, int, int]:
    """The category of what varies at text[start:end], and the span of the matched item."""
    lo = max(0, start - _AROUND)
    window = text[lo : end + _AROUND]
    for name, rx in _CATEGORIES:
        for m in rx.finditer(window):
            s, e = lo + m.start(), lo + m.end()
            if s <= max(start, end - 1) and e > start:  # the match covers the first difference
                return name, s, e
    s, e = start, max(end, start + 1)
    while s > 0 and text[s - 1].isalnum():
        s -= 1
    while e < len(text) and text[e].isalnum():
        e += 1
    return "text", s, e


@dataclass(frozen=True)
class DivergenceExample:
    """Where two similar prompts first differ, and what differs there."""

    token_offset: int
    char_offset: int | None  # None for token-id prompts
    what_varies: str  # a category, or "a span of N tokens" for token ids
    shared_after: float  # share of the later prompt's content windows also in the earlier one
    snippets: tuple[str, str] | None = None  # only with show_text

    def to_dict(self) -> dict:
        d = {
            "token_offset": self.token_offset,
            "char_offset": self.char_offset,
            "what_varies": self.what_varies,
            "shared_after": round(self.shared_after, 3),
        }
        if self.snippets is not None:
            d["snippets"] = list(self.snippets)
        return d


_SHINGLE = 8  # tokens per shingle when comparing two sample prompts
_SHINGLE_POWERS = np.array([pow(0x9E3779B97F4A7C15, j, 1 << 64) for j in range(_SHINGLE)], dtype=np.uint64)


def _shingles(tokens: np.ndarray) -> np.ndarray:
    """Distinct hashes of every _SHINGLE-token window (sorted)."""
    if len(tokens) < _SHINGLE:
        return np.empty(0, dtype=np.uint64)
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens, dtype=np.uint64), _SHINGLE)
    h = np.sort(windows @ _SHINGLE_POWERS)
    return h[np.append(True, h[1:] != h[:-1])]


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    if isinstance(a, np.ndarray):
        differ = np.flatnonzero(a[:n] != b[:n])
        return int(differ[0]) if len(differ) else n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class PromptSample:
    """A prompt kept for the divergence examples: its token ids, and its text where it had one."""

    tokens: np.ndarray
    text: str | None = None


def divergence_example(
    later: PromptSample, candidates: Sequence[PromptSample], count_tokens, *, show_text: bool = False
) -> DivergenceExample | None:
    """Diff a dynamic prompt against the most similar earlier sample; None if none is similar."""
    mine = _shingles(later.tokens)
    if len(mine) == 0:
        return None
    best, best_share = None, 0.0
    for c in candidates:
        share = np.count_nonzero(np.isin(mine, _shingles(c.tokens), assume_unique=True)) / len(mine)
        if share > best_share:
            best, best_share = c, share
    if best is None or best_share < 0.3:
        return None
    a, b = (later.text, best.text) if later.text is not None and best.text is not None else (later.tokens, best.tokens)
    lcp = _common_prefix(a, b)
    if lcp >= min(len(a), len(b)):
        return None  # one is a prefix of the other: nothing varies
    sa, sb = a[lcp : lcp + 400], b[lcp : lcp + 400]
    if not isinstance(a, str):
        sa, sb = sa.tolist(), sb.tolist()
    ops = difflib.SequenceMatcher(None, sa, sb, autojunk=False).get_opcodes()
    i2 = next((o[2] for o in ops if o[0] != "equal"), 1)
    j2 = next((o[4] for o in ops if o[0] != "equal"), 1)
    if isinstance(a, str):
        what, s, e = classify_varying(a, lcp, lcp + max(i2, 1))
        _, s2, e2 = classify_varying(b, lcp, lcp + max(j2, 1))
        snippets = (a[s:e][:SNIPPET_CHARS], b[s2:e2][:SNIPPET_CHARS]) if show_text else None
        return DivergenceExample(count_tokens(a[:s]), s, what, best_share, snippets)
    n = max(i2, 1)
    snippets = (str(sa[: min(n, 8)]), str(sb[: min(max(j2, 1), 8)])) if show_text else None
    return DivergenceExample(lcp, None, f"{TOKEN_SPAN} of {n}", best_share, snippets)


# --- unstable serialization -----------------------------------------------------------------
@dataclass(frozen=True)
class SerializationStats:
    requests: int  # requests looked at
    requests_with_payloads: int
    payloads: int
    unstable_requests: int
    unstable_fraction: float  # of all requests looked at
    locations: Mapping[str, int]  # where reordered payloads were found (tools, user message, ...)
    complete: bool  # False when the table of payloads seen was full and new ones went unchecked

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["locations"] = dict(self.locations)
        return d


class SerializationTracker:
    """Per distinct payload (compared with sorted keys), the key order it was first sent with."""

    _CAP = 1 << 18  # distinct payloads remembered (about 100 bytes each)

    def __init__(self) -> None:
        self._first_order: dict[int, int] = {}
        self.requests = self.with_payloads = self.payloads = self.unstable = 0
        self.locations: Counter = Counter()
        self.complete = True

    def add(self, payloads: Sequence[tuple[str, Any]]) -> bool:
        self.requests += 1
        if not payloads:
            return False
        self.with_payloads += 1
        unstable = False
        for where, obj in payloads:
            self.payloads += 1
            canonical = hash(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str))
            as_sent = hash(json.dumps(obj, ensure_ascii=False, default=str))
            first = self._first_order.get(canonical)
            if first is None:
                if len(self._first_order) < self._CAP:
                    self._first_order[canonical] = as_sent
                else:
                    self.complete = False
            elif first != as_sent:
                unstable = True
                self.locations[where] += 1
        self.unstable += unstable
        return unstable

    def result(self) -> SerializationStats:
        return SerializationStats(
            self.requests,
            self.with_payloads,
            self.payloads,
            self.unstable,
            self.unstable / self.requests if self.requests else 0.0,
            dict(self.locations.most_common()),
            self.complete,
        )


# --- findings ------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def dynamic_prefix_finding(
    dynamic_fraction: float,
    seen_fraction: float,
    cached_fraction: float,
    divergence_tokens: int | None,
    examples: Sequence[DivergenceExample],
) -> Finding | None:
    if dynamic_fraction < DYNAMIC_PREFIX_WARN:
        return None
    whats = Counter(e.what_varies for e in examples)
    what = whats.most_common(1)[0][0] if whats else None
    at = sorted(e.token_offset for e in examples)[len(examples) // 2] if examples else divergence_tokens
    where = f" at about token {at}" if at is not None else ""
    message = (
        f"{_pct(dynamic_fraction)} of prompt content repeats earlier prompts but comes after a point where "
        f"prompts differ, so an exact-prefix cache cannot reuse it; prompts first diverge{where}"
        + (f" ({what})" if what else "")
    )
    if what and what.startswith(TOKEN_SPAN):
        thing = "the tokens that vary per request"
    elif what and what != "text":
        thing = f"the {what}"
    else:
        thing = "the part that varies per request"
    evidence = {
        "dynamic_token_fraction": dynamic_fraction,
        "similar_token_fraction": seen_fraction,
        "cache_servable_similar_fraction": cached_fraction,
        "divergence_token": at,
        "examples": [e.to_dict() for e in examples],
    }
    return Finding(
        DYNAMIC_PREFIX,
        "critical" if dynamic_fraction >= DYNAMIC_PREFIX_CRITICAL else "warning",
        message,
        evidence,
        f"move {thing}{where} to the end of the prompt, after the shared content",
    )


def unstable_serialization_finding(stats: SerializationStats) -> Finding | None:
    if stats.unstable_requests == 0 or stats.unstable_fraction < UNSTABLE_WARN:
        return None
    places = ", ".join(stats.locations)
    message = (
        f"{stats.unstable_requests} requests ({_pct(stats.unstable_fraction)}) send JSON ({places}) equal to an "
        "earlier request's but with its keys in another order: same meaning, different bytes, so prefix "
        "matching stops there"
    )
    fix = (
        "serialise JSON with a fixed key order (e.g. json.dumps(obj, sort_keys=True)) before it goes into the "
        "prompt; where it cannot be made stable, move it to the end of the prompt"
    )
    return Finding(UNSTABLE_SERIALIZATION, "warning", message, stats.to_dict(), fix)


def kv_offload_finding(unlimited: float, at_capacity: float, capacity_tokens: int) -> Finding | None:
    gap = unlimited - at_capacity
    if gap < KV_OFFLOAD_GAP:
        return None
    message = (
        f"an unlimited prefix cache would serve {_pct(unlimited)} of prompt tokens, an LRU cache of "
        f"{capacity_tokens} tokens only {_pct(at_capacity)}: evicted prefixes are recomputed"
    )
    fix = (
        "offload KV blocks to CPU memory or disk (e.g. LMCache or the engine's CPU offload) or give the KV cache "
        "more memory, so evicted prefixes are reloaded instead of recomputed"
    )
    return Finding(
        KV_OFFLOAD,
        "warning",
        message,
        {
            "unlimited_token_fraction": unlimited,
            "at_capacity_token_fraction": at_capacity,
            "capacity_tokens": capacity_tokens,
            "gap": gap,
        },
        fix,
    )
