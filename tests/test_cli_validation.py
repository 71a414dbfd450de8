"""Numbers the user or a server gives are validated: one line on stderr, exit 2 (a bad flag or
file) or 3 (a bad server), never a traceback, nothing left behind (issue 22, items 5, 7, 8, 13).

Each case is a value that once gave a traceback or a silently wrong result: `--duration nan`,
`--interval nan` (which also left an empty --out), `fleet --since 99999999999h`, a NaN gate
tolerance that turned a +97% regression into "inconclusive", a replica count of 300 digits.

The fake HTTP servers here answer what no real engine or Prometheus answers on demand: JSON
nested thousands deep, a sample time of 1e300, NaN as a JSON number, an answer past the size
bound. Each is a stdlib server on 127.0.0.1 answering a fixed body per path, stopped after its test.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.probes.bounded_json import MAX_JSON_DEPTH, JSONBoundsError, deeper_than, loads_bounded
from tests.evidence_builders import build

FIXTURES = Path(__file__).parent / "fixtures"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there, a connection is refused at once
NESTED = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError on this


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """main() in-process; argparse's exit (SystemExit) read as the exit code it carries."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def one_error_line(code: int, err: str, expected_code: int = 2) -> str:
    """The one `llm-diagnose: error:` line of a refused command (argparse's usage lines aside)."""
    assert code == expected_code, (code, err)
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("llm-diagnose: error:")]
    others = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(errors) == 1 and others == errors, err
    return errors[0]


# --- flags: every duration, rate and count -----------------------------------------------------------
def _run(tmp: Path, *flags: str) -> list[str]:
    return ["run", "--url", CLOSED, "--out", str(tmp / "out"), *flags]


def _fleet(tmp: Path, *flags: str) -> list[str]:
    return ["fleet", "--prometheus", CLOSED, "--out", str(tmp / "out"), *flags]


def _plan(tmp: Path, *flags: str) -> list[str]:
    evidence, trace = str(tmp / "evidence.json"), str(tmp / "t.jsonl")
    return ["plan", "--evidence", evidence, "--trace", trace, "--slo", "ttft:p99:2s", *flags]


FLAG_CASES = [
    (_run, ("--duration", "nan"), "argument --duration: 'nan' is not a finite number"),
    (_run, ("--duration", "inf"), "argument --duration: 'inf' is not a finite number"),
    (_run, ("--duration", "0"), "argument --duration: '0' is out of range"),
    (_run, ("--interval", "nan"), "argument --interval: 'nan' is not a finite number"),
    (_run, ("--duration=--",), "argument --duration: expected one argument"),  # argparse 3.11 gave a list
    (_run, ("--interval", "0.0001"), "argument --interval: '0.0001' is out of range"),
    (_run, ("--budget-requests", "99999999999999999999999"), "argument --budget-requests"),
    (_run, ("--max-rps", "-1"), "argument --max-rps: '-1' is out of range"),
    (_run, ("--block-size", "0"), "argument --block-size: '0' is out of range"),
    (_fleet, ("--since", "nan"), "argument --since: 'nan' is not a finite duration"),
    (_fleet, ("--since", "99999999999h"), "argument --since: '99999999999h' is out of range: from 1ms to 366d"),
    (_fleet, ("--start", "nan"), "argument --start: 'nan' is not a time between 1970-01-01 and 9999-12-31"),
    (_fleet, ("--start", "1e300"), "argument --start: '1e300' is not a time"),
    (_fleet, ("--end", "inf"), "argument --end: 'inf' is not a time"),
    (_fleet, ("--step", "nan"), "argument --step: 'nan' is not a finite number"),
    (_fleet, ("--step", "inf"), "argument --step: 'inf' is not a finite number"),
    (_fleet, ("--start", "0", "--end", "1e9"), "longer than 366 days"),
    (_fleet, ("--start", "200", "--end", "100"), "the window is empty"),
    (_fleet, ("--end", "100"), "the window starts before 1970"),  # --end minus the default --since 10m
    (_plan, ("--target-rps", "inf"), "argument --target-rps: 'inf' is not a finite number"),
    (_plan, ("--target-rps", "1e300"), "argument --target-rps: '1e300' is out of range"),
    (_plan, ("--target-rps", "5", "--max-batched-tokens", "0"), "argument --max-batched-tokens: '0' is out of range"),
    (_plan, ("--target-rps", "5", "--search-span", "1"), "argument --search-span: '1' is out of range"),
    (lambda tmp, *f: ["trace", str(tmp / "t.jsonl"), *f], ("--assume-tpot-ms", "nan"), "--assume-tpot-ms"),
    (lambda tmp, *f: ["instrument", *f, "--", "true"], ("--port", "65536"), "argument --port: '65536'"),
    (lambda tmp, *f: ["microbench", *f], ("--batch", "1,0"), "argument --batch: '0' is out of range"),
]


