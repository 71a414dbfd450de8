"""The streaming load client, its workloads, budget and plan, without a real engine.

The server here is FAKE (aiohttp on 127.0.0.1), and only for what a real server cannot be
made to do on demand: cut a stream mid-response, answer 429 or 500, send malformed SSE, stall
past a timeout, vanish; and for holding 1,000 streams open at once, which the 2-core test
machine could not do with a real engine beside it. Each fake behaviour says which fault it
stands for. Everything that a real server can show is tested against vLLM in
tests/test_small_model_live.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import pytest
from aiohttp import web

from llm_diagnose.probes.experiments import describe_plan, plan_experiments, run_experiments
from llm_diagnose.probes.experiments.common import ratio_with_bootstrap_ci
from llm_diagnose.probes.load import (
    ActiveBudget,
    BudgetGuard,
    ClosedLoop,
    ConstantArrivals,
    Driver,
    FaultKind,
    JsonlWriter,
    LengthDist,
    PoissonArrivals,
    PromptMaker,
    RequestRecord,
    RequestSpec,
    StreamingClient,
    StreamTimeouts,
    load_trace,
    read_records,
    shared_prefix_workload,
    synthetic_workload,
    trace_workload,
)
from llm_diagnose.probes.load.pacing import TraceArrivals, arrival_offsets
from llm_diagnose.probes.load.prompts import NONCE_TOKENS, NONCE_WORDS
from llm_diagnose.probes.load.replay import MOONCAKE_BLOCK_TOKENS
from llm_diagnose.probes.load.sse import SSEDecoder, read_chunk
from llm_diagnose.probes.results import Measurement, NotMeasured

SECRET = "sk-test-must-never-leak-1234"


# --- the fake server --------------------------------------------------------------------------
def _chunk(text: str, finish: str | None = None) -> bytes:
    obj = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(prompt: int, completion: int, cached: int | None = None) -> bytes:
    usage: dict = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n"


class FakeServer:
    """Behaviour chosen by the prompt's first word (a test-only convention)."""

    def __init__(self) -> None:
        self.open_streams = 0
        self.peak_streams = 0
        self.authorizations: list[str | None] = []
        self.requests = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.authorizations.append(request.headers.get("Authorization"))
        body = await request.json()
        prompt = body["prompt"] if isinstance(body["prompt"], str) else "ok"
        word, *args = prompt.split()[0].split(":")
        n = int(body.get("max_tokens", 4))
        # Any other prompt (the experiments' random words) streams at 2 ms a token, like a small model.
        gap = float(args[0]) / 1000 if word == "ok" and args else 0.002
        if word == "429":  # an overloaded server or gateway rate limit
            return web.json_response({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "2"})
        if word == "500":  # an engine crash on this request
            return web.json_response({"error": {"message": "internal engine error"}}, status=500)
        if word == "400":  # prompt too long / bad parameter
            return web.json_response({"error": {"message": "prompt is too long"}}, status=400)
        if word == "echo-auth":  # a careless gateway that echoes the request headers in its error
            return web.json_response(
                {"error": {"message": f"denied: {request.headers.get('Authorization')}"}}, status=403
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.open_streams += 1
        self.peak_streams = max(self.peak_streams, self.open_streams)
        try:
            if word == "stall":  # a hung engine: headers, then nothing
                await asyncio.sleep(30)
            if word == "malformed":  # a proxy that mangles the stream
                await resp.write(_chunk("a") + b"data: {not json\n\n")
                return resp
            if word == "error-event":  # vLLM reports a mid-stream engine error as an SSE error event
                await resp.write(_chunk("a") + b'data: {"error": {"message": "engine dead"}}\n\n')
                return resp
            if (body.get("stream_options") or {}).get("continuous_usage_stats"):
                # What a speculative-decoding engine streams: several tokens per event, usage in each.
                for i in range(0, n, 3):
                    done = min(n, i + 3)
                    obj = {
                        "choices": [{"index": 0, "text": "abc", "finish_reason": "length" if done == n else None}],
                        "usage": {"prompt_tokens": 7, "completion_tokens": done, "total_tokens": 7 + done},
                    }
                    await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    await asyncio.sleep(gap)
                await resp.write(_usage(7, n) + b"data: [DONE]\n\n")
                return resp
            for i in range(n):
                if word == "cut" and i == int(args[0]):  # the server process dies mid-response
                    request.transport.abort()
                    return resp
                last = i == n - 1 and word != "no-done"
                data = _chunk(f"t{i} ", "length" if last else None)
                if word == "crlf":
                    data = data.replace(b"\n", b"\r\n")
                await resp.write(data)
                if gap:
                    await asyncio.sleep(gap)
            if word == "no-done":  # the stream just ends: no finish reason, no [DONE]
                return resp
            await resp.write(_usage(7, n, cached=3) + b"data: [DONE]\n\n")
            return resp
        finally:
            self.open_streams -= 1


@pytest.fixture
def fake() -> FakeServer:
    """A FakeServer; `_start` serves it on a free 127.0.0.1 port inside the test's own event loop."""
    return FakeServer()


async def _start(server: FakeServer) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/completions", server.completions)
    # handler_cancellation: a handler whose client went away stops (a stalled one would hold cleanup)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def run(coro):
    return asyncio.run(coro)


def _spec(prompt: str, max_tokens: int = 4, **kw) -> RequestSpec:
    return RequestSpec(prompt.split()[0], prompt, max_tokens, **kw)


async def _send_one(
    server: FakeServer, prompt: str, max_tokens: int = 4, timeouts: StreamTimeouts = StreamTimeouts()
) -> RequestRecord:
    runner, url = await _start(server)
    try:
        async with StreamingClient(url, "fake", timeouts=timeouts) as client:
            return await client.send(_spec(prompt, max_tokens))
    finally:
        await runner.cleanup()


# --- normal streams -----------------------------------------------------------------------------
def test_complete_stream_records_ttft_every_gap_tokens_and_finish(fake):
    r = run(_send_one(fake, "ok:10", 5))
    assert r.completed and r.fault is None and r.finish_reason == "length"
    assert len(r.event_times) == 5 and len(r.gaps_s) == 4
    assert all(0.008 < g < 0.2 for g in r.gaps_s), r.gaps_s  # 10 ms pacing, measured on the monotonic clock
    assert r.prompt_tokens == 7 and r.completion_tokens == 5 and r.cached_tokens == 3
    assert r.ttft_s is not None and r.e2e_s is not None and r.e2e_s >= r.event_times[-1]


def test_crlf_line_ends_are_read_like_lf(fake):
    r = run(_send_one(fake, "crlf", 6))
    assert r.completed and len(r.event_times) == 6


def test_api_key_is_sent_but_never_written(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_DIAGNOSE_API_KEY", SECRET)

    async def go():
        runner, url = await _start(fake)
        try:
            return await run_experiments(url, "fake", ActiveBudget(12, 6), tmp_path, experiments=("decode",))
        finally:
            await runner.cleanup()

    results = run(go())
    assert fake.authorizations and all(a == f"Bearer {SECRET}" for a in fake.authorizations)
    for f in tmp_path.iterdir():
        assert SECRET not in f.read_text()
    assert SECRET not in json.dumps({k: v.to_dict() for k, v in results.items()})
    echoed = run(_send_one(fake, "echo-auth"))
    assert echoed.fault is FaultKind.REJECTED and "denied: Bearer ***" in echoed.fault_detail
    assert SECRET not in echoed.fault_detail


def test_tokens_per_event_and_the_acceptance_estimate_without_server_counters(fake, tmp_path):
    async def go():
        runner, url = await _start(fake)
        try:
            return await run_experiments(url, "fake", ActiveBudget(10, 10), tmp_path, experiments=("spec",))
        finally:
            await runner.cleanup()

    results = run(go())
    assert results["spec.tokens_per_event"].value == pytest.approx(3.0, abs=0.05)
    length = results["spec.active_acceptance_length"]  # the experiment's own name (issue 26, item 1)
    assert isinstance(length, Measurement) and "tokens per streamed event" in length.note
    assert isinstance(results["spec.active_acceptance_rate"], NotMeasured)  # needs the engine's counters
    # The spec experiment's own request (the calibration request that sizes the run comes first).
    record = next(r for r in read_records(tmp_path) if r.experiment == "spec")
    assert record.event_tokens and set(record.event_tokens) <= {1, 2, 3}


def test_a_server_rejecting_an_extension_is_asked_again_without_it(fake):
    """FAKE 422 as `transformers serve` answers ignore_eos (measured: 'Unexpected fields')."""

    async def strict(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "ignore_eos" in body:
            return web.json_response(
                {"error": {"message": "Unexpected fields in the request: {'ignore_eos'}"}}, status=422
            )
        return await fake.completions(request)

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", strict)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            async with StreamingClient(url, "fake") as client:
                first = await client.send(_spec("ok", 3))
                second = await client.send(_spec("ok", 3))
                return first, second, client
        finally:
            await runner.cleanup()

    first, second, client = run(go())
    assert first.completed and second.completed
    assert client.unsupported == {"ignore_eos"} and len(client.negotiated) == 1
    assert fake.requests == 2  # the retry happened once; the second request went straight through


def test_a_request_lost_on_a_connection_the_server_closed_is_sent_again_once():
    # FAKE: a server that reads a request and closes the connection without answering, as
    # uvicorn does when a kept-alive connection's idle timeout fires just as it is reused (seen
    # on real vLLM; it cannot be made to happen on demand). Then it answers normally.
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await reader.readuntil(b"\r\n\r\n")
        if len(accepted) != 2:  # all but the first request's second try
            writer.close()
            return
        body = _chunk("a") + _chunk("b", "length") + _usage(3, 2) + b"data: [DONE]\n\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with StreamingClient(url, "fake") as client:
                first = await client.send(_spec("ok", 2))
                second = await client.send(_spec("ok", 2))
                return first, second, client.resent_stale
        finally:
            server.close()

    first, second, resent = run(go())
    assert first.completed and first.completion_tokens == 2  # the second try went through
    # Sent again once only: a server that closes every connection is recorded as losing it.
    assert second.fault is FaultKind.CONNECTION_LOST and resent == 2 and len(accepted) == 4


# --- faults: each recorded as itself, never as a fast response ------------------------------------
@pytest.mark.parametrize(
    "prompt, kind, status",
    [
        ("429", FaultKind.RATE_LIMITED, 429),
        ("500", FaultKind.SERVER_ERROR, 500),
        ("400", FaultKind.REJECTED, 400),
        ("cut:3", FaultKind.CUT_OFF, 200),
        ("malformed", FaultKind.MALFORMED, 200),
        ("error-event", FaultKind.STREAM_ERROR, 200),
        ("no-done", FaultKind.CUT_OFF, 200),
    ],
)
def test_each_fault_is_recorded_as_such(fake, prompt, kind, status):
    r = run(_send_one(fake, prompt, 8))
    assert r.fault is kind, (r.fault, r.fault_detail)
    assert r.http_status == status
    assert not r.completed and r.e2e_s is None  # a fault never counts as a (fast) response
    assert r.fault_detail
    if kind is FaultKind.RATE_LIMITED:
        assert "Retry-After: 2" in r.fault_detail and "rate limited" in r.fault_detail
    if kind is FaultKind.CUT_OFF and prompt.startswith("cut"):
        assert len(r.event_times) == 3  # what arrived before the cut is kept


def test_idle_timeout_is_a_timeout_not_a_response(fake):
    r = run(_send_one(fake, "stall", 4, StreamTimeouts(connect_s=1, idle_s=0.3, total_s=5)))
    assert r.fault is FaultKind.TIMEOUT_IDLE and not r.completed
    assert 0.25 < (r.t_end or 0) < 2


def test_total_timeout(fake):
    r = run(_send_one(fake, "ok:50", 100, StreamTimeouts(connect_s=1, idle_s=5, total_s=0.3)))
    assert r.fault is FaultKind.TIMEOUT_TOTAL and 2 <= len(r.event_times) < 100


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


def test_a_server_that_is_not_there_is_unreachable():
    async def go():
        async with StreamingClient(f"http://127.0.0.1:{_closed_port()}", "m") as client:
            return await client.send(_spec("ok"))

    r = run(go())
    assert r.fault is FaultKind.UNREACHABLE and "cannot connect" in r.fault_detail


def test_a_server_that_stops_ends_the_run_with_a_partial_diagnosis(fake, tmp_path):
    """The server stops after the first experiment: the rest is NotMeasured, saying why."""

    async def go():
        runner, url = await _start(fake)

        def stop_after(name, results):
            if name == "decode":
                asyncio.get_running_loop().create_task(runner.cleanup())

        return await run_experiments(
            url, "fake", ActiveBudget(100, 20), tmp_path, experiments=("decode", "prefix", "spec"), on_result=stop_after
        )

    results = run(go())
    assert isinstance(results["decode.batch1_itl_p50_s"], Measurement)
    later = results["prefix.active_ttft_speedup"]
    assert isinstance(later, NotMeasured) and "stopped answering" in later.reason
    records = list(read_records(tmp_path))
    gone = [r.fault for r in records if r.fault in (FaultKind.UNREACHABLE, FaultKind.CONNECTION_LOST)]
    assert len(gone) == 3, [r.fault for r in records]  # three in a row, then nothing more is sent
    assert isinstance(results["active.failed_request_fraction"], Measurement)


def test_cancelled_requests_are_recorded_as_stopped_by_the_client(fake, tmp_path):
    async def go():
        runner, url = await _start(fake)
        try:
            async with StreamingClient(url, "fake") as client:
                driver = Driver(client, BudgetGuard(ActiveBudget(10, 30)), JsonlWriter(tmp_path / "requests.jsonl"))
                for i in range(3):
                    driver.start(RequestSpec(f"r{i}", "ok:20", 100))
                await asyncio.sleep(0.3)
                await driver.stop_all("test over")
                return driver.records
        finally:
            await runner.cleanup()

    records = run(go())
    assert len(records) == 3 and all(r.fault is FaultKind.STOPPED_BY_CLIENT for r in records)
    assert all(r.fault_detail == "test over" and len(r.event_times) >= 3 for r in records)
    on_disk = list(read_records(tmp_path))
    assert {r.request_id for r in on_disk} == {"r0", "r1", "r2"}  # written as they ended, not at exit
    assert on_disk[0].gaps_s == pytest.approx(records[0].gaps_s, abs=1e-6)


# --- scale -----------------------------------------------------------------------------------------
def test_holds_1000_concurrent_streams_with_overhead_far_below_the_gaps(fake):
    n, tokens, gap_ms = 1000, 20, 20

    async def go():
        runner, url = await _start(fake)
        try:
            async with StreamingClient(url, "fake", max_streams=1024) as client:
                t0 = time.perf_counter()
                records = await asyncio.gather(
                    *(client.send(RequestSpec(f"s{i}", f"ok:{gap_ms}", tokens)) for i in range(n))
                )
                return records, client, time.perf_counter() - t0
        finally:
            await runner.cleanup()

    records, client, wall = run(go())
    assert all(r.completed for r in records), {r.fault for r in records}
    assert client.peak_in_flight == n and fake.peak_streams >= 0.95 * n  # truly concurrent
    per_event = client.handling_s / client.events_parsed
    assert client.events_parsed == n * tokens
    # The client's own cost per token is far below the 20 ms gaps it measures (and below 1 ms).
    assert per_event < 0.05 * gap_ms / 1000 and per_event < 1e-3, per_event
    assert wall < 30


# --- SSE decoding -------------------------------------------------------------------------------------
def test_sse_decoder_survives_any_split_of_the_stream():
    stream = (
        b"".join(_chunk(f"w{i}") for i in range(50))
        + b": ping\n\nevent: x\nid: 3\ndata: a\ndata: b\n\n"
        + b"data: [DONE]\n\n"
    )
    rng = random.Random(0)
    for crlf in (False, True):
        data = stream.replace(b"\n", b"\r\n") if crlf else stream
        for _ in range(50):
            dec, out, i = SSEDecoder(), [], 0
            while i < len(data):
                j = i + rng.randint(1, 9)
                out += dec.feed(data[i:j])
                i = j
            out += dec.flush()
            assert len(out) == 52 and out[-2] == b"a\nb" and out[-1] == b"[DONE]"
            assert json.loads(out[0])["choices"][0]["text"] == "w0"


def test_sse_last_event_without_blank_line_is_kept():
    dec = SSEDecoder()
    assert dec.feed(b"data: [DONE]") == []
    assert dec.flush() == [b"[DONE]"]


def test_chunk_meaning_completions_and_chat():
    assert read_chunk({"choices": [{"text": "a", "finish_reason": None}]}, chat=False).is_token
    assert read_chunk({"choices": [{"text": "", "finish_reason": None}]}, chat=False).is_token  # special token
    end = read_chunk({"choices": [{"text": "", "finish_reason": "stop"}]}, chat=False)
    assert not end.is_token and end.finish_reason == "stop"  # the terminal marker is not a token
    role = read_chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, chat=True)
    assert not role.is_token
    assert read_chunk({"choices": [{"delta": {"content": "hi"}}]}, chat=True).is_token
    usage = read_chunk({"choices": [], "usage": {"completion_tokens": 3}}, chat=False)
    assert usage.usage == {"completion_tokens": 3} and not usage.is_token
    assert read_chunk({"error": {"message": "boom"}}, chat=False).error == "boom"


# --- budget and pacing ------------------------------------------------------------------------------
def test_budget_is_a_hard_bound_on_requests():
    async def go():
        guard = BudgetGuard(ActiveBudget(max_requests=5, max_seconds=10))
        admitted = await asyncio.gather(*(guard.admit() for _ in range(9)))
        return guard, admitted

    guard, admitted = run(go())
    assert sum(admitted) == 5 and guard.sent == 5 and guard.refused == 4
    assert "5 requests" in (guard.exhausted() or "")


def test_budget_paces_starts_to_max_rps_and_stops_at_the_deadline():
    async def go():
        guard = BudgetGuard(ActiveBudget(max_requests=100, max_seconds=0.5, max_rps=20))
        times = []

        async def one():
            if await guard.admit():
                times.append(time.perf_counter())

        await asyncio.gather(*(one() for _ in range(40)))
        return guard, sorted(times)

    guard, times = run(go())
    assert 3 <= len(times) <= 11  # 0.5 s at 20/s; fewer only if this host is very busy
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.0499  # never two starts closer than 1/20 s, however late a wake-up was
    assert times[-1] - guard.started < 0.5


def test_the_deadline_cuts_open_streams(fake):
    async def go():
        runner, url = await _start(fake)
        try:
            async with StreamingClient(url, "fake") as client:
                driver = Driver(client, BudgetGuard(ActiveBudget(10, 0.4)))
                t0 = time.perf_counter()
                record = await driver.send(RequestSpec("long", "ok:20", 1000))
                return record, time.perf_counter() - t0
        finally:
            await runner.cleanup()

    record, took = run(go())
    assert record.fault is FaultKind.STOPPED_BY_CLIENT and took < 1.0
    assert "deadline" in record.fault_detail


def test_on_sent_sees_the_real_send_time_after_a_wait_for_the_budget(fake):
    # The fake server is enough here: what is tested is the client's own clock, not the engine.
    async def go():
        runner, url = await _start(fake)
        try:
            async with StreamingClient(url, "fake") as client:
                driver = Driver(client, BudgetGuard(ActiveBudget(10, 5, max_rps=5)))
                seen: dict[str, float] = {}
                due = time.perf_counter()
                records = await asyncio.gather(
                    *(
                        driver.send(
                            RequestSpec(f"r{i}", "ok:2", 2), on_sent=lambda t, i=i: seen.__setitem__(f"r{i}", t)
                        )
                        for i in range(3)
                    )
                )
                plain = await driver.send(RequestSpec("no-hook", "ok:2", 2))
                return due, seen, records, plain, driver._on_sent
        finally:
            await runner.cleanup()

    due, seen, records, plain, hooks = run(go())
    assert {r.request_id: r.t_send for r in records} == seen  # exactly the record's send time
    assert max(seen.values()) - due >= 0.39  # the third waited two 1/5 s slots for the rate limit
    assert plain.fault is None and hooks == {}  # no hook left behind


def test_arrival_processes():
    poisson = arrival_offsets(PoissonArrivals(10.0, seed=1), 2000)
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert abs(sum(gaps) / len(gaps) - 0.1) < 0.01
    assert arrival_offsets(ConstantArrivals(4.0), 3) == (0.0, 0.25, 0.5)
    assert arrival_offsets(TraceArrivals((100.0, 101.0, 103.0), speedup=2.0), 3) == (0.0, 0.5, 1.5)


def test_open_loop_workload_runs_at_its_rate(fake):
    async def go():
        runner, url = await _start(fake)
        try:
            async with StreamingClient(url, "fake") as client:
                driver = Driver(client, BudgetGuard(ActiveBudget(50, 10)))
                wl = synthetic_workload(
                    PromptMaker(), 6, LengthDist.fixed(4), LengthDist.fixed(3), pacing=ConstantArrivals(10.0)
                )
                return await driver.run(wl)
        finally:
            await runner.cleanup()

    records = run(go())
    starts = sorted(r.t_send for r in records)
    assert len(records) == 6 and all(r.completed for r in records)
    assert starts[-1] - starts[0] == pytest.approx(0.5, abs=0.08)


# --- workloads -------------------------------------------------------------------------------------------
def test_length_distributions():
    rng = random.Random(0)
    assert {LengthDist.fixed(7).sample(rng) for _ in range(10)} == {7}
    u = [LengthDist.uniform(5, 9).sample(rng) for _ in range(500)]
    assert min(u) == 5 and max(u) == 9
    h = [LengthDist.heavy_tailed(100, 1.5, 1, 100000).sample(rng) for _ in range(20000)]
    mean = sum(h) / len(h)
    cv = (sum((x - mean) ** 2 for x in h) / len(h)) ** 0.5 / mean
    assert 90 <= sorted(h)[len(h) // 2] <= 110 and 1.2 < cv < 1.8


EXACT = PromptMaker(token_pool=tuple(range(10, 500)), tokens_per_word=1.0, calibrated=True, source="test")


def test_shared_prefix_workload_shares_exactly_the_prefix_and_salting_removes_it():
    wl = shared_prefix_workload(
        EXACT,
        groups=2,
        per_group=3,
        prefix_tokens=256,
        suffix_len=LengthDist.fixed(32),
        output_len=LengthDist.fixed(8),
        seed=1,
    )
    by_group: dict[str, list] = {}
    for s in wl.specs:
        by_group.setdefault(s.tag, []).append(s.prompt)
        assert len(s.prompt) == 256 + 32 and s.planned_prompt_tokens == 288
    g0, g1 = by_group["group-0"], by_group["group-1"]
    assert all(p[:256] == g0[0][:256] for p in g0) and g0[0][:256] != g1[0][:256]
    assert len({p[256:] for p in g0}) == 3  # distinct suffixes
    salted = shared_prefix_workload(
        EXACT,
        groups=1,
        per_group=3,
        prefix_tokens=256,
        suffix_len=LengthDist.fixed(32),
        output_len=LengthDist.fixed(8),
        salted=True,
        seed=1,
    )
    firsts = {s.prompt[:NONCE_TOKENS] for s in salted.specs}
    assert len(firsts) == 3  # every request starts differently: nothing shareable
    # a new run draws a new prefix nonce, so an earlier run's cache cannot serve it
    again = shared_prefix_workload(
        EXACT, groups=1, per_group=1, prefix_tokens=256, suffix_len=LengthDist.fixed(1), output_len=LengthDist.fixed(1)
    )
    assert again.specs[0].prompt[:NONCE_TOKENS] != g0[0][:NONCE_TOKENS]


def test_text_prompts_without_a_tokenizer_are_sized_by_words():
    text = PromptMaker().body(130, random.Random(0), "chat")
    assert isinstance(text, str) and len(text.split()) == 100


# --- traces ------------------------------------------------------------------------------------------------
def test_mooncake_hash_ids_become_prompts_sharing_exactly_those_prefixes(tmp_path):
    p = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 4]},
        {"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [9, 2]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(p)
    wl = trace_workload(trace, EXACT, run_salt="s1", max_model_len=4096)
    a, b, c = (s.prompt for s in wl.specs)
    assert len(a) == 1200 and len(b) == 1100 and len(c) == 600
    assert [s.max_tokens for s in wl.specs] == [10, 20, 5]
    block = MOONCAKE_BLOCK_TOKENS
    assert a[: 2 * block] == b[: 2 * block] and a[2 * block : 2 * block + 10] != b[2 * block : 2 * block + 10]
    assert a[:block] != c[:block]  # a different first id shares nothing, even though id 2 follows
    assert arrival_offsets(wl.pacing, 3) == (0.0, 0.5, 1.5)
    scaled = trace_workload(trace, EXACT, run_salt="s1", speedup=5.0)
    assert arrival_offsets(scaled.pacing, 3) == pytest.approx((0.0, 0.1, 0.3))
    other_run = trace_workload(trace, EXACT, run_salt="s2")
    assert other_run.specs[0].prompt[:block] != a[:block]  # per-run salt: no warm cache across runs


def test_replay_of_lengths_text_and_token_ids(tmp_path):
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    wl = trace_workload(load_trace(azure), EXACT, pacing=PoissonArrivals(2.0))
    assert [len(s.prompt) for s in wl.specs] == [374, 396] and [s.max_tokens for s in wl.specs] == [44, 109]
    assert isinstance(wl.pacing, PoissonArrivals)
    at_own_times = trace_workload(load_trace(azure), EXACT)
    assert arrival_offsets(at_own_times.pacing, 2)[1] == pytest.approx(4.3145789, abs=1e-5)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "say hi", "output_length": 3, "timestamp": 2.0})
        + "\n"
        + json.dumps({"prompt_token_ids": [5, 6, 7], "output_length": 2, "timestamp": 3.0})
        + "\n"
    )
    text, ids = trace_workload(load_trace(prompts), PromptMaker(), pacing=ClosedLoop(2), endpoint="chat").specs
    assert text.prompt == "say hi" and text.endpoint == "chat" and text.max_tokens == 3
    assert ids.prompt == (5, 6, 7) and ids.endpoint == "completions"  # token ids only go to completions
    clipped = trace_workload(load_trace(azure), EXACT, pacing=ClosedLoop(1), max_model_len=400)
    assert clipped.specs[1].tag == "clipped" and len(clipped.specs[1].prompt) + clipped.specs[1].max_tokens <= 400


