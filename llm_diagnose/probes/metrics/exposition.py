"""Prometheus text exposition -> a typed, immutable snapshot of one scrape.

This is the one place llm-diagnose parses /metrics text. The reference parser is
prometheus_client's (`text_string_to_metric_families`), the library vLLM, SGLang and
TensorRT-LLM use to write the page. Its pure-Python tokenizer costs 13-27 ms on a real 52 KB
vLLM page, so pages go through a fast path first: one compiled regular expression per line
for the shapes engines actually write (`name{a="b",...} value [timestamp]`, `# HELP`/`# TYPE`
lines), fed into the same family state machine as prometheus_client's, so it yields the same
samples (names, labels, values, timestamps, family types). Anything the fast path does not
recognise (quoted metric names, odd whitespace, exemplars, a value `float()` rejects, ...)
sends the whole page to prometheus_client, which then also reports the error with its line.
`tests/test_metrics_safety.py` checks the two agree sample for sample on every fixture and on
generated pages.

What this module adds on top of the samples:
- samples indexed by their wire name (`vllm:prompt_tokens_total`), because the family name in
  `# TYPE` is spelled with or without `_total` depending on the engine version;
- labels as a frozenset, because multiprocess output orders them alphabetically and
  single-process output puts `le` last;
- `*_created` samples (unix timestamps next to every counter and histogram) kept apart, so
  they are never read as counts but can still reveal a restarted server;
- histograms by name, one `HistogramSeries` (cumulative buckets, count, sum) per label set;
- bad samples (an infinite value, a NaN/negative count, a value beyond 2^53, a second copy of
  a series) excluded and listed in `Scrape.bad`, so no arithmetic downstream meets them;
- bounds on the page (MAX_PAGE_BYTES, MAX_SERIES): past them the page is refused with
  `MetricsTooLarge`, before it costs seconds and gigabytes;
- parse errors that quote the offending line and its number.
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import NamedTuple

from prometheus_client.parser import text_fd_to_metric_families

from llm_diagnose.probes.http import MalformedMetrics

__all__ = [
    "Labels",
    "Series",
    "HistogramSeries",
    "BadSample",
    "Scrape",
    "MetricsTooLarge",
    "parse_exposition",
    "scrape_from_samples",
    "labels_match",
    "exposition_samples",
    "reference_samples",
    "fast_samples",
    "NotFastPath",
    "page_too_large",
    "MAX_PAGE_BYTES",
    "MAX_SERIES",
    "MAX_EXACT_VALUE",
    "BAD_INFINITE",
    "BAD_NAN_COUNT",
    "BAD_NEGATIVE_COUNT",
    "BAD_HUGE",
    "BAD_DUPLICATE",
]

Labels = frozenset  # frozenset[tuple[str, str]]: order-free, hashable
EMPTY_LABELS: Labels = frozenset()
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")

# --- limits ------------------------------------------------------------------------------------
# A real vLLM 0.32 page is 52 KB and 445 series per engine; SGLang's 87 KB. 8 MiB is ~150 such
# pages. Past it the body is not read further and the page is refused, not truncated: half a
# page would read as series vanishing.
MAX_PAGE_BYTES = 8 << 20
# 50,000 series is ~110 vLLM engines' worth (a 64-rank data-parallel vLLM writes ~28,500). A page
# with more nearly always carries a label with unbounded values (request ids, user ids, URL
# paths): such a page cost 66 s and 2.6 GB in a 6 s run (2.5 M series). At the limit, with
# every label set new, the parse takes about a second, in a worker thread.
MAX_SERIES = 50_000
# Counts at or below 2^53 are exact in a double. No engine counter gets near it (1 M tokens/s
# takes 285 years); a value beyond it is a broken exporter, and summing a few of them
# overflows to inf.
MAX_EXACT_VALUE = float(2**53)

# Why a sample was excluded (Scrape.bad). NaN gauges are not bad: engines write NaN for "no
# reading" (SGLang's fwd_occupancy before the first batch), and every reader skips NaN.
BAD_INFINITE = "infinite value"
BAD_NAN_COUNT = "NaN count or sum"
BAD_NEGATIVE_COUNT = "negative count"
BAD_HUGE = "beyond 2^53"
BAD_DUPLICATE = "duplicate series (the first copy is kept, as Prometheus does)"


class MetricsTooLarge(MalformedMetrics):
    """The page exceeds MAX_PAGE_BYTES or MAX_SERIES; `limit_name` names the limit."""

    def __init__(self, message: str, url: str | None = None, limit_name: str = "", limit: int = 0) -> None:
        super().__init__(message, url)
        self.limit_name = limit_name
        self.limit = limit


def labels_match(labels: Labels, where: Iterable[tuple[str, str]]) -> bool:
    """True when every (name, value) pair of `where` is among `labels`."""
    return all(pair in labels for pair in where)


class Series(NamedTuple):
    """One sample of a scrape: a label set and its value (NaN is kept; callers skip it).

    A named tuple, not a frozen dataclass: a page holds hundreds, and building them is a
    third of the parse otherwise.
    """

    labels: Labels
    value: float

    def label(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == name:
                return v
        return default


@dataclass(frozen=True)
class HistogramSeries:
    """One histogram label set (without `le`): cumulative bucket counts, count and sum.

    `buckets` is sorted by upper edge and ends with +Inf whenever the page carried it.
    """

    labels: Labels
    buckets: tuple[tuple[float, float], ...]  # (upper edge, cumulative count)
    count: float
    sum: float

    @property
    def edges(self) -> tuple[float, ...]:
        return tuple(edge for edge, _ in self.buckets)


@dataclass(frozen=True)
class BadSample:
    """A sample excluded from a scrape, and why (one of the BAD_* reasons)."""

    name: str  # wire sample name
    labels: Labels
    value: float
    reason: str

    def describe(self) -> str:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels))
        return f"{self.name}{{{labels}}} = {self.value!r} ({self.reason})"


@dataclass(frozen=True)
class Scrape:
    """Everything one /metrics page said, indexed for lookup. Immutable once built."""

    samples: Mapping[str, tuple[Series, ...]]  # wire sample name -> series
    types: Mapping[str, str]  # wire sample name -> family type (counter, gauge, histogram, ...)
    histograms: Mapping[str, tuple[HistogramSeries, ...]]  # histogram name -> series
    created: Mapping[tuple[str, Labels], float] = field(default_factory=dict)  # (base name, labels) -> unix time
    bad: tuple[BadSample, ...] = ()  # samples left out of everything above
    # Series the page carried but that were excluded as bad, by wire sample name (histograms by
    # their name, labels without `le`): a reader must not mistake them for absent series.
    excluded: Mapping[str, frozenset] = field(default_factory=dict)

    # --- lookups ------------------------------------------------------------------------
    def names(self) -> frozenset[str]:
        return frozenset(self.samples) | frozenset(self.histograms)

    def has(self, name: str, where: Iterable[tuple[str, str]] = ()) -> bool:
        where = tuple(where)
        if name in self.histograms:
            return any(labels_match(h.labels, where) for h in self.histograms[name])
        return any(labels_match(s.labels, where) for s in self.samples.get(name, ()))

    def series(self, name: str, where: Iterable[tuple[str, str]] = ()) -> tuple[Series, ...]:
        where = tuple(where)
        return tuple(s for s in self.samples.get(name, ()) if labels_match(s.labels, where))

    def excluded_labels(self, name: str, where: Iterable[tuple[str, str]] = ()) -> tuple[Labels, ...]:
        """Label sets of `name` matching `where` that this page carried but excluded as bad."""
        where = tuple(where)
        return tuple(labels for labels in self.excluded.get(name, ()) if labels_match(labels, where))

    def value(self, name: str, where: Iterable[tuple[str, str]] = (), aggregate: str = "sum") -> float | None:
        """The series of `name` matching `where`, aggregated over the other labels.

        "sum" is for counts (requests over DP engines, tokens over `is_streaming`), "max" for
        usage fractions (the fullest engine is the one that preempts). NaN samples are
        skipped; None when nothing matches.
        """
        values = [s.value for s in self.series(name, where) if not math.isnan(s.value)]
        if not values:
            return None
        if aggregate == "sum":
            return math.fsum(values)
        if aggregate == "max":
            return max(values)
        if aggregate == "first":
            return values[0]
        raise ValueError(f"unknown aggregate {aggregate!r} (expected sum, max or first)")

    def histogram(self, name: str, where: Iterable[tuple[str, str]] = ()) -> tuple[HistogramSeries, ...]:
        where = tuple(where)
        return tuple(h for h in self.histograms.get(name, ()) if labels_match(h.labels, where))

    def created_at(self, base_name: str, labels: Labels) -> float | None:
        return self.created.get((base_name, labels))


# --- tokenizing: fast path and reference --------------------------------------------------------
# A raw sample, as both paths give it: (wire name, ((label, value), ...) in page order, value,
# timestamp in seconds or None, family type as prometheus_client names it).
RawSample = tuple[str, tuple[tuple[str, str], ...], float, "float | None", str]


class NotFastPath(Exception):
    """The fast path met text it does not handle exactly as prometheus_client: use the reference."""


def _as_float(value: int | float) -> float:
    # prometheus_client returns a 400-digit integer as an int, which float() refuses.
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


class _NumberedLines:
    """Feeds prometheus_client one line at a time and remembers which line it is on.

    Lines are split on "\\n" only, as prometheus_client's own text_string_to_metric_families
    (a StringIO) does; the parser raises ValueError without a line number, this supplies it.
    """

    def __init__(self, text: str) -> None:
        self._lines = text.split("\n")
        self.number = 0

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(self._lines, 1):
            self.number = number
            yield line

    def current(self) -> str:
        return self._lines[self.number - 1] if 0 < self.number <= len(self._lines) else ""


_TOO_LARGE_ADVICE = (
    "A page this size nearly always carries a label with unbounded values (request or user ids, URL "
    "paths); drop that label in the exporter, or point --metrics-url at an endpoint that serves the "
    "engine's metrics alone"
)


def page_too_large(source: str, limit: int = MAX_PAGE_BYTES) -> MetricsTooLarge:
    """The error for a page over MAX_PAGE_BYTES (the scraper stops reading there)."""
    return MetricsTooLarge(
        f"{source} served a metrics page over {limit / (1 << 20):g} MiB (limit MAX_PAGE_BYTES): "
        f"not read further. {_TOO_LARGE_ADVICE}",
        None,
        limit_name="MAX_PAGE_BYTES",
        limit=limit,
    )


def _too_many_series(source: str, limit: int) -> MetricsTooLarge:
    return MetricsTooLarge(
        f"{source} lists more than {limit:,} series (limit MAX_SERIES): not parsed further. {_TOO_LARGE_ADVICE}",
        None,
        limit_name="MAX_SERIES",
        limit=limit,
    )


def reference_samples(text: str, source: str = "/metrics", max_series: int | None = None) -> list[RawSample]:
    """The page's samples as prometheus_client's parser gives them (text_string_to_metric_families,
    fed line by line to know the line an error is on).

    Raises:
        MalformedMetrics: the parser rejected a line (the message quotes it, with its number).
        MetricsTooLarge: more than `max_series` samples.
    """
    lines = _NumberedLines(text)
    out: list[RawSample] = []
    limit = max_series if max_series is not None else sys.maxsize  # sys.maxsize: no limit
    try:
        # The parser only iterates over its argument: the stubs ask for a TextIO, lines suffice.
        for family in text_fd_to_metric_families(lines):  # type: ignore[arg-type]
            for s in family.samples:
                ts = None if s.timestamp is None else float(s.timestamp)  # a float here; Sample also admits a Timestamp
                out.append((s.name, tuple(s.labels.items()), _as_float(s.value), ts, family.type))
                if len(out) > limit:
                    raise _too_many_series(source, limit)
    except (ValueError, OverflowError) as exc:
        line = lines.current().strip()
        shown = line if len(line) <= 160 else line[:157] + "..."
        detail = str(exc) or type(exc).__name__
        raise MalformedMetrics(
            f"malformed /metrics text from {source} at line {lines.number}: {shown!r} "
            f"(Prometheus parser: {detail[:120]})",
            None,
            line_number=lines.number,
            line=line,
        ) from None
    return out


# prometheus_client splits comment lines on string.whitespace, quote-aware.
_WS = " \t\n\r\x0b\x0c"
_WS_SPLIT = re.compile(r"[ \t\n\r\x0b\x0c]+")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = r"[a-zA-Z_][a-zA-Z0-9_]*"
# Label values without a backslash (nearly all) are checked by the first pattern; values with
# escapes (\\, \", \n) by the second, slower one.
_PLAIN_PAIR = _LABEL_NAME_RE + r'="[^"\\]*"'
_PLAIN_LABELS = re.compile(rf"(?:{_PLAIN_PAIR},)*(?:{_PLAIN_PAIR})?")
_PLAIN_PAIRS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_ESCAPED_PAIR = _LABEL_NAME_RE + r'="[^"\\]*(?:\\.[^"\\]*)*"'
_ESCAPED_LABELS = re.compile(rf"(?:{_ESCAPED_PAIR},)*(?:{_ESCAPED_PAIR})?")
_ESCAPED_PAIRS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# prometheus_client's Metric accepts these types ("untyped" becomes "unknown").
_METRIC_TYPES = frozenset({"counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset"})
_ALLOWED_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}

# What a label block parses to: the pairs in page order, the label set, the set without `le`,
# `le` (None when absent) and its value (None when absent or not a number).
_LabelInfo = tuple[tuple[tuple[str, str], ...], Labels, Labels, "str | None", "float | None"]
# A server writes the same label blocks and names on every page, so what each parses to is
# kept from page to page: a cached block costs one dict lookup instead of two regex passes.
# Bounded (cleared when full) so a high-cardinality page cannot grow it without limit.
LABEL_CACHE_SIZE = 32_768
# "name{labels}" (or a bare "name") -> (name, what the labels parse to)
_label_cache: dict[str, tuple[str, _LabelInfo]] = {}
_name_cache: dict[str, str] = {}  # each name once: later dict lookups reuse its cached hash


def _label_info(pairs: tuple[tuple[str, str], ...]) -> _LabelInfo:
    labels = frozenset(pairs)
    for k, v in pairs:
        if k == "le":
            try:
                edge: float | None = float(v)  # "+Inf" parses to inf
            except ValueError:
                edge = None
            return pairs, labels, labels - {(k, v)}, v, edge
    return pairs, labels, labels, None, None


_NO_LABELS: _LabelInfo = _label_info(())


def _parse_labels(text: str) -> _LabelInfo:
    """The label block between the braces, when it has the strict form `a="x",b="y"[,]`."""
    if "\\" in text:
        if _ESCAPED_LABELS.fullmatch(text) is None:
            raise NotFastPath
        pairs = tuple((k, _ESCAPE.sub(_unescape, v) if "\\" in v else v) for k, v in _ESCAPED_PAIRS.findall(text))
    else:
        if _PLAIN_LABELS.fullmatch(text) is None:
            raise NotFastPath
        pairs = tuple(_PLAIN_PAIRS.findall(text))
    if "__" in text and any(k.startswith("__") for k, _ in pairs):
        raise NotFastPath  # reserved label names, __name__ among them
    if len(pairs) > 1 and len(dict(pairs)) != len(pairs):
        raise NotFastPath  # a label given twice: prometheus_client refuses the line
    return _label_info(pairs)


def _new_name(name: str) -> str:
    if _METRIC_NAME.fullmatch(name) is None:
        raise NotFastPath
    if len(_name_cache) >= LABEL_CACHE_SIZE:
        _name_cache.clear()
    _name_cache[name] = name
    return name


def _allowed_names(name: str, typ: str) -> tuple[str, ...]:
    return tuple(name + suffix for suffix in _ALLOWED_SUFFIXES.get(typ, ("",)))


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPE[match.group(0)]


def _timestamp(text: str) -> float:
    # As prometheus_client: milliseconds, read as an integer first (exact for huge ones).
    if "_" in text:
        raise NotFastPath
    try:
        number: int | float = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise NotFastPath from None
    try:
        return number / 1000
    except OverflowError:
        raise NotFastPath from None


# One family of samples as the fast path groups them: (family type, [(wire name, label info,
# value, timestamp)]).
_Run = tuple[str, list[tuple[str, _LabelInfo, float, "float | None"]]]


def _sample_line(line: str) -> tuple[str, _LabelInfo, float, float | None]:
    """A sample line the label cache does not know yet: checked in full, and its head cached.

    The value (a float) holds no brace, so the last "}" closes the label block.
    """
    cache, names = _label_cache, _name_cache
    known: tuple[str, _LabelInfo] | None
    brace = line.find("{")
    if brace < 0:
        s_name, _, tail = line.partition(" ")
        s_name = names.get(s_name) or _new_name(s_name)
        info, close = _NO_LABELS, len(s_name)
        known = (s_name, info)
    else:
        close = line.rfind("}") + 1
        if close <= brace:
            raise NotFastPath
        known = cache.get(line[:close])
        if known is None:
            known = (names.get(line[:brace]) or _new_name(line[:brace]), _parse_labels(line[brace + 1 : close - 1]))
        s_name, info = known
        tail = line[close:]
        if tail[:1] != " ":
            raise NotFastPath
    # Only spaces may separate the value and timestamp (isprintable() is False for tabs and
    # other whitespace, which prometheus_client treats differently).
    if not tail.isprintable():
        raise NotFastPath
    tail = tail.lstrip(" ")
    if " " in tail:
        value_text, _, ts_text = tail.partition(" ")
        ts_text = ts_text.lstrip(" ")
        if not ts_text or " " in ts_text:
            raise NotFastPath
        ts: float | None = _timestamp(ts_text)
    else:
        value_text, ts = tail, None
    if not value_text or "_" in value_text:
        raise NotFastPath
    try:
        value = float(value_text)
    except ValueError:
        raise NotFastPath from None
    if len(cache) >= LABEL_CACHE_SIZE:
        cache.clear()
    cache[line[:close]] = known
    return s_name, info, value, ts


def _fast_runs(text: str, source: str, max_series: int | None) -> list[_Run]:
    """The page's samples, family by family, for the common shapes only.

    The family state machine is prometheus_client's (text_fd_to_metric_families): a sample
    whose name the current `# TYPE` does not allow becomes a one-sample untyped family and
    ends the current one; counters typed without `_total` get it appended.

    Raises:
        NotFastPath: a line it does not handle exactly as prometheus_client does.
        MetricsTooLarge: more than `max_series` samples.
    """
    runs: list[_Run] = []
    family: list[tuple[str, _LabelInfo, float, float | None]] = []
    allowed: tuple[str, ...]  # the sample names the current family takes
    name, typ, allowed = "", "untyped", ()
    cache, names = _label_cache, _name_cache
    limit = max_series if max_series is not None else sys.maxsize  # sys.maxsize: no limit
    count = 0

    def flush() -> None:
        nonlocal family
        if family:  # only ever filled under a named family (`allowed` is empty otherwise)
            if typ == "counter" and not name.endswith("_total"):
                family = [(n + "_total", i, v, t) for n, i, v, t in family]
            runs.append(("unknown" if typ == "untyped" else typ, family))
            family = []

    for line in text.split("\n"):
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":
            if line.startswith(("# HELP ", "# TYPE ")):
                # The usual shape: what follows the name (help text, type) cannot change how the
                # first three tokens split, quotes included.
                kind = line[2:6]
                candidate, _, rest = line[7:].partition(" ")
                candidate = names.get(candidate) or _new_name(candidate)
                rest = rest.lstrip(_WS)
            else:
                if '"' in line:
                    tokens = _WS_SPLIT.split(line, 2)
                    if '"' in tokens[0] or (len(tokens) > 1 and '"' in tokens[1]):
                        raise NotFastPath  # a quote in the first two tokens changes the tokenizing
                    if len(tokens) > 1 and tokens[1] in ("HELP", "TYPE"):
                        raise NotFastPath  # a quoted (UTF-8) metric name
                    continue  # an ordinary comment with a quote in its text
                parts = _WS_SPLIT.split(line, 3)
                if len(parts) < 2:
                    continue
                kind = parts[1]
                if len(parts) > 2:
                    if kind != "HELP" and kind != "TYPE":
                        continue
                    candidate = names.get(parts[2]) or _new_name(parts[2])
                else:
                    candidate = ""  # "# HELP" alone starts a nameless family, as in prometheus_client
                rest = parts[3] if len(parts) > 3 else ""
            if kind == "HELP":
                if candidate != name:
                    flush()
                    name, typ, allowed = candidate, "untyped", (candidate,)
            elif kind == "TYPE":
                if not rest:
                    raise NotFastPath  # prometheus_client refuses a TYPE line without a type
                if candidate != name:
                    flush()
                    name = candidate
                typ = rest
                if ("unknown" if typ == "untyped" else typ) not in _METRIC_TYPES:
                    raise NotFastPath  # prometheus_client refuses the type when it builds the family
                if typ == "counter" and name == "_total":
                    raise NotFastPath  # the family name would be empty
                allowed = _allowed_names(name, typ)
            continue
        # A sample: NAME[{LABELS}] VALUE [TIMESTAMP]. The usual line is a known "name{labels}"
        # and one space before the value: one dict lookup.
        head, _, value_text = line.rpartition(" ")
        known = cache.get(head)
        if known is not None and value_text.isprintable() and "_" not in value_text:
            s_name, info = known
            ts = None
            try:
                value = float(value_text)
            except ValueError:
                raise NotFastPath from None
        else:
            s_name, info, value, ts = _sample_line(line)
        count += 1
        if count > limit:
            raise _too_many_series(source, limit)
        if s_name in allowed:
            family.append((s_name, info, value, ts))
        else:
            flush()
            name, typ, allowed = "", "untyped", ()
            runs.append(("unknown", [(s_name, info, value, ts)]))
    flush()
    return runs


def fast_samples(text: str, source: str = "/metrics", max_series: int | None = None) -> list[RawSample]:
    """The page's samples, as `reference_samples` gives them, by the fast path.

    Raises:
        NotFastPath: the page has a line the fast path does not handle exactly as
            prometheus_client does (the caller then uses `reference_samples`).
        MetricsTooLarge: more than `max_series` samples.
    """
    return [(n, i[0], v, t, ftype) for ftype, items in _fast_runs(text, source, max_series) for n, i, v, t in items]


def exposition_samples(text: str, source: str = "/metrics", max_series: int | None = None) -> list[RawSample]:
    """The page's samples: the fast path where it applies, prometheus_client's parser elsewhere."""
    try:
        return fast_samples(text, source, max_series)
    except NotFastPath:
        return reference_samples(text, source, max_series)


def parse_exposition(
    text: str, source: str = "/metrics", *, max_bytes: int = MAX_PAGE_BYTES, max_series: int = MAX_SERIES
) -> Scrape:
    """Parse Prometheus text exposition into a `Scrape`.

    Raises:
        MalformedMetrics: the parser rejected a line (the message quotes it, with its number),
            or a histogram bucket has no `le` label.
        MetricsTooLarge: the page is longer than `max_bytes` characters or lists more than
            `max_series` samples.
    """
    if len(text) > max_bytes:
        raise page_too_large(source, max_bytes)
    try:
        runs = _fast_runs(text, source, max_series)
    except NotFastPath:
        runs = [
            (ftype, [(n, _label_info(pairs), v, t)])
            for n, pairs, v, t, ftype in reference_samples(text, source, max_series)
        ]
    return _build(runs, {}, source)


# --- from samples to a Scrape -------------------------------------------------------------------
def _counts_events(name: str, typ: str | None) -> bool:
    """Whether a sample is a count of events (never negative, never NaN): a counter, or a
    histogram's or summary's bucket/count. Untyped samples are judged by their suffix."""
    if typ == "counter":
        return True
    if typ in ("histogram", "summary"):
        return name.endswith(("_bucket", "_count"))
    if typ in (None, "unknown", "untyped"):
        return name.endswith(("_total", "_bucket", "_count"))
    return False


def _bad_reason(name: str, value: float, typ: str | None) -> str | None:
    if value != value:  # NaN
        return BAD_NAN_COUNT if _counts_events(name, typ) or name.endswith("_sum") else None
    if value in (math.inf, -math.inf):
        return BAD_INFINITE
    if value > MAX_EXACT_VALUE or value < -MAX_EXACT_VALUE:
        return BAD_HUGE
    if value < 0 and _counts_events(name, typ):
        return BAD_NEGATIVE_COUNT
    return None


def scrape_from_samples(
    samples: Iterable[tuple[str, Labels, float]], types: Mapping[str, str] | None = None, source: str = "/metrics"
) -> Scrape:
    """A `Scrape` from (wire name, labels, value) samples, by the rules `parse_exposition` applies.

    For samples that arrive without a page: a Prometheus server's query API returns the
    series it stored from one scrape (llm_diagnose.probes.metrics.prometheus_api). `types` may be empty;
    histograms are then found by their `le` labels.

    Raises:
        MalformedMetrics: a histogram bucket has no usable `le` label.
    """
    items: list[tuple[str, _LabelInfo, float, float | None]] = [
        (name, _label_info(tuple(labels)), value, None) for name, labels, value in samples
    ]
    return _build([("", items)], types or {}, source)


def _build(runs: Iterable[_Run], types: Mapping[str, str], source: str) -> Scrape:
    """The Scrape: samples indexed, bad ones excluded and listed, `_created` and histograms apart.

    A sample's type is the type of the first family that carried its name (a run's type ""
    leaves it to `types`).
    """
    raw: dict[str, dict[Labels, float]] = {}  # name -> labels -> value; Series made at the end
    types = dict(types)
    created_raw: list[tuple[str, Labels, float]] = []
    bad: list[BadSample] = []
    excluded: dict[str, set[Labels]] = defaultdict(set)
    # Histogram buckets as they come: name -> [(labels without le, le, edge, count or None when bad)].
    buckets: dict[str, list[tuple[Labels, str | None, float | None, float | None]]] = defaultdict(list)
    prev = None
    by_labels: dict[Labels, float] | None = {}  # None: the run's name ends in _created
    hist_parts: list[tuple[Labels, str | None, float | None, float | None]] | None = None
    for ftype, items in runs:
        for name, info, value, _ in items:
            if name is not prev:  # what depends on the name alone, once per run of equal names
                prev = name
                if name.endswith("_created"):
                    by_labels = None
                else:
                    if name not in types and ftype:
                        types[name] = ftype
                    by_labels = raw.get(name)
                    if by_labels is None:
                        raw[name] = by_labels = {}
                    hist_parts = buckets[name[: -len("_bucket")]] if name.endswith("_bucket") else None
            labels = info[1]
            if by_labels is None:
                created_raw.append((name, labels, value))
                continue
            if labels in by_labels:
                bad.append(BadSample(name, labels, value, BAD_DUPLICATE))
                continue
            # Most values are small finite non-negative numbers: one comparison clears them.
            if 0.0 <= value <= MAX_EXACT_VALUE or (reason := _bad_reason(name, value, types.get(name))) is None:
                by_labels[labels] = value
                if hist_parts is not None:
                    hist_parts.append((info[2], info[3], info[4], value))
            else:
                bad.append(BadSample(name, labels, value, reason))
                excluded[name].add(labels)
                if hist_parts is not None:
                    hist_parts.append((info[2], info[3], info[4], None))

    # A `_created` sample is a timestamp only if its counter/histogram sibling exists;
    # otherwise it is a metric that happens to end in _created and is kept as such.
    created: dict[tuple[str, Labels], float] = {}
    for name, labels, value in created_raw:
        base = name[: -len("_created")]
        if base + "_total" in raw or base + "_count" in raw or base + "_bucket" in raw:
            if not math.isfinite(value):
                bad.append(BadSample(name, labels, value, BAD_INFINITE if value == value else BAD_NAN_COUNT))
            elif (base, labels) in created:
                bad.append(BadSample(name, labels, value, BAD_DUPLICATE))
            else:
                created[(base, labels)] = value
            continue
        reason = None if 0.0 <= value <= MAX_EXACT_VALUE else _bad_reason(name, value, "gauge")
        by_labels = raw.setdefault(name, {})
        if labels in by_labels:
            bad.append(BadSample(name, labels, value, BAD_DUPLICATE))
        elif reason is not None:
            bad.append(BadSample(name, labels, value, reason))
            excluded[name].add(labels)
        else:
            by_labels[labels] = value
        types.setdefault(name, "gauge")

    histograms = _collect_histograms(raw, buckets, types, excluded, source)
    return Scrape(
        samples=MappingProxyType({k: tuple(map(_series, v.items())) for k, v in raw.items() if v}),
        types=MappingProxyType(types),
        histograms=MappingProxyType(histograms),
        created=MappingProxyType(created),
        bad=tuple(bad),
        excluded=MappingProxyType({k: frozenset(v) for k, v in excluded.items()}),
    )


_series = partial(tuple.__new__, Series)  # (labels, value) -> Series, all in C (Series._make is Python)


def _collect_histograms(
    raw: Mapping[str, Mapping[Labels, float]],
    buckets: Mapping[str, list[tuple[Labels, str | None, float | None, float | None]]],
    types: Mapping[str, str],
    excluded: dict[str, set[Labels]],
    source: str,
) -> dict[str, tuple[HistogramSeries, ...]]:
    # A histogram is a `_bucket` family typed histogram, or an untyped one whose samples all
    # carry `le` (pages without # TYPE lines, e.g. some proxies, still parse).
    # A label set with any bad part (bucket, count or sum) is left out whole and listed in
    # `excluded` under the histogram's name: a histogram missing a bucket would misplace quantiles.
    out: dict[str, tuple[HistogramSeries, ...]] = {}
    for name, parts in buckets.items():
        typed = types.get(name + "_bucket") == "histogram"
        has_le = all(le is not None for _, le, _, _ in parts)
        if not (typed or has_le):
            continue
        if not has_le:
            raise MalformedMetrics(
                f"malformed /metrics text from {source}: histogram {name} has a bucket without an `le` label", None
            )
        grouped: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        dropped = set(excluded.get(name + "_count", ())) | set(excluded.get(name + "_sum", ()))
        for rest, le, edge, count in parts:
            if edge is None:
                raise MalformedMetrics(
                    f"malformed /metrics text from {source}: histogram {name} has le={le!r}, not a number", None
                )
            if count is None:
                dropped.add(rest)
            else:
                grouped[rest].append((edge, count))
        counts = raw.get(name + "_count", {})
        sums = raw.get(name + "_sum", {})
        series = []
        for labels, edges in grouped.items():
            if labels in dropped:
                continue
            edges.sort()
            # _count equals the +Inf bucket by definition; fall back to it when _count is absent.
            count = counts.get(labels)
            if count is None:
                count = edges[-1][1] if math.isinf(edges[-1][0]) else math.nan
            series.append(HistogramSeries(labels, tuple(edges), count, sums.get(labels, math.nan)))
        if dropped:
            excluded[name] = set(excluded.get(name, ())) | dropped
        if series:
            out[name] = tuple(series)
    return out
