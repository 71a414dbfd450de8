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
def test_the_demo_finds_fixes_and_proves_a_bottleneck_on_a_real_vllm(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(
        ["demo", "--out", str(out), "--workdir", str(tmp_path / "work"), "--duration", "10", "--requests", "32"]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr + stdout
    before, after = out / "before", out / "after"
    for folder in (before, after):
        for name in ("evidence.json", "diagnosis.json", "summary.txt", "metrics.jsonl", "requests.jsonl"):
            assert (folder / name).stat().st_size > 0, (folder, name)
        assert len((folder / "requests.jsonl").read_text().splitlines()) == 32  # the same workload twice
        assert len((folder / "metrics.jsonl").read_text().splitlines()) >= 8  # one line per scrape, as taken
        # The host beside the server: vLLM's processes were found through its port, so the CPU of
        # other processes is told from the server's (verify reads it: a host that changed under the
        # server between the runs makes its timings cannot-tell).
        others = Evidence.from_json((folder / "evidence.json").read_text()).measurement("client.host_other_cores")
        assert others is not None and "server's processes" in (others.note or ""), folder
    # 1. found: the server runs without prefix caching while every prompt shares a long system prompt
    ev_before = Evidence.from_json((before / "evidence.json").read_text())
    assert ev_before.fact("engine.name") == "vllm" and ev_before.fact("config.prefix_caching") is False
    assert ev_before.measurement("prefix.potential_fraction").value > 0.8  # measured from the prompts
    d_before = json.loads((before / "diagnosis.json").read_text())
    status = {r["technique"]: r["status"] for r in d_before["recommendations"]}
    assert status["prefix-caching"] == "recommended", status
    assert "The diagnosis recommends prefix-caching: vllm --enable-prefix-caching" in stdout
    # 2. fixed: the server restarted with the recommended setting, and its cache now hits
    ev_after = Evidence.from_json((after / "evidence.json").read_text())
    assert ev_after.fact("config.prefix_caching") is True
    assert ev_after.measurement("prefix.hit_rate").value > 0.5
    d_after = json.loads((after / "diagnosis.json").read_text())
    assert {r["technique"]: r["status"] for r in d_after["recommendations"]}["prefix-caching"] == "in-place"
    # 3. proven: verify identified the change and judged its promised effect from the samples
    assert "prefix-caching" in stdout and "delivered" in stdout, stdout
    assert main(["verify", str(before), str(after), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["comparable"] is True, doc["comparability_reasons"]
    hit = [c for c in doc["claims"] if c["key"] == "prefix.hit_rate"]
    assert hit and hit[0]["verdict"] == "delivered", doc["claims"]
    # 4. and shown: the before/after page, verify's result over both diagnoses
    page = (out / "before-after.html").read_text()
    assert 'id="verify"' in page and 'id="side-by-side"' in page and "config.prefix_caching" in page


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
        (["--duration", "0"], "argument --duration: '0' is out of range"),  # refused by the flag's type
        (["--duration", "1", "--interval", "5"], "longer than --duration"),  # refused by the command
    ],
)
def test_run_bad_flags_exit_2(tmp_path, capsys, argv, expected):
    code: object
    try:
        code = main(["run", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "r"), *argv])
    except SystemExit as exc:  # argparse's exit, as for any flag it refuses
        code = exc.code
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
    itl = evidence.measurement("decode.batch1_itl_p50_s")  # the decode experiment's, under its own name
    assert itl is not None and itl.provenance.method.startswith("active"), itl
    served = evidence.get("decode.itl_p50_s")  # beside what the engine served over the window
    assert served is not None and not served.provenance.method.startswith("active"), served
    assert itl.summary is not None and itl.summary.n > 10, "an active latency carries its samples"
    wait_idle(vllm_server.url)  # the server is shared: leave it with no request still in flight


def requests_in_flight(url: str) -> float:
    """The vLLM server's running and waiting requests, from its /metrics page."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
    )


def wait_idle(url: str, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if requests_in_flight(url) == 0:
            return
        time.sleep(0.2)


@pytest.mark.real_engine
def test_a_terminated_run_stops_like_ctrl_c_and_keeps_its_samples(vllm_server, tmp_path):
    # `kill`, `docker stop` and a CI job's timeout send TERM, not Ctrl-C. Python's default for TERM
    # ends the process on the spot: no cleanup (the demo's vLLM servers were left running, seen here),
    # no message. The command line turns it into an interrupt.
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "r"
    argv = [sys.executable, "-m", "llm_diagnose", "run", "--url", vllm_server.url, "--duration", "120",
            "--interval", "0.5", "--out", str(out), "--quiet"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "llm-diagnose: interrupted; the scrapes taken so far are in" in err and "Traceback" not in err, err
    assert len(metrics.read_text().splitlines()) >= 2