@pytest.mark.parametrize("command, flags, expected", FLAG_CASES, ids=[" ".join(c[1]) for c in FLAG_CASES])
def test_a_bad_number_is_one_line_and_exit_2(tmp_path, command, flags, expected):
    line = one_error_line(*run_cli(command(tmp_path, *flags))[::2])
    assert expected in line, line
    assert not (tmp_path / "out").exists()  # refused before any folder was made


def test_run_interval_nan_leaves_no_empty_out(tmp_path):
    out = tmp_path / "runs" / "a"
    code, _, err = run_cli(["run", "--url", CLOSED, "--out", str(out), "--interval", "nan"])
    one_error_line(code, err)
    assert not (tmp_path / "runs").exists()


def test_plan_on_an_empty_trace_is_one_line(tmp_path):
    (tmp_path / "evidence.json").write_text(build({"engine.name": "vllm"}).to_json())
    (tmp_path / "t.jsonl").write_text("")
    line = one_error_line(*run_cli([*_plan(tmp_path), "--target-rps", "5"])[::2])
    assert "t.jsonl" in line and "empty" in line and "at least one request" in line


# --- settings files: type and range on load, with the setting's name ---------------------------------
@pytest.mark.parametrize(
    "table, name",
    [
        ('"q1.kv_saturation" = nan', "q1.kv_saturation"),  # a fraction
        ('"q1.kv_saturation" = -1', "q1.kv_saturation"),
        ('"q1.kv_saturation" = 1.5', "q1.kv_saturation"),
        ('"confidence.direct" = inf', "confidence.direct"),  # a confidence
        ('"confidence.direct" = -0.1', "confidence.direct"),
        ('"q5.max_itl_p50_s" = -1', "q5.max_itl_p50_s"),  # an amount: at least 0
        ('"q5.max_itl_p50_s" = inf', "q5.max_itl_p50_s"),
    ],
)
def test_a_threshold_out_of_its_range_names_itself(tmp_path, table, name):
    (tmp_path / "evidence.json").write_text(build({"engine.name": "vllm"}).to_json())
    (tmp_path / "th.toml").write_text(f"[thresholds]\n{table}\n")
    line = one_error_line(*run_cli(["decide", str(tmp_path), "--thresholds", str(tmp_path / "th.toml")])[::2])
    assert f"threshold {name!r} must be a finite number" in line and "th.toml" in line, line


def test_a_threshold_in_range_is_taken(tmp_path):
    from llm_diagnose.diagnose.tree.thresholds import Thresholds

    th = Thresholds.from_mapping({"q1.kv_saturation": 1, "sanity.max_weights_fraction": 250.0, "q5.max_itl_p50_s": 0})
    assert (th["q1.kv_saturation"], th["sanity.max_weights_fraction"], th["q5.max_itl_p50_s"]) == (1.0, 250.0, 0.0)


def test_an_slo_limit_of_nan_names_the_file_and_the_objective(tmp_path):
    (tmp_path / "evidence.json").write_text(build({"engine.name": "vllm"}).to_json())
    (tmp_path / "slo.toml").write_text("[slo]\nttft_p99_s = nan\n")
    line = one_error_line(*run_cli(["decide", str(tmp_path), "--thresholds", str(tmp_path / "slo.toml")])[::2])
    assert "slo.toml: [slo] ttft_p99_s = nan" in line and "positive number of seconds" in line


