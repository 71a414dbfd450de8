"""The one registry of comparison tolerances: its defaults, the two files that set it (the
`[tolerances]` table of --thresholds, the `[gate]` table of --rules over it), and the failure
ceiling that the gate and verify decide with one predicate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.commands.gate import load_thresholds_file
from llm_diagnose.diagnose.compare.request_measurements import REQUEST_FAILED_FRACTION
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.errors import ExitCode, UsageError
from llm_diagnose.diagnose.gate.judge import FAILURE_CEILING, compare
from llm_diagnose.diagnose.gate.result import RunData
from llm_diagnose.diagnose.gate.rules import GateRules, GateRulesError, load_rules
from llm_diagnose.diagnose.tolerances import (
    MAX_FAILED_FRACTION,
    PROMPT_TOKENS,
    TAIL_TOLERANCE,
    TOLERANCE,
    TOLERANCES,
    Tolerances,
)
from llm_diagnose.diagnose.verify.judge import verify
from tests.test_request_failures import write_run as write_failing_run
from tests.test_verify import side
from tests.test_verify import write_run as write_verify_run

THRESHOLDS_FILE = """
[thresholds]
"q2.min_reuse_fraction" = 0.2

[slo]
ttft_p99_s = 2.0

[tolerances]
tolerance = 0.3
max_failed_fraction = 0.5

