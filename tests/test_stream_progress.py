"""A hung engine is a server fault, not a healthy quiet one (issue 22, item 2); a chunk that is
not an OpenAI stream chunk is the server's fault, not a client error or a traceback.

Progress is tokens: a stream whose response headers came and that then delivered no token (at
most `: ping` comments) within the no-progress bound, while no other stream got one either, is
`no-progress`; SSE comments reset neither the idle timeout nor the stall rule's clock.

Every server here is FAKE, on 127.0.0.1, because a real engine cannot do these things on demand:
hang after accepting a request (headers, then nothing or keep-alive comments only), send bytes
that are not JSON or JSON nested 100,000 deep (a broken proxy or a buggy server), or stream at
an exact slow cadence with an exact first-token delay. Bounds are passed small through
StreamTimeouts so that the file runs in seconds; the healthy slow stream runs under the
product's default bounds, the ones a real slow server meets.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from llm_diagnose.probes.load import ActiveBudget, BudgetGuard, Driver, FaultKind, RequestSpec, StreamingClient
from llm_diagnose.probes.load.active_run import run_summary
from llm_diagnose.probes.load.client import NO_PROGRESS_S, NO_PROGRESS_TTFT_FACTOR, StreamTimeouts
from llm_diagnose.probes.load.records import Endpoint, RequestRecord, parse_record_line
from llm_diagnose.probes.load.sse import read_chunk
from llm_diagnose.probes.results import Measurement
from tests.test_safety_client import _serve

PING_EVERY_S = 0.2
DEEP = 100_000


def _token(text: str = "x", finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


_END = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}\n\ndata: [DONE]\n\n'

# The bad chunk each "bad:<name>" prompt sends after one good token.
BAD_CHUNKS = {
    "not-json": b"{not json",
    "deep-array": b"[" * DEEP + b"]" * DEEP,
    "deep-object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "a-list": b"[1, 2]",
    "choices-of-numbers": b'{"choices":[1]}',
    "choices-a-string": b'{"choices":"abc"}',
    "usage-a-string": b'{"choices":[],"usage":"many"}',
    "finish-an-object": b'{"choices":[{"text":"a","finish_reason":{"why":1}}]}',
}


async def _engine(request: web.Request) -> web.StreamResponse:
    """FAKE engine; what it does is the prompt's first word."""
    body = await request.json()
    chat = "messages" in body
    word, _, arg = str(body["messages"][0]["content"] if chat else body["prompt"]).partition(":")
    if word == "no-headers":  # still queued before the HTTP layer answers: not a byte yet
        await asyncio.sleep(30)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if word == "nothing":  # a hung engine behind a live HTTP layer: headers, then nothing
        await asyncio.sleep(30)
    elif word == "pings":  # the same, with an SSE keep-alive comment every PING_EVERY_S
        for _ in range(150):
            await resp.write(b": ping\n\n")
            await asyncio.sleep(PING_EVERY_S)
    elif word == "tokens-then-pings":  # hung mid-response, the HTTP layer still pinging
        for _ in range(3):
            await resp.write(_token())
            await asyncio.sleep(0.01)
        for _ in range(150):
            await resp.write(b": ping\n\n")
            await asyncio.sleep(PING_EVERY_S)
    elif word == "slow":  # healthy but slow: first token after 1.5 s, then one every 0.3 s
        await asyncio.sleep(1.5)
        for i in range(int(arg or 5)):
            await resp.write(_token(finish="length" if i == int(arg or 5) - 1 else None))
            await asyncio.sleep(0.3)
        await resp.write(_END)
    elif word == "first-after":  # one token after `arg` seconds, then done
        await asyncio.sleep(float(arg))
        await resp.write(_token(finish="length") + _END)
    elif word == "flowing":  # a token every 50 ms, for as long as the client reads
        for _ in range(600):
            await resp.write(_token())
            await asyncio.sleep(0.05)
    elif word == "bad":
        await resp.write(_token() + b"data: " + BAD_CHUNKS[arg] + b"\n\n" + _token(finish="length") + _END)
    elif word == "chat-bad-delta":
        await resp.write(b'data: {"choices":[{"delta":"oops","finish_reason":null}]}\n\n' + _END)
    elif word == "absurd-usage":  # numbers json.loads takes but no count is: inf, NaN
        usage = b'{"choices":[],"usage":{"prompt_tokens":1e999,"completion_tokens":NaN}}'
        await resp.write(_token(finish="length") + b"data: " + usage + b"\n\ndata: [DONE]\n\n")
    return resp


