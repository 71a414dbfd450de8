"""Replaying an earlier run (`run --active --replay`): reading the source, planning it within the
budget, the bodies it sends, and the run against a loopback fake (no real engine)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from aiohttp import web

from llm_diagnose.diagnose import cli
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.prompts import PromptMaker
from llm_diagnose.probes.load.records import INPUTS_FILE, REQUESTS_FILE, RequestRecord
from llm_diagnose.probes.load.replay_inputs import (
    REPLAY_EXPERIMENT,
    ReplayError,
    plan_replay,
    read_replay_source,
    replay_workload,
    run_replay,
)

BIG = ActiveBudget(max_requests=1000, max_seconds=600)


def _input(rid, offset, body, *, send=1, experiment="decode", phase="steady", path="/v1/completions") -> dict:
    return {
        "request_id": rid,
        "send": send,
        "experiment": experiment,
        "phase": phase,
        "t_offset_s": offset,
        "method": "POST",
        "path": path,
        "body": body,
    }


def _body(prompt, max_tokens=4, model="tiny-llama", **extra) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    body["prompt"] = prompt
    body["ignore_eos"] = True
    body.update(extra)
    return body


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _inputs(tmp_path: Path) -> Path:
    return _write_jsonl(
        tmp_path / INPUTS_FILE,
        [
            _input("decode-0", 1.25, _body([5, 6, 7], 8)),
            _input("decode-1", 1.75, _body("hello there", 3, temperature=0.5), phase="probe"),
            _input("decode-1", 1.80, _body("hello there", 3, temperature=0.5), send=2, phase="probe"),  # a resend
            _input(
                "chat-0",
                2.5,
                {
                    "model": "tiny-llama",
                    "max_tokens": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": "q"}],
                },
                experiment="prefix",
                phase="",
                path="/v1/chat/completions",
            ),
        ],
    )


def _record(rid, t_send, *, planned=None, prompt=None, completion=None, endpoint="completions", **kw) -> dict:
    return RequestRecord(
        request_id=rid,
        experiment=kw.get("experiment", "interference"),
        phase=kw.get("phase", "solo"),
        tag="",
        endpoint=endpoint,
        t_send=t_send,
        t_send_wall=1.7e9 + t_send,
        event_times=tuple(0.01 * i for i in range(kw.get("events", 0))),
        http_status=200,
        prompt_tokens=prompt,
        planned_prompt_tokens=planned,
        completion_tokens=completion,
        finish_reason="length",
    ).to_dict()


# --- reading ------------------------------------------------------------------------------------
def test_inputs_are_read_in_send_order_from_the_first_send_with_relative_offsets(tmp_path):
    source = read_replay_source(_inputs(tmp_path))
    assert source.kind == "inputs"
    assert [r.request_id for r in source.requests] == ["decode-0", "decode-1", "chat-0"]
    assert [r.offset_s for r in source.requests] == [0.0, 0.5, 1.25]  # from the first request, not the run start
    assert source.resends_skipped == 1
    assert [r.endpoint for r in source.requests] == ["completions", "completions", "chat"]
    assert [r.phase_label for r in source.requests] == ["decode/steady", "decode/probe", "prefix"]


def test_a_folder_replays_its_inputs_and_falls_back_to_its_requests(tmp_path):
    _inputs(tmp_path)
    _write_jsonl(tmp_path / REQUESTS_FILE, [_record("a", 10.0, planned=5, completion=2)])
    assert read_replay_source(tmp_path).kind == "inputs"
    (tmp_path / INPUTS_FILE).unlink()
    assert read_replay_source(tmp_path).kind == "requests"


def test_requests_give_lengths_at_their_send_times(tmp_path):
    path = _write_jsonl(
        tmp_path / REQUESTS_FILE,
        [  # written as they completed: not in send order
            _record("b", 12.5, planned=30, prompt=31, completion=7),
            _record("a", 10.0, prompt=20, completion=None, events=3, phase=""),
            _record("c", 11.0, completion=4),  # no prompt length at all: cannot be replayed
        ],
    )
    source = read_replay_source(path)
    assert [(r.request_id, r.offset_s) for r in source.requests] == [("a", 0.0), ("b", 2.5)]
    a, b = source.requests
    assert (a.prompt_tokens, a.output_tokens) == (20, 3)  # no usage: the events received
    assert (b.prompt_tokens, b.output_tokens) == (30, 7)  # the planned length before the server's count
    assert len(source.skipped) == 1 and "c has no prompt length" in source.skipped[0]


@pytest.mark.parametrize(
    ("content", "why"),
    [(None, "no such file"), ("", "no request to replay"), ("\n\n", "no request"), ("{}\n", "no request")],
)
def test_missing_or_empty_sources_are_refused(tmp_path, content, why):
    path = tmp_path / "inputs.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReplayError, match=why):
        read_replay_source(path)


def test_an_unknown_format_is_refused_in_one_line(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("this is not a trace\nnor anything else\n")
    with pytest.raises(ReplayError, match="neither inputs.jsonl, requests.jsonl nor a known trace") as err:
        read_replay_source(path)
    assert "\n" not in str(err.value)


def test_a_folder_without_run_files_is_refused(tmp_path):
    with pytest.raises(ReplayError, match="no inputs.jsonl or requests.jsonl"):
        read_replay_source(tmp_path)


# --- planning -----------------------------------------------------------------------------------
def test_the_budget_cuts_by_count_and_by_time_and_says_how_many(tmp_path):
    rows = [_input(f"r{i}", 0.5 * i, _body([1, 2], 2)) for i in range(10)]  # offsets 0 .. 4.5 s
    source = read_replay_source(_write_jsonl(tmp_path / INPUTS_FILE, rows))
    by_count = plan_replay(source, ActiveBudget(max_requests=4, max_seconds=60), "tiny-llama")
    assert [r.request_id for r in by_count.requests] == ["r0", "r1", "r2", "r3"]
    assert by_count.cut == 6 and "6 requests of the source will not be sent" in by_count.describe()
    by_time = plan_replay(source, ActiveBudget(max_requests=100, max_seconds=2.0), "tiny-llama")
    assert [r.offset_s for r in by_time.requests] == [0.0, 0.5, 1.0, 1.5]
    assert by_time.cut == 6 and "after the budget's 2 s" in by_time.cut_reason


def test_lengths_only_sources_keep_a_budget_slot_for_tokenize(tmp_path):
    rows = [_record(f"r{i}", float(i), planned=8, completion=2) for i in range(5)]
    source = read_replay_source(_write_jsonl(tmp_path / REQUESTS_FILE, rows))
    plan = plan_replay(source, ActiveBudget(max_requests=5, max_seconds=60), "m")
    assert plan.needs_prompts and plan.count == 4 and plan.cut == 1


def test_the_announcement_names_the_count_span_and_source(tmp_path):
    path = _inputs(tmp_path)
    text = plan_replay(read_replay_source(path), BIG, "tiny-llama").describe()
    assert f"replay: 3 requests over 1.2 s, the recorded request bodies, at their recorded times, from {path}" in text
    assert "1 recorded resends are not replayed" in text


# --- what is sent -------------------------------------------------------------------------------
def _payloads(plan, model="ignored", drop=frozenset()):
    return [s.payload(model, drop) for s in replay_workload(plan).specs]


def test_the_bodies_sent_are_the_recorded_ones(tmp_path):
    source = read_replay_source(_inputs(tmp_path))
    plan = plan_replay(source, BIG, "tiny-llama")
    assert _payloads(plan) == [dict(r.body) for r in source.requests]
    workload = replay_workload(plan)
    assert [s.experiment for s in workload.specs] == [REPLAY_EXPERIMENT] * 3
    assert [s.phase for s in workload.specs] == ["decode/steady", "decode/probe", "prefix"]
    assert [s.request_id for s in workload.specs] == ["decode-0", "decode-1", "chat-0"]
    assert workload.pacing.times_s == (0.0, 0.5, 1.25)


def test_the_model_name_is_the_targets_and_the_plan_says_so(tmp_path):
    source = read_replay_source(_inputs(tmp_path))
    plan = plan_replay(source, BIG, "other-model")
    assert {p["model"] for p in _payloads(plan)} == {"other-model"}
    assert "name model tiny-llama; the target serves other-model" in plan.describe()
    for sent, recorded in zip(_payloads(plan), source.requests):
        assert {**sent, "model": "tiny-llama"} == dict(recorded.body)
    unknown = plan_replay(source, BIG, None)  # the target names none: the recorded name stays
    assert {p["model"] for p in _payloads(unknown)} == {"tiny-llama"}
    assert "target serves" not in unknown.describe()


def test_a_rejected_extension_can_still_be_dropped_by_the_client(tmp_path):
    source = read_replay_source(_inputs(tmp_path))
    sent = _payloads(plan_replay(source, BIG, "tiny-llama"), drop={"ignore_eos", "stream_options"})
    assert all("ignore_eos" not in p and "stream_options" not in p for p in sent)


def test_a_body_without_the_extensions_gets_none_added(tmp_path):
    body = {"model": "m", "max_tokens": 3, "stream": True, "prompt": "x y"}  # the original server refused them
    source = read_replay_source(_write_jsonl(tmp_path / INPUTS_FILE, [_input("a", 0.0, body)]))
    spec = replay_workload(plan_replay(source, BIG, "m")).specs[0]
    assert spec.payload("m", frozenset({"stream_options"})) == body
    assert not spec.ignore_eos


def test_lengths_only_replays_build_prompts_of_the_recorded_lengths(tmp_path):
    rows = [
        _record("a", 0.0, planned=12, completion=5),
        _record("b", 0.4, planned=3, completion=9, endpoint="chat", experiment="prefix", phase="warm"),
    ]
    plan = plan_replay(read_replay_source(_write_jsonl(tmp_path / REQUESTS_FILE, rows)), BIG, "m")
    prompts = PromptMaker(token_pool=tuple(range(100, 200)), calibrated=True)
    specs = replay_workload(plan, prompts).specs
    assert isinstance(specs[0].prompt, tuple) and len(specs[0].prompt) == 12  # token ids: exact length
    assert [(s.max_tokens, s.ignore_eos, s.endpoint) for s in specs] == [(5, True, "completions"), (9, True, "chat")]
    assert [s.phase for s in specs] == ["interference/solo", "prefix/warm"]
    clipped = replay_workload(plan, prompts, max_model_len=14).specs[0]
    assert (clipped.max_tokens, clipped.tag) == (2, "clipped")


def test_a_trace_goes_through_the_trace_workload(tmp_path):
    path = _write_jsonl(
        tmp_path / "trace.jsonl",
        [{"timestamp": 1000 * i, "input_length": 600, "output_length": 4, "hash_ids": [i, i + 1]} for i in range(5)],
    )
    source = read_replay_source(path, trace_limit=3)
    assert (
        source.kind == "trace"
        and source.trace_format == "mooncake"
        and len(source.trace) == 3
        and source.trace_more == 1
    )
    plan = plan_replay(source, ActiveBudget(max_requests=3, max_seconds=60), "m")
    assert plan.count == 2 and plan.cut == 2  # one slot for POST /tokenize
    assert "2 or more requests of the source will not be sent" in plan.describe()  # the rest was never read
    workload = replay_workload(plan, PromptMaker(token_pool=tuple(range(100, 200))))
    assert [s.experiment for s in workload.specs] == [REPLAY_EXPERIMENT] * 2


# --- the CLI: bad input sends nothing -----------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--active", "--replay", "MISSING"], "no such file"),
        (["--replay", "INPUTS"], "add --active"),
        (["--active", "--replay", "INPUTS", "--experiments", "decode"], "drop --experiments"),
    ],
)
def test_bad_replay_usage_exits_2_before_anything_is_contacted(tmp_path, capsys, extra, message):
    inputs = _inputs(tmp_path)
    args = [a.replace("MISSING", str(tmp_path / "nope.jsonl")).replace("INPUTS", str(inputs)) for a in extra]
    out = tmp_path / "after"
    # Port 9 (discard) on loopback: nothing listens, and nothing may be asked before the error.
    code = cli.main(["run", "--url", "http://127.0.0.1:9", "--out", str(out), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


# --- against a loopback fake --------------------------------------------------------------------
class RecordingServer:
    """Streams `max_tokens` tokens for any request; keeps every body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens", 1))
        chat = "messages" in body
        for i in range(n):
            finish = "length" if i == n - 1 else None
            choice = {"index": 0, "finish_reason": finish}
            choice.update({"delta": {"content": "t"}} if chat else {"text": "t"})
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp


