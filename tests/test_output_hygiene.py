"""Output hygiene: secrets in URLs never reach an output, and control characters are shown, not obeyed.

Two rules (issue 22, items 9 and 10):
- a URL's user:password and its signature-like query values (sig=, X-Amz-Signature=, code=, ...)
  are redacted (`probes.http.redact_url`) in every output: console, summary.txt, metrics.jsonl,
  evidence.json, reports, gate and verify outputs, error messages;
- control characters (ESC sequences, CR, C1, DEL, bidi overrides) from a model name or a label
  are written as visible escapes in text outputs (`report.control_chars`); JSON outputs carry
  them as \\u escapes, so a JSON reader still gets the exact string.

The end-to-end tests use a FAKE server on 127.0.0.1 (tests/test_metrics_safety.ThreadedFake), and
say why: a real engine cannot be made to serve a model whose name holds an ESC sequence (vLLM takes
--served-model-name from its command line, and a name that clears the terminal line is the point of
the test), and its /metrics labels come from that name. The page it serves is the real vLLM 0.32
page from tests/fixtures, with the model_name label edited.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.text.control_chars import escape_controls, escape_controls_in_json
from llm_diagnose.probes.http import redact_url
from tests.test_metrics_safety import VLLM_PAGE, ThreadedFake

# What a hostile model name or label does on a terminal: erase the line, return to its start,
# write a verdict of its own; an 8-bit CSI (C1), DEL and a right-to-left override for good measure.
EVIL = "\x1b[2K\r all good \x9b31m\x7f\u202eevil"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

USER, PASSWORD = "hyg-user", "pw-SECRET-1"
SIG, AMZ_SIG, AMZ_CRED, CODE = "SIG-SECRET-2", "AMZ-SECRET-3", "AMZ-CRED-SECRET-4", "CODE-SECRET-5"
SECRETS = (PASSWORD, SIG, AMZ_SIG, AMZ_CRED, CODE)


# --- redact_url ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@host:8000/metrics?api_key=s3cret&x=1", "http://***@host:8000/metrics?api_key=***&x=1"),
        ("user:pw@127.0.0.1:8000", "***@127.0.0.1:8000"),  # typed without a scheme, as --url accepts
        ("http://h/m?sig=a&se=2030&sv=1", "http://h/m?sig=***&se=2030&sv=1"),  # Azure SAS: only the sig
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AK%2F1&X-Amz-Date=2025"
            "&X-Amz-Expires=60&X-Amz-Signature=ff&X-Amz-Security-Token=tt",
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=***&X-Amz-Date=2025"
            "&X-Amz-Expires=60&X-Amz-Signature=***&X-Amz-Security-Token=***",
        ),
        ("http://h/?X-Goog-Signature=1&GoogleAccessId=2", "http://h/?X-Goog-Signature=***&GoogleAccessId=***"),
        ("http://h/cb?code=abc&state=s", "http://h/cb?code=***&state=s"),  # an OAuth redirect
        ("http://h/?SIG=a&Token=b&PassWord=c", "http://h/?SIG=***&Token=***&PassWord=***"),  # any case
        ("http://h/?X%2DAmz%2DSignature=a", "http://h/?X%2DAmz%2DSignature=***"),  # a percent-encoded name
        ("http://h/?my_refresh_token=a&upload_signature=b", "http://h/?my_refresh_token=***&upload_signature=***"),
        ("http://h/?a=1;token=b", "http://h/?a=1;token=***"),  # ';' splits parameters on some servers
        ("http://h/cb#access_token=a&state=s", "http://h/cb#access_token=***&state=s"),  # implicit OAuth
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),  # nothing to hide: unchanged
        ("http://h/?page=2&q=a%20b", "http://h/?page=2&q=a%20b"),  # left as written, not re-encoded
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown


# --- escape_controls -------------------------------------------------------------------------
def test_escape_controls_shows_every_control_and_keeps_the_layout():
    shown = escape_controls(f"model {EVIL}\n\tnext line")
    assert shown == "model \\x1b[2K\\x0d all good \\x9b31m\\x7f\\u202eevil\n\tnext line"
    assert not RAW_CONTROL.search(shown)
    assert escape_controls(shown) == shown  # idempotent: an escaped text is printable
    assert escape_controls("naïve 模型 ok") == "naïve 模型 ok"  # non-ASCII text is not a control


def test_escape_controls_in_json_is_the_same_document_to_a_reader():
    doc = json.dumps({"model": EVIL, "text": "naïve"}, indent=2, ensure_ascii=False)
    assert RAW_CONTROL.search(doc)  # json leaves C1, DEL and bidi raw with ensure_ascii=False
    safe = escape_controls_in_json(doc)
    assert not RAW_CONTROL.search(safe) and "naïve" in safe
    assert json.loads(safe) == json.loads(doc)


# --- end to end: run, then every output that reads its folder --------------------------------
def _assert_clean(name: str, data: bytes, *, text_output: bool) -> None:
    for secret in (*SECRETS, f"{USER}:{PASSWORD}"):
        assert secret.encode() not in data, f"{name} holds the secret {secret!r}"
    if text_output:  # what a terminal shows: no control character but newline and tab
        decoded = data.decode("utf-8")
        found = RAW_CONTROL.search(decoded)
        assert found is None, f"{name} holds a raw control character {found.group()!r}"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> tuple[Path, str, str]:
    """One `run` against a server whose model name and labels are EVIL, through a URL with secrets.

    Fake: see the module docstring (no real engine serves a model named with an ESC sequence).
    """
    page = VLLM_PAGE.replace('model_name="tiny-llama"', f'model_name="{EVIL}"')
    assert page != VLLM_PAGE
    out = tmp_path_factory.mktemp("hygiene") / "run"
    mp = pytest.MonkeyPatch()
    for var in ("LLM_DIAGNOSE_API_KEY", "OPENAI_API_KEY"):  # Basic credentials in the URL, no Bearer key
        mp.delenv(var, raising=False)
    import io
    import sys

    stdout, stderr = io.StringIO(), io.StringIO()
    mp.setattr(sys, "stdout", stdout)
    mp.setattr(sys, "stderr", stderr)
    try:
        with ThreadedFake([page], model=EVIL) as fake:
            base = f"http://{USER}:{PASSWORD}@127.0.0.1:{fake.port}"
            metrics = (
                f"{base}/metrics?sig={SIG}&X-Amz-Signature={AMZ_SIG}&X-Amz-Credential={AMZ_CRED}"
                f"&code={CODE}&X-Amz-Date=20250101"
            )
            # Not --quiet: the progress lines are under test too.
            argv = ["run", "--url", base, "--metrics-url", metrics, "--duration", "1", "--interval", "0.5"]
            code = main([*argv, "--out", str(out)])
    finally:
        mp.undo()
    assert code == 0, stderr.getvalue()
    return out, stdout.getvalue(), stderr.getvalue()


def test_run_writes_no_secret_and_no_raw_control_anywhere(hostile_run):
    out, stdout, stderr = hostile_run
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"evidence.json", "diagnosis.json", "summary.txt", "metrics.jsonl"}
    for path in files:
        _assert_clean(str(path), path.read_bytes(), text_output=path.suffix not in (".json", ".jsonl"))
        if path.suffix == ".json":
            json.loads(path.read_text())  # still JSON, escapes and all
    _assert_clean("stdout", stdout.encode(), text_output=True)
    _assert_clean("stderr", stderr.encode(), text_output=True)
    # The progress line names the target, redacted; the hostile name is shown, escaped, and
    # the data keeps it exact (evidence.json is JSON: \u001b, the real name to a reader).
    assert "watching http://***@127.0.0.1:" in stderr
    assert "scrape ok" in stderr  # the progress lines were seen
    shown = escape_controls(EVIL)
    assert f"model {shown}" in stdout and f"model {shown}" in (out / "summary.txt").read_text()
    assert json.loads((out / "evidence.json").read_text())["items"]["engine.model"]["value"] == EVIL
    scrape = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert (
        "sig=***" in scrape["url"] and "X-Amz-Signature=***" in scrape["url"] and "X-Amz-Date=20250101" in scrape["url"]
    )
    assert f'model_name="{EVIL}"' in scrape["text"]  # the raw page is kept exact


def test_reports_gate_and_verify_carry_no_secret_and_no_raw_control(hostile_run, tmp_path, capsys):
    out, _, _ = hostile_run
    # Folder names are the runs' labels in gate and verify: give them the hostile name too.
    before, after = tmp_path / f"before{EVIL}", tmp_path / f"after{EVIL}"
    shutil.copytree(out, before)
    shutil.copytree(out, after)
    written = {}
    for fmt in ("md", "html", "json"):
        written[fmt] = tmp_path / f"report.{fmt}"
        assert main(["report", str(before), "--out", str(written[fmt])]) == 0
    gate_out = {f"gate.{x}": tmp_path / f"gate.{x}" for x in ("md", "json", "xml")}
    written.update(gate_out)
    gate = ["gate", "--baseline", str(before), "--current", str(after), "--verbose"]
    gate += ["--markdown", str(gate_out["gate.md"]), "--json", str(gate_out["gate.json"])]
    assert main([*gate, "--junit", str(gate_out["gate.xml"])]) == 0
    verify_out = {f"verify.{x}": tmp_path / f"verify.{x}" for x in ("md", "html", "xml")}
    written.update(verify_out)
    verify = ["verify", str(before), str(after), "--markdown", str(verify_out["verify.md"])]
    verify += ["--html", str(verify_out["verify.html"]), "--junit", str(verify_out["verify.xml"])]
    assert main(verify) in (0, 5)  # the same run twice: nothing adopted, nothing to judge
    captured = capsys.readouterr()
    _assert_clean("report/gate/verify stdout", captured.out.encode(), text_output=True)
    _assert_clean("report/gate/verify stderr", captured.err.encode(), text_output=True)
    assert escape_controls(EVIL) in captured.out  # the labels were shown: escaped, not dropped
    for name, path in written.items():
        data = path.read_bytes()
        _assert_clean(name, data, text_output=True)  # JSON too: ours carry no raw control either
        if name.endswith("json"):
            json.loads(data)
    md = written["md"].read_text()  # Markdown escapes the '[' and folds the CR (whitespace) too
    assert "\\x1b\\[2K all good \\x9b31m" in md


def test_a_secret_query_on_the_base_url_is_not_shown_even_when_the_run_fails(tmp_path, capsys, monkeypatch):
    # Fake, as above. A query on --url is not sent as the engine expects (paths are appended to
    # the base URL), so the run fails: its error message must still not show the signature.
    monkeypatch.delenv("LLM_DIAGNOSE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with ThreadedFake([VLLM_PAGE]) as fake:
        url = f"{USER}:{PASSWORD}@127.0.0.1:{fake.port}?sig={SIG}&X-Amz-Signature={AMZ_SIG}"
        code = main(["run", "--url", url, "--duration", "1", "--interval", "0.5", "--out", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code != 0 and "llm-diagnose: error:" in captured.err and "Traceback" not in captured.err
    assert "sig=***" in captured.err
    _assert_clean("stderr", captured.err.encode(), text_output=True)
    _assert_clean("stdout", captured.out.encode(), text_output=True)
    for path in (tmp_path / "r").rglob("*"):
        if path.is_file():
            _assert_clean(str(path), path.read_bytes(), text_output=False)


def test_plan_active_names_an_unreachable_target_without_its_credentials():
    # Real: a loopback port with nothing listening. The live goodput search's first request
    # fails; its error names the URL the user gave, redacted.
    from types import SimpleNamespace

    from llm_diagnose.diagnose.capacity.live import _measure
    from llm_diagnose.diagnose.errors import TargetError
    from llm_diagnose.probes.http import normalize_base_url
    from tests.test_live_attach import closed_port

    url = f"{USER}:{PASSWORD}@127.0.0.1:{closed_port()}"
    plan = SimpleNamespace(goodput=SimpleNamespace(requests=1))  # not read before the first request
    with pytest.raises(TargetError) as info:
        asyncio.run(_measure(url, normalize_base_url(url), plan, None))
    assert str(info.value).startswith("***@127.0.0.1:") and PASSWORD not in str(info.value)
