"""What every experiment shares: its context, the server's counters around it, result helpers.

`ServerDelta` reads the engine's own counters and histograms between two scrapes through
llm_diagnose/probes/metrics (the engine name tables and the reset-aware Window), so an experiment can set
what the client saw beside what the server says it did.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.faults import FaultKind
from llm_diagnose.probes.load.health import ClientHealth
from llm_diagnose.probes.load.prompts import PromptMaker
from llm_diagnose.probes.load.records import Endpoint, JsonlWriter, RequestRecord, RequestSpec
from llm_diagnose.probes.load.runner import Driver
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result, Summary
from llm_diagnose.probes.stats import StatisticSpec, bootstrap_comparison, cluster_bootstrap_comparison
from llm_diagnose.probes.warning_codes import WarningCode, coded

if TYPE_CHECKING:  # imported where used: an experiment without a metrics URL never loads the parser
    from llm_diagnose.probes.metrics.engines import Sel
    from llm_diagnose.probes.metrics.window import ScrapeRecord, Window

__all__ = [
    "MetricsReader",
    "ExperimentContext",
    "ExperimentOutcome",
    "ServerDelta",
    "TIMER",
    "settled_scrape",
    "gaps_of",
    "fault_summary",
    "ratio_with_bootstrap_ci",
    "not_measured",
    "with_warnings",
    "burst_warning",
    "send_until",
]

# The scraper the caller passes: an async callable returning one llm_diagnose.probes.metrics ScrapeRecord
# (llm_diagnose.probes.metrics.scraper.scrape_once gives one); None where a scrape failed.
MetricsReader = Callable[[], Awaitable["ScrapeRecord | None"]]

TIMER = (
    "time.perf_counter (CLOCK_MONOTONIC), read when a socket read returns and before it is parsed; "
    "every event of one read shares its time"
)
BOOTSTRAP_REPS = 2000


@dataclass
class ExperimentContext:
    """Everything an experiment needs; built once per run by run_experiments."""

    driver: Driver
    prompts: PromptMaker
    source: str  # the redacted server URL
    endpoint: Endpoint
    events: JsonlWriter
    metrics: MetricsReader | None = None
    max_model_len: int | None = None
    rng: random.Random = field(default_factory=random.Random)
    notes: list[str] = field(default_factory=list)
    # What the running experiment has completed so far, analysed: a runner sets it as each phase
    # ends, so a phase that overruns the experiment's deadline loses itself, not the phases before
    # it (run_experiments calls it when the safety timeout fires). Reset for every attempt.
    salvage: Callable[[], ExperimentOutcome] | None = None
    # The latest the running experiment may go on (perf_counter) where its own deadline proves too
    # short for the server it meets, without touching the time later experiments were planned to
    # use (the budget's deadline less their caps); never before the experiment's own deadline.
    slack_until: float = 0.0

    # The most requests of other clients the running experiment's scrapes saw in flight on the
    # server (its running and waiting gauges less this client's own in flight); reset per attempt.
    others_max: float = 0.0

    async def scrape(self) -> ScrapeRecord | None:
        """A settled scrape of the server's metrics, or None (no scraper, or it failed).

        A page that shows other clients' requests is read once more SHARED_PAUSE_S later (a
        request of ours the engine has not yet let go of is gone by then); busy both times, that
        second page is the scrape: counters under other traffic never stop moving, so waiting for
        them to settle would only eat the experiment's time. The count goes to `others_max`."""
        if self.metrics is None:
            return None
        try:
            first = await self.metrics()
            others = self._others_in_flight(first)
            if others > 0:
                await asyncio.sleep(SHARED_PAUSE_S)
                second = await self.metrics()
                if second is None or not second.ok:  # the re-read failed: the first page and its count stand
                    self.others_max = max(self.others_max, others)
                    return first
                again = self._others_in_flight(second)
                if again > 0:
                    self.others_max = max(self.others_max, min(others, again))
                    return second
                first = second
            if first is None:  # the scrape failed: no second try (a hung page must not cost the time twice)
                return None
            return await settled_scrape(self.metrics, first)
        except Exception as exc:  # noqa: BLE001 - a failed scrape loses the counters, not the run
            self.notes.append(f"a metrics scrape failed ({type(exc).__name__}: {exc})")
            return None

    def _others_in_flight(self, record: ScrapeRecord | None) -> float:
        """Requests on the server that are not this client's, from one page (0 where it shows none)."""
        if record is None or not record.ok:
            return 0.0
        from llm_diagnose.probes.metrics.load_at_start import load_of_page

        load = load_of_page(record, self.source)
        return max(0.0, (load.requests or 0) - self.driver.client.in_flight)

    def other_traffic_warning(self) -> str | None:
        """The warning an experiment's figures carry where other clients' requests were in flight
        at its scrapes (Q.OTHER_TRAFFIC_WARNING); None where none were seen."""
        if self.others_max <= 0:
            return None
        return coded(
            WarningCode.OTHER_TRAFFIC,
            f"{Q.OTHER_TRAFFIC_WARNING} up to {self.others_max:.0f} request(s) of other clients were in flight on "
            "the server during this experiment: its figures are measured with their load on top of this run's",
        )

    def provenance(self, experiment: str, window_s: float | None = None) -> Provenance:
        return Provenance(method=f"active-probe/{experiment}", source=self.source, timer=TIMER, window_s=window_s)