async def _with_engine(test):
    runner, url, _ = await _serve([("POST", "/v1/completions", _engine), ("POST", "/v1/chat/completions", _engine)])
    try:
        return await test(url)
    finally:
        await runner.cleanup()


def _send(prompt: str, timeouts: StreamTimeouts, endpoint: Endpoint = "completions") -> RequestRecord:
    async def test(url: str) -> RequestRecord:
        async with StreamingClient(url, "fake", timeouts=timeouts) as client:
            return await client.send(RequestSpec(prompt, prompt, 100, endpoint))

    return asyncio.run(_with_engine(test))


def _stopped_after(seconds: float, prompt: str, timeouts: StreamTimeouts) -> RequestRecord:
    """The record of a stream the driver stops after `seconds` (an experiment's phase over)."""

    async def test(url: str) -> RequestRecord:
        async with StreamingClient(url, "fake", timeouts=timeouts) as client:
            driver = Driver(client, BudgetGuard(ActiveBudget(5, 30)))
            driver.start(RequestSpec(prompt, prompt, 100))
            await asyncio.sleep(seconds)
            await driver.stop_all("phase over")
            return driver.records[0]

    return asyncio.run(_with_engine(test))


def _round_trip(record: RequestRecord) -> RequestRecord:
    """The record as requests.jsonl holds it and a run-folder reader reads it back."""
    back = parse_record_line(json.dumps(record.to_dict(), allow_nan=False))
    assert back is not None
    return back


# --- a hung engine -----------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", ["nothing", "pings"])
def test_headers_then_no_token_is_no_progress_at_the_bound(prompt):
    record = _send(prompt, StreamTimeouts(no_progress_s=0.5, idle_s=30, total_s=20))
    assert record.fault is FaultKind.NO_PROGRESS and record.server_fault, (record.fault, record.fault_detail)
    assert record.http_status == 200 and not record.event_times and not record.completed
    assert (
        "no-progress bound 0.5 s" in record.fault_detail
        and "comments and keep-alives do not count" in record.fault_detail
    )
    assert record.t_end is not None and record.t_end >= 0.5  # never before the bound
    assert _round_trip(record).fault is FaultKind.NO_PROGRESS  # a kind the run-folder reader knows


def test_comments_do_not_reset_the_idle_timeout():
    # Before: every read, a comment too, reset the idle clock, and this stream ran to its total timeout.
    record = _send("tokens-then-pings", StreamTimeouts(idle_s=0.8, total_s=10))
    assert record.fault is FaultKind.TIMEOUT_IDLE, (record.fault, record.fault_detail)
    assert len(record.event_times) == 3 and "no token between two tokens" in record.fault_detail


def test_a_stream_that_only_pings_after_its_tokens_is_stalled_when_ended():
    # Before: the pings counted as the server sending, so the client's stop read as ours, not a stall.
    record = _stopped_after(1.0, "tokens-then-pings", StreamTimeouts(stall_s=0.4))
    assert record.fault is FaultKind.STALLED and len(record.event_times) == 3, (record.fault, record.fault_detail)
    assert "phase over" in record.fault_detail