@pytest.mark.parametrize(
    "table, field",
    [
        ("[gate]\ntolerance = nan", "gate.tolerance"),
        ("[gate]\ntail_tolerance = inf", "gate.tail_tolerance"),
        ("[gate]\nconfidence = nan", "gate.confidence"),
        ("[gate]\nresamples = 9000000000000", "gate.resamples"),
        ('[metrics."requests.ttft_p50_s"]\ntolerance_abs = nan', "tolerance_abs"),
        ("[diagnosis]\nmin_confidence = nan", "diagnosis.min_confidence"),
    ],
)
def test_a_gate_setting_of_nan_is_refused_not_read_as_inconclusive(tmp_path, table, field):
    (tmp_path / "rules.toml").write_text(table + "\n")
    code, _, err = run_cli(
        ["gate", "--baseline", str(tmp_path), "--current", str(tmp_path), "--rules", str(tmp_path / "rules.toml")]
    )
    line = one_error_line(code, err)
    assert field in line and "rules.toml" in line, line


# --- the plan's replica count: words past the bound, never hundreds of digits --------------------------
def test_a_replica_count_past_the_bound_is_said_in_words():
    from llm_diagnose.diagnose.capacity import EngineLimits, SimRequest, StepModel, plan_capacity
    from llm_diagnose.diagnose.capacity.plan import MAX_REPLICAS, beyond_max_replicas, replicas_needed
    from llm_diagnose.diagnose.report.capacity import console_text, markdown_lines
    from llm_diagnose.diagnose.tree.slo import SLO, Objective

    assert replicas_needed(1e300, 2.0) is None and beyond_max_replicas(1e300, 2.0)
    assert replicas_needed(MAX_REPLICAS * 2.0, 2.0) == MAX_REPLICAS and not beyond_max_replicas(MAX_REPLICAS * 2.0, 2.0)
    model = StepModel(fixed_s=0.002, per_seq_s=0.0005, per_prefill_token_s=2e-6, request_overhead_s=0.004)
    items = [SimRequest(0.0, 256, 16) for _ in range(20)]
    plan = plan_capacity(
        items, model, EngineLimits(64, 2048, None, 16), SLO((Objective("ttft", 90, 0.5),), True), 1e300
    )
    today = plan.today
    assert today.goodput_rps is not None and today.replicas is None and today.gpus is None
    assert today.replicas_more_than == MAX_REPLICAS and f"more than {MAX_REPLICAS:,} replicas" in today.assumption
    text = console_text(plan.to_dict()) + "\n".join(markdown_lines(plan.to_dict()))
    assert f"more than {MAX_REPLICAS:,}" in text
    assert not any(len(word) > 30 and word.isdigit() for word in text.replace(",", "").split())


