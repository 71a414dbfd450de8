"""Gate rules: which quantities the gate compares, which way is better, what change is tolerated.

The defaults (`llm_diagnose.diagnose.compare.rules.DEFAULT_METRICS`, `DiagnosisRules()`) cover
latency and throughput quantiles (per request from `requests.jsonl` where the run has one, else
the engine's own), memory and KV headroom, hit rates, and the diagnosis itself. A TOML file
(`gate --rules FILE`) overrides any of them; every field is optional:

    [gate]
    confidence = 0.95     # level of the bootstrap confidence interval of the change
    resamples = 2000      # bootstrap resamples per rule
    seed = 0              # seeded: the same two runs always give the same verdicts
    min_samples = 8       # fewer raw samples than this in either run: inconclusive
    tolerance = 0.10      # relative tolerance of metric rules that set none (medians, means, rates)
    tail_tolerance = 0.20 # the same for tail quantiles (keys naming p90, p99, ...): tails are noisier
    max_failed_fraction = 0.05  # the current run failing more of the requests it sent is a regression
    severity = "regression"  # what a metric's regression is: "warning" reports it without failing
    only_listed = false   # true: compare only the metrics listed in this file

    [metrics."latency.ttft_p50_s"]
    better = "lower"      # "lower" or "higher"; required for a key without a default rule
    tolerance = 0.15      # relative: up to 15% worse is a pass
    statistic = "median"  # optional: "median", "mean" or "p95"-style; default from the key name
                          # (p99 for *_p99*, mean for *_mean, else the median)

    [metrics."prefix.hit_rate"]
    tolerance_abs = 0.05  # absolute, in the key's unit (here: 5 points of hit rate)

    [metrics."prefix.hit_rate"]
    severity = "regression"  # per metric, over the [gate] default

    [metrics."kv.preemptions_per_s"]
    enabled = false       # drop a default rule

    [diagnosis]
    new_pitfall = "regression"         # a pitfall detected now and not before
    changed_answer = "regression"      # a question answered yes before and no now, or the reverse
    unknown_answer = "inconclusive"    # an answer that became, or was, "unknown"; a technique in
                                       # place before that the current run could not verify
    new_recommendation = "regression"  # a technique recommended (or not working) now and not before
    lost_technique = "regression"      # a technique in place before and not now (seen off, no longer needed)
    min_confidence = 0.5               # a change between answers no surer than this counts as unknown_answer

`tolerance`, `tail_tolerance` and `max_failed_fraction` are the tolerance registry's
(`llm_diagnose.diagnose.tolerances`): `[gate]` sets them over what the `[tolerances]`
table of `--thresholds` set. Each diagnosis rule, and each severity, is one of "regression",
"inconclusive", "warning" (shown, never fails) or "ignore". A metric's severity applies to its
regressions only: an improvement or an inconclusive comparison stays what it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from llm_diagnose.diagnose.compare.rules import DEFAULT_METRICS, MetricRule
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.compare.statistic import STATISTIC_NAME
from llm_diagnose.diagnose.tolerances import (
    MAX_FAILED_FRACTION,
    TAIL_TOLERANCE,
    TOLERANCE,
    Tolerances,
    TolerancesError,
    checked_number,
)
from llm_diagnose.diagnose.toml_file import read_toml

__all__ = [
    "GateRulesError",
    "DiagnosisRules",
    "GateRules",
    "SEVERITIES",
    "MAX_RESAMPLES",
    "load_rules",
    "rules_from_mapping",
]

SEVERITIES = ("regression", "inconclusive", "warning", "ignore")
# More bootstrap resamples than this buy no precision (the interval's ends move by well under a
# percent past 10,000) and cost minutes per rule.
MAX_RESAMPLES = 1_000_000
# The [gate] fields that are the tolerance registry's.
_REGISTRY_FIELDS = (TOLERANCE, TAIL_TOLERANCE, MAX_FAILED_FRACTION)


class GateRulesError(ValueError):
    """A rules file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class DiagnosisRules:
    new_pitfall: str = "regression"
    changed_answer: str = "regression"
    unknown_answer: str = "inconclusive"
    new_recommendation: str = "regression"
    lost_technique: str = "regression"
    min_confidence: float = 0.5  # a change between answers no surer than this counts as unknown_answer


@dataclass(frozen=True)
class GateRules:
    metrics: tuple[MetricRule, ...] = DEFAULT_METRICS
    diagnosis: DiagnosisRules = field(default_factory=DiagnosisRules)
    settings: CompareSettings = field(default_factory=CompareSettings)
    severity: str = "regression"  # what a metric's regression is, where its rule says nothing
    source: str = "defaults"


# --- reading a rules file ---------------------------------------------------------------------
def _number(where: str, value: object, *, low: float, high: float | None = None, integer: bool = False) -> float:
    try:
        return checked_number(where, value, low=low, high=high, integer=integer)
    except TolerancesError as exc:
        raise GateRulesError(str(exc)) from None


def _check_keys(where: str, table: Mapping, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise GateRulesError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(allowed)}")


def _severity(where: str, value: object) -> str:
    if value not in SEVERITIES:
        raise GateRulesError(f"{where} must be one of {', '.join(SEVERITIES)}, got {value!r}")
    return value


