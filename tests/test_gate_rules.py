"""Gate rules files: defaults, overrides, and errors that name the field."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.compare.rules import DEFAULT_METRICS
from llm_diagnose.diagnose.gate.rules import GateRulesError, load_rules, rules_from_mapping


def test_defaults_cover_latency_throughput_memory_and_hit_rates():
    keys = {r.key for r in load_rules(None).metrics}
    assert {
        "latency.ttft_p99_s",
        "decode.itl_p50_s",
        "throughput.generation_tokens_per_s",
        "memory.device_free_fraction",
        "kv.capacity_tokens",
        "prefix.hit_rate",
    } <= keys
    assert all(r.better in ("lower", "higher") for r in DEFAULT_METRICS)


def test_a_rules_file_overrides_adds_and_drops(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text("""
[gate]
resamples = 500
tolerance = 0.2

[metrics."latency.ttft_p50_s"]
tolerance = 0.3

[metrics."prefix.hit_rate"]
tolerance = 0.1

[metrics."kv.usage_p95"]
better = "lower"
tolerance_abs = 0.1
statistic = "p90"

[metrics."kv.preemptions_per_s"]
enabled = false

[diagnosis]
changed_answer = "warning"
min_confidence = 0.7
""")
    rules = load_rules(path)
    by_key = {r.key: r for r in rules.metrics}
    assert rules.settings.resamples == 500 and rules.settings.tolerance == 0.2 and rules.source == str(path)
    assert by_key["latency.ttft_p50_s"].tolerance == 0.3
    assert by_key["prefix.hit_rate"].tolerance == 0.1 and by_key["prefix.hit_rate"].tolerance_abs is None
    assert by_key["kv.usage_p95"].statistic == "p90" and by_key["kv.usage_p95"].tolerance_abs == 0.1
    assert "kv.preemptions_per_s" not in by_key
    assert rules.diagnosis.changed_answer == "warning" and rules.diagnosis.new_pitfall == "regression"
    assert rules.diagnosis.min_confidence == 0.7


def test_only_listed_keeps_just_the_file_s_metrics():
    rules = rules_from_mapping({"gate": {"only_listed": True}, "metrics": {"decode.itl_p50_s": {}}})
    assert [r.key for r in rules.metrics] == ["decode.itl_p50_s"]


@pytest.mark.parametrize(
    "data,message",
    [
        ({"gate": {"resamples": 10}}, "gate.resamples must be at least 100"),
        ({"gate": {"confidence": 1.5}}, "gate.confidence must be between"),
        ({"gate": {"seeds": 1}}, "unknown field 'seeds'"),
        ({"limits": {}}, "unknown field 'limits'"),
        ({"metrics": {"my.key": {"tolerance": 0.1}}}, "required: there is no default rule"),
        ({"metrics": {"decode.itl_p50_s": {"better": "faster"}}}, 'better must be "lower" or "higher"'),
        ({"metrics": {"decode.itl_p50_s": {"tolerance": 0.1, "tolerance_abs": 0.01}}}, "not both"),
        ({"metrics": {"decode.itl_p50_s": {"statistic": "max"}}}, "statistic must be"),
        ({"metrics": {"decode.itl_p50_s": {"tolerance": -1}}}, "tolerance must be at least 0"),
        ({"metrics": {"decode.itl_p50_s": 3}}, "must be a table"),
        ({"diagnosis": {"new_pitfall": "fail"}}, "must be one of regression, inconclusive, warning, ignore"),
        ({"diagnosis": {"new_thing": "warning"}}, "unknown field 'new_thing'"),
        ({"diagnosis": {"min_confidence": 2}}, "diagnosis.min_confidence must be between 0 and 1"),
    ],
)
def test_bad_rules_are_refused_naming_the_field(data, message):
    with pytest.raises(GateRulesError, match=None) as exc:
        rules_from_mapping(data, "gate.toml")
    assert message in str(exc.value) and str(exc.value).startswith("gate.toml")


def test_unreadable_rules_files(tmp_path):
    with pytest.raises(GateRulesError, match="does not exist"):
        load_rules(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text("[gate\n")
    with pytest.raises(GateRulesError, match="not valid TOML"):
        load_rules(tmp_path / "bad.toml")


def test_gate_tolerances_apply_to_rules_that_set_none():
    from llm_diagnose.diagnose.compare.statistic import is_tail, statistic_name

    rules = rules_from_mapping(
        {"gate": {"tolerance": 0.3, "tail_tolerance": 0.6}, "metrics": {"latency.e2e_p50_s": {"tolerance": 0.05}}}
    )
    by_key = {r.key: r for r in rules.metrics}
    assert by_key["latency.ttft_p50_s"].tolerance_in(rules.settings) == 0.3
    assert by_key["latency.ttft_p99_s"].tolerance_in(rules.settings) == 0.6
    assert by_key["latency.e2e_p50_s"].tolerance_in(rules.settings) == 0.05
    assert by_key["prefix.hit_rate"].tolerance_in(rules.settings) == 0.05  # its own, absolute
    assert statistic_name("decode.itl_p99_s") == "p99" and is_tail("p99") and not is_tail("median")


def test_a_metric_severity_turns_its_regressions_into_warnings():
    from llm_diagnose.diagnose.gate.judge import judge_rule
    from tests.evidence_builders import build

    rules = rules_from_mapping(
        {"gate": {"severity": "warning"}, "metrics": {"prefix.hit_rate": {"severity": "regression"}}}
    )
    ttft = next(r for r in rules.metrics if r.key == "latency.ttft_p50_s")
    hit = next(r for r in rules.metrics if r.key == "prefix.hit_rate")
    slow = judge_rule(ttft, build(latency__ttft_p50_s=0.1), build(latency__ttft_p50_s=0.3), rules)
    assert slow.verdict == "warning" and slow.detail.endswith("(a warning by the rules)")
    lost = judge_rule(hit, build(prefix__hit_rate=0.9), build(prefix__hit_rate=0.1), rules)
    assert lost.verdict == "regression"
    with pytest.raises(GateRulesError, match="gate.severity must be one of"):
        rules_from_mapping({"gate": {"severity": "fatal"}})
