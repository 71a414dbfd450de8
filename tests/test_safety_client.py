"""Attach safely, the client's side (issue 17, items 1, 2, 8, 11): the active budget is a hard
bound on every POST that leaves, resends included; no redirect is followed off the target's
origin (active requests, /metrics scrapes, discovery); a stream the client gave up on because
the server stopped sending is a server fault; a redirect loop says so in words.

Every server here is FAKE, on loopback, because a real engine cannot do these things on demand:
close a connection after reading a request and before answering (what uvicorn does when its
keep-alive timer fires as a connection is reused), reject an optional field by name (only
`transformers serve` does, and only for some fields), redirect to another origin or in a loop
(a misconfigured proxy in front of an engine), or stall mid-stream (a hung engine). Each fake
says which of these it stands for. Counts are taken on the server side: what reached it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llm_diagnose.probes.discovery import discover
from llm_diagnose.probes.experiments import run_experiments
from llm_diagnose.probes.http import (
    MAX_REDIRECTS,
    RedirectRefused,
    get_text,
    make_session,
    response_error_text,
    same_origin,
)
from llm_diagnose.probes.load import (
    ActiveBudget,
    BudgetGuard,
    ClosedLoop,
    Driver,
    FaultKind,
    RequestSpec,
    StreamingClient,
    StreamTimeouts,
)
from llm_diagnose.probes.load.workloads import Workload
from llm_diagnose.probes.metrics.scraper import scrape_once
from llm_diagnose.probes.results import Measurement

METRICS_PAGE = (Path(__file__).parent / "fixtures" / "metrics" / "vllm-0.10.2-v1.txt").read_text()


def run(coro):
    return asyncio.run(coro)


def _sse_body(tokens: int = 2) -> bytes:
    out = b""
    for i in range(tokens):
        obj = {"choices": [{"index": 0, "text": f"t{i}", "finish_reason": "length" if i == tokens - 1 else None}]}
        out += b"data: " + json.dumps(obj).encode() + b"\n\n"
    usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
    return out + b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"


def _specs(n: int, max_tokens: int = 2) -> tuple[RequestSpec, ...]:
    return tuple(RequestSpec(f"r{i}", "hello", max_tokens) for i in range(n))


def _most_in_one_second(times: list[float], window_s: float = 1.0) -> int:
    """The most arrivals in any half-open window [t, t + window_s)."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u < t + window_s) for i, t in enumerate(times)), default=0)


# Arrivals are stamped by the fake server on the test's own event loop, so a busy 2-core host
# can delay one stamp against the next by more than RATE_MARGIN's 20 ms. The band: no 0.8 s
# window holds more than max_rps arrivals (200 ms of stamping jitter allowed), while unpaced
# resends (what the old code sent: 6 in a second) still break it.
ARRIVAL_WINDOW_S = 0.8


# --- item 1: the budget counts every POST that leaves ----------------------------------------------
class ClosingServer:
    """FAKE: reads each request in full, then closes the connection without answering every
    `close_every`-th one (a kept-alive connection closed by the server as the client reused it;
    a real uvicorn does it only by the accident of timing). Records when each POST arrived."""

    def __init__(self, close_every: int = 2) -> None:
        self.arrivals: list[float] = []
        self.close_every = close_every

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.arrivals.append(time.perf_counter())
        n = len(self.arrivals)
        if n % self.close_every == 1 % self.close_every:  # the 1st, then every close_every-th
            writer.close()  # read, never answered
            return
        body = _sse_body()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        try:
            await writer.drain()
        finally:
            writer.close()

    async def start(self) -> tuple[asyncio.Server, str]:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _drive(
    url: str, budget: ActiveBudget, specs: tuple[RequestSpec, ...], concurrency: int = 1
) -> tuple[Driver, StreamingClient]:
    async with StreamingClient(url, "fake") as client:
        driver = Driver(client, BudgetGuard(budget))
        await driver.run(Workload("safety", specs, ClosedLoop(concurrency)))
        return driver, client