[tolerances.workload]
prompt_tokens = 4.0
"""


def test_every_tolerance_is_named_with_its_default_meaning_and_source():
    defaults = Tolerances()
    assert defaults[TOLERANCE] == 0.10 and defaults[TAIL_TOLERANCE] == 0.20 and defaults[MAX_FAILED_FRACTION] == 0.05
    assert CompareSettings().tolerance == 0.10 and CompareSettings().tail_tolerance == 0.20
    for t in TOLERANCES.values():
        assert defaults[t.name] == t.default and t.meaning and t.source, t
        assert t.unit in ("relative", "fraction"), t


def test_the_thresholds_file_sets_the_registry_and_the_gate_rules_set_it_over(tmp_path):
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text(THRESHOLDS_FILE)
    tree, from_file = load_thresholds_file(str(thresholds))
    assert tree is not None and tree["q2.min_reuse_fraction"] == 0.2  # the tree's table is the tree's
    assert from_file[TOLERANCE] == 0.3 and from_file[PROMPT_TOKENS] == 4.0 and from_file[MAX_FAILED_FRACTION] == 0.5
    assert from_file[TAIL_TOLERANCE] == 0.20  # not set: its default
    assert from_file.overridden == {TOLERANCE, PROMPT_TOKENS, MAX_FAILED_FRACTION}
    assert from_file.source == str(thresholds)
    # No rules file: the thresholds file's values are the gate's.
    assert load_rules(None, from_file).settings.tolerance == 0.3
    # A rules file's [gate] sets the names it shares over them; the others stay as the thresholds set them.
    rules = tmp_path / "gate.toml"
    rules.write_text("[gate]\ntolerance = 0.15\n")
    settings = load_rules(rules, from_file).settings
    assert (
        settings.tolerance == 0.15 and settings.max_failed_fraction == 0.5 and settings.tolerances[PROMPT_TOKENS] == 4.0
    )
    assert settings.tolerances.source == f"{thresholds} + {rules}"
    # A metric rule without a tolerance of its own takes the registry's in force.
    ttft = next(r for r in load_rules(rules, from_file).metrics if r.key == "latency.ttft_p50_s")
    assert ttft.tolerance_in(settings) == 0.15


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[tolerances]\nslack = 0.1\n", "unknown tolerance 'slack' in [tolerances]; known: tolerance, tail_tolerance"),
        ("[tolerances]\ntolerance = nan\n", "tolerances.tolerance must be a finite number"),
        ("[tolerances]\ntolerance = -0.1\n", "tolerances.tolerance must be at least 0"),
        ("[tolerances]\nmax_failed_fraction = 2\n", "tolerances.max_failed_fraction must be between 0 and 1"),
        ('[tolerances.workload]\nprompt_tokens = "10%"\n', "tolerances.workload.prompt_tokens must be a number"),
        ("tolerances = 0.1\n", "tolerances must be a table"),
    ],
)
def test_a_bad_tolerance_is_refused_naming_the_file_and_the_field(tmp_path, table, message):
    path = tmp_path / "t.toml"
    path.write_text(table)
    with pytest.raises(UsageError, match=None) as exc:
        load_thresholds_file(str(path))
    assert message in str(exc.value) and str(path) in str(exc.value), exc.value


def test_the_gate_rules_check_the_registry_names_by_the_registry_ranges():
    from llm_diagnose.diagnose.gate.rules import rules_from_mapping

    with pytest.raises(GateRulesError, match="rules.toml gate.max_failed_fraction must be between 0 and 1"):
        rules_from_mapping({"gate": {"max_failed_fraction": 1.5}}, "rules.toml")
    with pytest.raises(GateRulesError, match="gate.tail_tolerance must be a finite number"):
        rules_from_mapping({"gate": {"tail_tolerance": math.inf}}, "rules.toml")


def test_the_gate_ceiling_and_the_verify_note_are_one_predicate(tmp_path):
    """10 of 40 failed is exactly a 25% ceiling: within it for both; 12 of 40 is above it for both."""
    settings = CompareSettings(tolerances=Tolerances().set({MAX_FAILED_FRACTION: 0.25}, "test"))
    ok = write_failing_run(tmp_path / "ok")
    at = write_failing_run(tmp_path / "at", failing=set(range(0, 20, 2)), seed=2)
    above = write_failing_run(tmp_path / "above", failing=set(range(0, 24, 2)), seed=3)
    base = side(ok)
    for folder, failing in ((at, False), (above, True)):
        cur = side(folder)
        fraction = cur.evidence.measurement(REQUEST_FAILED_FRACTION)
        assert fraction is not None and settings.failed_too_often(fraction.value) is failing
        result = compare(
            RunData(base.evidence, base.diagnosis), RunData(cur.evidence, cur.diagnosis), GateRules(settings=settings)
        )
        ceiling = next(o for o in result.outcomes if o.name == FAILURE_CEILING)
        assert ceiling.verdict == ("regression" if failing else "pass"), ceiling
        noted = any("more than 25%" in n for n in verify(base, cur, settings=settings).notes)
        assert noted is failing, folder


def test_gate_thresholds_file_sets_the_ceiling_and_rules_override_it(tmp_path, capsys):
    baseline = write_failing_run(tmp_path / "ok")
    current = write_failing_run(tmp_path / "some", failing=set(range(0, 24, 2)), seed=2)  # 30% failed
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text(THRESHOLDS_FILE)  # max_failed_fraction = 0.5; [thresholds] and [slo] as well
    argv = ["gate", "--baseline", str(baseline), "--current", str(current), "--verbose"]

    def ceiling(*extra: str) -> str:
        main([*argv, *extra])
        out = capsys.readouterr().out
        return next(line.split()[0] for line in out.splitlines() if line.split()[1:2] == [FAILURE_CEILING])

    assert ceiling() == "regression"  # the default ceiling, 5%
    assert ceiling("--thresholds", str(thresholds)) == "pass"  # the thresholds file's 50%
    rules = tmp_path / "gate.toml"
    rules.write_text("[gate]\nmax_failed_fraction = 0.2\n")
    assert ceiling("--thresholds", str(thresholds), "--rules", str(rules)) == "regression"  # the rules' 20%


def test_verify_thresholds_file_sets_the_workload_tolerance(tmp_path, capsys):
    before = write_verify_run(tmp_path / "before", prefix_caching=False, hit_rate=0.0, ttft_s=0.20, seed=1)
    after = write_verify_run(
        tmp_path / "after", prefix_caching=True, hit_rate=0.45, ttft_s=0.12, prompt=2048, seed=2
    )  # four times the prompt: +300%, beyond the default 10%
    assert main(["verify", str(before), str(after)]) == ExitCode.INCONCLUSIVE
    assert "prompt tokens (median) differs by +300.0% (tolerance 10%)" in capsys.readouterr().out
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text(THRESHOLDS_FILE)  # workload.prompt_tokens = 4.0: +300% is within it
    code = main(["verify", str(before), str(after), "--thresholds", str(thresholds)])
    out = capsys.readouterr().out
    assert code != ExitCode.INCONCLUSIVE and "no verdicts" not in out, out


def test_a_bad_thresholds_file_is_one_line_exit_2(tmp_path, capsys):
    before = write_verify_run(tmp_path / "before", prefix_caching=False, hit_rate=0.0, ttft_s=0.20, seed=1)
    bad = tmp_path / "bad.toml"
    bad.write_text("[tolerances]\ntolerance = -1\n")
    for argv in (
        ["verify", str(before), str(before), "--thresholds", str(bad)],
        ["gate", "--baseline", str(before), "--current", str(before), "--thresholds", str(bad)],
    ):
        assert main(argv) == ExitCode.USAGE, argv
        err = capsys.readouterr().err
        assert "tolerances.tolerance must be at least 0" in err and "Traceback" not in err, err
    missing = Path(tmp_path / "none.toml")
    assert main(["verify", str(before), str(before), "--thresholds", str(missing)]) == ExitCode.USAGE
    assert f"thresholds file {missing} does not exist" in capsys.readouterr().err
