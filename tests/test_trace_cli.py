"""`llm-diagnose trace`: the JSON contract users' CI reads, errors and the evidence file."""

from __future__ import annotations

import json
import random
import string
import uuid

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes.traces import analyze_trace
from tests import trace_synthetic as synthetic


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


# --- trace and decide judge alike ---------------------------------------------------------------
TRACE_IDS = {"dynamic-prefix", "unstable-serialization", "kv-offload"}


def _some_dynamic_prompts(path, *, dynamic=15, unique=85, seed=0):
    """A trace where 15% of the prompt tokens sit behind a varying lead: between the trace analysis's
    old line (10%) and the tree's q2.dynamic_prefix_fraction (20%), and far from half the misses."""
    rng = random.Random(seed)
    shared = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "order", "status")) for _ in range(300))

    def word():
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randrange(3, 9)))

    rows = [{"prompt": f"Request {uuid.UUID(int=rng.getrandbits(128))}. {shared}"} for _ in range(dynamic)]
    rows += [{"prompt": " ".join(word() for _ in range(300))} for _ in range(unique)]
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _trace_ids(capsys, path, *argv) -> set[str]:
    code, out, _ = _run(capsys, path, "--json", *argv)
    assert code == 0
    return {f["id"] for f in json.loads(out)["findings"]}


def _decide_ids(capsys, evidence, *argv) -> set[str]:
    """What decide finds on the same evidence, in the trace's ids: its detected pitfalls, and a
    'yes' KV answer (the tree's form of kv-offload)."""
    assert main(["decide", str(evidence), "--json", *map(str, argv)]) == 0
    doc = json.loads(capsys.readouterr().out)
    found = {p["pitfall"] for p in doc["pitfalls"] if p["detected"]}
    if next(a for a in doc["answers"] if a["question"] == "KV")["answer"] == "yes":
        found.add("kv-offload")
    return found & TRACE_IDS


@pytest.mark.parametrize(
    "name, write, argv, expected",
    [
        ("dynamic", lambda p: synthetic.dynamic_text_prompts(p, n=60, kind="uuid"), (), {"dynamic-prefix"}),
        ("some-dynamic", _some_dynamic_prompts, (), set()),  # the trace flagged it at 10% before
        ("reordered", lambda p: synthetic.shuffled_tool_chat(p, n=60, shuffle_every=3), (), {"unstable-serialization"}),
        ("rarely-reordered", lambda p: synthetic.shuffled_tool_chat(p, n=60, shuffle_every=30), (), set()),  # 1.7%
        (
            "evicted",
            lambda p: synthetic.mooncake_hash_ids(p, n=3000, groups=20, shared_blocks=3),
            ("--kv-capacity-tokens", 512 * 10),
            {"kv-offload"},
        ),
    ],
)
def test_trace_and_decide_agree_on_the_same_file(tmp_path, capsys, name, write, argv, expected):
    path = tmp_path / f"{name}.jsonl"
    write(path)
    evidence = tmp_path / "ev.json"
    ids = _trace_ids(capsys, path, "--evidence-out", evidence, *argv)
    assert ids == expected
    assert _decide_ids(capsys, evidence) == ids


def test_some_dynamic_content_is_measured_but_under_the_line(tmp_path):
    path = tmp_path / "some.jsonl"
    _some_dynamic_prompts(path)
    a = analyze_trace(path)
    assert 0.10 <= a.similarity.dynamic_fraction < 0.20  # the case the two limits used to split
    assert a.divergence_examples and a.divergence_examples[0].what_varies == "uuid"  # measured all the same


def test_thresholds_move_the_trace_findings_as_they_move_decide(tmp_path, capsys):
    path = tmp_path / "tools.jsonl"
    synthetic.shuffled_tool_chat(path, n=60, shuffle_every=30)  # 1 request in 60 reorders its tool schema
    strict = tmp_path / "strict.toml"
    strict.write_text('[thresholds]\n"q2.unstable_serialization_fraction" = 0.01\n')
    evidence = tmp_path / "ev.json"
    assert _trace_ids(capsys, path, "--evidence-out", evidence) == set() == _decide_ids(capsys, evidence)
    assert (
        _trace_ids(capsys, path, "--thresholds", strict)
        == {"unstable-serialization"}
        == _decide_ids(capsys, evidence, "--thresholds", strict)
    )
    code, out, _ = _run(capsys, path, "--thresholds", strict)
    assert code == 0 and f"thresholds from {strict}" in out and "[warning] unstable-serialization" in out


def test_thresholds_set_the_dynamic_prefix_severity(tmp_path, capsys):
    path = tmp_path / "uuid.jsonl"
    synthetic.dynamic_text_prompts(path, n=40, kind="uuid")
    lenient = tmp_path / "lenient.toml"
    lenient.write_text("[thresholds.q2]\ndynamic_prefix_critical = 1.0\n")

    def finding(*argv):
        code, out, _ = _run(capsys, path, "--json", *argv)
        assert code == 0
        return next(f for f in json.loads(out)["findings"] if f["id"] == "dynamic-prefix")

    default, moved = finding(), finding("--thresholds", lenient)
    assert (default["severity"], moved["severity"]) == ("critical", "warning")
    named = {c["threshold"]: c["limit"] for c in moved["comparisons"]}
    assert named["q2.dynamic_prefix_fraction"] == 0.20 and named["q2.dynamic_prefix_critical"] == 1.0


def test_a_bad_thresholds_file_fails_before_the_analysis(tmp_path, capsys):
    path = tmp_path / "tools.jsonl"
    synthetic.shuffled_tool_chat(path, n=10)
    bad = tmp_path / "bad.toml"
    bad.write_text('[thresholds]\n"q2.no_such_limit" = 1\n')
    code, out, err = _run(capsys, path, "--thresholds", bad)
    assert code == 2 and "unknown threshold 'q2.no_such_limit'" in err and out == ""