def test_stale_connection_resends_count_against_the_request_budget():
    server = ClosingServer(close_every=2)  # every request's first try is lost: each costs two POSTs

    async def go():
        srv, url = await server.start()
        try:
            return await _drive(url, ActiveBudget(max_requests=10, max_seconds=30), _specs(20))
        finally:
            srv.close()

    driver, client = run(go())
    assert len(server.arrivals) == 10  # the budget of 10, spent in full and never exceeded (was 20)
    assert driver.guard.sent == 10 and client.attempts == 10 and client.resent_stale == 5
    assert sum(r.completed for r in driver.records) == 5
    assert driver.not_sent == 15 and driver.server_gone is None


def test_a_resend_the_budget_refuses_is_recorded_with_why():
    server = ClosingServer(close_every=1)  # closes every connection: a resend is due, and refused

    async def go():
        srv, url = await server.start()
        try:
            return await _drive(url, ActiveBudget(max_requests=1, max_seconds=30), _specs(3))
        finally:
            srv.close()

    driver, client = run(go())
    assert len(server.arrivals) == 1
    (record,) = driver.records
    assert record.fault is FaultKind.CONNECTION_LOST
    assert "not sent again: the budget of 1 requests is spent" in record.fault_detail


def test_max_rps_holds_for_resends_measured_where_the_requests_arrive():
    server = ClosingServer(close_every=2)

    async def go():
        srv, url = await server.start()
        try:
            # Four workers at once: without pacing, resends would bunch up behind the first tries.
            return await _drive(url, ActiveBudget(max_requests=8, max_seconds=30, max_rps=2), _specs(20), concurrency=4)
        finally:
            srv.close()

    driver, client = run(go())
    assert len(server.arrivals) == client.attempts == 8 and client.resent_stale >= 1
    assert _most_in_one_second(server.arrivals, ARRIVAL_WINDOW_S) <= 2, [
        round(t - server.arrivals[0], 3) for t in server.arrivals
    ]


async def _serve(
    routes: list[tuple[str, str, object]], host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str, int]:
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://{host}:{bound}", bound


async def _stream(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_sse_body())
    return resp


def test_the_resend_after_a_rejected_optional_field_counts_against_the_budget():
    # FAKE: `transformers serve` answers 422 to `ignore_eos`; a vLLM cannot be made to.
    posts: list[float] = []

    async def strict(request: web.Request) -> web.StreamResponse:
        posts.append(time.perf_counter())
        body = await request.json()
        if "ignore_eos" in body:
            return web.json_response(
                {"error": {"message": "Unexpected fields in the request: {'ignore_eos'}"}}, status=422
            )
        return await _stream(request)

    async def go():
        runner, url, _ = await _serve([("POST", "/v1/completions", strict)])
        try:
            return await _drive(url, ActiveBudget(max_requests=3, max_seconds=30), _specs(5))
        finally:
            await runner.cleanup()

    driver, client = run(go())
    assert len(posts) == 3  # 2 for the first request (one rejected), 1 for the second; no more
    assert sum(r.completed for r in driver.records) == 2 and driver.not_sent == 3
    assert client.unsupported == {"ignore_eos"}


# --- item 2 and 11: redirects ------------------------------------------------------------------------
def _other_hosts() -> list[str]:
    """Another loopback address than 127.0.0.1, if this host can bind one (Linux can)."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return ["127.0.0.2"]
    except OSError:
        return []


ELSEWHERE = [("127.0.0.1", "another port")] + [(h, "another host") for h in _other_hosts()]


class Elsewhere:
    """FAKE: the other origin a proxy sends requests to. Counts every request it gets."""

    def __init__(self) -> None:
        self.hits = 0

    async def any(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        await request.read()
        if request.path.endswith("/metrics"):
            return web.Response(text=METRICS_PAGE, content_type="text/plain")
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "elsewhere", "owned_by": "vllm"}]})
        return await _stream(request)


async def _pair(host: str, status: int):
    """A target whose every path redirects (HTTP `status`) to the same path on `host`: a port
    of its own for 127.0.0.1, the target's own port for another loopback address."""
    other = Elsewhere()
    holder: dict[str, str] = {}

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, headers={"Location": holder["base"] + request.path_qs})

    target, target_url, target_port = await _serve([("*", "/{tail:.*}", redirect)])
    port = 0 if host == "127.0.0.1" else target_port  # same port, other host: still another origin
    elsewhere, other_url, _ = await _serve([("*", "/{tail:.*}", other.any)], host=host, port=port)
    holder["base"] = other_url
    return target, elsewhere, target_url, other_url, other


