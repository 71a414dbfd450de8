"""The `decide` command, CLI error handling, and the documentation of the stable identifiers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import COMMANDS, build_parser, main
from llm_diagnose.diagnose.tree.diagnosis import PITFALLS, QUESTIONS, TECHNIQUES
from tests.evidence_builders import build

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def evidence_file(tmp_path):
    ev = build(
        {
            "kv.usage_p95": 0.99,
            "kv.preemptions": 7,
            "engine.name": "vllm",
            "prefix.potential_fraction": 0.6,
            "config.prefix_caching": False,
        }
    )
    path = tmp_path / "evidence.json"
    path.write_text(ev.to_json())
    return path


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_decide_prints_the_diagnosis(capsys, evidence_file):
    code, out, err = run_cli(capsys, "decide", str(evidence_file))
    assert code == 0, err
    assert out.splitlines()[2].startswith("Bottleneck: Q1:")
    # KV full with preemptions while the model fits: a capacity finding (issue 13), not "quantize"
    assert "scale-out [recommended]" in out and "prefix-caching [recommended]" in out
    assert "vllm: --kv-cache-dtype fp8" in out
    assert "Path through the tree:" in out and "Not measured:" in out


def test_decide_json_uses_the_stable_identifiers(capsys, evidence_file):
    code, out, _ = run_cli(capsys, "decide", str(evidence_file), "--json")
    assert code == 0
    d = json.loads(out)
    assert d["schema"] == "llm-diagnose/diagnosis"
    assert [a["question"] for a in d["answers"]] == list(QUESTIONS)
    statuses = {r["technique"]: r["status"] for r in d["recommendations"]}
    assert statuses["scale-out"] == "recommended" and statuses["prefix-caching"] == "recommended"
    assert (d["headline_kind"], d["headline_subject"]) == ("capacity", "scale-out")
    assert {p["pitfall"] for p in d["pitfalls"]} == set(PITFALLS)


def test_decide_reads_a_run_folder_and_declared_workload(capsys, evidence_file):
    code, out, _ = run_cli(capsys, "decide", str(evidence_file.parent), "--offline", "--json")
    assert code == 0
    rec = {r["technique"]: r for r in json.loads(out)["recommendations"]}
    assert rec["offline-batch"]["status"] == "recommended"


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        ("{not json", "not JSON"),
        ('{"schema": "other"}', "field 'schema'"),
        ('{"schema": "llm-diagnose/evidence", "version": 99, "items": {}}', "field 'version'"),
        (
            '{"schema": "llm-diagnose/evidence", "version": 1, "items": {"kv.usage_p95": {"kind": "measurement"}}}',
            "field 'items.kv.usage_p95'",
        ),
        # (a value of the wrong type is not a reason to refuse the file: tests/test_safety_files.py)
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"schema": "llm-diagnose/evidence", "version": 1, "items": [1, 2]}', "field 'items'"),
    ],
)
def test_bad_evidence_is_one_clear_line_and_exit_2(capsys, tmp_path, content, expected):
    path = tmp_path / "evidence.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli(capsys, "decide", str(path))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-diagnose: error:") and expected in lines[0]


def test_unknown_threshold_names_it(capsys, tmp_path, evidence_file):
    rules = tmp_path / "t.toml"
    rules.write_text('[thresholds]\n"q9.nothing" = 1\n')
    code, _, err = run_cli(capsys, "decide", str(evidence_file), "--thresholds", str(rules))
    assert code == 2 and "unknown threshold 'q9.nothing'" in err


def test_wrong_flag_exits_2(capsys, evidence_file):
    with pytest.raises(SystemExit) as exc:
        main(["decide", str(evidence_file), "--no-such-flag"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_python_dash_m_works():
    proc = subprocess.run([sys.executable, "-m", "llm_diagnose", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0
    assert "exit codes:" in proc.stdout


def _sub_commands(parser) -> dict:
    return next(a for a in parser._actions if a.dest == "command").choices


def test_the_parser_has_exactly_the_commands_each_with_help_and_an_example():
    sub = _sub_commands(build_parser())
    assert list(sub) == list(COMMANDS)
    for name, p in sub.items():
        assert p.description, name
        assert "example" in (p.epilog or "").lower(), f"'{name}' has no Example in its help"


def test_the_top_level_help_is_the_same_without_importing_the_commands():
    # `llm-diagnose --help` lists COMMANDS' summaries without importing a command; each must be
    # the help= its own module gives, or the list would say something the command does not.
    assert build_parser(full=()).format_help() == build_parser().format_help()
    assert list(_sub_commands(build_parser(full=("decide",)))) == list(COMMANDS)


def test_a_command_without_its_module_is_an_error(monkeypatch):
    monkeypatch.setitem(COMMANDS, "no-such-command", "listed, but there is no module for it")
    with pytest.raises(ModuleNotFoundError, match="no-such-command"):
        build_parser()
    with pytest.raises(ModuleNotFoundError, match="no-such-command"):
        main(["no-such-command"])


# What a command line imports, seen from a fresh interpreter (this one has imported everything).
_IMPORTS_OF = """
import contextlib, io, json, sys
if sys.argv[1] == "--import":
    __import__(sys.argv[2]); code = 0
else:
    from llm_diagnose.diagnose.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(sys.argv[1:])
        except SystemExit as exc:  # --help
            code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
HEAVY = {"aiohttp", "prometheus_client"}  # the HTTP client and the metrics parser: live runs only


def imports_of(*argv: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_OF, *argv], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["code"] == 0, proc.stderr
    return set(result["modules"])


def test_the_top_level_help_imports_no_command():
    modules = imports_of("--help")
    assert not {m for m in modules if m.startswith("llm_diagnose.diagnose.commands")}
    assert not HEAVY & modules


@pytest.mark.parametrize("argv", [("decide", "--help"), ("plan", "--help"), ("decide", "EVIDENCE")])
def test_offline_commands_load_neither_the_http_client_nor_the_metrics_parser(argv, evidence_file):
    modules = imports_of(*(str(evidence_file) if a == "EVIDENCE" else a for a in argv))
    others = {m for m in modules if m.startswith("llm_diagnose.diagnose.commands.")} - {
        "llm_diagnose.diagnose.commands.common",
        "llm_diagnose.diagnose.commands.argtypes",  # the flags' validated types, shared like common
        f"llm_diagnose.diagnose.commands.{argv[0]}",
    }
    assert not others  # a command imports its own module alone
    assert not HEAVY & modules, HEAVY & modules


def test_docs_document_every_identifier_and_exit_code():
    # The reference moved from the README to docs/ (tests/test_docs.py checks every identifier the tree emits).
    identifiers = (ROOT / "docs" / "identifiers.md").read_text()
    for ident in QUESTIONS + TECHNIQUES + PITFALLS:
        assert f"`{ident}`" in identifiers, ident
    exit_codes = (ROOT / "docs" / "exit-codes.md").read_text()
    for code in ("0", "1", "2", "3", "4", "5", "130"):
        assert f"| {code} |" in exit_codes
