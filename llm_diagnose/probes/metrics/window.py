"""A window of scrapes, and what it says: counter increases, gauge series, histogram deltas.

Counters are turned into increases the way Prometheus `increase()`/`rate()` does: per
series, between consecutive successful scrapes, a value lower than the previous one means
the counter was reset (the server restarted) and the new value is all increase since the
reset. Two refinements Prometheus cannot make but we can, because we see every page:
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

Memory is bounded however long the window: pages are folded in as they arrive
(window_tally.WindowTally: per-series increases, a thinned sample of whole pages for the
gauges, counts of failures, bad samples and restarts; its module docstring lists the bounds).
Below the bounds every figure is the one every page gives; past them, gauges are read from an
even sample of the pages and per-interval rates from merged intervals, and `describe` says so.

Coverage: a window the scrape loop planned knows how many scrapes it planned and how many of
them a good page answered (a scrape that fails, and the ticks that pass while it hangs, are
unanswered). Below `min_coverage` of them the window is incomplete, as one that stopped early.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from llm_diagnose.probes.http import MalformedMetrics
from llm_diagnose.probes.metrics.engines import Candidate, Product, Ratio, Sel, selector_parts
from llm_diagnose.probes.metrics.exposition import BadSample, Scrape, labels_match, parse_exposition
from llm_diagnose.probes.metrics.histogram import merge_buckets
from llm_diagnose.probes.metrics.scrape_record import ScrapeRecord
from llm_diagnose.probes.metrics.window_tally import MAX_TRACKED_SERIES, WindowTally, summed_buckets
from llm_diagnose.probes.runfiles import JsonLine, read_json_lines
from llm_diagnose.probes.runfolder_names import METRICS as METRICS_FILE

__all__ = [
    "ScrapeRecord",
    "Interval",
    "CounterIncrease",
    "HistogramIncrease",
    "GaugeSeries",
    "Window",
    "ScrapeLine",
    "scrape_lines",
    "scrape_path",
    "METRICS_FILE",
    "BAD_NEGATIVE_READING",
    "DEFAULT_MIN_COVERAGE",
]

# Why a gauge reading was left out (the parse-level reasons are exposition.BAD_*).
BAD_NEGATIVE_READING = "negative reading of a quantity that cannot be negative"

# The share of its planned scrapes a window needs answered to count as complete: the default of
# the tree's threshold evidence.min_window_coverage (diagnose/tree/thresholds.py), which `run`
# passes in. 0.8: a fifth of the window unseen is a window cut short (issue 22, item 12: a
# /metrics that hung answered 3 of 9 scrapes, and the run called its window complete).
DEFAULT_MIN_COVERAGE = 0.8


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
    untracked: int = 0  # readings of series past window_tally.MAX_TRACKED_SERIES, not counted

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
    untracked: int = 0  # readings of series past window_tally.MAX_TRACKED_SERIES, not counted

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


@dataclass(frozen=True)
class Window:
    """Scrapes of one /metrics URL over time, with the analysis the passive probes need.

    Built from `records` (every page folded into a fresh tally), or from a `tally` the scrape
    loop filled as it went; either way `records` ends up as the records the tally kept (all of
    them below its bounds).
    """

    source: str  # the redacted metrics URL
    records: tuple[ScrapeRecord, ...] = ()
    planned_duration_s: float | None = None
    stopped_early: str | None = None  # why the window ended before it was planned to, if it did
    notes: tuple[str, ...] = field(default=())  # e.g. lines of a run folder that could not be read
    planned_scrapes: int | None = None  # scrapes the loop planned (None: not a planned window)
    answered_scrapes: int | None = None  # of those, how many a good page answered
    min_coverage: float = DEFAULT_MIN_COVERAGE
    tally: WindowTally | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        tally = self.tally
        if tally is None:
            tally = WindowTally()
            for record in self.records:
                tally.add(record)
            object.__setattr__(self, "tally", tally)
        object.__setattr__(self, "records", tally.records())

    @property
    def _tally(self) -> WindowTally:
        assert self.tally is not None  # set in __post_init__
        return self.tally

    # --- shape ------------------------------------------------------------------------
    @property
    def ok_records(self) -> tuple[ScrapeRecord, ...]:
        """The good pages the window kept (every one below window_tally.MAX_KEPT_PAGES)."""
        return tuple(r for r in self.records if r.ok)

    @property
    def failed_records(self) -> tuple[ScrapeRecord, ...]:
        return tuple(r for r in self.records if not r.ok)

    @property
    def n_scrapes(self) -> int:
        """Scrape attempts, kept or not."""
        return self._tally.attempts

    @property
    def n_ok(self) -> int:
        """Good pages, kept or not."""
        return self._tally.ok

    @property
    def duration_s(self) -> float:
        ok = self.ok_records
        return ok[-1].t_mono - ok[0].t_mono if len(ok) >= 2 else 0.0

    @property
    def ended_at(self) -> str:
        ok = self.ok_records or self.records
        t = ok[-1].t_wall if ok else 0.0
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")

    @property
    def coverage(self) -> float | None:
        """The share of the planned scrapes a good page answered (None: nothing was planned)."""
        if not self.planned_scrapes or self.answered_scrapes is None:
            return None
        return min(1.0, self.answered_scrapes / self.planned_scrapes)

    @property
    def short_of_coverage(self) -> str | None:
        """Why the window's coverage falls short of `min_coverage`, or None when it does not."""
        coverage = self.coverage
        if coverage is None or coverage >= self.min_coverage:
            return None
        return (
            f"only {self.answered_scrapes} of {self.planned_scrapes} planned scrapes of {self.source} answered "
            f"({coverage:.0%}, below the {self.min_coverage:.0%} a complete window needs: "
            "evidence.min_window_coverage)"
        )

    @property
    def incomplete(self) -> str | None:
        """Why the window is incomplete (stopped early, or too few scrapes answered); None when complete."""
        reasons = [r for r in (self.stopped_early, self.short_of_coverage) if r]
        return "; ".join(reasons) if reasons else None

    @property
    def restarts(self) -> tuple[float, ...]:
        """Unix times of the pages at which the server had restarted since the page before (a counter
        series went down, or its `_created` changed): the first window_tally.MAX_KEPT_RESTARTS."""
        return tuple(self._tally.restarts)

    def first_scrape(self) -> Scrape | None:
        ok = self.ok_records
        return ok[0].scrape if ok else None

    def last_scrape(self) -> Scrape | None:
        ok = self.ok_records
        return ok[-1].scrape if ok else None

    def describe(self) -> str:
        """One line: how many scrapes, over how long, and whether the window is complete."""
        n_ok, n = self.n_ok, self.n_scrapes
        text = f"{n_ok} of {n} scrapes of {self.source} succeeded over {self.duration_s:.1f} s"
        n_bad = self.bad_sample_count
        if n_bad:
            text += f"; {n_bad} bad sample{'s' if n_bad > 1 else ''} excluded"
        text += "".join(f"; {part}" for part in self._bounds_hit())
        if self.stopped_early:
            text += f"; stopped early: {self.stopped_early}"
        if self.short_of_coverage:
            text += f"; incomplete: {self.short_of_coverage}"
        return text

    def _bounds_hit(self) -> list[str]:
        """What the window thinned or left out to stay within its memory bounds (window_tally)."""
        t = self._tally
        parts = []
        if t.page_stride > 1:
            parts.append(
                f"gauges read from {len(self.ok_records)} of the {self.n_ok} good pages, one in {t.page_stride} "
                "(MAX_KEPT_PAGES, MAX_KEPT_READINGS)"
            )
        if t.interval_stride > 1:
            parts.append(f"rates per {t.interval_stride} scrape intervals (MAX_INTERVALS)")
        if t.untracked_total:
            parts.append(self.untracked_note())
        return parts

    def untracked_note(self) -> str:
        """'' or one phrase: readings of series past window_tally.MAX_TRACKED_SERIES, left out."""
        t = self._tally
        if not t.untracked_total:
            return ""
        names = ", ".join(name for name, _ in t.untracked.most_common(3))
        return (
            f"{t.untracked_total} reading(s) of series past the first {MAX_TRACKED_SERIES:,} distinct series left "
            f"out (MAX_TRACKED_SERIES; a label with unbounded values? e.g. {names or 'many names'})"
        )

    @property
    def bad_sample_count(self) -> int:
        """Samples the window's pages left out as bad (exposition.BAD_*), all pages counted."""
        return self._tally.bad_count

    def bad_samples(self) -> tuple[tuple[float, BadSample], ...]:
        """The first window_tally.MAX_KEPT_BAD_SAMPLES samples the pages left out, with the page's time (t_mono)."""
        return tuple(self._tally.bad_kept)

    def describe_bad_samples(self, limit: int = 4) -> str:
        """One line: the bad samples by name and reason, most frequent first ("" when none)."""
        t = self._tally
        if not t.bad_count:
            return ""
        n = t.bad_count
        parts = [f"{name}: {k} x {reason}" for (name, reason), k in t.bad_kinds.most_common(limit)]
        more = len(t.bad_kinds) - limit + (1 if t.bad_other else 0)
        if more > 0:
            parts.append(f"and {more} more")
        example = t.bad_kept[0][1].describe()
        return (
            f"{n} bad sample{'s' if n > 1 else ''} on {t.bad_pages} of {self.n_ok} pages "
            f"excluded ({'; '.join(parts)}); first: {example[:200]}"
        )

    # --- candidates -------------------------------------------------------------------
    @staticmethod
    def _present(candidate: Candidate, scrape: Scrape) -> bool:
        return all(scrape.has(sel.name, sel.where) for sel in selector_parts(candidate))

    def resolve(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The first candidate (newest name first) that any kept page contains."""
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
        """The gauge's reading on every kept page (every page below window_tally.MAX_KEPT_PAGES)."""
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
        t = self._tally
        series = t.counters(sel.name, sel.where)
        total, intervals = 0.0, []
        for slot, t_start, t_end in t.intervals():
            step = math.fsum(s.steps.get(slot) for s in series if s.steps is not None)
            total += step
            intervals.append(Interval(t_start, t_end, step))
        return CounterIncrease(
            sel.describe(),
            total,
            sum(s.resets for s in series),
            tuple(intervals),
            sum(s.excluded for s in series),
            t.untracked_readings(sel.name),
        )

    # --- histograms -------------------------------------------------------------------
    def histogram(self, sel: Sel) -> HistogramIncrease:
        """Bucket increases of a histogram over the window, summed over label sets."""
        t = self._tally
        series = t.histograms(sel.name, sel.where)
        count = total_sum = 0.0
        intervals = []
        for slot, t_start, t_end in t.intervals():
            step_count = step_sum = 0.0
            for s in series:
                if s.steps is not None and s.sums is not None:
                    step_count += s.steps.get(slot)
                    step_sum += s.sums.get(slot)
            count += step_count
            total_sum += step_sum
            intervals.append((t_start, t_end, step_count, step_sum))
        # Each series' increases over consecutive intervals add up bucket by bucket.
        summed = [summed_buckets(s) for s in series if s.buckets is not None]
        return HistogramIncrease(
            sel.describe(),
            merge_buckets(summed) if summed else (),
            count,
            total_sum,
            sum(s.resets for s in series),
            tuple(intervals),
            sum(s.excluded for s in series),
            t.untracked_readings(sel.name),
        )

    # --- persistence ------------------------------------------------------------------
    @classmethod
    def from_jsonl(cls, path: str | Path, source: str | None = None) -> Window:
        """Rebuild a window from a run folder's metrics.jsonl (or the file itself), a page at a time
        (`scrape_lines`): lines that are no scrape record are skipped and listed in `notes`; pages
        that do not parse become failed records with the parser's message."""
        tally = WindowTally()  # pages folded in as they are read: memory stays bounded
        notes: list[str] = []
        seen_source = source
        for line in scrape_lines(path):
            if line.unreadable:
                notes.append(line.note())
                continue
            seen_source = seen_source or line.url
            tally.add(line.record(seen_source or str(line.path)))
        return cls(seen_source or str(scrape_path(path)), notes=tuple(notes), tally=tally)


def scrape_path(path: str | Path) -> Path:
    """A run folder's metrics.jsonl, or the file named."""
    p = Path(path)
    return p / METRICS_FILE if p.is_dir() else p


@dataclass(frozen=True)
class ScrapeLine:
    """One line of metrics.jsonl as the scraper wrote it (scraper.py lists the fields), or why it is
    no scrape record (`unreadable`; the other fields are then empty)."""

    path: Path
    number: int  # from 1
    t_wall: float = math.nan  # unix time of the scrape
    t_mono: float = math.nan  # monotonic clock
    url: str | None = None
    text: str | None = None  # the page as served; None where the scrape failed
    error: str | None = None
    elapsed_s: float | None = None
    unreadable: str = ""  # why the line is no scrape record; "" for a record

    def note(self) -> str:
        return f"{self.path.name} line {self.number} is not a scrape record ({self.unreadable}); skipped"

    def record(self, source: str) -> ScrapeRecord:
        """The page parsed (a failed record where it does not parse)."""
        return record_from_text(self.t_wall, self.t_mono, self.text, self.error, self.elapsed_s, source)


def scrape_lines(path: str | Path) -> Iterator[ScrapeLine]:
    """Every line of a metrics.jsonl (or a run folder's), one at a time: the one reader of the file.

    Read as every run-folder file is (runfiles.read_json_lines: a plain file, never a link,
    UnsafePathError otherwise, raised here before the first line; a line cap). A line that
    cannot be read (a run killed mid-write, over the line cap, not UTF-8) or that has no times
    comes back `unreadable`, for the caller to count.
    """
    p = scrape_path(path)
    return _scrape_lines(p, read_json_lines(p))


def _scrape_lines(p: Path, lines: Iterator[JsonLine]) -> Iterator[ScrapeLine]:
    for line in lines:
        d = line.obj or {}  # None: unreadable, and line.why says why
        try:
            t_wall, t_mono = float(d["t_wall"]), float(d["t_mono"])
        except (ValueError, KeyError, TypeError):
            yield ScrapeLine(p, line.number, unreadable=line.why or "no t_wall and t_mono times")
            continue
        text, error, elapsed = d.get("text"), d.get("error"), d.get("elapsed_s")
        url = d.get("url")
        yield ScrapeLine(
            p,
            line.number,
            t_wall,
            t_mono,
            url if isinstance(url, str) else None,
            text,
            error,
            elapsed,
        )


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


def label_values(scrape: Scrape, name: str, where: Iterable[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """The label sets of an info gauge (value 1, payload in labels), one dict per series."""
    return [dict(s.labels) for s in scrape.series(name, tuple(where)) if labels_match(s.labels, tuple(where))]