@pytest.mark.parametrize("host, what", ELSEWHERE)
@pytest.mark.parametrize("status", [302, 307, 308])
def test_an_active_request_is_never_redirected_off_the_target(host, what, status):
    async def go():
        target, elsewhere, url, other_url, other = await _pair(host, status)
        try:
            driver, client = await _drive(url, ActiveBudget(max_requests=5, max_seconds=30), _specs(5))
            return driver, other, other_url
        finally:
            await target.cleanup()
            await elsewhere.cleanup()

    driver, other, other_url = run(go())
    assert other.hits == 0  # nothing reached the other origin
    record = driver.records[0]
    assert record.fault is FaultKind.REDIRECTED and not record.completed
    assert "another origin" in record.fault_detail and "not followed" in record.fault_detail
    assert other_url in record.fault_detail  # where it pointed
    # Three in a row: the run stops instead of spending the rest of the budget on redirects.
    assert len(driver.records) == 3 and "redirects" in (driver.server_gone or "")


@pytest.mark.parametrize("host, what", ELSEWHERE)
def test_a_scrape_and_discovery_never_follow_a_redirect_off_the_target(host, what):
    async def go():
        target, elsewhere, url, other_url, other = await _pair(host, 302)
        try:
            async with make_session() as session:
                _, _, scrape_error = await scrape_once(session, url + "/metrics")
                try:
                    await discover(url, session=session)
                    discovery_error = None
                except RedirectRefused as exc:
                    discovery_error = exc
            return scrape_error, discovery_error, other
        finally:
            await target.cleanup()
            await elsewhere.cleanup()

    scrape_error, discovery_error, other = run(go())
    assert other.hits == 0
    for error in (scrape_error, discovery_error):
        assert isinstance(error, RedirectRefused)
        assert "another origin" in str(error) and "not followed" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize(
    "status, posts, completed, followed",
    [
        (307, {"old": 3, "new": 2}, 2, 2),  # temporary: asked again every time, two POSTs a request
        (308, {"old": 1, "new": 4}, 4, 1),  # permanent: remembered, later requests go straight there
    ],
)
def test_a_same_origin_redirect_is_followed_and_counted_in_the_budget(status, posts, completed, followed):
    # FAKE: a proxy that moved the API (a real engine serves its own paths directly).
    seen: dict[str, int] = {"old": 0, "new": 0}

    async def moved(request: web.Request) -> web.Response:
        seen["old"] += 1
        await request.read()
        return web.Response(status=status, headers={"Location": "/v2/completions"})

    async def new(request: web.Request) -> web.StreamResponse:
        seen["new"] += 1
        return await _stream(request)

    async def go():
        runner, url, _ = await _serve([("POST", "/v1/completions", moved), ("POST", "/v2/completions", new)])
        try:
            return await _drive(url, ActiveBudget(max_requests=5, max_seconds=30), _specs(5))
        finally:
            await runner.cleanup()

    driver, client = run(go())
    assert seen == posts and driver.guard.sent == 5  # 5 POSTs in all, however they were spent
    assert sum(r.completed for r in driver.records) == completed
    assert client.redirects_followed == followed
    if status == 307:
        last = driver.records[-1]
        assert last.fault is FaultKind.REDIRECTED and "not sent again" in last.fault_detail
    else:
        assert any("moved completions permanently" in n for n in client.negotiated)


def test_a_redirect_loop_says_so_in_words():
    # FAKE: a proxy that redirects a path to itself (no engine does).
    hits = {"n": 0}

    async def loop(request: web.Request) -> web.Response:
        hits["n"] += 1
        await request.read()
        return web.Response(status=302, headers={"Location": request.path})

    async def go():
        runner, url, _ = await _serve([("*", "/{tail:.*}", loop)])
        try:
            async with make_session() as session:
                try:
                    await get_text(session, url + "/metrics")
                except RedirectRefused as exc:
                    get_error = exc
            hits["get"] = hits["n"]
            driver, _ = await _drive(url, ActiveBudget(max_requests=20, max_seconds=30), _specs(1))
            return get_error, driver
        finally:
            await runner.cleanup()

    get_error, driver = run(go())
    message = str(get_error)
    assert "redirect loop" in message and "()" not in message and "/metrics" in message
    assert hits["get"] == MAX_REDIRECTS + 1  # the first GET and MAX_REDIRECTS hops, then no more
    (record,) = driver.records
    assert record.fault is FaultKind.REDIRECTED and "redirect loop" in record.fault_detail
    assert hits["n"] - hits["get"] == MAX_REDIRECTS + 1 == driver.guard.sent  # every hop counted


