"""Gate rules: which quantities the gate compares, which way is better, what change is tolerated.

The defaults (`DEFAULT_METRICS`, `DiagnosisRules()`) cover latency and throughput quantiles
(per request from `requests.jsonl` where the run has one, else the engine's own), memory and
KV headroom, hit rates, and the diagnosis itself. A TOML file (`gate --rules
FILE`) overrides any of them; every field is optional:

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

Each diagnosis rule, and each severity, is one of "regression", "inconclusive", "warning"
(shown, never fails) or "ignore". A metric's severity applies to its regressions only: an
improvement or an inconclusive comparison stays what it is.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from llm_diagnose.probes import quantities as Q

__all__ = [
    "statistic_name",
    "is_tail",
    "REQUEST_TTFT_P50",
    "REQUEST_TTFT_P99",
    "REQUEST_TPOT_P50",
    "REQUEST_E2E_P50",
    "REQUEST_FAILED_FRACTION",
    "MAX_FAILED_FRACTION",
    "REQUEST_DECODE_TOKENS",
    "GateRulesError",
    "MetricRule",
    "DiagnosisRules",
    "GateSettings",
    "GateRules",
    "DEFAULT_METRICS",
    "SEVERITIES",
    "load_rules",
    "rules_from_mapping",
]

Better = Literal["lower", "higher"]

# Client-side latencies from the run folder's requests.jsonl (see llm_diagnose.diagnose.gate.request_measurements):
# the one source of per-request samples, so the gate can tell a latency change from noise.
REQUEST_TTFT_P50 = "requests.ttft_p50_s"
REQUEST_TTFT_P99 = "requests.ttft_p99_s"
REQUEST_TPOT_P50 = "requests.tpot_p50_s"
REQUEST_E2E_P50 = "requests.e2e_p50_s"
# The share of the requests the run sent that the server failed (llm_diagnose.probes.load.failures):
# one 0/1 sample per request sent, so two runs compare by the bootstrap of the mean like any other.
REQUEST_FAILED_FRACTION = "requests.failed_fraction"
# Not a gated metric: how many inter-token intervals the engine's ITL histogram should hold for
# the client's requests (each one's output tokens after its first), for the cross-check.
REQUEST_DECODE_TOKENS = "requests.decode_tokens"
SEVERITIES = ("regression", "inconclusive", "warning", "ignore")
# More bootstrap resamples than this buy no precision (the interval's ends move by well under a
# percent past 10,000) and cost minutes per rule.
MAX_RESAMPLES = 1_000_000
_STATISTIC = re.compile(r"^(median|mean|p\d{1,2}(\.\d+)?)$")
_QUANTILE_IN_KEY = re.compile(r"_p(\d{1,2}(?:\.\d+)?)(?:_|$)")


def statistic_name(key: str, override: str | None = None) -> str:
    """The statistic a key names: "p99" for `*_p99*`, "mean" for `*_mean`, else "median"."""
    if override:
        return "median" if override == "p50" else override
    m = _QUANTILE_IN_KEY.search(key)
    if m:
        return "median" if float(m.group(1)) == 50 else f"p{m.group(1)}"
    return "mean" if key.endswith("_mean") or "_mean_" in key else "median"


def is_tail(statistic: str) -> bool:
    return statistic.startswith("p") and float(statistic[1:]) > 50


class GateRulesError(ValueError):
    """A rules file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class MetricRule:
    key: str
    better: Better
    tolerance: float | None = None  # relative (0.1 = 10%); None: the [gate] default
    tolerance_abs: float | None = None  # absolute, in the key's unit; replaces `tolerance`
    statistic: str | None = None  # None: named by the key (p99 for *_p99*, mean for *_mean), else median
    min_samples: int | None = None
    severity: str | None = None  # what a regression of this metric is; None: the [gate] default

    @property
    def relative(self) -> bool:
        return self.tolerance_abs is None

    def tolerance_in(self, settings: GateSettings) -> float:
        """The tolerance that applies: the rule's own, else the [gate] default for its statistic."""
        if self.tolerance_abs is not None:
            return self.tolerance_abs
        if self.tolerance is not None:
            return self.tolerance
        return settings.tail_tolerance if is_tail(statistic_name(self.key, self.statistic)) else settings.tolerance

    def describe_tolerance(self, settings: GateSettings) -> str:
        tol = self.tolerance_in(settings)
        if not self.relative:
            return f"{tol:g} {self.better}-is-better, absolute"
        return f"{tol:.0%} {self.better}-is-better"


def _m(key: str, better: Better, tolerance: float | None = None, tolerance_abs: float | None = None) -> MetricRule:
    return MetricRule(key, better, tolerance, tolerance_abs)


# Relative rules take the [gate] tolerance (tails: tail_tolerance). Fractions get absolute
# ones (a hit rate going from 2% to 3% is +50% relative and means nothing); so does queueing
# time, which is 0 on an idle server.
# A failed request is no latency sample: a server that answers fast by failing half its requests
# must not pass. Failures are compared between the runs (2 points of the requests sent, absolute:
# one failure in 40 is within a run's noise, ten are not), and `GateSettings.max_failed_fraction`
# caps the current run's share whatever the baseline did.
REQUEST_FAILED_RULE = MetricRule(REQUEST_FAILED_FRACTION, "lower", tolerance_abs=0.02, statistic="mean")
# The default ceiling of the share of requests a current run may lose: a healthy server fails none,
# and a gate that passes a server losing one request in twenty protects nobody.
MAX_FAILED_FRACTION = 0.05

