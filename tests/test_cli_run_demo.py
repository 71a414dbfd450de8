"""`run` and `demo` end to end through the CLI: the demo against a real vLLM it starts itself,
`run` against a real server and against nothing at all."""

from __future__ import annotations

import json
import socket

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.tree.evidence import Evidence


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.real_engine
def test_demo_diagnoses_a_real_vllm_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(
        ["demo", "--out", str(out), "--workdir", str(tmp_path / "work"), "--duration", "14", "--requests", "48"]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "Bottleneck:" in stdout and f"run folder: {out}" in stdout
    for name in ("evidence.json", "diagnosis.json", "summary.txt", "metrics.jsonl", "requests.jsonl", "workload.jsonl"):
        assert (out / name).stat().st_size > 0, name
    assert len((out / "requests.jsonl").read_text().splitlines()) == 48
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 10  # one line per scrape, as taken
    evidence = Evidence.from_json((out / "evidence.json").read_text())
    assert evidence.fact("engine.name") == "vllm" and evidence.fact("config.prefix_caching") is True
    # the shared system prompt is measured twice: from the prompts, and by the server's counters
    assert evidence.measurement("prefix.potential_fraction").value > 0.8
    assert evidence.measurement("prefix.hit_rate").value > 0.5
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    answers = {a["question"]: a["answer"] for a in diagnosis["answers"]}
    status = {r["technique"]: r["status"] for r in diagnosis["recommendations"]}
    assert answers["Q2"] == "yes" and status["prefix-caching"] == "in-place"
    assert status["continuous-batching"] == "in-place" and status["paged-attention"] == "in-place"


def test_run_against_nothing_is_a_target_error(tmp_path, capsys):
    port = _free_port()
    code = main(
        ["run", "--url", f"http://127.0.0.1:{port}", "--duration", "1", "--out", str(tmp_path / "r"), "--quiet"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("llm-diagnose: error:") and f"127.0.0.1:{port}" in err[-1]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--duration", "0"], "must be positive"),
        (["--duration", "1", "--interval", "5"], "longer than --duration"),
    ],
)
def test_run_bad_flags_exit_2(tmp_path, capsys, argv, expected):
    code = main(["run", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "r"), *argv])
    assert code == 2 and expected in capsys.readouterr().err


@pytest.mark.real_engine
def test_run_passively_reads_a_real_server(vllm_server, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--url",
            vllm_server.url,
            "--duration",
            "2",
            "--interval",
            "0.5",
            "--out",
            str(out),
            "--quiet",
            "--interactive",
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    evidence = Evidence.from_json((out / "evidence.json").read_text())
    assert evidence.fact("engine.name") == "vllm" and evidence.fact("engine.max_model_len") == 2048
    assert evidence.fact("workload.interactive") is True
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 4
    assert not (out / "requests.jsonl").exists(), "passive mode sends no request"


@pytest.mark.real_engine
def test_run_active_says_what_it_sends_and_keeps_to_the_budget(vllm_server, tmp_path, capsys):
    out = tmp_path / "active"
    code = main(
        [
            "run",
            "--url",
            vllm_server.url,
            "--duration",
            "2",
            "--interval",
            "0.5",
            "--out",
            str(out),
            "--quiet",
            "--active",
            "--budget-requests",
            "40",
            "--budget-seconds",
            "25",
            "--experiments",
            "decode,prefix",
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "--active will send" in stderr
    assert stderr.index("--active will send") < len(stderr)  # printed before the run's output
    sent = (out / "requests.jsonl").read_text().splitlines()
    assert 0 < len(sent) <= 40, "the request budget is a hard bound"
    evidence = Evidence.from_json((out / "evidence.json").read_text())
    itl = evidence.measurement("decode.itl_p50_s")
    assert itl is not None and itl.provenance.method.startswith("active"), itl
    assert itl.summary is not None and itl.summary.n > 10, "an active latency carries its samples"
    _wait_idle(vllm_server.url)  # the server is shared: leave it with no request still in flight


def _wait_idle(url: str, timeout_s: float = 30.0) -> None:
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        busy = sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
        )
        if busy == 0:
            return
        time.sleep(0.2)
