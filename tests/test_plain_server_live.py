"""`run` against a REAL plain `transformers serve` on the tiny model: no engine metrics, attached
from the client with --active.

One server for the module. It runs with a Hugging Face cache folder that does not exist, so its
GET /v1/models answers 500 (as the issue met it); /metrics and /version answer 404. The last test
creates that folder, after which the server lists no model (200, an empty list): the tests run in
file order, and each checks the /v1/models answer it expects first.
"""

from __future__ import annotations

import contextlib
import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.demo.vllm_server import TransformersServer
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import EXPERIMENT_KEYS
from llm_diagnose.probes.metrics.passive import PASSIVE_KEYS

pytestmark = pytest.mark.real_engine

PLAIN = "plain OpenAI-compatible server"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TransformersServer]:
    with TransformersServer(tiny_model_dir, tmp_path_factory.mktemp("plain")) as started:
        yield started


def models_status(server: TransformersServer) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("llm-diagnose: error:")]
    assert len(lines) == 1, err
    return lines[0]


def evidence(folder: Path) -> dict:
    return json.loads((folder / "evidence.json").read_text())["items"]


def bodies(folder: Path) -> list[dict]:
    lines = (folder / "inputs.jsonl").read_text().splitlines()
    return [json.loads(line)["body"] for line in lines if line.strip()]


def test_a_passive_run_refuses_it_in_one_line_naming_both_ways_to_measure_it(
    server: TransformersServer, tmp_path: Path
) -> None:
    assert models_status(server)[0] == 500  # no Hugging Face cache folder
    code, _, err = run_cli("run", "--url", server.url, "--out", str(tmp_path / "p"), "--duration", "1", "--quiet")
    assert code == 3, err
    line = error_line(err)
    assert "/v1/models gave 500" in line, line
    assert "pass --active to measure it from the client" in line and "llm-diagnose instrument" in line, line


def test_active_attaches_it_and_measures_from_the_client(server: TransformersServer, tmp_path: Path) -> None:
    assert models_status(server)[0] == 500
    out = tmp_path / "a"
    code, stdout, err = run_cli(
        "run", "--url", server.url, "--out", str(out), "--active", "--quiet",
        "--experiments", "prefix", "--budget-seconds", "25", "--budget-requests", "60",
    )  # fmt: skip
    assert code == 0, err
    assert f"attaching it as a {PLAIN}" in err and "one request of the budget" in err, err
    items = evidence(out)
    # The client measured what it can: the time per token of the calibration request, and the prefix experiment's TTFT.
    for key in (Q.CALIBRATION_ITL, Q.PREFIX_ACTIVE_TTFT_SPEEDUP):
        assert items[key]["kind"] == "measurement" and items[key]["value"] > 0, (key, items[key])
    # Every engine-side figure says why it is missing and what would measure it.
    active_keys = {k for keys in EXPERIMENT_KEYS.values() for k in keys}
    for key in set(PASSIVE_KEYS) - active_keys:
        item = items[key]
        if item["kind"] == "fact":  # what discovery learned (none here: /v1/models answered 500)
            continue
        assert item["kind"] == "not-measured", (key, item)
        assert item["reason"].startswith("not measured here, because"), (key, item)
        assert "llm-diagnose instrument" in item.get("hint", ""), (key, item)
    assert items[Q.SERVER_REQUESTS_AT_START]["kind"] == "not-measured"
    # The model: /v1/models named none, the completion check's answer did (as the server names it).
    model = items[Q.ENGINE_MODEL]
    assert model["kind"] == "fact" and model["value"].startswith(server.model_name), model
    assert model["provenance"]["method"] == "http-post"
    notes = items[Q.ACTIVE_NOTES]["value"]
    assert f"attached as a {PLAIN}" in notes and "/v1/completions answered a completion" in notes, notes
    # No window was watched, and no request named a model: the server listed none, and is pinned to its own.
    assert not (out / "metrics.jsonl").exists()
    sent = bodies(out)
    assert sent and all("model" not in body for body in sent)
    assert items[Q.ACTIVE_REQUESTS_SENT]["value"] <= 60 - 1  # the completions check took one of the budget
    assert "Bottleneck:" in stdout


def test_a_model_name_the_server_does_not_serve_is_refused_at_the_check(
    server: TransformersServer, tmp_path: Path
) -> None:
    code, _, err = run_cli(
        "run", "--url", server.url, "--out", str(tmp_path / "w"), "--active", "--quiet",
        "--model", "not-the-served-model", "--budget-seconds", "5", "--budget-requests", "10",
    )  # fmt: skip
    assert code == 3, err
    line = error_line(err)
    assert "'not-the-served-model'" in line and "HTTP 400" in line and "pass --model NAME" in line, line
    assert not (tmp_path / "w" / "requests.jsonl").exists()  # nothing sent after the check


def test_model_names_the_requests_where_the_server_lists_none(server: TransformersServer, tmp_path: Path) -> None:
    (server.work_dir / "cache" / "hf" / "hub").mkdir(parents=True, exist_ok=True)  # an empty cache now
    assert models_status(server) == (200, {"object": "list", "data": []})
    out = tmp_path / "m"
    code, _, err = run_cli(
        "run", "--url", server.url, "--out", str(out), "--active", "--quiet", "--model", server.model_name,
        "--experiments", "decode", "--budget-seconds", "6", "--budget-requests", "20",
    )  # fmt: skip
    assert code == 0, err
    items = evidence(out)
    model = items[Q.ENGINE_MODEL]
    assert model["kind"] == "fact" and model["value"] == server.model_name, model
    assert model["provenance"]["method"] == "declared"
    assert "listing no model(s)" in items[Q.ACTIVE_NOTES]["value"]
    sent = bodies(out)
    assert sent and all(body.get("model") == server.model_name for body in sent)
