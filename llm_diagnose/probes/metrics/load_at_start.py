"""The server's own load just before an active run sends anything: is someone else using it?

An active run, and above all `plan --active` (a load test that pushes the server past its SLO),
shares the server with whoever else it serves. Before the first request the engine's running and
waiting gauges (engines.py's `running` and `waiting` concepts) are read from its /metrics page:
nothing of the run is in flight yet, so every request they count is another client's.

A page that shows requests is read once more SETTLE_S later, and that second read is the one
reported (with the first's count in its note): the last requests of a run that has just ended
(the user's previous command) are gone within a step or two, while a server that serves others is
serving a second later too.

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

__all__ = ["ServerLoad", "load_of_page", "read_server_load", "server_load_before_sending", "SETTLE_S"]

SETTLE_S = 1.0  # between the two reads of a page that shows requests in flight


@dataclass(frozen=True)
class ServerLoad:
    """Requests in flight on the server before the run sent anything; None where not known."""

    source: str  # the metrics URL, redacted
    running: float | None = None
    waiting: float | None = None
    series: str = ""  # the gauges read, for the note
    error: str = ""  # why the load is not known ("" when it is)
    taken_at: str = ""
    first_requests: float | None = None  # the first read's count, where a second read settled it

    @property
    def requests(self) -> int | None:
        if self.running is None and self.waiting is None:
            return None
        return round((self.running or 0.0) + (self.waiting or 0.0))

    @property
    def busy(self) -> bool:
        return (self.requests or 0) > 0

    def _counts(self) -> str:
        parts = [
            f"{v:.0f} {what}" for v, what in ((self.running, "running"), (self.waiting, "waiting")) if v is not None
        ]
        return ", ".join(parts)

    def headline(self) -> str:
        """Who else the server serves: 'the server is already serving N request(s) of other clients (...)'."""
        twice = f", read twice {SETTLE_S:g} s apart" if self.first_requests is not None else ""
        return (
            f"the server is already serving {self.requests} request(s) of other clients "
            f"({self._counts()}, {self.source}{twice})"
        )

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
            f"; {self.first_requests:.0f} at a first read {SETTLE_S:g} s before"
            if self.first_requests is not None
            else ""
        )
        note = f"{self._counts()}, read from {self.series}{settled}"
        return {Q.SERVER_REQUESTS_AT_START: Measurement(float(self.requests), "count", prov, note=note)}


async def _read_once(session: aiohttp.ClientSession, metrics_url: str, shown: str) -> ServerLoad:
    from llm_diagnose.probes.metrics.scraper import scrape_once

    record, _, _ = await scrape_once(session, metrics_url)
    return load_of_page(record, shown)


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
    `settle_s`: between the two reads of a busy page (SETTLE_S by default)."""
    from llm_diagnose.probes.discovery import discover
    from llm_diagnose.probes.http import ProbeHTTPError, redact_url

    try:
        found = await discover(base_url, metrics_url=metrics_url, session=session, require_metrics=False)
    except ProbeHTTPError as exc:
        return ServerLoad(redact_url(metrics_url or base_url), error=str(exc), taken_at=now_iso())
    shown = redact_url(found.metrics_url)
    first = await _read_once(session, found.metrics_url, shown)
    if not first.busy:
        return first
    await asyncio.sleep(SETTLE_S if settle_s is None else settle_s)
    second = await _read_once(session, found.metrics_url, shown)
    if second.requests is None:  # the second read failed: the first stands
        return first
    return replace(second, first_requests=float(first.requests or 0))


def server_load_before_sending(base_url: str, metrics_url: str | None = None) -> ServerLoad:
    """`read_server_load` with a session of its own, for a command about to send."""
    from llm_diagnose.probes.http import make_session

    async def read() -> ServerLoad:
        async with make_session() as session:
            return await read_server_load(session, base_url, metrics_url)

    return asyncio.run(read())