def test_a_slow_healthy_stream_is_not_a_fault_under_the_default_bounds():
    """A real slow server: first token after 1.5 s, then one every 0.3 s. Completed, or stopped
    by the client mid-flow: never no-progress, stalled or timed out."""

    async def test(url: str) -> tuple[RequestRecord, RequestRecord, float]:
        async with StreamingClient(url, "fake") as whole, StreamingClient(url, "fake") as stopped:
            driver = Driver(stopped, BudgetGuard(ActiveBudget(5, 30)))
            driver.start(RequestSpec("cut-short", "slow:20", 100))
            completed = await whole.send(RequestSpec("whole", "slow:5", 100))
            await driver.stop_all("phase over")
            return completed, driver.records[0], whole.no_progress_bound_s

    completed, stopped, bound = asyncio.run(_with_engine(test))
    assert completed.completed and completed.fault is None and len(completed.event_times) == 5, completed.fault_detail
    assert stopped.fault is FaultKind.STOPPED_BY_CLIENT and len(stopped.event_times) >= 2, stopped.fault_detail
    # What the run learnt of this server raises the bound: 4 x its slowest first token, if over the floor.
    assert completed.ttft_s is not None
    assert bound == pytest.approx(max(NO_PROGRESS_S, NO_PROGRESS_TTFT_FACTOR * completed.ttft_s))


def test_the_bound_grows_with_the_slowest_first_token_seen():
    async def test(url: str) -> tuple[RequestRecord, RequestRecord, float]:
        async with StreamingClient(url, "fake", timeouts=StreamTimeouts(no_progress_s=0.5, idle_s=30)) as client:
            first = await client.send(RequestSpec("first", "first-after:0.2", 100))
            bound = client.no_progress_bound_s
            hung = await client.send(RequestSpec("hung", "nothing", 100))
            return first, hung, bound

    first, hung, bound = asyncio.run(_with_engine(test))
    assert first.completed and first.ttft_s is not None and first.ttft_s >= 0.2, first.fault_detail
    assert bound == pytest.approx(NO_PROGRESS_TTFT_FACTOR * first.ttft_s) and bound > 0.5  # not the floor
    assert hung.fault is FaultKind.NO_PROGRESS and f"no-progress bound {bound:.1f} s" in hung.fault_detail
    assert hung.t_end is not None and hung.t_end >= bound


def test_a_first_request_may_wait_longer_for_its_first_token_inside_a_raised_floor():
    # The calibration request: nothing is known of the server yet, and a fresh CPU vLLM serving
    # another client's streams held its first token past the 5 s floor (issue 26's live test).
    async def test(url: str) -> tuple[RequestRecord, RequestRecord, float]:
        async with StreamingClient(url, "fake", timeouts=StreamTimeouts(no_progress_s=0.5, idle_s=30)) as client:
            with client.no_progress_floor(3.0):
                inside = await client.send(RequestSpec("first", "first-after:1.2", 100))
            after = client.timeouts.no_progress_s
            cut = await client.send(RequestSpec("hung", "nothing", 100))
            return inside, cut, after

    inside, cut, after = asyncio.run(_with_engine(test))
    assert inside.completed and inside.ttft_s is not None and inside.ttft_s >= 1.2, inside.fault_detail
    assert after == 0.5  # the floor is the client's own again once the block ends
    # ... and then grows with the first token it saw (4 x 1.2 s), as for any stream.
    assert cut.fault is FaultKind.NO_PROGRESS and cut.t_end is not None and cut.t_end >= 4 * 1.2


