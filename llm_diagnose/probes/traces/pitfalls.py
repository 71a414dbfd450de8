"""What the prompt pitfalls of a prefix cache are made of, measured in the prompts themselves.

- Where similar prompts diverge: content that repeats across prompts but sits after something
  that varies per request (a timestamp, a user id, a request id) is out of a byte-exact prefix
  cache's reach. How much is `similarity.py`'s; here a pair of sample prompts is diffed to say
  where they first diverge and what varies there, as a category ("ISO timestamp", "uuid",
  "integer id"), never the text unless asked for (`show_text`).
- Key order of JSON payloads (tool schemas, JSON in messages): a payload equal to an earlier one
  but written with its keys in another order has equal meaning, different bytes, and no prefix
  match from there on.

Measurements only: whether they amount to a finding (`dynamic-prefix`, `unstable-serialization`)
is judged in `llm_diagnose.diagnose.trace_findings`, with the tree's named thresholds.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_diagnose.probes.traces.hashing import segment_positions

__all__ = [
    "DivergenceExample",
    "PromptSample",
    "SampleIndex",
    "SerializationStats",
    "SerializationTracker",
    "classify_varying",
    "divergence_example",
    "TOKEN_SPAN",
]

SNIPPET_CHARS = 40
TOKEN_SPAN = "token span"  # what varies, for token-id prompts (no text to categorise)


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
        d: dict = {
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


def _common_prefix(a: str | np.ndarray, b: str | np.ndarray) -> int:
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


class SampleIndex:
    """The distinct shingles of the sample prompts, sorted together with the sample each came
    from: the earlier sample that shares most of a prompt is found in one search, not in one
    set comparison per sample (32 dynamic prompts against 256 samples were seconds)."""

    def __init__(self, samples: Sequence[PromptSample]) -> None:
        self.samples = tuple(samples)
        per_sample = [_shingles(s.tokens) for s in self.samples]
        hashes = np.concatenate(per_sample) if per_sample else np.empty(0, dtype=np.uint64)
        owners = np.repeat(np.arange(len(per_sample)), [len(h) for h in per_sample])
        order = np.argsort(hashes, kind="stable")
        self._hashes, self._owners = hashes[order], owners[order]

    def most_similar(self, shingles: np.ndarray, before: int) -> tuple[int | None, float]:
        """Among the first `before` samples, the first one holding the largest share of
        `shingles` (distinct, sorted), and that share; None where none holds any."""
        if before <= 0 or len(shingles) == 0:
            return None, 0.0
        lo = np.searchsorted(self._hashes, shingles, "left")
        found = np.searchsorted(self._hashes, shingles, "right") - lo
        _, local = segment_positions(found)
        # A sample's shingles are distinct: it owns each match once, so its count is its share's numerator.
        held = np.bincount(self._owners[np.repeat(lo, found) + local], minlength=len(self.samples))[:before]
        best = int(np.argmax(held))
        return (best, int(held[best]) / len(shingles)) if held[best] else (None, 0.0)


def divergence_example(
    later: PromptSample, index: SampleIndex, before: int, count_tokens, *, show_text: bool = False
) -> DivergenceExample | None:
    """Diff a dynamic prompt against the most similar of the first `before` samples; None if none is similar."""
    best_at, best_share = index.most_similar(_shingles(later.tokens), before)
    if best_at is None or best_share < 0.3:
        return None
    best = index.samples[best_at]
    if later.text is not None and best.text is not None:
        a, b = later.text, best.text
        lcp = _common_prefix(a, b)
        if lcp >= min(len(a), len(b)):
            return None  # one is a prefix of the other: nothing varies
        i2, j2 = _first_change(a[lcp : lcp + 400], b[lcp : lcp + 400])
        what, s, e = classify_varying(a, lcp, lcp + max(i2, 1))
        _, s2, e2 = classify_varying(b, lcp, lcp + max(j2, 1))
        snippets = (a[s:e][:SNIPPET_CHARS], b[s2:e2][:SNIPPET_CHARS]) if show_text else None
        return DivergenceExample(count_tokens(a[:s]), s, what, best_share, snippets)
    lcp = _common_prefix(later.tokens, best.tokens)
    if lcp >= min(len(later.tokens), len(best.tokens)):
        return None
    sa, sb = later.tokens[lcp : lcp + 400].tolist(), best.tokens[lcp : lcp + 400].tolist()
    i2, j2 = _first_change(sa, sb)
    n = max(i2, 1)
    snippets = (str(sa[: min(n, 8)]), str(sb[: min(max(j2, 1), 8)])) if show_text else None
    return DivergenceExample(lcp, None, f"{TOKEN_SPAN} of {n}", best_share, snippets)


def _first_change(sa: Sequence[Any], sb: Sequence[Any]) -> tuple[int, int]:
    """Where the first stretch that differs ends, in each of two sequences (1 when none is found)."""
    ops = difflib.SequenceMatcher(None, sa, sb, autojunk=False).get_opcodes()
    return next((o[2] for o in ops if o[0] != "equal"), 1), next((o[4] for o in ops if o[0] != "equal"), 1)


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