DEFAULT_METRICS: tuple[MetricRule, ...] = (
    REQUEST_FAILED_RULE,
    _m(REQUEST_TTFT_P50, "lower"),
    _m(REQUEST_TTFT_P99, "lower"),
    _m(REQUEST_TPOT_P50, "lower"),
    _m(REQUEST_E2E_P50, "lower"),
    _m(Q.TTFT_P50, "lower"),
    _m(Q.TTFT_P99, "lower"),
    _m(Q.ITL_P50, "lower"),
    _m(Q.ITL_P99, "lower"),
    _m(Q.E2E_P50, "lower"),
    _m(Q.QUEUE_TIME_P50, "lower", tolerance_abs=0.05),
    _m(Q.GEN_TOKENS_PER_S, "higher"),
    _m(Q.PROMPT_TOKENS_PER_S, "higher"),
    _m(Q.REQUESTS_PER_S, "higher"),
    _m(Q.DEVICE_FREE_FRACTION, "higher", tolerance_abs=0.05),
    _m(Q.KV_CAPACITY_TOKENS, "higher", 0.05),
    _m(Q.PREEMPTION_RATE, "lower", tolerance_abs=0.05),
    _m(Q.PREFIX_HIT_RATE, "higher", tolerance_abs=0.05),
    _m(Q.SPEC_ACCEPTANCE_RATE, "higher", tolerance_abs=0.05),
)


@dataclass(frozen=True)
class DiagnosisRules:
    new_pitfall: str = "regression"
    changed_answer: str = "regression"
    unknown_answer: str = "inconclusive"
    new_recommendation: str = "regression"
    lost_technique: str = "regression"
    min_confidence: float = 0.5  # a change between answers no surer than this counts as unknown_answer


@dataclass(frozen=True)
class GateSettings:
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    min_samples: int = 8
    tolerance: float = 0.10
    tail_tolerance: float = 0.20
    severity: str = "regression"
    # The current run's share of failed requests above which the gate fails, whatever the baseline
    # did (1 turns the ceiling off; the comparison with the baseline still applies).
    max_failed_fraction: float = MAX_FAILED_FRACTION


@dataclass(frozen=True)
class GateRules:
    metrics: tuple[MetricRule, ...] = DEFAULT_METRICS
    diagnosis: DiagnosisRules = field(default_factory=DiagnosisRules)
    settings: GateSettings = field(default_factory=GateSettings)
    source: str = "defaults"


# --- reading a rules file ---------------------------------------------------------------------
def _shown(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


def _number(where: str, value: object, *, low: float, high: float | None = None, integer: bool = False) -> float:
    """A field's number, checked for type, finiteness and range; the error names the field.

    NaN is refused first: it compares false with every bound, so `tolerance = nan` would pass
    the range check and then make every comparison with it false (issue 22: a +97% regression
    read as inconclusive).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise GateRulesError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise GateRulesError(f"{where} must be a finite number, got {value!r}")
    if value < low:
        most = "" if high is None else f" (and at most {_shown(high)})"
        raise GateRulesError(f"{where} must be at least {low:g}{most}, got {value!r}")
    if high is not None and value > high:
        raise GateRulesError(f"{where} must be between {low:g} and {_shown(high)}, got {value!r}")
    return value


def _check_keys(where: str, table: Mapping, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise GateRulesError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(allowed)}")


def _severity(where: str, value: object) -> str:
    if value not in SEVERITIES:
        raise GateRulesError(f"{where} must be one of {', '.join(SEVERITIES)}, got {value!r}")
    return value


def _settings(src: str, table: Mapping) -> tuple[GateSettings, bool]:
    _check_keys(
        f"{src} [gate]",
        table,
        (
            "confidence",
            "resamples",
            "seed",
            "min_samples",
            "tolerance",
            "tail_tolerance",
            "severity",
            "max_failed_fraction",
            "only_listed",
        ),
    )
    s = GateSettings()
    settings = GateSettings(
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
        tolerance=_number(f"{src} gate.tolerance", table.get("tolerance", s.tolerance), low=0),
        tail_tolerance=_number(f"{src} gate.tail_tolerance", table.get("tail_tolerance", s.tail_tolerance), low=0),
        severity=_severity(f"{src} gate.severity", table.get("severity", s.severity)),
        max_failed_fraction=_number(
            f"{src} gate.max_failed_fraction", table.get("max_failed_fraction", s.max_failed_fraction), low=0, high=1
        ),
    )
    only = table.get("only_listed", False)
    if not isinstance(only, bool):
        raise GateRulesError(f"{src} gate.only_listed must be true or false, got {only!r}")
    return settings, only


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
        if not isinstance(stat, str) or not _STATISTIC.match(stat):
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


def rules_from_mapping(data: Mapping, source: str = "mapping") -> GateRules:
    _check_keys(source, data, ("gate", "metrics", "diagnosis"))
    for section in ("gate", "metrics", "diagnosis"):
        if not isinstance(data.get(section, {}), Mapping):
            raise GateRulesError(f"{source}: [{section}] must be a table")
    settings, only_listed = _settings(source, data.get("gate", {}))
    defaults = {r.key: r for r in DEFAULT_METRICS}
    listed = data.get("metrics", {})
    metrics: dict[str, MetricRule] = {} if only_listed else dict(defaults)
    for key, table in listed.items():
        rule = _metric(source, key, table, defaults.get(key))
        if rule is None:
            metrics.pop(key, None)
        else:
            metrics[key] = rule
    return GateRules(tuple(metrics.values()), _diagnosis(source, data.get("diagnosis", {})), settings, source)


def load_rules(path: str | Path | None) -> GateRules:
    """The default rules, or those of a TOML file (see the module docstring)."""
    if path is None:
        return GateRules()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateRulesError(f"rules file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GateRulesError(f"rules file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise GateRulesError(f"rules file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise GateRulesError(f"rules file {path} is not readable: arrays or tables nested too deeply") from None
    return rules_from_mapping(data, str(path))