def test_a_stream_queued_behind_flowing_streams_is_not_no_progress():
    """Headers and no token while another stream of the client flows: queued behind it (a
    one-at-a-time server), not hung. Once nothing flows for the bound, it is no-progress."""

    async def test(url: str) -> dict[str, RequestRecord]:
        records: dict[str, RequestRecord] = {}
        timeouts = StreamTimeouts(no_progress_s=0.3, idle_s=30, total_s=20)
        async with StreamingClient(url, "fake", timeouts=timeouts) as client:
            client.on_record = lambda r: records.update({r.request_id: r})
            flowing = asyncio.create_task(client.send(RequestSpec("flowing", "flowing", 500)))
            waiting = asyncio.create_task(client.send(RequestSpec("waiting", "nothing", 100)))
            await asyncio.sleep(1.2)  # four bounds: the waiting one would be no-progress on its own
            assert not waiting.done(), waiting.result().fault_detail
            flowing.cancel("phase over")
            await asyncio.gather(flowing, waiting, return_exceptions=True)
        return records

    records = asyncio.run(_with_engine(test))
    waiting, flowing = records["waiting"], records["flowing"]
    assert flowing.fault is FaultKind.STOPPED_BY_CLIENT and len(flowing.event_times) > 5
    assert waiting.fault is FaultKind.NO_PROGRESS, (waiting.fault, waiting.fault_detail)
    # Judged only once the other stream's tokens had stopped for the bound.
    last_token = flowing.t_send + flowing.event_times[-1]
    assert waiting.t_end is not None and waiting.t_send + waiting.t_end >= last_token + 0.3


def test_a_stream_still_waiting_for_headers_is_queueing():
    record = _stopped_after(1.0, "no-headers", StreamTimeouts(no_progress_s=0.3, idle_s=30))
    assert record.fault is FaultKind.STOPPED_BY_CLIENT and record.http_status is None, record.fault_detail


def test_a_hung_engine_shows_in_the_runs_fault_summary():
    async def test(url: str) -> dict:
        timeouts = StreamTimeouts(no_progress_s=0.3, idle_s=30)
        async with StreamingClient(url, "fake", timeouts=timeouts) as client:
            driver = Driver(client, BudgetGuard(ActiveBudget(5, 30)))
            for i in range(2):
                await driver.send(RequestSpec(f"r{i}", "pings", 100))
            return run_summary(driver, "fake", 1.0)

    failed = asyncio.run(_with_engine(test))["active.failed_request_fraction"]
    assert isinstance(failed, Measurement) and failed.value == 1.0
    assert "2 no-progress" in failed.note and "faults: none" not in failed.note


# --- chunks that are not stream chunks ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BAD_CHUNKS))
def test_a_chunk_that_is_not_a_stream_chunk_is_malformed(name):
    record = _send(f"bad:{name}", StreamTimeouts(idle_s=10, total_s=20))
    assert record.fault is FaultKind.MALFORMED and record.server_fault, (record.fault, record.fault_detail)
    assert len(record.event_times) == 1  # the token before it is kept
    assert "event after 1 tokens" in record.fault_detail and len(record.fault_detail) < 300
    assert _round_trip(record).fault is FaultKind.MALFORMED


def test_a_chat_delta_that_is_not_an_object_is_malformed():
    record = _send("chat-bad-delta", StreamTimeouts(idle_s=10, total_s=20), endpoint="chat")
    assert record.fault is FaultKind.MALFORMED and "delta is str" in record.fault_detail, record.fault_detail


def test_usage_numbers_that_are_no_count_are_left_out():
    record = _send("absurd-usage", StreamTimeouts(idle_s=10, total_s=20))
    assert record.completed and record.prompt_tokens is None and record.completion_tokens is None
    assert _round_trip(record).completed  # and the record still writes as strict JSON


def test_read_chunk_names_what_is_wrong_with_a_chunk():
    assert read_chunk([1], chat=False).malformed == "chunk is list, not an object"
    assert read_chunk({"choices": [None]}, chat=False).malformed == "a choice is NoneType, not an object"
    assert read_chunk({"choices": {"0": {}}}, chat=True).malformed == "choices is dict, not a list"
    good = read_chunk({"choices": [{"text": "a", "finish_reason": None}]}, chat=False)
    assert good.malformed is None and good.is_token