def test_fresh_cache_salts_every_prompt_of_a_workload_alike_and_each_workload_anew(tmp_path):
    # A goodput search sends the same trace in every trial; without a salt the server's prefix
    # cache served the second trial 63% of its prompt tokens (vllm:prefix_cache_hits_total).
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "the same system prompt then a question", "output_length": 3}]
    rows += [{"prompt": "another text", "output_length": 3}, {"prompt_token_ids": [5, 6, 7, 8], "output_length": 2}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(prompts)
    plain = trace_workload(trace, EXACT, pacing=ClosedLoop(1))
    assert [s.prompt for s in plain.specs][0] == rows[0]["prompt"]  # off by default: a replay sends the trace as it is
    one, two = (trace_workload(trace, EXACT, pacing=ClosedLoop(1), fresh_cache=True).specs for _ in range(2))
    for specs in (one, two):
        a, b, ids = specs
        salt = a.prompt.split("\n")[0]
        assert a.prompt == f"{salt}\n{rows[0]['prompt']}" and b.prompt.startswith(salt + "\n")  # one salt a workload
        # Words, sized as a body is (EXACT: a token a word): not a hex string of unknown length.
        assert len(salt.split()) == max(NONCE_WORDS, NONCE_TOKENS) == 6
        assert ids.prompt[NONCE_TOKENS:] == (5, 6, 7, 8) and len(ids.prompt) == 4 + NONCE_TOKENS
        assert ids.planned_prompt_tokens == 4 + NONCE_TOKENS
    assert one[0].prompt.split("\n")[0] != two[0].prompt.split("\n")[0]  # each workload anew
    assert one[2].prompt[:NONCE_TOKENS] != two[2].prompt[:NONCE_TOKENS]
    without_pool = trace_workload(trace, PromptMaker(), pacing=ClosedLoop(1), fresh_cache=True).specs[2].prompt
    assert set(without_pool[:NONCE_TOKENS]) <= {5, 6, 7, 8}  # ids of the trace's own where the maker knows none


def test_fresh_cache_leaves_hash_id_bodies_their_length_and_draws_them_anew(tmp_path):
    p = tmp_path / "mooncake.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [1, 2]}) + "\n")
    trace = load_trace(p)
    seeded = [trace_workload(trace, EXACT, run_salt="s1", fresh_cache=True).specs[0].prompt for _ in range(2)]
    assert [len(x) for x in seeded] == [1000, 1000]  # no salt in front: the body is drawn from a fresh one
    assert seeded[0][:MOONCAKE_BLOCK_TOKENS] != seeded[1][:MOONCAKE_BLOCK_TOKENS]  # even where run_salt is given
    kept = [trace_workload(trace, EXACT, run_salt="s1").specs[0].prompt for _ in range(2)]
    assert kept[0] == kept[1]  # without fresh_cache a run_salt still fixes the bodies


# --- plan ---------------------------------------------------------------------------------------------------
def test_plan_fits_the_budget_and_says_what_it_will_send():
    plan = plan_experiments(
        ActiveBudget(max_requests=30, max_seconds=25, max_rps=5),
        max_model_len=1024,
        target="http://127.0.0.1:8000",
        model="tiny",
    )
    assert plan.requests <= 30 and plan.duration_bound_s <= 25
    text = describe_plan(plan)
    assert "/v1/completions" in text and "http://127.0.0.1:8000" in text and "at most 30 requests" in text
    assert "5 requests/s" in text and "hard bound" in text
    for name, step in plan.steps:
        assert name in text and f"at most {step.requests} requests" in text
    tiny = plan_experiments(ActiveBudget(max_requests=6, max_seconds=60))
    assert tiny.requests <= 6 and tiny.skipped and "will not run" in describe_plan(tiny)
    with pytest.raises(ValueError, match="known: decode"):
        plan_experiments(ActiveBudget(), ("nonsense",))


def test_plan_lengths_fit_the_context():
    plan = plan_experiments(ActiveBudget(), max_model_len=512)
    for _, step in plan.steps:
        for field in ("prompt_tokens", "output_tokens", "long_tokens", "prefix_tokens", "stream_output_tokens"):
            value = getattr(step, field, 0)
            values = value if isinstance(value, tuple) else (value,)
            assert all(v < 512 for v in values), (step, field)


def test_ratio_interval_covers_the_true_ratio():
    rng = random.Random(3)
    num = [rng.lognormvariate(0, 0.3) * 2.0 for _ in range(60)]
    den = [rng.lognormvariate(0, 0.3) for _ in range(200)]
    value, summary = ratio_with_bootstrap_ci(num, den)
    assert summary.ci_low < value < summary.ci_high
    assert summary.ci_low < 2.0 < summary.ci_high


@pytest.mark.real_engine
def test_each_request_records_its_http_phases_against_a_real_vllm(vllm_server, tmp_path):
    """aiohttp's request tracing, per request: a first request opens a connection, the next one
    reuses it, and with one connection for two concurrent requests the second waits for the
    client's own pool (then its TTFT holds a client-side queue). Every phase comes before the
    first token, and the phases survive requests.jsonl."""
    from llm_diagnose.probes.load.records import read_records

    def spec(i: int) -> RequestSpec:
        return RequestSpec(f"p{i}", f"Tell me about the number {i}.", 24, ignore_eos=True)

    async def go():
        writer = JsonlWriter(tmp_path / "requests.jsonl")
        async with StreamingClient(
            vllm_server.url, vllm_server.model_name, max_streams=1, on_record=lambda r: writer.write(r.to_dict())
        ) as client:
            first = await client.send(spec(0))
            second = await client.send(spec(1))
            both = await asyncio.gather(client.send(spec(2)), client.send(spec(3)))
        writer.close()
        return first, second, both

    first, second, (a, b) = asyncio.run(go())
    for r in (first, second, a, b):
        assert r.completed and r.http is not None, r
        h = r.http
        assert h.headers_sent_s is not None and h.response_headers_s is not None, h
        assert h.headers_sent_s <= h.response_headers_s <= r.ttft_s <= r.t_end, (h, r.ttft_s, r.t_end)
    assert first.http.reused is False and first.http.connect_s is not None and first.http.connect_s > 0
    assert second.http.reused is True and second.http.connect_s is None
    waited = max(a, b, key=lambda r: r.http.pool_wait_s or 0.0)
    other = b if waited is a else a
    # One connection: the second of two concurrent requests waited for the first to end.
    assert waited.http.pool_wait_s is not None and waited.http.pool_wait_s >= 0.5 * other.t_end, (a.http, b.http)
    again = {r.request_id: r.http.to_dict() for r in read_records(tmp_path / "requests.jsonl") if r.http}
    assert again == {r.request_id: r.http.to_dict() for r in (first, second, a, b)}  # as written: rounded to 0.1 us


def test_http_phases_round_trip_and_a_damaged_one_is_another_schema():
    from llm_diagnose.probes.load.records import HttpPhases, RecordSchemaError, parse_record_line

    phases = HttpPhases(pool_wait_s=0.25, connect_s=None, reused=True, headers_sent_s=0.2501, response_headers_s=0.3)
    line = RequestRecord("r", "e", "", "", "completions", 1.0, 2.0, (0.4,), t_end=0.5, http=phases).to_dict()
    assert line["http"] == {"pool_wait_s": 0.25, "reused": True, "headers_sent_s": 0.2501, "response_headers_s": 0.3}
    back = parse_record_line(json.dumps(line))
    assert back is not None and back.http == phases
    assert parse_record_line(json.dumps({**line, "http": None})).http is None  # written before phases were
    with pytest.raises(RecordSchemaError):
        parse_record_line(json.dumps({**line, "http": [0.25]}))
