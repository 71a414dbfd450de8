"""Each request's HTTP phases, from aiohttp's request tracing (records.HttpPhases).

`phase_trace_config()` is handed to the load client's session once; each attempt passes its own
`PhaseClock` as `trace_request_ctx`, and aiohttp calls back as the request reaches each step.
The clock is the client's (time.perf_counter, as `RequestRecord.t_send`), and a callback runs
when the event loop gets to it, so on a starved client these times are late like every other.
Requests sent without a clock (the scraper's, discovery's) are not timed.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import aiohttp

from llm_diagnose.probes.load.records import HttpPhases

__all__ = ["PhaseClock", "phase_trace_config"]


class PhaseClock:
    """Marks of one attempt, seconds after its `t0` (mutable while the request runs)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.marks: dict[str, float] = {}
        self.reused: bool | None = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter() - self.t0)  # the first time each step happens

    def span(self, start: str, end: str) -> float | None:
        a, b = self.marks.get(start), self.marks.get(end)
        return None if a is None or b is None else max(b - a, 0.0)

    def phases(self) -> HttpPhases:
        return HttpPhases(
            pool_wait_s=self.span("queued_start", "queued_end"),
            connect_s=self.span("create_start", "create_end"),
            reused=self.reused,
            headers_sent_s=self.marks.get("headers_sent"),
            body_sent_s=self.marks.get("chunk_sent"),
            response_headers_s=self.marks.get("request_end"),
        )


def _marker(name: str):
    async def on_step(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
        clock = ctx.trace_request_ctx
        if isinstance(clock, PhaseClock):
            clock.mark(name)
            if name == "reuseconn":
                clock.reused = True
            elif name == "create_start":
                clock.reused = False

    return on_step


def phase_trace_config() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    for signal, name in (
        (config.on_connection_queued_start, "queued_start"),
        (config.on_connection_queued_end, "queued_end"),
        (config.on_connection_create_start, "create_start"),
        (config.on_connection_create_end, "create_end"),
        (config.on_connection_reuseconn, "reuseconn"),
        (config.on_request_headers_sent, "headers_sent"),
        (config.on_request_chunk_sent, "chunk_sent"),
        (config.on_request_end, "request_end"),
    ):
        signal.append(_marker(name))
    config.freeze()
    return config
