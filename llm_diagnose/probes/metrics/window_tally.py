"""What a window keeps of its pages as they arrive: bounded, however long the run.

A day of 1 s scrapes is 86,400 pages, ~80 KB each once parsed (a real vLLM page): a window
that held them all grew by ~300 MB an hour. `WindowTally` folds each page in as it arrives and
keeps only what the window's figures read:

- per series (a sample name and label set, or a histogram's label set), the state the increase
  arithmetic of window.py needs (the last good reading and its `_created`, resets, readings left
  out) and its increase per interval between consecutive good pages. Past MAX_INTERVALS intervals,
  or MAX_INTERVAL_CELLS numbers over all series, neighbouring intervals merge pairwise: a total is
  the same sum of the same increases, only per-interval rates coarsen (2, 4, ... scrape intervals).
  A histogram's bucket increases are summed as they come, exactly (the sum `math.fsum` gives);
- at most MAX_TRACKED_SERIES distinct series. Readings of series past it (a label with unbounded
  values: request ids, paths) are left out, counted by name, and every figure says so;
- whole pages, for gauges and info labels: the first and the latest always, every page between
  until MAX_KEPT_PAGES, then every 2nd, 4th, ... page (an even sample of the window), thinned
  further while the kept pages hold more than MAX_KEPT_READINGS samples;
- failed attempts: the first and the latest MAX_KEPT_FAILURES // 2, and how many there were;
- bad samples: how many, per name and reason (MAX_BAD_KINDS kinds, the rest counted together),
  the first MAX_KEPT_BAD_SAMPLES of them;
- the pages at which the server had restarted (a counter went down, a `_created` changed): the
  first MAX_KEPT_RESTARTS, and how many.

Below every bound nothing is thinned and every figure is the one all the pages give.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from llm_diagnose.probes.metrics.exposition import BadSample, HistogramSeries, Labels, Scrape, labels_match
from llm_diagnose.probes.metrics.scrape_record import ScrapeRecord

__all__ = [
    "WindowTally",
    "MAX_INTERVALS",
    "MAX_INTERVAL_CELLS",
    "MAX_TRACKED_SERIES",
    "MAX_KEPT_PAGES",
    "MAX_KEPT_READINGS",
    "MAX_KEPT_FAILURES",
    "MAX_BAD_KINDS",
    "MAX_KEPT_BAD_SAMPLES",
    "MAX_KEPT_RESTARTS",
    "page_restarted",
]

# Intervals between good pages kept per series: 512 is 8.5 min at 1 s before the first merge; a
# day at 1 s ends with intervals of 256 s (a rate sample every ~4 min, 337 of them).
MAX_INTERVALS = 512
# Per-interval numbers over all series (8 bytes each: 8 MB). A page with thousands of series
# coarsens its intervals sooner instead of growing past it.
MAX_INTERVAL_CELLS = 1_000_000
# Distinct series followed (~0.5-1 KB each with their state). A real vLLM page has ~120 once
# histogram buckets are counted with their histogram; a 64-rank data-parallel vLLM ~8,000.
MAX_TRACKED_SERIES = 20_000
# Whole pages kept for gauges (~80 KB each for a real vLLM page: ~21 MB), and the samples they
# may hold together (~200 bytes each: ~25 MB); pages with thousands of series are thinned sooner.
MAX_KEPT_PAGES = 256
MAX_KEPT_READINGS = 120_000
MAX_KEPT_FAILURES = 64
MAX_BAD_KINDS = 256
MAX_KEPT_BAD_SAMPLES = 100
MAX_KEPT_RESTARTS = 1_000
MAX_NAMED_UNTRACKED = 64  # names whose untracked readings are counted one by one; the rest together

_R = TypeVar("_R")  # one series' reading on a page: a counter's value (float), a HistogramSeries


def _msum_add(partials: list[float], x: float) -> None:
    """Add `x` to an exact running sum kept as non-overlapping partials (Shewchuk; the algorithm
    behind math.fsum): math.fsum(partials) is then the correctly rounded sum of every x added."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


