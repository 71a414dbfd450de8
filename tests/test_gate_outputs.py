"""The gate's outputs and command: terminal summary, JUnit XML (validated), Markdown, exit codes."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.gate.judge import compare
from llm_diagnose.diagnose.gate.render import render_junit, render_text
from llm_diagnose.diagnose.gate.result import RunData
from llm_diagnose.diagnose.gate.rules import GateRules
from llm_diagnose.diagnose.report import markdown
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes.results import Measurement
from tests.test_report_content import rendered_markdown
from tests.test_report_samples import PROV, XSS, rich_evidence, write_run

SCHEMA = xmlschema.XMLSchema(Path(__file__).parent / "fixtures" / "junit" / "junit.xsd")


def variant(evidence: Evidence, **samples: list[float]) -> Evidence:
    """The evidence with some keys (dots as __) replaced by sampled measurements."""
    items = dict(evidence.items)
    for key, values in samples.items():
        key = key.replace("__", ".")
        items[key] = Measurement(sorted(values)[len(values) // 2], items[key].unit, PROV, samples=tuple(values))
    return Evidence(evidence.target, items, evidence.created_at, evidence.tool, evidence.host)


def ttft(median: float, n: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0, spread) for _ in range(n)]


def _result(current: Evidence, baseline: Evidence | None = None):
    baseline = baseline or rich_evidence()
    return compare(RunData(baseline, diagnose(baseline), "runs/main"), RunData(current, diagnose(current), "runs/pr"))


def test_junit_validates_against_the_schema_and_counts_what_it_holds():
    slow = variant(rich_evidence(), latency__ttft_p50_s=ttft(0.3, 200, 0.1, 1))
    noisy = variant(slow, decode__itl_p50_s=ttft(0.03, 12, 1.0, 2))
    result = _result(noisy)
    xml = render_junit(result, timestamp="2026-12-02T10:00:00", hostname="ci")
    SCHEMA.validate(xml)
    suite = ET.fromstring(xml).find("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == len(result.outcomes)
    assert int(suite.get("failures")) == len(suite.findall("testcase/failure")) == result.counts()["regression"] >= 1
    assert int(suite.get("skipped")) == len(suite.findall("testcase/skipped"))
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert "latency.ttft_p50_s" in failed
    skipped = {c.get("name"): c.find("skipped").get("message") for c in cases if c.find("skipped") is not None}
    assert skipped["decode.itl_p50_s"].startswith("inconclusive: ")


def test_junit_stays_valid_with_hostile_labels():
    result = _result(rich_evidence())
    result = type(result)(result.outcomes, result.rules, f"runs/{XSS}\x01\"'&", "cur<>")
    xml = render_junit(result)
    SCHEMA.validate(xml)
    props = {p.get("name"): p.get("value") for p in ET.fromstring(xml).iter("property")}
    assert props["baseline"] == f"runs/{XSS}\"'&"


def test_the_schema_is_strict():
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        SCHEMA.validate('<testsuites><testsuite name="x" tests="one" failures="0" errors="0"/></testsuites>')
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        SCHEMA.validate(
            '<testsuites><testsuite name="x" tests="1" failures="0" errors="0">'
            '<testcase name="a" classname="c" time="0"><failure/><skipped/></testcase>'
            "</testsuite></testsuites>"
        )


def test_markdown_summary_renders_as_one_table_row_per_rule():
    result = _result(variant(rich_evidence(), latency__ttft_p50_s=ttft(0.3, 200, 0.1, 1)))
    text = markdown.render_gate(result)
    assert text.startswith("## llm-diagnose gate: REGRESSION")
    md = rendered_markdown(text)
    (table,) = md.tables
    assert table[0] == ["rule", "verdict", "baseline", "current", "change (CI)", "tolerance", "how"]
    assert len(table) == 1 + len(result.outcomes) and {len(r) for r in table} == {7}
    assert table[1][0] == "latency.ttft_p50_s" and table[1][1] == "regression"


def test_terminal_summary_leads_with_the_verdict_and_lists_what_is_not_a_pass():
    text = render_text(_result(variant(rich_evidence(), latency__ttft_p50_s=ttft(0.3, 200, 0.1, 1))))
    lines = text.splitlines()
    assert lines[0] == "llm-diagnose gate: REGRESSION"
    assert any(line.split()[:2] == ["regression", "latency.ttft_p50_s"] for line in lines)
    assert not any(line.strip().startswith("pass ") for line in lines)
    assert "bootstrap 95% confidence interval" in text


# --- the command --------------------------------------------------------------------------------
def _runs(tmp_path: Path, current: Evidence) -> tuple[Path, Path]:
    return (
        write_run(tmp_path / "base", rich_evidence(), with_requests=False),
        write_run(tmp_path / "cur", current, with_requests=False),
    )


def test_gate_command_passes_a_rerun_of_the_same_configuration(tmp_path, capsys):
    base, cur = _runs(
        tmp_path,
        variant(
            rich_evidence(), latency__ttft_p50_s=ttft(0.2, 200, 0.1, 9), decode__itl_p50_s=ttft(0.03, 200, 0.13, 8)
        ),
    )
    out = tmp_path / "out"
    out.mkdir()
    code = main(
        [
            "gate",
            "--baseline",
            str(base),
            "--current",
            str(cur),
            "--junit",
            str(out / "gate.xml"),
            "--markdown",
            str(out / "gate.md"),
            "--json",
            str(out / "gate.json"),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert text.startswith("llm-diagnose gate: PASS")
    SCHEMA.validate(str(out / "gate.xml"))
    assert json.loads((out / "gate.json").read_text())["verdict"] == "pass"
    assert (out / "gate.md").read_text().startswith("## llm-diagnose gate: PASS")


def test_gate_command_exit_codes(tmp_path, capsys):
    base, slow = _runs(tmp_path, variant(rich_evidence(), latency__ttft_p50_s=ttft(0.3, 200, 0.1, 1)))
    assert main(["gate", "--baseline", str(base), "--current", str(slow)]) == 1
    noisy = write_run(
        tmp_path / "noisy", variant(rich_evidence(), latency__ttft_p50_s=ttft(0.2, 10, 1.2, 3)), with_requests=False
    )
    assert main(["gate", "--baseline", str(base), "--current", str(noisy)]) == 0
    assert "INCONCLUSIVE" in capsys.readouterr().out
    assert main(["gate", "--baseline", str(base), "--current", str(noisy), "--fail-on-inconclusive"]) == 5
    assert main(["gate", "--baseline", str(base / "evidence.json"), "--current", str(slow / "diagnosis.json")]) == 1


def test_gate_command_rules_and_usage_errors(tmp_path, capsys):
    base, slow = _runs(tmp_path, variant(rich_evidence(), latency__ttft_p50_s=ttft(0.3, 200, 0.1, 1)))
    rules = tmp_path / "gate.toml"
    rules.write_text('[metrics."latency.ttft_p50_s"]\nenabled = false\n')
    assert main(["gate", "--baseline", str(base), "--current", str(slow), "--rules", str(rules)]) == 0
    rules.write_text('[metrics."latency.ttft_p50_s"]\nbetter = "sideways"\n')
    assert main(["gate", "--baseline", str(base), "--current", str(slow), "--rules", str(rules)]) == 2
    assert "better must be" in capsys.readouterr().err
    assert main(["gate", "--baseline", str(tmp_path / "missing"), "--current", str(slow)]) == 2
    only_diagnosis = tmp_path / "only"
    only_diagnosis.mkdir()
    (only_diagnosis / "diagnosis.json").write_text((base / "diagnosis.json").read_text())
    assert main(["gate", "--baseline", str(only_diagnosis), "--current", str(slow)]) == 2
    assert "needs the run's evidence.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["gate", "--baseline", str(base)])  # argparse: --current is required
    assert exc.value.code == 2


def test_default_rules_need_no_file():
    assert GateRules().source == "defaults"
