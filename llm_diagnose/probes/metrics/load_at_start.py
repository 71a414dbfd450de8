"""The server's own load just before an active run sends anything: is someone else using it?

An active run, and above all `plan --active` (a load test that pushes the server past its SLO),
shares the server with whoever else it serves. Before the first request the engine's running and
waiting gauges (engines.py's `running` and `waiting` concepts) are read from its /metrics page:
nothing of the run is in flight yet, so every request they count is another client's.

The page is read READS times over SETTLE_S, and the reads after the first decide. The last
requests of a run that has just ended (the user's previous command) are gone within a step or two,
so the first read alone may count them; a server that serves others is serving a second later too.
One read alone can also miss a server that serves others: a closed-loop client's requests end
together and the gauges read 0 until its next ones are scheduled (measured on a vLLM CPU server
with four other streams: one read in about ten fell in such a gap). So the later reads are taken
half a second apart, the most requests any of them shows is the count, and where none shows any
but the engine's generated-tokens counter moved between them, someone else's request ran in
between: the server is busy, with at least one request (the note says how that is known).

Read-only, as passive mode: GET /v1/models (through discovery, which finds the metrics URL as
`run` does) and GET /metrics. Never raises for an unreadable server: `error` says why the load is
not known, and the caller goes on (the run itself meets the same failure and says so).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import aiohttp

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result, now_iso

if TYPE_CHECKING:
    from llm_diagnose.probes.metrics.window import ScrapeRecord

__all__ = [
    "ServerLoad",
    "load_of_page",
    "load_of_reads",
    "read_server_load",
    "server_load_before_sending",
    "SETTLE_S",
    "READS",
]

SETTLE_S = 1.0  # from the first read of the page to the last
READS = 3  # the first, then two more spread over SETTLE_S: a gap between another client's requests rarely covers both


@dataclass(frozen=True)
class ServerLoad:
    """Requests in flight on the server before the run sent anything; None where not known."""

    source: str  # the metrics URL, redacted
    running: float | None = None
    waiting: float | None = None
    series: str = ""  # the gauges read, for the note
    error: str = ""  # why the load is not known ("" when it is)
    taken_at: str = ""
    first_requests: float | None = None  # the first read's count, where later reads settled it
    tokens_between: float = 0.0  # tokens the engine generated between the later reads (no request of the run's)
    span_s: float = SETTLE_S  # from the first read to the last

    @property
    def requests(self) -> int | None:
        """Requests in flight (running + waiting) at the read that showed the most; None where not known."""
        if self.running is None and self.waiting is None:
            return None
        return round((self.running or 0.0) + (self.waiting or 0.0))

    @property
    def told_by_tokens_alone(self) -> bool:
        """No read showed a request in flight, but the engine generated tokens between the later reads."""
        return not (self.requests or 0) and self.tokens_between > 0

    @property
    def others_at_least(self) -> int:
        """Other clients' requests: the gauges' count, or 1 where none was in flight at a read but the
        engine generated tokens between the later reads (a request ran between them)."""
        return max(self.requests or 0, 1 if self.tokens_between > 0 else 0)

    @property
    def busy(self) -> bool:
        return self.others_at_least > 0

    def _counts(self) -> str:
        parts = [
            f"{v:.0f} {what}" for v, what in ((self.running, "running"), (self.waiting, "waiting")) if v is not None
        ]
        return ", ".join(parts)

    def headline(self) -> str:
        """Who else the server serves: 'the server is already serving N request(s) of other clients (...)'."""
        read = f", read {READS} times over {self.span_s:g} s" if self.first_requests is not None else ""
        return (
            f"the server is already serving {self.count_words()} of other clients "
            f"({self._counts()}{self._between()}, {self.source}{read})"
        )

    def count_words(self) -> str:
        """'N request(s)', or 'at least 1 request(s)' where only the generated tokens tell it."""
        at_least = "at least " if self.told_by_tokens_alone else ""
        return f"{at_least}{self.others_at_least} request(s)"

    def _between(self) -> str:
        if not self.told_by_tokens_alone:
            return ""
        return f" at both later reads, but {self.tokens_between:.0f} tokens generated between them"

    def describe(self) -> str:
        """One line: the server's load before sending, or why it is not known."""
        if self.requests is None:
            return f"the server's load before sending is not known: {self.error}"
        if not self.busy:
            return f"the server had no request in flight before sending ({self._counts()}, {self.source})"
        return f"{self.headline()}: they share every figure of this run, and this run adds its load to theirs"

    def evidence(self) -> dict[str, Result]:
        """SERVER_REQUESTS_AT_START: the count, or why it is not known."""
        prov = Provenance("prometheus-gauge", self.source, taken_at=self.taken_at or now_iso())
        if self.requests is None:
            return {
                Q.SERVER_REQUESTS_AT_START: NotMeasured(
                    f"the server's load before the run could not be read: {self.error}",
                    "give --metrics-url where the engine's metrics are",
                    prov,
                )
            }
        settled = (
            f"; {self.first_requests:.0f} at a first read, the most of {READS - 1} later reads over "
            f"{self.span_s:g} s kept"
            if self.first_requests is not None
            else ""
        )
        note = f"{self._counts()}{self._between()}, read from {self.series}{settled}"
        if self.told_by_tokens_alone:
            prov = replace(prov, method="prometheus-gauge+counter")
        return {Q.SERVER_REQUESTS_AT_START: Measurement(float(self.others_at_least), "count", prov, note=note)}