@dataclass(frozen=True)
class ExperimentOutcome:
    """An experiment's results, and the median gap its client timings were judged against.

    `judge`, when given, is called with the client's health over the experiment (known only
    once it is over) and returns results to add or replace: the decode experiment uses it to
    say whether a client/server disagreement came from a starved client.
    """

    results: dict[str, Result]
    median_gap_s: float | None = None
    notes: tuple[str, ...] = ()
    judge: Callable[[ClientHealth], dict[str, Result]] | None = None
    # The smallest time the verdict rests on (a token gap, a probe's latency, a prefill's stall):
    # client lag is "starvation" against it (ClientHealth.starved). None: the median gap.
    verdict_scale_s: float | None = None

    @property
    def starvation_scale_s(self) -> float | None:
        return self.verdict_scale_s if self.verdict_scale_s is not None else self.median_gap_s


SETTLE_PAUSE_S = 0.05
SETTLE_TRIES = 20  # at most a second
# Between two reads of a page that shows other clients' requests: vLLM drops a finished or
# cancelled stream from its running gauge within a step or two, so a count still there is theirs.
SHARED_PAUSE_S = 0.25


# Families the serving process exports about itself, not about the engine's work: its CPU time,
# garbage collector and HTTP handlers move whenever anyone reads or calls the server. Left in, a
# page never "settled" while other clients scraped it (CI: four diagnosers on one vLLM, each
# settled scrape ran to its 1 s limit, and the decode experiment's batch-1 share was gone before
# its first request: an empty run).
NOT_ENGINE_PREFIXES = ("process_", "python_", "http_")


def _counters(record: ScrapeRecord | None) -> frozenset:
    """Every engine counter value and histogram count of a scrape (NaN left out: it never equals itself)."""
    scrape = getattr(record, "scrape", None)
    if scrape is None:
        return frozenset()
    values = {
        (name, s.labels, s.value)
        for name, series in scrape.samples.items()
        if name.endswith("_total") and not name.startswith(NOT_ENGINE_PREFIXES)
        for s in series
        if not math.isnan(s.value)
    }
    values |= {
        (name, h.labels, h.count)
        for name, hs in scrape.histograms.items()
        if not name.startswith(NOT_ENGINE_PREFIXES)
        for h in hs
    }
    return frozenset(values)


async def settled_scrape(read: MetricsReader, first: ScrapeRecord | None = None) -> ScrapeRecord | None:
    """A scrape taken once the engine's counters stopped moving (None: no good scrape).

    A response reaches the client before the engine's statistics for it reach /metrics
    (vLLM ships them from the engine process with later outputs), so a scrape right after
    the last response can miss its counts: measured, a prefix hit rate of 0.22 where the
    responses' own cached_tokens said 0.71. Two equal consecutive pages mean it has caught up.
    `first`: a page already read, to start from.
    """
    record = first if first is not None else await read()
    for _ in range(SETTLE_TRIES):
        if not getattr(record, "ok", False):
            return None
        await asyncio.sleep(SETTLE_PAUSE_S)
        again = await read()
        if getattr(again, "ok", False) and _counters(again) == _counters(record):
            return again
        record = again
    return record if getattr(record, "ok", False) else None


