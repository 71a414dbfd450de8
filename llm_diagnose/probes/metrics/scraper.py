"""The scrape loop: GET /metrics on a fixed cadence, keep the pages on disk as they arrive.

Each attempt becomes one JSON line in `RUN_DIR/metrics.jsonl`,
`{"t_wall", "t_mono", "elapsed_s", "url", "text"}` or `{..., "error"}` (a page that fails to
parse keeps both), written and flushed before the next scrape, so a run that is interrupted
or whose server dies loses nothing. Past MAX_METRICS_FILE_BYTES the file keeps an even sample
of the attempts (scrape_file.py says exactly which). `Window.from_jsonl` reads the folder back.

In memory the loop keeps a `WindowTally`, which folds each page in as it arrives: a run of any
length fits in a fixed memory (window_tally.py lists the bounds).

Coverage: the loop counts the scrapes it planned and those a good page answered. A failed
attempt leaves its tick unanswered, and so does every tick that passes while it hangs; a slow
page that does answer covers the ticks it took. Stopped on request (`stop`), only the ticks due
by then were planned. Below `min_coverage` the window is incomplete (Window.incomplete).

Pages are bounded: a body over exposition.MAX_PAGE_BYTES is not read further, a page over
MAX_SERIES not parsed further (MetricsTooLarge, a failed scrape like a malformed page), and
parsing runs in a worker thread, so neither blocks the event loop or stretches --duration.

Failure policy: the first scrape must succeed and carry engine metrics, otherwise the
matching error is raised (nothing can be diagnosed). Later failures are recorded; after
`max_consecutive_failures` in a row the loop stops early and the window says why.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from llm_diagnose.probes.http import (
    HTTPStatusError,
    MalformedMetrics,
    MetricsUnavailable,
    NotAnLLMServer,
    ProbeHTTPError,
    ResponseTooLarge,
    get_text,
    make_session,
    redact_url,
)
from llm_diagnose.probes.metrics.engines import detect_engine, metrics_hint_for
from llm_diagnose.probes.metrics.exposition import MAX_PAGE_BYTES, page_too_large, parse_exposition
from llm_diagnose.probes.metrics.scrape_file import MAX_METRICS_FILE_BYTES, ScrapeFile
from llm_diagnose.probes.metrics.window import DEFAULT_MIN_COVERAGE, METRICS_FILE, ScrapeRecord, Window
from llm_diagnose.probes.metrics.window_tally import WindowTally

__all__ = ["Scraper", "scrape_window", "scrape_once", "DEFAULT_INTERVAL_S", "DEFAULT_MAX_CONSECUTIVE_FAILURES"]

DEFAULT_INTERVAL_S = 1.0
# Three misses in a row: a server that is only slow answers one of three; a dead one none.
DEFAULT_MAX_CONSECUTIVE_FAILURES = 3

SampleCallback = Callable[[ScrapeRecord, int], None]


async def scrape_once(
    session: aiohttp.ClientSession,
    metrics_url: str,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> tuple[ScrapeRecord, str | None, ProbeHTTPError | None]:
    """One GET of `metrics_url`: the record, the raw text (None when there was no page), the error.

    Never raises for a failed scrape: the caller decides whether a failure is fatal.
    """
    t_wall, t0 = wall(), clock()
    try:
        answer = await get_text(session, metrics_url, max_bytes=MAX_PAGE_BYTES)
    except ResponseTooLarge as exc:
        err: ProbeHTTPError = page_too_large(redact_url(metrics_url), exc.limit)
        err.url = exc.url
        return ScrapeRecord(t_wall, t0, None, str(err), clock() - t0), None, err
    except HTTPStatusError as exc:
        failed: ProbeHTTPError = exc
        if exc.status == 404:
            failed = MetricsUnavailable(
                f"{redact_url(metrics_url)} answered HTTP 404: the server exposes no "
                f"Prometheus metrics there ({metrics_hint_for(None)})",
                metrics_url,
            )
        return ScrapeRecord(t_wall, t0, None, str(failed), clock() - t0), None, failed
    except ProbeHTTPError as exc:
        return ScrapeRecord(t_wall, t0, None, str(exc), clock() - t0), None, exc
    # Timestamp a page at the middle of its request: the engine rendered it somewhere in there.
    t_mid = t0 + answer.elapsed_s / 2
    if answer.content_type.startswith("text/html") or answer.text.lstrip()[:1] in ("<", "{", "["):
        kind = "an HTML page" if answer.text.lstrip()[:1] == "<" or "html" in answer.content_type else "JSON"
        err = NotAnLLMServer(
            f"{answer.url} serves {kind}, not Prometheus metrics: is this the engine's metrics URL? "
            "(trtllm-serve: /prometheus/metrics; Triton: port 8002)",
            metrics_url,
        )
        return ScrapeRecord(t_wall, t_mid, None, str(err), answer.elapsed_s), answer.text, err
    try:
        # Off the event loop: a large page must not stall the load driver's token timestamps
        # or the scrape cadence (its size and series count are bounded: exposition.MAX_*).
        scrape = await asyncio.to_thread(parse_exposition, answer.text, answer.url)
    except MalformedMetrics as exc:
        exc.url = answer.url
        return ScrapeRecord(t_wall, t_mid, None, str(exc), answer.elapsed_s), answer.text, exc
    return ScrapeRecord(t_wall, t_mid, scrape, None, answer.elapsed_s), answer.text, None


class Scraper:
    """Scrapes one metrics URL every `interval_s`, appending each page to the run folder.

    `tally` holds what was collected so far, so a caller interrupted mid-run (Ctrl-C) can
    still build `window()` from it.
    """

    def __init__(
        self,
        metrics_url: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        run_dir: str | Path | None = None,
        on_sample: SampleCallback | None = None,
        max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES,
        min_coverage: float = DEFAULT_MIN_COVERAGE,
        max_file_bytes: int = MAX_METRICS_FILE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if max_consecutive_failures < 1:
            raise ValueError("max_consecutive_failures must be at least 1")
        self.metrics_url = metrics_url
        self.source = redact_url(metrics_url)
        self.interval_s = interval_s
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.on_sample = on_sample
        self.max_consecutive_failures = max_consecutive_failures
        self.min_coverage = min_coverage
        self.max_file_bytes = max_file_bytes
        # clock and sleep together make the cadence; a test passes a virtual pair so the ticks it
        # counts do not depend on how busy the host is (a slow scrape skips ticks by design).
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self.tally = WindowTally()
        self.stopped_early: str | None = None
        self.planned_duration_s: float | None = None
        self.planned_scrapes: int | None = None  # ticks planned (those due by then, when stopped on request)
        self.unanswered = 0  # of those, ticks no good page answered
        self.file_notes: tuple[str, ...] = ()

    @property
    def metrics_path(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / METRICS_FILE

    def window(self) -> Window:
        """The window so far: the tally itself, so take it once the loop has ended (`run` returns it)."""
        planned = self.planned_scrapes
        return Window(
            self.source,
            planned_duration_s=self.planned_duration_s,
            stopped_early=self.stopped_early,
            notes=self.file_notes,
            planned_scrapes=planned,
            answered_scrapes=None if planned is None else max(0, planned - self.unanswered),
            min_coverage=self.min_coverage,
            tally=self.tally,
        )

    async def _write(self, file: ScrapeFile | None, record: ScrapeRecord, text: str | None) -> None:
        if file is None:
            return
        line: dict[str, object] = {
            "t_wall": record.t_wall,
            "t_mono": record.t_mono,
            "elapsed_s": record.elapsed_s,
            "url": self.source,
        }
        if text is not None:
            line["text"] = text
        if record.error is not None:
            line["error"] = record.error
        encoded = json.dumps(line)
        if file.would_rewrite(encoded):  # reads and rewrites the file: off the event loop
            await asyncio.to_thread(file.write, encoded)
        else:
            file.write(encoded)

    async def run(
        self, duration_s: float, *, session: aiohttp.ClientSession | None = None, stop: asyncio.Event | None = None
    ) -> Window:
        """Scrape for `duration_s` (first and last scrape included), or until `stop` is set
        (then one last scrape is taken at once, so the window covers everything until then).

        Raises:
            TargetUnreachable, NotAnLLMServer, MalformedMetrics, MetricsUnavailable: the first
                scrape failed, or its page carries no engine metrics. The failed attempt is on
                disk all the same.
        """
        if duration_s < 0:
            raise ValueError("duration_s must not be negative")
        self.planned_duration_s = duration_s
        own_session = session is None
        session = session or make_session()
        file = None
        path = self.metrics_path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            file = ScrapeFile(path, self.max_file_bytes)  # never through a link
        try:
            await self._loop(session, duration_s, file, stop)
        finally:
            if file is not None:
                file.close()
                self.file_notes = (file.problem,) if file.problem else ()
            if own_session:
                await session.close()
        return self.window()

    async def _loop(
        self, session: aiohttp.ClientSession, duration_s: float, file: ScrapeFile | None, stop: asyncio.Event | None
    ) -> None:
        t0 = self._clock()
        planned = int(math.floor(duration_s / self.interval_s + 1e-9)) + 1
        self.planned_scrapes, self.unanswered = planned, 0
        tick, failures = 0, 0
        while tick < planned:
            delay = t0 + tick * self.interval_s - self._clock()
            if delay > 0:
                if stop is not None:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                    except TimeoutError:
                        pass
                else:
                    await self._sleep(delay)
            # Stopping takes one last scrape, so the window covers everything up to now.
            stopping = stop is not None and stop.is_set()
            record, text, error = await scrape_once(session, self.metrics_url, clock=self._clock, wall=self._wall)
            first = self.tally.attempts == 0
            if first and record.scrape is not None:  # the first page, parsed
                guess = detect_engine(record.scrape)
                if guess.engine is None:
                    error = MetricsUnavailable(
                        f"{self.source} serves no vllm:/sglang:/trtllm engine metrics ({metrics_hint_for(None)})",
                        self.metrics_url,
                    )
                    record = ScrapeRecord(record.t_wall, record.t_mono, None, str(error), record.elapsed_s)
            self.tally.add(record)
            await self._write(file, record, text)
            if self.on_sample is not None:
                self.on_sample(record, self.tally.attempts - 1)
            if error is not None and first:
                raise error
            # Skip ticks that already passed (a slow scrape must not cause a burst).
            after = max(tick + 1, int(math.floor((self._clock() - t0) / self.interval_s)) + 1)
            if stopping:  # stopped on request: the ticks due by now were the plan
                self.planned_scrapes = planned = min(planned, after)
            if error is not None:  # this tick, and those that passed while it failed, went unanswered
                self.unanswered += min(after, planned) - tick
            failures = failures + 1 if error is not None else 0
            if failures >= self.max_consecutive_failures:
                self.unanswered += max(0, planned - after)  # the ticks it will not try
                elapsed = self._clock() - t0
                self.stopped_early = (
                    f"{self.source} failed {failures} scrapes in a row after {elapsed:.1f} s "
                    f"(last: {error}); kept {self.tally.ok} good scrapes of {planned} planned"
                )
                return
            if stopping:
                return
            tick = after


async def scrape_window(
    metrics_url: str,
    duration_s: float,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    run_dir: str | Path | None = None,
    on_sample: SampleCallback | None = None,
    session: aiohttp.ClientSession | None = None,
    stop: asyncio.Event | None = None,
    max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> Window:
    """Scrape `metrics_url` every `interval_s` for `duration_s`; see `Scraper.run`."""
    scraper = Scraper(
        metrics_url,
        interval_s=interval_s,
        run_dir=run_dir,
        on_sample=on_sample,
        max_consecutive_failures=max_consecutive_failures,
        min_coverage=min_coverage,
    )
    return await scraper.run(duration_s, session=session, stop=stop)
