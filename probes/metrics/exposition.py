"""Prometheus text exposition -> a typed, immutable snapshot of one scrape.

The parsing itself is prometheus_client's (`text_fd_to_metric_families`), the same library
vLLM, SGLang and TensorRT-LLM use to write the page. What this module adds:

- samples indexed by their wire name (`vllm:prompt_tokens_total`), because the family name in
  `# TYPE` is spelled with or without `_total` depending on the engine version;
- labels as a frozenset, because multiprocess output orders them alphabetically and
  single-process output puts `le` last;
- `*_created` samples (unix timestamps next to every counter and histogram) kept apart, so
  they are never read as counts but can still reveal a restarted server;
- histograms by name, one `HistogramSeries` (cumulative buckets, count, sum) per label set;
- parse errors that quote the offending line and its number.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.parser import text_fd_to_metric_families

from probes.http import MalformedMetrics

__all__ = ["Labels", "Series", "HistogramSeries", "Scrape", "parse_exposition", "scrape_from_samples", "labels_match"]

Labels = frozenset  # frozenset[tuple[str, str]]: order-free, hashable
EMPTY_LABELS: Labels = frozenset()
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")


def labels_match(labels: Labels, where: Iterable[tuple[str, str]]) -> bool:
    """True when every (name, value) pair of `where` is among `labels`."""
    return all(pair in labels for pair in where)


@dataclass(frozen=True)
class Series:
    """One sample of a scrape: a label set and its value (NaN is kept; callers skip it)."""

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
class Scrape:
    """Everything one /metrics page said, indexed for lookup. Immutable once built."""

    samples: Mapping[str, tuple[Series, ...]]  # wire sample name -> series
    types: Mapping[str, str]  # wire sample name -> family type (counter, gauge, histogram, ...)
    histograms: Mapping[str, tuple[HistogramSeries, ...]]  # histogram name -> series
    created: Mapping[tuple[str, Labels], float] = field(default_factory=dict)  # (base name, labels) -> unix time

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


class _NumberedLines:
    """Feeds the parser one line at a time and remembers which line it is on.

    prometheus_client's parser reads lazily and raises ValueError on the line it is
    parsing, without a line number; this iterator supplies it.
    """

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()
        self.number = 0

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(self._lines, 1):
            self.number = number
            yield line

    def current(self) -> str:
        return self._lines[self.number - 1] if 0 < self.number <= len(self._lines) else ""


def _base_of_created(name: str) -> str:
    return name[: -len("_created")]


def parse_exposition(text: str, source: str = "/metrics") -> Scrape:
    """Parse Prometheus text exposition into a `Scrape`.

    Raises:
        MalformedMetrics: the parser rejected a line (the message quotes it, with its number),
            or a histogram bucket has no `le` label.
    """
    lines = _NumberedLines(text)
    samples: list[tuple[str, Labels, float]] = []
    types: dict[str, str] = {}
    try:
        for family in text_fd_to_metric_families(lines):
            for sample in family.samples:
                samples.append((sample.name, frozenset(sample.labels.items()), float(sample.value)))
                if not sample.name.endswith("_created"):  # typed below, once known to be a metric
                    types.setdefault(sample.name, family.type)
    except ValueError as exc:
        line = lines.current().strip()
        shown = line if len(line) <= 160 else line[:157] + "..."
        detail = str(exc) or type(exc).__name__
        raise MalformedMetrics(
            f"malformed /metrics text from {source} at line {lines.number}: {shown!r} "
            f"(Prometheus parser: {detail[:120]})", None, line_number=lines.number, line=line) from None
    return scrape_from_samples(samples, types, source)


def scrape_from_samples(samples: Iterable[tuple[str, Labels, float]], types: Mapping[str, str] | None = None,
                        source: str = "/metrics") -> Scrape:
    """A `Scrape` from (wire name, labels, value) samples, by the rules `parse_exposition` applies.

    For samples that arrive without a page: a Prometheus server's query API returns the
    series it stored from one scrape (probes.metrics.prometheus_api). `types` may be empty;
    histograms are then found by their `le` labels.

    Raises:
        MalformedMetrics: a histogram bucket has no usable `le` label.
    """
    raw: dict[str, list[Series]] = defaultdict(list)
    types = dict(types or {})
    created_raw: list[tuple[str, Labels, float]] = []
    for name, labels, value in samples:
        if name.endswith("_created"):
            created_raw.append((name, labels, value))
            continue
        raw[name].append(Series(labels, value))

    # A `_created` sample is a timestamp only if its counter/histogram sibling exists;
    # otherwise it is a metric that happens to end in _created and is kept as such.
    created: dict[tuple[str, Labels], float] = {}
    for name, labels, value in created_raw:
        base = _base_of_created(name)
        if base + "_total" in raw or base + "_count" in raw or base + "_bucket" in raw:
            created[(base, labels)] = value
        else:
            raw[name].append(Series(labels, value))
            types.setdefault(name, "gauge")

    histograms = _collect_histograms(raw, types, source)
    return Scrape(
        samples=MappingProxyType({k: tuple(v) for k, v in raw.items()}),
        types=MappingProxyType(types),
        histograms=MappingProxyType(histograms),
        created=MappingProxyType(created),
    )


def _collect_histograms(raw: Mapping[str, list[Series]], types: Mapping[str, str],
                        source: str) -> dict[str, tuple[HistogramSeries, ...]]:
    # A histogram is a `_bucket` family typed histogram, or an untyped one whose samples all
    # carry `le` (pages without # TYPE lines, e.g. some proxies, still parse).
    out: dict[str, tuple[HistogramSeries, ...]] = {}
    for bucket_name, bucket_series in raw.items():
        if not bucket_name.endswith("_bucket"):
            continue
        name = bucket_name[: -len("_bucket")]
        typed = types.get(bucket_name) == "histogram"
        has_le = all(s.label("le") is not None for s in bucket_series)
        if not (typed or has_le):
            continue
        if not has_le:
            raise MalformedMetrics(f"malformed /metrics text from {source}: histogram {name} has a bucket "
                                   "without an `le` label", None)
        grouped: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        for s in bucket_series:
            le = s.label("le")
            try:
                edge = float(le)  # "+Inf" parses to inf
            except (TypeError, ValueError):
                raise MalformedMetrics(f"malformed /metrics text from {source}: histogram {name} has "
                                       f"le={le!r}, not a number", None) from None
            grouped[frozenset(p for p in s.labels if p[0] != "le")].append((edge, s.value))
        counts = {s.labels: s.value for s in raw.get(name + "_count", ())}
        sums = {s.labels: s.value for s in raw.get(name + "_sum", ())}
        series = []
        for labels, buckets in grouped.items():
            buckets.sort()
            # _count equals the +Inf bucket by definition; fall back to it when _count is absent.
            count = counts.get(labels, buckets[-1][1] if buckets and math.isinf(buckets[-1][0]) else math.nan)
            series.append(HistogramSeries(labels, tuple(buckets), count, sums.get(labels, math.nan)))
        out[name] = tuple(series)
    return out