class ServerDelta:
    """What the engine's own metrics say happened between two scrapes.

    `passive()` is llm_diagnose.probes.metrics' passive evidence over the two-scrape window (prefix hit
    rate, spec-decode acceptance, ...: computed there, once, for every engine);
    `counter()` and `histogram_mean()` read single concepts the passive keys do not carry.
    """

    def __init__(self, before: ScrapeRecord | None, after: ScrapeRecord | None) -> None:
        self.available = before is not None and after is not None
        self.engine: str | None = None
        self._window: Window | None = None
        self._passive: dict[str, Result] | None = None
        if before is None or after is None or after.scrape is None:  # (a settled scrape has its page)
            return
        from llm_diagnose.probes.metrics.engines import ENGINE_METRICS, detect_engine
        from llm_diagnose.probes.metrics.window import Window

        self._window = Window("metrics", (before, after))
        self.engine = detect_engine(after.scrape).engine
        self._table = ENGINE_METRICS.get(self.engine or "", {})

    def passive(self) -> dict[str, Result]:
        """Passive evidence over the window ({} without two scrapes)."""
        if self._window is None:
            return {}
        if self._passive is None:
            from llm_diagnose.probes.metrics.passive import passive_evidence

            self._passive = passive_evidence(self._window)
        return self._passive

    def _selector(self, concept: str) -> tuple[Window, Sel] | None:
        """The window and the concept's plain selector; None without a window or when the engine lacks it."""
        from llm_diagnose.probes.metrics.engines import Sel

        if self._window is None:
            return None
        sel = self._window.resolve(self._table.get(concept, ()))
        return (self._window, sel) if isinstance(sel, Sel) else None

    def counter(self, concept: str) -> float | None:
        """The increase of a plain counter concept; None when the engine lacks it."""
        found = self._selector(concept)
        return None if found is None else found[0].counter(found[1]).total

    def histogram_mean(self, concept: str) -> tuple[float, float] | None:
        """(mean, count) of the observations a histogram concept gained; None when none.

        The mean is exact (the histogram's _sum over its _count), whatever the bucket edges.
        """
        found = self._selector(concept)
        if found is None:
            return None
        inc = found[0].histogram(found[1])
        return None if inc.mean is None else (inc.mean, inc.count)


async def send_until(driver: Driver, spec: RequestSpec, until: float, why: str) -> RequestRecord | None:
    """`driver.send(spec)`, stopped by the client at `until` (perf_counter) if still running then.

    A stream stopped this way keeps what it measured (its record says stopped-by-client, with
    `why`), so a request started near a phase's end cannot carry the phase past its deadline.
    None when the budget refused the request.
    """
    task = driver.start(spec)
    done, _ = await asyncio.wait([task], timeout=max(0.0, until - time.perf_counter()))
    if done:
        return task.result()
    task.cancel(why)
    await asyncio.gather(task, return_exceptions=True)
    sent_as = driver.attempt_id(spec.request_id)
    return next((r for r in reversed(driver.records) if r.request_id == sent_as), None)


# --- helpers on records ----------------------------------------------------------------------
def gaps_of(records: Iterable[RequestRecord]) -> list[float]:
    """Inter-token gaps of records whose stream the server did not break.

    A stream we stopped ourselves (phase over) keeps its gaps: every one was measured in full.
    A stream that failed (cut, timed out) gives none: its last gaps may be the failure itself.
    """
    out: list[float] = []
    for r in records:
        if r.fault is None or r.fault is FaultKind.STOPPED_BY_CLIENT:
            out.extend(r.gaps_s)
    return out


def arrived_whole(record: RequestRecord) -> bool:
    """Every gap of the stream is under BURST_GAP_S: its tokens came together, so nothing in it was timed."""
    gaps = record.gaps_s
    return bool(gaps) and all(g < BURST_GAP_S for g in gaps)


def timed_gaps_of(records: Iterable[RequestRecord]) -> tuple[list[float], int]:
    """`gaps_of` the streams that did not arrive whole, and how many did (and were left out).

    A stream read in one go has gaps of ~0 that a mean cannot see through (seen on this shared
    host: every stream of a concurrency level bundled, a growth of 0.0 that reads as "batching
    is free"); one read over time keeps its span, which a mean of its gaps recovers."""
    kept = [r for r in records if not arrived_whole(r)]
    whole = sum(1 for r in records if arrived_whole(r))
    return gaps_of(kept), whole