def test_a_blank_aiohttp_error_message_is_never_printed_as_empty_parentheses():
    blank = aiohttp.ClientResponseError(None, (), status=0, message="")  # type: ignore[arg-type]
    assert response_error_text(blank) == "ClientResponseError"
    too_many = aiohttp.TooManyRedirects(None, (), status=302)  # type: ignore[arg-type]
    assert response_error_text(too_many) == "HTTP 302, TooManyRedirects"


def test_origins_compare_scheme_host_and_port():
    assert same_origin("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/metrics")
    assert same_origin("http://host/a", "http://HOST:80/b")  # the default port, case-insensitive host
    assert not same_origin("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    assert not same_origin("http://127.0.0.1:8000", "http://127.0.0.2:8000")
    assert not same_origin("http://127.0.0.1:8000", "https://127.0.0.1:8000")
    assert not same_origin("http://127.0.0.1:8000", "http://localhost:8000")


# --- item 8: a stall is a server fault ---------------------------------------------------------------
def _stalling(tokens: int = 3, gap_s: float = 0.01):
    """FAKE: a hung engine mid-response: `tokens` tokens, then nothing, connection kept open."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if body.get("prompt") == "slow":  # a healthy stream, just slow: 20 ms a token, never silent long
            for _ in range(10_000):
                await resp.write(b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n')
                await asyncio.sleep(0.02)
        if body.get("prompt") == "queued":  # headers, no token yet: waiting in the queue
            await asyncio.sleep(60)
        for _ in range(tokens):
            await resp.write(b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n')
            await asyncio.sleep(gap_s)
        await asyncio.sleep(60)
        return resp

    return handler


def test_a_stream_stopped_after_the_server_went_silent_is_a_stall_not_a_client_stop():
    timeouts = StreamTimeouts(idle_s=60, stall_s=0.4)

    async def go():
        runner, url, _ = await _serve([("POST", "/v1/completions", _stalling())])
        try:
            async with StreamingClient(url, "fake", timeouts=timeouts) as client:
                driver = Driver(client, BudgetGuard(ActiveBudget(10, 30)))
                for prompt in ("stall", "slow", "queued"):
                    driver.start(RequestSpec(prompt, prompt, 100))
                await asyncio.sleep(1.0)
                await driver.stop_all("phase over")
            async with StreamingClient(url, "fake", timeouts=timeouts) as client:
                deadline_driver = Driver(client, BudgetGuard(ActiveBudget(10, 1.0)))
                at_deadline = await deadline_driver.send(RequestSpec("stall-2", "stall", 100))
            return {r.request_id: r for r in driver.records}, at_deadline
        finally:
            await runner.cleanup()

    records, at_deadline = run(go())
    stalled = records["stall"]
    assert stalled.fault is FaultKind.STALLED and stalled.server_fault and len(stalled.event_times) == 3
    assert "stopped sending" in stalled.fault_detail and "phase over" in stalled.fault_detail
    assert records["slow"].fault is FaultKind.STOPPED_BY_CLIENT  # flowing when stopped: not a stall
    assert records["queued"].fault is FaultKind.STOPPED_BY_CLIENT  # no token yet: queueing, not a stall
    assert at_deadline.fault is FaultKind.STALLED and "deadline" in at_deadline.fault_detail


def test_a_stall_shows_in_the_runs_fault_summary(tmp_path):
    async def go():
        runner, url, _ = await _serve([("POST", "/v1/completions", _stalling())])
        try:
            return await run_experiments(
                url,
                "fake",
                ActiveBudget(12, 6),
                tmp_path,
                experiments=("decode",),
                timeouts=StreamTimeouts(stall_s=0.5),
            )
        finally:
            await runner.cleanup()

    results = run(go())
    failed = results["active.failed_request_fraction"]
    assert isinstance(failed, Measurement) and failed.value > 0
    assert "stalled" in failed.note and "faults: none" not in failed.note
