"""A window of scrapes, and what it says: counter increases, gauge series, histogram deltas.

Counters are turned into increases the way Prometheus `increase()`/`rate()` does: per
series, between consecutive successful scrapes, a value lower than the previous one means
the counter was reset (the server restarted) and the new value is all increase since the
reset. Two refinements Prometheus cannot make but we can, because we hold every page:
- a series whose `_created` timestamp changed was reset even if it has since climbed above
  its old value;
- a series that appears on a page after an earlier page lacked it was created in between,
  so its whole value is increase (SGLang adds `is_streaming="true"` on the first streamed
  request; a restarted server brings new series).
Histograms are counters bucket by bucket; a windowed quantile comes from the bucket
increases, never from lifetime totals.

Bad samples (an infinite counter, a negative count, a duplicate: see exposition.BAD_*) never
reach this arithmetic: the page leaves them out and lists them. A series excluded on one page
keeps its last good reading as the baseline, so the next good reading counts the increase
since then (not its whole lifetime value, as a series that had vanished would). Gauges that
measure something that cannot be negative (usage, queue lengths, capacities) also drop
negative readings. Each result says how many readings it left out.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from llm_diagnose.probes.http import MalformedMetrics
from llm_diagnose.probes.metrics.engines import Candidate, Product, Ratio, Sel, selector_parts
from llm_diagnose.probes.metrics.exposition import (
    BadSample,
    HistogramSeries,
    Labels,
    Scrape,
    labels_match,
    parse_exposition,
)
from llm_diagnose.probes.metrics.histogram import merge_buckets
from llm_diagnose.probes.runfolder_names import METRICS as METRICS_FILE

__all__ = [
    "ScrapeRecord",
    "Interval",
    "CounterIncrease",
    "HistogramIncrease",
    "GaugeSeries",
    "Window",
    "METRICS_FILE",
    "BAD_NEGATIVE_READING",
]

# Why a gauge reading was left out (the parse-level reasons are exposition.BAD_*).
BAD_NEGATIVE_READING = "negative reading of a quantity that cannot be negative"


@dataclass(frozen=True)
class ScrapeRecord:
    """One scrape attempt: when, and either the parsed page or why there is none."""

    t_wall: float  # unix time (for reports and joining with other logs)
    t_mono: float  # monotonic clock (for rates: immune to NTP steps)
    scrape: Scrape | None = None
    error: str | None = None
    elapsed_s: float | None = None  # how long the GET took

    @property
    def ok(self) -> bool:
        return self.scrape is not None


@dataclass(frozen=True)
class Interval:
    t_start: float  # monotonic
    t_end: float
    increase: float

    @property
    def rate(self) -> float:
        return self.increase / (self.t_end - self.t_start) if self.t_end > self.t_start else 0.0


@dataclass(frozen=True)
class CounterIncrease:
    selector: str
    total: float
    resets: int
    intervals: tuple[Interval, ...]
    excluded: int = 0  # bad readings left out (see the module docstring)

    @property
    def duration_s(self) -> float:
        return self.intervals[-1].t_end - self.intervals[0].t_start if self.intervals else 0.0

    @property
    def rate(self) -> float:
        d = self.duration_s
        return self.total / d if d > 0 else 0.0


@dataclass(frozen=True)
class HistogramIncrease:
    """Observations added to a histogram over the window, summed over label sets."""

    selector: str
    buckets: tuple[tuple[float, float], ...]  # cumulative increase per upper edge
    count: float
    sum: float
    resets: int
    intervals: tuple[tuple[float, float, float, float], ...]  # (t_start, t_end, count increase, sum increase)
    excluded: int = 0  # bad label sets left out, summed over pages

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass(frozen=True)
class GaugeSeries:
    selector: str
    points: tuple[tuple[float, float], ...]  # (t_mono, value), NaN readings dropped
    excluded: int = 0  # readings left out: a bad series on the page, or below the floor
    negative: int = 0  # of which below the floor (the page itself did not flag them)

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(v for _, v in self.points)


def _counter_step(
    prev: float | None, cur: float, prev_created: float | None, cur_created: float | None
) -> tuple[float, bool]:
    """Increase of one counter series between two pages, and whether it was reset."""
    if prev is None:
        return cur, False  # created between the two pages: it started from 0
    restarted = prev_created is not None and cur_created is not None and cur_created != prev_created
    if cur < prev or restarted:
        return cur, True
    return cur - prev, False


_Reading = TypeVar("_Reading")  # one series' reading on a page: a counter's value, a histogram


def _series_steps(
    records: Sequence[ScrapeRecord],
    read: Callable[[Scrape], tuple[Mapping[Labels, _Reading], list[Labels]]],
    created: Callable[[Scrape, Labels], float | None],
    step: Callable[[_Reading | None, _Reading, float | None, float | None], tuple[_Reading, bool]],
) -> tuple[list[tuple[float, float, list[tuple[Labels, _Reading, bool]]]], int]:
    """Per interval between consecutive good pages: (t_start, t_end, [(labels, increase, reset)]);
    and how many bad readings were left out.

    `read` gives a page's good readings by label set and the label sets it excluded. A label
    set excluded on a page keeps its last good reading (and `_created`) as the baseline; one
    excluded on the first page has no baseline, so its first good reading only starts one.
    """
    if not records:
        return [], 0
    first = records[0].scrape
    assert first is not None
    good, bad = read(first)
    state: dict[Labels, tuple[_Reading, float | None] | None] = {
        labels: (v, created(first, labels)) for labels, v in good.items()
    }
    for labels in bad:
        state.setdefault(labels, None)
    excluded = len(bad)
    out = []
    for a, b in zip(records, records[1:]):
        assert b.scrape is not None
        good, bad = read(b.scrape)
        excluded += len(bad)
        new: dict[Labels, tuple[_Reading, float | None] | None] = {}
        incs: list[tuple[Labels, _Reading, bool]] = []
        for labels, value in good.items():
            cur_created = created(b.scrape, labels)
            new[labels] = (value, cur_created)
            if labels not in state:  # created between the two pages: it started from 0
                inc, was_reset = step(None, value, None, cur_created)
            else:
                prev = state[labels]
                if prev is None:  # only bad readings so far: this one is the baseline
                    continue
                inc, was_reset = step(prev[0], value, prev[1], cur_created)
            incs.append((labels, inc, was_reset))
        for labels in bad:
            if labels not in new and labels in state:
                new[labels] = state[labels]  # carried over the bad reading
        state = new
        out.append((a.t_mono, b.t_mono, incs))
    return out, excluded


@dataclass(frozen=True)
class Window:
    """Scrapes of one /metrics URL over time, with the analysis the passive probes need."""

    source: str  # the redacted metrics URL
    records: tuple[ScrapeRecord, ...]
    planned_duration_s: float | None = None
    stopped_early: str | None = None  # why the window ended before it was planned to, if it did
    notes: tuple[str, ...] = field(default=())  # e.g. lines of a run folder that could not be read

    # --- shape ------------------------------------------------------------------------
    @property
    def ok_records(self) -> tuple[ScrapeRecord, ...]:
        return tuple(r for r in self.records if r.ok)

    @property
    def failed_records(self) -> tuple[ScrapeRecord, ...]:
        return tuple(r for r in self.records if not r.ok)

    @property
    def duration_s(self) -> float:
        ok = self.ok_records
        return ok[-1].t_mono - ok[0].t_mono if len(ok) >= 2 else 0.0

    @property
    def ended_at(self) -> str:
        ok = self.ok_records or self.records
        t = ok[-1].t_wall if ok else 0.0
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")

    def first_scrape(self) -> Scrape | None:
        ok = self.ok_records
        return ok[0].scrape if ok else None

    def last_scrape(self) -> Scrape | None:
        ok = self.ok_records
        return ok[-1].scrape if ok else None

    def describe(self) -> str:
        """One line: how many scrapes, over how long, and whether the window is complete."""
        n_ok, n = len(self.ok_records), len(self.records)
        text = f"{n_ok} of {n} scrapes of {self.source} succeeded over {self.duration_s:.1f} s"
        n_bad = len(self.bad_samples())
        if n_bad:
            text += f"; {n_bad} bad sample{'s' if n_bad > 1 else ''} excluded"
        if self.stopped_early:
            text += f"; stopped early: {self.stopped_early}"
        return text

    def bad_samples(self) -> tuple[tuple[float, BadSample], ...]:
        """Every sample the pages of the window left out, with the page's time (t_mono)."""
        return tuple((r.t_mono, b) for r in self.records if r.scrape is not None for b in r.scrape.bad)

    def describe_bad_samples(self, limit: int = 4) -> str:
        """One line: the bad samples by name and reason, most frequent first ("" when none)."""
        bad = self.bad_samples()
        if not bad:
            return ""
        pages = len({t for t, _ in bad})
        counts = Counter((b.name, b.reason) for _, b in bad)
        parts = [f"{name}: {n} x {reason}" for (name, reason), n in counts.most_common(limit)]
        if len(counts) > limit:
            parts.append(f"and {len(counts) - limit} more")
        example = bad[0][1].describe()
        return (
            f"{len(bad)} bad sample{'s' if len(bad) > 1 else ''} on {pages} of {len(self.ok_records)} pages "
            f"excluded ({'; '.join(parts)}); first: {example[:200]}"
        )

    # --- candidates -------------------------------------------------------------------
    @staticmethod
    def _present(candidate: Candidate, scrape: Scrape) -> bool:
        return all(scrape.has(sel.name, sel.where) for sel in selector_parts(candidate))

    def resolve(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The first candidate (newest name first) that any successful scrape contains."""
        scrapes = [r.scrape for r in self.ok_records]
        for candidate in candidates:
            if any(self._present(candidate, s) for s in scrapes if s is not None):
                return candidate
        return None

    # --- gauges -----------------------------------------------------------------------
    @staticmethod
    def gauge_reading(
        scrape: Scrape, candidate: Candidate, aggregate: str = "sum", floor: float | None = 0.0
    ) -> tuple[float | None, str | None]:
        """One page's reading of a gauge candidate, and why it was left out (None: it was not).

        A reading is left out when a series it adds up was excluded from the page (a sum
        without it would be wrong) or lies below `floor` (0 by default: usage, queue lengths
        and capacities cannot be negative; None for gauges with a negative sentinel, such as
        vLLM V0's -1 hit rate). A HitPair is not a gauge: (None, None).
        """
        sels = (
            (candidate,)
            if isinstance(candidate, Sel)
            else selector_parts(candidate)
            if isinstance(candidate, (Ratio, Product))
            else ()
        )
        for sel in sels:
            if scrape.excluded_labels(sel.name, sel.where):
                return None, "excluded"
            if floor is not None and any(s.value < floor for s in scrape.series(sel.name, sel.where)):
                return None, BAD_NEGATIVE_READING
        return Window.gauge_value(scrape, candidate, aggregate), None

    @staticmethod
    def gauge_value(scrape: Scrape, candidate: Candidate, aggregate: str = "sum") -> float | None:
        """One page's reading of a gauge candidate, as the page says it (see gauge_reading)."""
        if isinstance(candidate, Sel):
            return scrape.value(candidate.name, candidate.where, aggregate)
        if isinstance(candidate, Ratio):
            num = scrape.value(candidate.num.name, candidate.num.where, "sum")
            den = scrape.value(candidate.den.name, candidate.den.where, "sum")
            return None if num is None or not den else num / den
        if isinstance(candidate, Product):
            a = scrape.value(candidate.a.name, candidate.a.where, "sum")
            b = scrape.value(candidate.b.name, candidate.b.where, "sum")
            return None if a is None or b is None else a * b
        return None

    def gauge(self, candidate: Candidate, aggregate: str = "sum", floor: float | None = 0.0) -> GaugeSeries:
        points, excluded, negative = [], 0, 0
        for r in self.ok_records:
            assert r.scrape is not None
            v, why = self.gauge_reading(r.scrape, candidate, aggregate, floor)
            excluded += why is not None
            negative += why == BAD_NEGATIVE_READING
            if v is not None and math.isfinite(v):
                points.append((r.t_mono, v))
        return GaugeSeries(candidate.describe(), tuple(points), excluded, negative)

    def latest(self, candidate: Candidate, aggregate: str = "sum", floor: float | None = 0.0) -> float | None:
        series = self.gauge(candidate, aggregate, floor)
        return series.points[-1][1] if series.points else None

    # --- counters -----------------------------------------------------------------------
    def counter(self, sel: Sel) -> CounterIncrease:
        """Increase of `sel` over the window, summed over its series, resets handled."""
        base = sel.name[: -len("_total")] if sel.name.endswith("_total") else sel.name

        def read(scrape: Scrape) -> tuple[dict[Labels, float], list[Labels]]:
            good, bad = {}, list(scrape.excluded_labels(sel.name, sel.where))
            for s in scrape.series(sel.name, sel.where):
                if math.isnan(s.value):
                    bad.append(s.labels)  # a NaN count: no reading (typed counters never get here)
                else:
                    good[s.labels] = s.value
            return good, bad

        steps, excluded = _series_steps(
            self.ok_records, read, lambda sc, labels: sc.created_at(base, labels), _counter_step
        )
        total, resets, intervals = 0.0, 0, []
        for t_start, t_end, incs in steps:
            step = math.fsum(inc for _, inc, _ in incs)
            resets += sum(was_reset for _, _, was_reset in incs)
            total += step
            intervals.append(Interval(t_start, t_end, step))
        return CounterIncrease(sel.describe(), total, resets, tuple(intervals), excluded)

    # --- histograms -------------------------------------------------------------------
    def histogram(self, sel: Sel) -> HistogramIncrease:
        """Bucket increases of a histogram over the window, summed over label sets."""

        def read(scrape: Scrape) -> tuple[dict[Labels, HistogramSeries], list[Labels]]:
            return (
                {h.labels: h for h in scrape.histogram(sel.name, sel.where)},
                list(scrape.excluded_labels(sel.name, sel.where)),
            )

        steps, excluded = _series_steps(
            self.ok_records, read, lambda sc, labels: sc.created_at(sel.name, labels), _histogram_step
        )
        per_series: dict[Labels, list[tuple[tuple[float, float], ...]]] = {}
        count = total_sum = 0.0
        resets = 0
        intervals = []
        for t_start, t_end, incs in steps:
            step_count = step_sum = 0.0
            for labels, inc, was_reset in incs:
                resets += was_reset
                per_series.setdefault(labels, []).append(inc.buckets)
                step_count += _finite(inc.count)
                step_sum += _finite(inc.sum)
            count += step_count
            total_sum += step_sum
            intervals.append((t_start, t_end, step_count, step_sum))
        summed = []
        for parts in per_series.values():
            # Each series' increases over consecutive intervals add up bucket by bucket.
            summed.append(merge_buckets(parts))
        return HistogramIncrease(
            sel.describe(),
            merge_buckets(summed) if summed else (),
            count,
            total_sum,
            resets,
            tuple(intervals),
            excluded,
        )

    # --- persistence ------------------------------------------------------------------
    @classmethod
    def from_jsonl(cls, path: str | Path, source: str | None = None) -> Window:
        """Rebuild a window from a run folder's metrics.jsonl (or the file itself).

        Lines that are not JSON (a run killed mid-write) are skipped and listed in `notes`;
        pages that do not parse become failed records with the parser's message.
        """
        p = Path(path)
        if p.is_dir():
            p = p / METRICS_FILE
        records: list[ScrapeRecord] = []
        notes: list[str] = []
        seen_source = source
        with open(p, encoding="utf-8", errors="replace") as fh:  # a stray byte spoils its line only
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    t_wall, t_mono = float(d["t_wall"]), float(d["t_mono"])
                except (ValueError, KeyError, TypeError):
                    notes.append(f"{p.name} line {number} is not a scrape record (truncated write?); skipped")
                    continue
                seen_source = seen_source or d.get("url")
                records.append(
                    record_from_text(
                        t_wall, t_mono, d.get("text"), d.get("error"), d.get("elapsed_s"), seen_source or str(p)
                    )
                )
        return cls(seen_source or str(p), tuple(records), notes=tuple(notes))


def record_from_text(
    t_wall: float, t_mono: float, text: str | None, error: str | None, elapsed_s: float | None, source: str
) -> ScrapeRecord:
    """A record from a raw page: parsed when it parses, a failed record when not."""
    if text is None or error is not None:
        return ScrapeRecord(t_wall, t_mono, None, error or "no page", elapsed_s)
    try:
        return ScrapeRecord(t_wall, t_mono, parse_exposition(text, source), None, elapsed_s)
    except MalformedMetrics as exc:
        return ScrapeRecord(t_wall, t_mono, None, str(exc), elapsed_s)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _histogram_step(
    prev: HistogramSeries | None, cur: HistogramSeries, prev_created: float | None, cur_created: float | None
) -> tuple[HistogramSeries, bool]:
    if prev is None:
        return cur, False
    prev_buckets = dict(prev.buckets)
    restarted = prev_created is not None and cur_created is not None and cur_created != prev_created
    shrunk = cur.count < prev.count or any(c < prev_buckets.get(e, 0.0) for e, c in cur.buckets)
    if restarted or shrunk:
        return cur, True
    buckets = tuple((e, c - prev_buckets.get(e, 0.0)) for e, c in cur.buckets)
    return HistogramSeries(cur.labels, buckets, cur.count - prev.count, cur.sum - prev.sum), False


def label_values(scrape: Scrape, name: str, where: Iterable[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """The label sets of an info gauge (value 1, payload in labels), one dict per series."""
    return [dict(s.labels) for s in scrape.series(name, tuple(where)) if labels_match(s.labels, tuple(where))]