def test_a_replay_sends_the_recorded_bodies_and_writes_the_run_files(tmp_path):
    server = RecordingServer()
    source = read_replay_source(_inputs(tmp_path))
    plan = plan_replay(source, ActiveBudget(max_requests=2, max_seconds=30), "tiny-llama")  # cut to two
    out = tmp_path / "after"

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", server.handle)
        app.router.add_post("/v1/chat/completions", server.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            return await run_replay(url, plan, ActiveBudget(max_requests=2, max_seconds=30), out)
        finally:
            await runner.cleanup()

    results = asyncio.run(go())
    assert server.bodies == [dict(r.body) for r in source.requests[:2]]
    inputs = [json.loads(line) for line in (out / INPUTS_FILE).read_text().splitlines()]
    assert [i["body"] for i in inputs] == server.bodies
    assert [i["experiment"] for i in inputs] == [REPLAY_EXPERIMENT] * 2
    offsets = [i["t_offset_s"] for i in inputs]
    assert offsets[1] - offsets[0] == pytest.approx(0.5, abs=0.25)  # recorded 0.5 s apart
    records = [json.loads(line) for line in (out / REQUESTS_FILE).read_text().splitlines()]
    assert sorted(r["request_id"] for r in records) == ["decode-0", "decode-1"]
    assert all(r["finish_reason"] == "length" and r["experiment"] == REPLAY_EXPERIMENT for r in records)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    end = next(e for e in events if e.get("event") == "run-end")
    assert end["not_sent"] == 1 and end["sent"] == 2
    assert "1 requests of the source were not sent" in str(results[Q.ACTIVE_NOTES].value)


def test_random_bodies_differ_between_two_lengths_only_replays(tmp_path):
    """Two replays of one requests.jsonl must not share prompts (an earlier replay's cache cannot serve them)."""
    rows = [_record("a", 0.0, planned=16, completion=2)]
    plan = plan_replay(read_replay_source(_write_jsonl(tmp_path / REQUESTS_FILE, rows)), BIG, "m")
    prompts = PromptMaker(token_pool=tuple(range(1000, 5000)))
    random.seed(0)
    first = replay_workload(plan, prompts).specs[0].prompt
    random.seed(0)
    assert replay_workload(plan, prompts).specs[0].prompt != first


def test_a_lengths_only_replay_asks_tokenize_once_within_the_budget(tmp_path):
    server = RecordingServer()
    tokenized: list[dict] = []

    async def tokenize(request: web.Request) -> web.Response:
        tokenized.append(await request.json())
        return web.json_response({"tokens": list(range(100, 400)), "max_model_len": 2048})

    rows = [_record("a", 5.0, planned=12, completion=3), _record("b", 5.2, planned=40, completion=6, phase="")]
    rows.append(_record("c", 5.4, planned=8, completion=2))  # beyond the budget: 2 requests + POST /tokenize
    budget = ActiveBudget(max_requests=3, max_seconds=30)
    plan = plan_replay(read_replay_source(_write_jsonl(tmp_path / REQUESTS_FILE, rows)), budget, "m")
    out = tmp_path / "after"

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", server.handle)
        app.router.add_post("/tokenize", tokenize)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            return await run_replay(url, plan, budget, out)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert len(tokenized) == 1
    assert [(len(b["prompt"]), b["max_tokens"], b["ignore_eos"]) for b in server.bodies] == [
        (12, 3, True),
        (40, 6, True),
    ]
    records = [json.loads(line) for line in (out / REQUESTS_FILE).read_text().splitlines()]
    assert sorted((r["request_id"], r["phase"]) for r in records) == [("a", "interference/solo"), ("b", "interference")]
    end = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()][-1]
    assert (end["event"], end["sent"], end["not_sent"]) == ("run-end", 3, 1)