def load_of_page(record: ScrapeRecord, shown: str) -> ServerLoad:
    """The running and waiting requests one scraped page shows (`error` says why where it shows none)."""
    from llm_diagnose.probes.metrics.engines import ENGINE_METRICS, detect_engine
    from llm_diagnose.probes.metrics.window import Window

    if record.scrape is None:
        return ServerLoad(shown, error=record.error or "no page", taken_at=now_iso())
    engine = detect_engine(record.scrape).engine
    table = ENGINE_METRICS.get(engine or "", {})
    window = Window(shown, (record,))
    readings: dict[str, float | None] = {}
    names = []
    for concept in ("running", "waiting"):
        candidate = window.resolve(table.get(concept, ()))
        readings[concept] = None if candidate is None else window.latest(candidate)
        if candidate is not None:
            names.append(candidate.describe())
    taken = now_iso()
    if all(v is None for v in readings.values()):
        why = f"its metrics ({engine or 'engine not recognised'}) have no running or waiting gauge"
        return ServerLoad(shown, error=why, taken_at=taken)
    return ServerLoad(shown, readings["running"], readings["waiting"], ", ".join(names), taken_at=taken)


async def read_server_load(
    session: aiohttp.ClientSession,
    base_url: str,
    metrics_url: str | None = None,
    *,
    settle_s: float | None = None,
) -> ServerLoad:
    """The server's requests in flight now (see the module's docstring); never raises for the server.
    `settle_s`: from the first read to the last (SETTLE_S by default)."""
    from llm_diagnose.probes.discovery import discover
    from llm_diagnose.probes.http import ProbeHTTPError, redact_url
    from llm_diagnose.probes.metrics.scraper import scrape_once

    try:
        found = await discover(base_url, metrics_url=metrics_url, session=session, require_metrics=False)
    except ProbeHTTPError as exc:
        return ServerLoad(redact_url(metrics_url or base_url), error=str(exc), taken_at=now_iso())
    shown = redact_url(found.metrics_url)
    span = SETTLE_S if settle_s is None else settle_s
    records: list[ScrapeRecord] = []
    for i in range(READS):
        if i:
            await asyncio.sleep(span / (READS - 1))
        record, _, _ = await scrape_once(session, found.metrics_url)
        records.append(record)
        if i == 0 and record.scrape is not None and load_of_page(record, shown).requests is None:
            break  # a page with no running or waiting gauge: reading it again says nothing more
    return replace(load_of_reads(records, shown), span_s=span)


def load_of_reads(records: list[ScrapeRecord], shown: str) -> ServerLoad:
    """The load that reads of one page taken in turn show (see the module's docstring): the most
    requests a read after the first readable one shows, and the tokens generated between those
    reads; the only readable read's where just one could be read (a read that failed is left out)."""
    from llm_diagnose.probes.metrics.engines import ENGINE_METRICS, Sel, detect_engine
    from llm_diagnose.probes.metrics.window import Window

    loads = [(r, load_of_page(r, shown)) for r in records]
    read = [(r, load) for r, load in loads if load.requests is not None]  # a failed read (a timeout) is left out
    if len(read) < 2:
        return read[0][1] if read else loads[0][1]
    first, later = read[0][1], read[1:]
    peak = max((load for _, load in later), key=lambda load: load.requests or 0)
    pages = tuple(r for r, _ in later)
    last = pages[-1].scrape
    engine = detect_engine(last).engine if last is not None else None
    window = Window(shown, pages)
    counter = window.resolve(ENGINE_METRICS.get(engine or "", {}).get("generation_tokens", ()))
    tokens = 0.0
    if isinstance(counter, Sel) and len(pages) >= 2:
        increase = window.counter(counter)
        tokens = increase.total if not increase.resets else 0.0  # a restarted engine's counter tells nothing
    return replace(peak, first_requests=float(first.requests or 0), tokens_between=tokens)


def server_load_before_sending(base_url: str, metrics_url: str | None = None) -> ServerLoad:
    """`read_server_load` with a session of its own, for a command about to send."""
    from llm_diagnose.probes.http import make_session

    async def read() -> ServerLoad:
        async with make_session() as session:
            return await read_server_load(session, base_url, metrics_url)

    return asyncio.run(read())