class _Steps:
    """One series' increase per interval slot, from the first slot it had one in (`start`)."""

    __slots__ = ("start", "values")

    def __init__(self, start: int) -> None:
        self.start = start
        self.values = array("d")

    def add(self, slot: int, x: float) -> int:
        """Add `x` to `slot`; returns how many cells were added (0 or more)."""
        i, values = slot - self.start, self.values
        if i < len(values):
            values[i] += x
            return 0
        grown = i + 1 - len(values)
        if grown > 1:
            values.extend(array("d", bytes(8 * (grown - 1))))
        values.append(x)
        return grown

    def get(self, slot: int) -> float:
        i = slot - self.start
        return self.values[i] if 0 <= i < len(self.values) else 0.0

    def halve(self) -> None:
        """Merge slots pairwise (slot k of the new numbering is old slots 2k and 2k+1)."""
        start, values = self.start, self.values
        new_start = start // 2
        merged = array("d", bytes(8 * ((start + len(values) - 1) // 2 - new_start + 1)))
        for i, x in enumerate(values):
            merged[(start + i) // 2 - new_start] += x
        self.start, self.values = new_start, merged


class _Series(Generic[_R]):
    """What one series' increases need: its last good reading and `_created` (None: no baseline
    yet), the ok-page index it was last on (good, or carried over a bad reading), resets, bad
    readings left out, and its increase per slot (for a histogram: count and sum per slot, and its
    bucket increases summed exactly)."""

    __slots__ = ("value", "created", "page", "resets", "excluded", "steps", "sums", "buckets")

    def __init__(self) -> None:
        self.value: _R | None = None
        self.created: float | None = None
        self.page = -2  # never present yet
        self.resets = 0
        self.excluded = 0
        self.steps: _Steps | None = None  # counter increase, or histogram count increase
        self.sums: _Steps | None = None  # histogram sum increase
        self.buckets: dict[float, list[float]] | None = None  # edge -> exact partial sums


def counter_step(
    prev: float | None, cur: float, prev_created: float | None, cur_created: float | None
) -> tuple[float, bool]:
    """Increase of one counter series between two pages, and whether it was reset."""
    if prev is None:
        return cur, False  # created between the two pages: it started from 0
    restarted = prev_created is not None and cur_created is not None and cur_created != prev_created
    if cur < prev or restarted:
        return cur, True
    return cur - prev, False


def histogram_step(
    prev: HistogramSeries | None, cur: HistogramSeries, prev_created: float | None, cur_created: float | None
) -> tuple[HistogramSeries, bool]:
    """Increase of one histogram series between two pages, and whether it was reset."""
    if prev is None:
        return cur, False
    prev_buckets = dict(prev.buckets)
    restarted = prev_created is not None and cur_created is not None and cur_created != prev_created
    shrunk = cur.count < prev.count or any(c < prev_buckets.get(e, 0.0) for e, c in cur.buckets)
    if restarted or shrunk:
        return cur, True
    buckets = tuple((e, c - prev_buckets.get(e, 0.0)) for e, c in cur.buckets)
    return HistogramSeries(cur.labels, buckets, cur.count - prev.count, cur.sum - prev.sum), False


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def page_restarted(before: Scrape, after: Scrape) -> bool:
    """Whether the server restarted between two pages: a `_created` timestamp changed, or a
    counter series went down."""
    if any(before.created.get(key, t) != t for key, t in after.created.items()):
        return True
    for name, kind in after.types.items():
        if kind != "counter":
            continue
        prev = {s.labels: s.value for s in before.samples.get(name, ())}
        if any(s.value < prev.get(s.labels, -math.inf) for s in after.samples.get(name, ())):
            return True
    return False


def _is_histogram(scrape: Scrape, name: str) -> bool:
    """Whether `name` is a histogram on this page: parsed, typed, or with label sets left out as bad."""
    bucket = name + "_bucket"
    return (
        name in scrape.histograms
        or scrape.types.get(bucket) == "histogram"
        or bucket in scrape.excluded
        or (bucket in scrape.samples and name in scrape.excluded)
    )


def _readings(record: ScrapeRecord) -> int:
    return sum(len(v) for v in record.scrape.samples.values()) if record.scrape is not None else 0


class _Slots:
    """The intervals between consecutive good pages, merged pairwise when there are too many."""

    def __init__(self) -> None:
        self.stride = 1  # raw intervals per slot
        self.raw = 0  # raw intervals seen
        self.starts: list[float] = []
        self.ends: list[float] = []

    def add(self, t_start: float, t_end: float) -> tuple[int, bool]:
        """The slot of the next raw interval, and whether the slots were merged to make room."""
        slot = self.raw // self.stride
        merged = slot >= MAX_INTERVALS
        if merged:
            self.halve()
            slot = self.raw // self.stride
        if slot == len(self.starts):
            self.starts.append(t_start)
            self.ends.append(t_end)
        else:
            self.ends[slot] = t_end
        self.raw += 1
        return slot, merged

    def halve(self) -> None:
        n = len(self.starts)
        self.stride *= 2
        self.starts = self.starts[::2]
        self.ends = [self.ends[min(2 * k + 1, n - 1)] for k in range(len(self.starts))]


class _KeptPages:
    """Good pages kept whole: the first, an even sample (ok index % stride == 0), and the latest."""

    def __init__(self) -> None:
        self.stride = 1
        self.sample: list[tuple[int, int, ScrapeRecord]] = []  # (ok index, attempt index, record)
        self.readings = 0  # samples on the sampled pages
        self.latest: tuple[int, int, ScrapeRecord] | None = None

    def add(self, ok_index: int, attempt: int, record: ScrapeRecord) -> None:
        self.latest = (ok_index, attempt, record)
        if ok_index % self.stride:
            return
        self.sample.append(self.latest)
        self.readings += _readings(record)
        while len(self.sample) > 1 and (len(self.sample) > MAX_KEPT_PAGES or self.readings > MAX_KEPT_READINGS):
            self.stride *= 2
            self.sample = [kept for kept in self.sample if kept[0] % self.stride == 0]
            self.readings = sum(_readings(r) for _, _, r in self.sample)

    def records(self) -> list[tuple[int, ScrapeRecord]]:
        """(attempt index, record) of every kept page, in order."""
        out = [(attempt, r) for _, attempt, r in self.sample]
        if self.latest is not None and (not self.sample or self.sample[-1][0] != self.latest[0]):
            out.append((self.latest[1], self.latest[2]))
        return out


class WindowTally:
    """A window's pages folded in as they arrive (see the module docstring for what is kept)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.ok = 0
        self._slots = _Slots()
        self._counters: dict[str, dict[Labels, _Series[float]]] = {}
        self._histograms: dict[str, dict[Labels, _Series[HistogramSeries]]] = {}
        self._tracked = 0
        self._cells = 0
        self.untracked: Counter[str] = Counter()  # name -> readings left out past MAX_TRACKED_SERIES
        self.untracked_other = 0  # readings of names past MAX_NAMED_UNTRACKED
        self._pages = _KeptPages()
        self._failures_first: list[tuple[int, ScrapeRecord]] = []
        self._failures_last: deque[tuple[int, ScrapeRecord]] = deque(maxlen=MAX_KEPT_FAILURES // 2)
        self.bad_count = 0
        self.bad_pages = 0
        self.bad_kinds: Counter[tuple[str, str]] = Counter()  # (name, reason) -> count
        self.bad_other = 0  # bad samples of kinds past MAX_BAD_KINDS
        self.bad_kept: list[tuple[float, BadSample]] = []
        self.restarts: list[float] = []  # unix times of pages where the server had restarted
        self.restart_count = 0
        self._last: ScrapeRecord | None = None

    # --- folding pages in ------------------------------------------------------------------
    def add(self, record: ScrapeRecord) -> None:
        attempt = self.attempts
        self.attempts += 1
        scrape = record.scrape
        if scrape is None:
            if len(self._failures_first) < MAX_KEPT_FAILURES // 2:
                self._failures_first.append((attempt, record))
            else:
                self._failures_last.append((attempt, record))
            return
        page = self.ok
        self.ok += 1
        self._tally_bad(record.t_mono, scrape)
        slot = -1
        if self._last is not None:
            assert self._last.scrape is not None
            if page_restarted(self._last.scrape, scrape):
                self.restart_count += 1
                if len(self.restarts) < MAX_KEPT_RESTARTS:
                    self.restarts.append(record.t_wall)
            slot, merged = self._slots.add(self._last.t_mono, record.t_mono)
            if merged:
                self._halve_series()
        self._fold_counters(scrape, page, slot)
        self._fold_histograms(scrape, page, slot)
        if self._cells > MAX_INTERVAL_CELLS and len(self._slots.starts) > 1:
            self._slots.halve()
            self._halve_series()
        self._pages.add(page, attempt, record)
        self._last = record

    def _series(self, table: dict[str, dict[Labels, _Series[_R]]], name: str, labels: Labels) -> _Series[_R] | None:
        by_labels = table.get(name)
        if by_labels is None:
            by_labels = table[name] = {}
        s = by_labels.get(labels)
        if s is None:
            if self._tracked >= MAX_TRACKED_SERIES:
                if name in self.untracked or len(self.untracked) < MAX_NAMED_UNTRACKED:
                    self.untracked[name] += 1
                else:
                    self.untracked_other += 1
                return None
            s = by_labels[labels] = _Series()
            self._tracked += 1
        return s

    def _good(
        self,
        table: dict[str, dict[Labels, _Series[_R]]],
        name: str,
        labels: Labels,
        value: _R,
        created: float | None,
        page: int,
        slot: int,
        step: Callable[[_R | None, _R, float | None, float | None], tuple[_R, bool]],
    ) -> tuple[_Series[_R], _R, bool] | None:
        """A good reading; returns (series, increase, reset) when it makes an increase."""
        s = self._series(table, name, labels)
        if s is None:
            return None
        out = None
        if page > 0:
            if s.page != page - 1:  # absent on the page before: created in between, from 0
                inc, was_reset = step(None, value, None, created)
                out = (s, inc, was_reset)
            elif s.value is not None:  # None: only bad readings so far, this one is the baseline
                inc, was_reset = step(s.value, value, s.created, created)
                out = (s, inc, was_reset)
        s.value, s.created, s.page = value, created, page
        return out

    def _bad(self, table: dict[str, dict[Labels, _Series[_R]]], name: str, labels: Labels, page: int) -> None:
        """A reading left out: counted; the series keeps its last good reading as the baseline."""
        s = self._series(table, name, labels)
        if s is None:
            return
        s.excluded += 1
        if page == 0 and s.page == -2:
            s.page = 0  # on the first page: present, with no baseline yet
        elif page > 0 and s.page == page - 1:
            s.page = page  # carried over the bad reading

    def _add_step(self, steps: _Steps | None, slot: int, x: float) -> _Steps:
        if steps is None:
            steps = _Steps(slot)
        self._cells += steps.add(slot, x)
        return steps

    def _fold_counters(self, scrape: Scrape, page: int, slot: int) -> None:
        table, created, excluded = self._counters, scrape.created, scrape.excluded
        for name, series in scrape.samples.items():
            if name.endswith("_bucket") and _is_histogram(scrape, name[: -len("_bucket")]):
                continue
            base = name[: -len("_total")] if name.endswith("_total") else name
            nan: list[Labels] = []
            for labels, value in series:
                if value != value:  # a NaN count: no reading (typed counters never get here)
                    nan.append(labels)
                    continue
                made = self._good(table, name, labels, value, created.get((base, labels)), page, slot, counter_step)
                if made is not None:
                    s, inc, was_reset = made
                    s.resets += was_reset
                    s.steps = self._add_step(s.steps, slot, inc)
            for labels in (*excluded.get(name, ()), *nan):
                self._bad(table, name, labels, page)
        for name, labels_set in excluded.items():
            if name in scrape.samples or _is_histogram(scrape, name):
                continue
            if name.endswith("_bucket") and _is_histogram(scrape, name[: -len("_bucket")]):
                continue
            for labels in labels_set:
                self._bad(table, name, labels, page)

    def _fold_histograms(self, scrape: Scrape, page: int, slot: int) -> None:
        table, created, excluded = self._histograms, scrape.created, scrape.excluded
        names = list(scrape.histograms)
        names += [n for n in excluded if n not in scrape.histograms and _is_histogram(scrape, n)]
        for name in names:
            for h in scrape.histograms.get(name, ()):
                made = self._good(table, name, h.labels, h, created.get((name, h.labels)), page, slot, histogram_step)
                if made is not None:
                    s, inc, was_reset = made
                    s.resets += was_reset
                    s.steps = self._add_step(s.steps, slot, _finite(inc.count))
                    s.sums = self._add_step(s.sums, slot, _finite(inc.sum))
                    _add_buckets(s, inc.buckets)
            for labels in excluded.get(name, ()):
                self._bad(table, name, labels, page)

    def _halve_series(self) -> None:
        cells = 0
        for table in (self._counters, self._histograms):
            for by_labels in table.values():
                for s in by_labels.values():
                    for steps in (s.steps, s.sums):
                        if steps is not None:
                            steps.halve()
                            cells += len(steps.values)
        self._cells = cells

    def _tally_bad(self, t_mono: float, scrape: Scrape) -> None:
        if not scrape.bad:
            return
        self.bad_pages += 1
        for b in scrape.bad:
            self.bad_count += 1
            key = (b.name, b.reason)
            if key in self.bad_kinds or len(self.bad_kinds) < MAX_BAD_KINDS:
                self.bad_kinds[key] += 1
            else:
                self.bad_other += 1
            if len(self.bad_kept) < MAX_KEPT_BAD_SAMPLES:
                self.bad_kept.append((t_mono, b))

    # --- reading ---------------------------------------------------------------------------
    def records(self) -> tuple[ScrapeRecord, ...]:
        """The records kept (good pages and failed attempts), in the order they were taken."""
        kept = self._pages.records() + self._failures_first + list(self._failures_last)
        return tuple(r for _, r in sorted(kept, key=lambda pair: pair[0]))

    @property
    def page_stride(self) -> int:
        """1 when every good page is kept; 2, 4, ... once they are thinned."""
        return self._pages.stride

    @property
    def interval_stride(self) -> int:
        """Scrape intervals per kept interval: 1 until the intervals merge."""
        return self._slots.stride

    def intervals(self) -> Iterator[tuple[int, float, float]]:
        """(slot, t_start, t_end) of every kept interval (monotonic times)."""
        for slot, (t0, t1) in enumerate(zip(self._slots.starts, self._slots.ends)):
            yield slot, t0, t1

    def counters(self, name: str, where: Iterable[tuple[str, str]]) -> list[_Series[float]]:
        where = tuple(where)
        return [s for labels, s in self._counters.get(name, {}).items() if labels_match(labels, where)]

    def histograms(self, name: str, where: Iterable[tuple[str, str]]) -> list[_Series[HistogramSeries]]:
        where = tuple(where)
        return [s for labels, s in self._histograms.get(name, {}).items() if labels_match(labels, where)]

    def untracked_readings(self, name: str) -> int:
        """Readings of `name` left out past MAX_TRACKED_SERIES (names past MAX_NAMED_UNTRACKED: all of those)."""
        return self.untracked.get(name, 0) + (self.untracked_other if name not in self.untracked else 0)

    @property
    def untracked_total(self) -> int:
        return sum(self.untracked.values()) + self.untracked_other


def _add_buckets(s: _Series[HistogramSeries], buckets: tuple[tuple[float, float], ...]) -> None:
    """Sum a series' bucket increases over intervals, on the edges every interval had (as
    histogram.merge_buckets does, exactly)."""
    if s.buckets is None:
        s.buckets = {}
        for edge, count in buckets:
            s.buckets[edge] = [count] if count else []
        return
    here = dict(buckets)
    for edge in [e for e in s.buckets if e not in here]:
        del s.buckets[edge]
    for edge, partials in s.buckets.items():
        _msum_add(partials, here[edge])


def summed_buckets(s: _Series[HistogramSeries]) -> tuple[tuple[float, float], ...]:
    """A series' bucket increases over the window (what merge_buckets of its intervals gives)."""
    return tuple((edge, math.fsum(s.buckets[edge])) for edge in sorted(s.buckets)) if s.buckets else ()