# --- punctuality -------------------------------------------------------------------------------------
def _sent(rid: str, t_send: float):
    from llm_diagnose.probes.load.records import RequestRecord

    return RequestRecord(rid, "replay", "decode", "", "completions", t_send, 0.0)


def test_a_punctual_replay_reports_its_lateness_without_a_warning():
    from llm_diagnose.probes import quantities as Q
    from llm_diagnose.probes.load.replay_punctuality import send_lateness

    offsets = {f"r{i}": 0.1 * i for i in range(10)}
    records = [_sent(f"r{i}", 100.0 + 0.1 * i + 0.002 * (i % 3)) for i in range(10)]
    m = send_lateness(offsets, records, None, "test")[Q.REPLAY_SEND_LATENESS_P50]
    assert m.value == pytest.approx(0.002) and not m.warnings and len(m.samples) == 10


def test_a_replay_whose_client_stalled_says_it_did_not_keep_time():
    """As in CI: the event loop stalled, and every send due during the stall left at its end."""
    from llm_diagnose.probes import quantities as Q
    from llm_diagnose.probes.load.health import ClientHealth
    from llm_diagnose.probes.load.replay_punctuality import send_lateness

    offsets = {f"r{i}": 0.1 * i for i in range(10)}
    # The loop stalled from 0.05 to 0.65 s: r1-r6 (due 0.1-0.6 s) all left at 0.65 s.
    records = [_sent(f"r{i}", 100.0 + (0.65 if 1 <= i <= 6 else 0.1 * i)) for i in range(10)]
    records.append(_sent("r1", 200.0))  # a resend of r1: only its first send counts
    stalled = ClientHealth(2.0, (0.001,) * 50 + (1.8,), 0.05, 10, 0.001, 0.99, 2, True)
    m = send_lateness(offsets, records, stalled, "test")[Q.REPLAY_SEND_LATENESS_P50]
    assert [round(x, 3) for x in m.samples] == [0.0, 0.0, 0.0, 0.0, 0.05, 0.15, 0.25, 0.35, 0.45, 0.55], m
    assert m.value == pytest.approx(0.1)
    assert m.warnings and "did not keep the recorded times" in m.warnings[0]
    assert "client starved: its event loop stalled for up to 1.8 s" in m.warnings[0]