def fault_summary(records: Sequence[RequestRecord]) -> str | None:
    """'3 of 40 requests failed (2 rate-limited, 1 cut-off)', or None when none did."""
    kinds = Counter(r.fault.value for r in records if r.server_fault and r.fault is not None)
    if not kinds:
        return None
    detail = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    return f"{sum(kinds.values())} of {len(records)} requests failed ({detail}); they are excluded, not counted as fast"


BURST_GAP_S = 50e-6  # gaps this short mean two events came out of one socket read
BURST_SHARE = 0.2


def burst_warning(gaps: Sequence[float]) -> str | None:
    """A warning when many gaps are ~0: events arrived together, so gaps are not step times."""
    if not gaps:
        return None
    share = sum(g < BURST_GAP_S for g in gaps) / len(gaps)
    if share < BURST_SHARE:
        return None
    return (
        f"{share:.0%} of the gaps are under {BURST_GAP_S * 1e6:.0f} us: tokens arrived in bursts (the client read "
        "late, or the server batches its output, e.g. --stream-interval), so single gaps are not step times"
    )


# The vectorised forms of the statistics experiments pass (a per-resample Python call is ~14x slower).
_VECTORISED: dict[Callable[..., float], StatisticSpec] = {
    statistics.median: "median",
    statistics.fmean: "mean",
    statistics.mean: "mean",
}


def _vectorised(statistic: Callable[[Sequence[float]], float]) -> StatisticSpec:
    """The statistic as llm_diagnose.probes.stats takes it: by name, else applied row by row."""
    if statistic in _VECTORISED:
        return _VECTORISED[statistic]

    def per_row(values, axis=None):
        import numpy as np

        # A row is an ndarray, which numpy's stubs do not count as the Sequence the statistic takes.
        return statistic(values) if axis is None else np.apply_along_axis(statistic, axis, values)  # type: ignore[call-overload]

    return per_row


def ratio_with_bootstrap_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    seed: int = 0,
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    reps: int = BOOTSTRAP_REPS,
    level: float = 0.95,
    numerator_groups: Sequence[Sequence[float]] | None = None,
) -> tuple[float, Summary]:
    """statistic(numerator) / statistic(denominator), with a bootstrap CI resampling both sides.

    The Summary's samples are numerator / statistic(denominator) (the spread a reader sees);
    its ci_low/ci_high are replaced by the percentile-bootstrap interval of the ratio
    (llm_diagnose.probes.stats.bootstrap_comparison), which also carries the uncertainty of
    the denominator. `numerator_groups` (the numerator's values, grouped by what they share: the
    gaps of one injected prefill) makes the interval resample the numerator by group instead
    (llm_diagnose.probes.stats.cluster_bootstrap_comparison): values that move together are then
    one observation, not many.
    """
    base = statistic(denominator)
    if base <= 0:
        raise ValueError("the denominator's statistic must be positive")
    value = statistic(numerator) / base
    if numerator_groups is not None:
        interval = cluster_bootstrap_comparison(
            [[x] for x in denominator],
            numerator_groups,
            _vectorised(statistic),
            compare="ratio",
            resamples=reps,
            level=level,
            seed=seed,
        )
    else:
        interval = bootstrap_comparison(
            denominator, numerator, _vectorised(statistic), compare="ratio", resamples=reps, level=level, seed=seed
        )
    summary = Summary.from_samples([x / base for x in numerator])
    return value, replace(summary, ci_low=interval.low, ci_high=interval.high, ci_level=level)


def not_measured(keys: Iterable[str], reason: str, hint: str = "") -> dict[str, Result]:
    return {k: NotMeasured(reason, hint) for k in keys}


def with_warnings(results: dict[str, Result], warnings: Sequence[str]) -> dict[str, Result]:
    """The same results, each Measurement carrying `warnings` too (deduplicated, order kept)."""
    if not warnings:
        return results
    out: dict[str, Result] = {}
    for key, r in results.items():
        if isinstance(r, Measurement):
            merged = tuple(dict.fromkeys((*r.warnings, *warnings)))
            r = replace(r, warnings=merged)
        out[key] = r
    return out
