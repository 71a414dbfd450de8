"""`llm-diagnose trace`: the JSON contract users' CI reads, errors and the evidence file."""

from __future__ import annotations

import json

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes.traces import synthetic


def _run(capsys, *argv):
    code = main(["trace", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_contract(tmp_path, capsys):
    path = tmp_path / "tools.jsonl"
    synthetic.shuffled_tool_chat(path, n=40)
    code, out, _ = _run(capsys, path, "--json", "--kv-capacity-tokens", "4096")
    assert code == 0
    doc = json.loads(out)
    assert doc["requests"] == 40
    for side in ("input_tokens", "output_tokens"):
        assert {"p50", "mean", "p99", "cv"} <= set(doc[side])
    assert 0 <= doc["prefix_reuse"]["token_fraction"] <= 1
    assert doc["prefix_reuse"]["lru_token_fraction"] is not None
    ids = [f["id"] for f in doc["findings"]]
    assert "unstable-serialization" in ids
    for f in doc["findings"]:
        assert {"id", "severity", "message", "evidence", "fix"} <= set(f)


def test_console_output_never_prints_prompt_text(tmp_path, capsys):
    path = tmp_path / "uuid.jsonl"
    synthetic.dynamic_text_prompts(path, n=40, kind="uuid")
    code, out, _ = _run(capsys, path, "--block-size", "128")
    assert code == 0
    assert "dynamic-prefix" in out and "uuid" in out and "blocks of 128" in out
    assert "helpful assistant" not in out and "alpha" not in out


def test_errors_are_one_line_with_the_line_number(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{broken\n')
    code, _, err = _run(capsys, path, "--strict")
    assert code == 2 and f"{path}:2:" in err and err.count("\n") == 1
    code, out, err = _run(capsys, path)
    assert code == 0 and "1 lines skipped" in out
    code, _, err = _run(capsys, tmp_path / "nope.jsonl")
    assert code == 2 and "no such file" in err
    with pytest.raises(SystemExit) as exit_:
        main(["trace", str(path), "--block-size", "0"])
    assert exit_.value.code == 2


def test_evidence_out_feeds_decide(tmp_path, capsys):
    path = tmp_path / "az.csv"
    synthetic.lengths_csv(path, n=300)
    out_file = tmp_path / "ev.json"
    code, _, _ = _run(capsys, path, "--evidence-out", out_file)
    assert code == 0
    ev = Evidence.from_json(out_file.read_text())
    assert ev.measurement("outputs.length_cv") is not None and ev.target.url == str(path)
    assert main(["decide", str(out_file), "--json"]) == 0