# --- servers that answer past the bounds ---------------------------------------------------------------
class FixedAnswers(BaseHTTPRequestHandler):
    """Answers each GET with `routes[path]` (status, content type, body); 404 elsewhere."""

    routes: dict[str, tuple[int, str, bytes]] = {}

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        status, ctype, body = self.routes.get(self.path.split("?")[0], (404, "text/plain", b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def fake_server(routes: dict[str, tuple[int, str, bytes]]) -> Iterator[str]:
    handler = type("Handler", (FixedAnswers,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _json(body: str) -> tuple[int, str, bytes]:
    return 200, "application/json", body.encode()


def _matrix(t: object, points: int = 1) -> str:
    result = [{"metric": {"__name__": "vllm:num_requests_running", "instance": "a:1"}, "values": [[t, "1"]] * points}]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


@pytest.mark.parametrize(
    "body, expected",
    [
        (NESTED, f"more than {MAX_JSON_DEPTH} levels deep"),  # once a RecursionError
        (_matrix(1e300), "not a time inside the queried window"),  # once an OverflowError
        (_matrix(time.time() - 86400 * 30), "not a time inside the queried window"),
        (_matrix(1.0).replace('"1"]', "NaN]"), "NaN, not a finite number"),
        (_matrix(1.0).replace("1.0", "1e400"), "beyond what a float holds"),
    ],
    ids=["nested", "time-1e300", "time-outside-window", "nan-number", "overflowing-number"],
)
def test_fleet_against_a_bad_prometheus_is_one_line_exit_3(tmp_path, body, expected):
    with fake_server({"/api/v1/query": _json(body)}) as url:
        code, _, err = run_cli(["fleet", "--prometheus", url, "--since", "1m", "--out", str(tmp_path / "o")])
    line = one_error_line(code, err, expected_code=3)
    assert expected in line, line


def test_fleet_answer_past_the_size_bound_is_not_read(tmp_path, monkeypatch):
    from llm_diagnose.probes.metrics import prometheus_api

    monkeypatch.setattr(prometheus_api, "MAX_ANSWER_BYTES", 4096)  # the real bound is 128 MiB: too big to send here
    body = _matrix(time.time() - 5, points=1000)
    assert len(body) > 4096
    with fake_server({"/api/v1/query": _json(body)}) as url:
        code, _, err = run_cli(["fleet", "--prometheus", url, "--since", "1m", "--out", str(tmp_path / "o")])
    line = one_error_line(code, err, expected_code=3)
    assert "more than 4,096 bytes (MAX_ANSWER_BYTES)" in line and "--step" in line, line


def test_nested_json_from_v1_models_and_server_info_is_not_read(tmp_path):
    """Discovery records the answers as unusable and goes on: the engine comes from /metrics."""
    import asyncio

    from llm_diagnose.probes.discovery import discover

    page = (FIXTURES / "metrics" / "vllm-0.32.0-cpu-real.txt").read_bytes()
    routes = {
        "/v1/models": _json(NESTED),
        "/server_info": _json('{"vllm_config": ' + "[" * 100 + "]" * 100 + "}"),
        "/version": _json('{"version": NaN}'),
        "/metrics": (200, "text/plain; version=0.0.4", page),
    }
    with fake_server(routes) as url:
        found = asyncio.run(discover(url))
    assert found.engine == "vllm" and found.model is None and found.version is None
    assert (
        found.endpoints["/v1/models"]
        == f"unusable JSON (it nests arrays or objects more than {MAX_JSON_DEPTH} levels deep)"
    )
    assert found.endpoints["/server_info"].startswith("unusable JSON (it nests")
    assert found.endpoints["/version"] == "unusable JSON (it holds NaN, not a finite number)"


def test_run_against_a_server_answering_only_nested_json_is_one_line_exit_3(tmp_path):
    routes = {path: _json(NESTED) for path in ("/v1/models", "/version", "/server_info", "/get_server_info")}
    with fake_server(routes) as url:
        code, _, err = run_cli(["run", "--url", url, "--out", str(tmp_path / "o"), "--duration", "1", "--quiet"])
    line = one_error_line(code, err, expected_code=3)
    assert "not an LLM serving engine" in line and "unusable JSON" in line, line


# --- the bounded loader itself ---------------------------------------------------------------------------
def test_depth_is_counted_exactly_and_strings_do_not_count():
    assert not deeper_than("[" * 64 + "]" * 64, 64) and deeper_than("[" * 65 + "]" * 65, 64)
    assert not deeper_than('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "b": [1, {"c": []}]}', 4)
    assert not deeper_than('["\\"[[[[[[[[[[", "\\\\", "]]]]]"]', 1)  # escaped quotes and backslashes too
    assert deeper_than('{"a": [1, {"c": [[]]}]}', 4) and not deeper_than('{"a": [1, {"c": [[]]}]}', 5)
    assert loads_bounded('{"a": [1.5, "x\\"]"]}') == {"a": [1.5, 'x"]']}
    assert loads_bounded("1e300") == 1e300
    for bad, reason in (
        ("[" * 65 + "]" * 65, "levels deep"),
        ("[1, Infinity]", "Infinity, not a finite number"),
        ("-1e999", "beyond what a float holds"),
        ("1" * 400, "integer of 400 digits"),
        ("[1,", "not JSON"),
        ("[" * 10 + "}", "not JSON"),  # unbalanced: the parser says so
        ("[" * 3000 + "}", "levels deep"),  # unbalanced and deep: the parser's recursion stops it
    ):
        with pytest.raises(JSONBoundsError, match=reason):
            loads_bounded(bad)