def _settings(src: str, table: Mapping, tolerances: Tolerances) -> tuple[CompareSettings, str, bool]:
    _check_keys(
        f"{src} [gate]",
        table,
        ("confidence", "resamples", "seed", "min_samples", *_REGISTRY_FIELDS, "severity", "only_listed"),
    )
    s = CompareSettings()
    try:
        tolerances = tolerances.set({k: table[k] for k in _REGISTRY_FIELDS if k in table}, src, where="gate.")
    except TolerancesError as exc:
        raise GateRulesError(str(exc)) from None
    settings = CompareSettings(
        confidence=_number(f"{src} gate.confidence", table.get("confidence", s.confidence), low=0.5, high=0.999),
        resamples=int(
            _number(
                f"{src} gate.resamples", table.get("resamples", s.resamples), low=100, high=MAX_RESAMPLES, integer=True
            )
        ),
        seed=int(_number(f"{src} gate.seed", table.get("seed", s.seed), low=0, integer=True)),
        min_samples=int(
            _number(f"{src} gate.min_samples", table.get("min_samples", s.min_samples), low=2, integer=True)
        ),
        tolerances=tolerances,
    )
    severity = _severity(f"{src} gate.severity", table.get("severity", GateRules.severity))
    only = table.get("only_listed", False)
    if not isinstance(only, bool):
        raise GateRulesError(f"{src} gate.only_listed must be true or false, got {only!r}")
    return settings, severity, only


def _metric(src: str, key: str, table: object, default: MetricRule | None) -> MetricRule | None:
    where = f"{src} metrics.{key!r}"
    if not isinstance(table, Mapping):
        raise GateRulesError(f'{where} must be a table ([metrics."{key}"])')
    _check_keys(
        where, table, ("better", "tolerance", "tolerance_abs", "statistic", "min_samples", "severity", "enabled")
    )
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise GateRulesError(f"{where}.enabled must be true or false, got {enabled!r}")
    if not enabled:
        return None
    better = table.get("better", default.better if default else None)
    if better not in ("lower", "higher"):
        raise GateRulesError(
            f'{where}.better must be "lower" or "higher", got {better!r}'
            + ("" if default else " (required: there is no default rule for this key)")
        )
    if "tolerance" in table and "tolerance_abs" in table:
        raise GateRulesError(f"{where}: give tolerance (relative) or tolerance_abs (absolute), not both")
    rule = default or MetricRule(key, better)
    rule = replace(rule, better=better)
    if "tolerance" in table:
        rule = replace(rule, tolerance=_number(f"{where}.tolerance", table["tolerance"], low=0), tolerance_abs=None)
    if "tolerance_abs" in table:
        rule = replace(
            rule, tolerance_abs=_number(f"{where}.tolerance_abs", table["tolerance_abs"], low=0), tolerance=None
        )
    if "statistic" in table:
        stat = table["statistic"]
        if not isinstance(stat, str) or not STATISTIC_NAME.match(stat):
            raise GateRulesError(f'{where}.statistic must be "median", "mean" or like "p95", got {stat!r}')
        rule = replace(rule, statistic=stat)
    if "severity" in table:
        rule = replace(rule, severity=_severity(f"{where}.severity", table["severity"]))
    if "min_samples" in table:
        rule = replace(
            rule, min_samples=int(_number(f"{where}.min_samples", table["min_samples"], low=2, integer=True))
        )
    return rule


def _diagnosis(src: str, table: Mapping) -> DiagnosisRules:
    allowed = tuple(DiagnosisRules.__dataclass_fields__)
    _check_keys(f"{src} [diagnosis]", table, allowed)
    values: dict = {}
    for name, value in table.items():
        if name == "min_confidence":
            values[name] = _number(f"{src} diagnosis.min_confidence", value, low=0, high=1)
        else:
            values[name] = _severity(f"{src} diagnosis.{name}", value)
    return DiagnosisRules(**values)


def rules_from_mapping(data: Mapping, source: str = "mapping", tolerances: Tolerances | None = None) -> GateRules:
    """The rules of a file's tables; its `[gate]` tolerances set over `tolerances` (the registry's
    values in force, from `--thresholds`; by default the registry's defaults)."""
    _check_keys(source, data, ("gate", "metrics", "diagnosis"))
    for section in ("gate", "metrics", "diagnosis"):
        if not isinstance(data.get(section, {}), Mapping):
            raise GateRulesError(f"{source}: [{section}] must be a table")
    settings, severity, only_listed = _settings(source, data.get("gate", {}), tolerances or Tolerances())
    defaults = {r.key: r for r in DEFAULT_METRICS}
    listed = data.get("metrics", {})
    metrics: dict[str, MetricRule] = {} if only_listed else dict(defaults)
    for key, table in listed.items():
        rule = _metric(source, key, table, defaults.get(key))
        if rule is None:
            metrics.pop(key, None)
        else:
            metrics[key] = rule
    return GateRules(tuple(metrics.values()), _diagnosis(source, data.get("diagnosis", {})), settings, severity, source)


def load_rules(path: str | Path | None, tolerances: Tolerances | None = None) -> GateRules:
    """The default rules, or those of a TOML file (see the module docstring), with the registry's
    tolerances `tolerances` (from `--thresholds`) under the file's own."""
    if path is None:
        return GateRules(settings=CompareSettings(tolerances=tolerances or Tolerances()))
    return rules_from_mapping(read_toml(path, "rules file", GateRulesError), str(path), tolerances)
