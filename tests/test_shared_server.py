"""A server shared with others (issue 26, items 5 and 6): its GPUs among other tenants', and its
traffic before an active run sends anything.

The servers here are FAKE: fixed answers on 127.0.0.1 (a vLLM /metrics page whose running and
waiting gauges the test sets, GET only). Other clients' traffic on a server, at the moment a run
starts, cannot be arranged on demand with a real engine on this machine, and a real engine on a
GPU node with other tenants' GPUs cannot run here (no GPU): the fake pynvml of test_live_attach
stands for the node. Every request a fake server receives is recorded, so a test can show that
nothing was sent where nothing may be.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.commands import plan as plan_command
from llm_diagnose.diagnose.commands import run as run_command
from llm_diagnose.probes import nvml
from llm_diagnose.probes.http import make_session
from llm_diagnose.probes.load.budget import DEFAULT_MAX_RPS
from llm_diagnose.probes.metrics import load_at_start
from llm_diagnose.probes.metrics.load_at_start import read_server_load
from llm_diagnose.probes.results import Measurement, NotMeasured
from tests.evidence_builders import build
from tests.test_cli_validation import CLOSED, one_error_line, run_cli
from tests.test_live_attach import fake_pynvml

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
IDLE_PAGE = (FIXTURES / "vllm-0.32.0-cpu-real.txt").read_text()
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-llama", "max_model_len": 2048}]}).encode()


def vllm_page(running: int, waiting: int) -> str:
    """The real vLLM page with its running and waiting gauges set (waiting: the capacity reason and the total)."""
    page = IDLE_PAGE.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
        f'vllm:num_requests_running{{engine="0",model_name="tiny-llama"}} {running}.0',
    )
    page = page.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0',
        f'vllm:num_requests_waiting{{engine="0",model_name="tiny-llama"}} {waiting}.0',
    )
    page = page.replace(
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 0.0',
        f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="tiny-llama",reason="capacity"}} {waiting}.0',
    )
    assert page.count(f" {running}.0") >= 1 and (running == 0 or page != IDLE_PAGE)
    return page


class _Engine(BaseHTTPRequestHandler):
    pages: list[str] = []  # /metrics answers these in turn, then the last one again
    seen: list[tuple[str, str]] = []

    def _answer(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        path = self.path.split("?")[0]
        self.seen.append(("GET", path))
        if path == "/metrics":
            page = self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]
            self._answer(200, "text/plain; version=0.0.4", page.encode())
        elif path == "/v1/models":
            self._answer(200, "application/json", MODELS)
        else:
            self._answer(404, "text/plain", b"not found")

    def do_POST(self) -> None:  # noqa: N802 - an inference request: refused (this fake generates nothing)
        self.seen.append(("POST", self.path))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._answer(503, "application/json", b'{"error": "fake engine: no generation"}')

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def engine(*pages: str) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A fake vLLM on 127.0.0.1: its URL and the (method, path) of every request it received."""
    seen: list[tuple[str, str]] = []
    handler = type("Engine", (_Engine,), {"pages": list(pages), "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _load(url: str) -> load_at_start.ServerLoad:
    """The load read_server_load reads (discovery takes one /metrics page before its reads)."""

    async def read():
        async with make_session() as session:
            return await read_server_load(session, url, settle_s=0.0)

    return asyncio.run(read())


@pytest.fixture
def no_settle(monkeypatch):
    """The second read of a busy page follows at once (SETTLE_S is there for a real engine's last steps)."""
    monkeypatch.setattr(load_at_start, "SETTLE_S", 0.0)


# --- the server's load before sending --------------------------------------------------------------
def test_requests_in_flight_before_sending_are_counted_as_other_clients():
    with engine(vllm_page(9, 3)) as (url, seen):
        load = _load(url)
    assert (load.running, load.waiting, load.requests, load.busy) == (9.0, 3.0, 12, True)
    assert load.first_requests == 12.0  # read twice, busy both times
    assert not any(method == "POST" for method, _ in seen)  # read-only
    assert load.describe().startswith("the server is already serving 12 request(s) of other clients (9 running, ")
    item = load.evidence()["active.server_requests_at_start"]
    assert isinstance(item, Measurement) and item.value == 12.0 and item.unit == "count"
    assert "9 running, 3 waiting" in item.note and "vllm:num_requests_running" in item.note
    assert "12 at a first read" in item.note


def test_the_last_requests_of_a_run_that_just_ended_are_not_a_busy_server():
    # Busy at the first read, idle at the second: a straggler of the user's previous command drained.
    with engine(vllm_page(2, 0), vllm_page(2, 0), IDLE_PAGE) as (url, _):  # discovery reads the first page
        load = _load(url)
    assert load.requests == 0 and not load.busy and load.first_requests == 2.0
    assert load.evidence()["active.server_requests_at_start"].value == 0.0


def with_generated(page: str, tokens: int) -> str:
    """`page` with the engine's generated-tokens counter at `tokens`."""
    line = 'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 576.0'
    assert line in page
    return page.replace(line, f'vllm:generation_tokens_total{{engine="0",model_name="tiny-llama"}} {tokens}.0')


def test_a_gap_between_another_clients_requests_at_one_read_does_not_hide_them():
    # A closed-loop client's four requests end together: one read falls between them and its next ones.
    with engine(vllm_page(4, 0), *(vllm_page(4, 0), IDLE_PAGE, vllm_page(4, 0))) as (url, _):
        load = _load(url)
    assert (load.requests, load.busy, load.first_requests) == (4, True, 4.0)
    assert load.evidence()["active.server_requests_at_start"].value == 4.0


def test_tokens_generated_between_reads_that_each_show_nothing_in_flight_are_another_clients():
    pages = (with_generated(IDLE_PAGE, 576), with_generated(IDLE_PAGE, 600), with_generated(IDLE_PAGE, 648))
    with engine(pages[0], *pages) as (url, _):  # discovery reads the page once before the reads
        load = _load(url)
    assert (load.requests, load.tokens_between, load.others_at_least, load.busy) == (0, 48.0, 1, True)
    item = load.evidence()["active.server_requests_at_start"]
    assert isinstance(item, Measurement) and item.value == 1.0
    assert "0 running, 0 waiting at both later reads, but 48 tokens generated between them" in item.note
    assert "at least 1 request(s)" in load.describe()


def test_a_server_told_busy_by_its_tokens_alone_is_said_at_least_one_everywhere(monkeypatch, no_settle):
    """The summary's first line and `plan --active --allow-busy-target`'s note, where no read showed a
    request in flight but the engine generated tokens between the later reads."""
    from llm_diagnose.diagnose.collect import busy_at_start_line

    pages = (with_generated(IDLE_PAGE, 576), with_generated(IDLE_PAGE, 600), with_generated(IDLE_PAGE, 648))
    with engine(pages[0], *pages) as (url, _):
        load = _load(url)
    line = busy_at_start_line(load.evidence())
    assert line.startswith("SERVER ALREADY BUSY AT START: at least 1 request(s) of other clients ran just before"), line
    assert "0 running, 0 waiting at both later reads, but 48 tokens generated between them" in line
    assert load.evidence()["active.server_requests_at_start"].provenance.method == "prometheus-gauge+counter"
    monkeypatch.setattr(load_at_start, "server_load_before_sending", lambda *a, **k: load)
    note = plan_command._refuse_busy_target(argparse.Namespace(url=url, allow_busy_target=True))
    assert "already serving at least 1 request(s) of other clients" in note, note


def test_a_failed_first_read_does_not_hide_the_later_ones():
    """A read that fails (a timeout on a starved host) is left out; the readable ones still decide."""
    from llm_diagnose.probes.metrics.scrape_record import ScrapeRecord
    from llm_diagnose.probes.metrics.scraper import scrape_once

    async def read(url: str) -> ScrapeRecord:
        async with make_session() as session:
            record, _, _ = await scrape_once(session, url + "/metrics")
            return record

    with engine(vllm_page(3, 0)) as (url, _):
        good = asyncio.run(read(url))
    failed = ScrapeRecord(good.t_wall - 1, good.t_mono - 1, None, "timed out")
    load = load_at_start.load_of_reads([failed, good, good], "shown")
    assert (load.requests, load.busy, load.first_requests) == (3, True, 3.0)
    alone = load_at_start.load_of_reads([failed, failed, good], "shown")  # one readable read: it stands
    assert (alone.requests, alone.first_requests) == (3, None)
    assert load_at_start.load_of_reads([failed, failed, failed], "shown").error == "timed out"


def test_a_run_that_ended_just_before_is_not_another_client_even_if_its_last_step_generated_tokens():
    # Its last tokens fall between the first read and the second; nothing moves after.
    pages = (with_generated(vllm_page(2, 0), 576), with_generated(IDLE_PAGE, 580), with_generated(IDLE_PAGE, 580))
    with engine(pages[0], *pages) as (url, _):
        load = _load(url)
    assert (load.requests, load.tokens_between, load.busy, load.first_requests) == (0, 0.0, False, 2.0)


def test_a_load_that_cannot_be_read_is_said_not_guessed():
    load = _load(CLOSED)
    assert load.requests is None and not load.busy and load.error
    hole = load.evidence()["active.server_requests_at_start"]
    assert isinstance(hole, NotMeasured) and hole.reason.startswith("the server's load before the run could not")


# --- run --active: the default rate, and a busy server said before sending ---------------------------
def _args(**kw) -> argparse.Namespace:
    base = {"budget_requests": 200, "budget_seconds": 60.0, "max_rps": None, "replay": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_experiments_keep_to_the_default_rate_unless_told_and_a_replay_to_its_recording():
    assert run_command._budget(_args()).max_rps == DEFAULT_MAX_RPS
    assert run_command._budget(_args(max_rps=500.0)).max_rps == 500.0
    assert run_command._budget(_args(replay=Path("before"))).max_rps is None
    assert run_command._budget(_args(replay=Path("before"), max_rps=5.0)).max_rps == 5.0
    shown = run_command._will_send(_args(), run_command._budget(_args()), "PLAN")
    assert f"at most {DEFAULT_MAX_RPS:g} requests/s (the default --max-rps" in shown
    assert "default" not in run_command._will_send(_args(max_rps=50.0), run_command._budget(_args()), "PLAN")


def test_run_active_on_a_busy_server_says_so_before_sending_and_keeps_it_in_the_evidence(tmp_path, no_settle):
    out = tmp_path / "run"
    argv = ["run", "--url", "URL", "--out", str(out), "--duration", "1", "--interval", "0.5", "--quiet", "--active"]
    argv += ["--experiments", "prefix", "--budget-requests", "2", "--budget-seconds", "1"]
    with engine(vllm_page(9, 3)) as (url, seen):
        code, _, err = run_cli([url if a == "URL" else a for a in argv])
    assert code in (0, 4), err
    lines = err.splitlines()
    busy = next(i for i, line in enumerate(lines) if "already serving 12 request(s) of other clients" in line)
    will_send = next(i for i, line in enumerate(lines) if "--active will send" in line)
    assert busy < will_send and lines[busy].startswith("llm-diagnose: warning: ")
    assert f"at most {DEFAULT_MAX_RPS:g} requests/s (the default --max-rps" in lines[will_send]
    # Read before the first request left: discovery's page and the two reads precede the first POST.
    first_post = next(i for i, (method, _) in enumerate(seen) if method == "POST")
    assert seen[:first_post].count(("GET", "/metrics")) >= 3, seen[: first_post + 1]
    evidence = json.loads((out / "evidence.json").read_text())["items"]
    assert evidence["active.server_requests_at_start"]["value"] == 12.0
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("SERVER ALREADY BUSY AT START: 12 request(s) of other clients were in flight"), summary
    assert "(9 running, 3 waiting, read from vllm:num_requests_running" in summary.splitlines()[0]
    # The budget the experiments kept to carries the default rate.
    start = next(json.loads(e) for e in (out / "events.jsonl").read_text().splitlines() if '"run-start"' in e)
    assert f"at most {DEFAULT_MAX_RPS:g} requests/s" in start["budget"]


# --- plan --active: a load test refuses a server that serves others -----------------------------------
class _SearchReached(Exception):
    pass


def _plan_argv(tmp_path: Path, url: str, *extra: str) -> list[str]:
    (tmp_path / "evidence.json").write_text(build({"engine.name": "vllm", "config.max_num_seqs": 256}).to_json())
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": i, "input_length": 200, "output_length": 64, "hash_ids": [i]} for i in range(20)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["plan", "--evidence", str(tmp_path), "--trace", str(trace), "--target-rps", "10"]
    return [*argv, "--slo", "ttft:p90:1s", "--active", "--url", url, *extra]


def test_plan_active_refuses_a_server_that_already_serves_others(tmp_path, monkeypatch, no_settle):
    monkeypatch.setattr(plan_command, "_search_live", lambda *a, **k: pytest.fail("the search must not start"))
    with engine(vllm_page(4, 1)) as (url, seen):
        code, _, err = run_cli(_plan_argv(tmp_path, url))
    line = one_error_line(code, err, expected_code=2)
    assert "already serving 5 request(s) of other clients (4 running, 1 waiting" in line, line
    assert line.endswith("or add --allow-busy-target"), line
    assert not any(method == "POST" for method, _ in seen)


@pytest.mark.parametrize(
    "page, flags, said",
    [
        (vllm_page(4, 1), ("--allow-busy-target",), "warning: the server is already serving 5 request(s) of other"),
        (IDLE_PAGE, (), ""),
    ],
    ids=["busy-allowed", "idle"],
)
def test_plan_active_searches_a_busy_server_only_when_allowed_and_an_idle_one_always(
    tmp_path, monkeypatch, capsys, no_settle, page, flags, said
):
    def reached(*args, **kwargs):
        raise _SearchReached

    monkeypatch.setattr(plan_command, "_search_live", reached)
    with engine(page) as (url, _), pytest.raises(_SearchReached):
        main(_plan_argv(tmp_path, url, *flags))
    err = capsys.readouterr().err
    if said:
        assert said in err and "(--allow-busy-target)" in err, err
    else:
        assert "other clients" not in err, err


# --- run --gpus ----------------------------------------------------------------------------------------
def test_gpus_flag_takes_indices_and_uuids_and_refuses_anything_else():
    assert run_command.gpu_list("0, 2,GPU-5d3c7a1e-0000-1111-2222-333344445555,2") == (
        0,
        2,
        "GPU-5d3c7a1e-0000-1111-2222-333344445555",
    )
    for bad, words in (("cuda:0", "neither a GPU index nor a GPU UUID"), (",", "lists no GPU"), ("2000", "at most")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            run_command.gpu_list(bad)


def test_run_with_an_unknown_gpu_is_one_line_exit_2_before_the_target_is_touched(tmp_path, monkeypatch):
    read_fake = nvml.read_gpu_memory
    monkeypatch.setattr(nvml, "read_gpu_memory", lambda module=None: read_fake(fake_pynvml(count=4)))
    # CLOSED: a target contacted would be exit 3 (unreachable), not 2.
    code, _, err = run_cli(["run", "--url", CLOSED, "--out", str(tmp_path / "o"), "--gpus", "1,7", "--quiet"])
    line = one_error_line(code, err, expected_code=2)
    assert line.startswith("llm-diagnose: error: --gpus: no GPU 7 on this node: it has GPU0 (GPU-0), GPU1"), line
    assert not (tmp_path / "o").exists()


def test_run_reads_gpu_memory_on_the_gpus_asked_for(tmp_path, monkeypatch):
    read_fake = nvml.read_gpu_memory
    monkeypatch.setattr(nvml, "read_gpu_memory", lambda module=None: read_fake(fake_pynvml(count=4, processes=[])))
    out = tmp_path / "run"
    with engine(IDLE_PAGE) as (url, seen):
        code, _, err = run_cli(["run", "--url", url, "--out", str(out), "--duration", "0.5", "--interval", "0.5"])
        code_gpus, _, err_gpus = run_cli(
            ["run", "--url", url, "--out", str(out / "asked"), "--duration", "0.5", "--interval", "0.5", "--gpus", "2"]
        )
    assert code == 0 and code_gpus == 0, (err, err_gpus)
    assert not any(method == "POST" for method, _ in seen)  # passive
    fallback = json.loads((out / "evidence.json").read_text())["items"]
    assert fallback["memory.gpu_selection"]["value"] == "node"
    assert "GPU MEMORY READ ON every GPU of the node (4)" in err  # said at the end of the run too
    assert "processes hidden (PID namespace)" in fallback["memory.processes_used_bytes"]["reason"]
    asked = json.loads((out / "asked" / "evidence.json").read_text())["items"]
    assert asked["memory.gpu_selection"]["value"] == "asked"
    assert asked["memory.device_total_bytes"]["value"] == 80 * (1 << 30)
    assert "GPU MEMORY READ ON" not in err_gpus
