"""Measurement results: small immutable values that carry their statistics and provenance.

Three kinds of result exist, and nothing downstream may confuse them:

- `Measurement`: a number that was measured, with its unit, its raw samples (or a summary
  where only a summary exists, e.g. a histogram), and how, where and when it was taken.
- `Fact`: a configuration value that was observed (an engine flag, a model name, a dtype).
- `NotMeasured`: an explicit hole, with the reason and a hint on how to fill it. A missing
  measurement is never zero.

Standard library only (its statistics come from llm_diagnose.probes.stats, whose order statistics
are pure Python), so the decision tree and its tests need neither numpy nor torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime

from llm_diagnose.probes.stats import median_ci as _median_ci
from llm_diagnose.probes.stats import percentile
from llm_diagnose.probes.warning_codes import CodedWarning, WarningCode, legacy_coded

__all__ = [
    "Provenance",
    "Summary",
    "Measurement",
    "Fact",
    "NotMeasured",
    "Result",
    "now_iso",
    "percentile",
    "result_from_dict",
    "InvalidValue",
    "describe_json_value",
]


def now_iso() -> str:
    """The current UTC time as ISO-8601 with milliseconds (what every provenance records)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class InvalidValue(ValueError):
    """A field of a result read from JSON holds a value of the wrong type, or a non-finite one.

    Evidence.from_dict turns such an item into a NotMeasured saying so, instead of refusing the
    whole file; a missing field or an unknown kind is a plain ValueError (the file is refused).
    """


def describe_json_value(value: object) -> str:
    """What a JSON value is, for messages: "a string ('0.99')", "a boolean (true)", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({value[:24]!r}{'...' if len(value) > 24 else ''})"
    if isinstance(value, int):
        if value.bit_length() < 64:
            return f"the integer {value}"
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _number(value: object, name: str) -> float:
    """A JSON number as a finite float; InvalidValue for anything else (strings, booleans, huge
    integers, NaN and infinities)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidValue(f"field {name!r} is {describe_json_value(value)}, expected a number")
    try:
        f = float(value)
    except OverflowError:
        raise InvalidValue(f"field {name!r} is {describe_json_value(value)}, beyond the range of a number") from None
    if not math.isfinite(f):
        raise InvalidValue(f"field {name!r} is {f!r}, expected a finite number")
    return f


def _integer(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"field {name!r} is {describe_json_value(value)}, expected an integer")
    _number(value, name)  # within a float's range, like every other number
    return value


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"field {name!r} is {describe_json_value(value)}, expected a string")
    return value


def _list(value: object, name: str) -> list:
    if not isinstance(value, list):
        raise InvalidValue(f"field {name!r} is {describe_json_value(value)}, expected a list")
    return value


def _object(value: object, name: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidValue(f"field {name!r} is {describe_json_value(value)}, expected an object")
    return value


def _check_finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        # A non-finite number is not a measurement: the probe must say NotMeasured instead.
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


@dataclass(frozen=True)
class Provenance:
    """How, from where and when a result was obtained."""

    method: str  # e.g. "prometheus-counter-delta", "nvml", "trace-analysis", "cpu-timer"
    source: str  # e.g. a URL, a file path, a device name
    taken_at: str = field(default_factory=now_iso)
    timer: str | None = None  # which clock, and why that one (timing core)
    window_s: float | None = None  # length of the observation window, where there is one

    def to_dict(self) -> dict:
        d: dict = {"method": self.method, "source": self.source, "taken_at": self.taken_at}
        if self.timer is not None:
            d["timer"] = self.timer
        if self.window_s is not None:
            d["window_s"] = self.window_s
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Provenance:
        d = _object(d, "provenance")
        return cls(
            method=_text(d["method"], "provenance.method"),
            source=_text(d["source"], "provenance.source"),
            taken_at=_text(d["taken_at"], "provenance.taken_at"),
            timer=None if d.get("timer") is None else _text(d["timer"], "provenance.timer"),
            window_s=None if d.get("window_s") is None else _number(d["window_s"], "provenance.window_s"),
        )


@dataclass(frozen=True)
class Summary:
    """Summary statistics of a sample, or of a distribution known only by its quantiles."""

    n: int
    mean: float
    median: float
    stdev: float
    min: float
    max: float
    p05: float
    p95: float
    p99: float
    ci_low: float  # confidence interval of the median
    ci_high: float
    ci_level: float = 0.95

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("a Summary needs at least one observation")
        for name in ("mean", "median", "stdev", "min", "max", "p05", "p95", "p99", "ci_low", "ci_high"):
            _check_finite(name, getattr(self, name))

    @property
    def cv(self) -> float | None:
        """Coefficient of variation; None where the mean is zero (undefined, not zero)."""
        return None if self.mean == 0 else self.stdev / abs(self.mean)

    @property
    def iqr_like_spread(self) -> float | None:
        """Relative width of the median's confidence interval (a spread that tolerates outliers)."""
        return None if self.median == 0 else (self.ci_high - self.ci_low) / abs(self.median)

    @classmethod
    def from_samples(cls, samples: list[float] | tuple[float, ...], ci_level: float = 0.95) -> Summary:
        values = sorted(_check_finite("sample", s) for s in samples)
        if not values:
            raise ValueError("Summary.from_samples needs at least one sample")
        lo, hi = _median_ci(values, ci_level)
        return cls(
            n=len(values),
            mean=statistics.fmean(values),
            median=percentile(values, 50),
            stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
            min=values[0],
            max=values[-1],
            p05=percentile(values, 5),
            p95=percentile(values, 95),
            p99=percentile(values, 99),
            ci_low=lo,
            ci_high=hi,
            ci_level=ci_level,
        )

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> Summary:
        d = _object(d, "summary")
        missing = [k for k in cls.__dataclass_fields__ if k not in d and k != "ci_level"]
        if missing:
            raise InvalidValue(f"field 'summary' lacks {', '.join(map(repr, missing))}")
        return cls(
            n=_integer(d["n"], "summary.n"),
            **{k: _number(d[k], f"summary.{k}") for k in cls.__dataclass_fields__ if k != "n" and k in d},
        )


@dataclass(frozen=True)
class Measurement:
    """One measured quantity.

    `value` is the figure the quantity's name promises (a p95, a rate, a fraction).
    `samples` are the raw observations behind it where they exist (scrapes, timed blocks,
    per-request values); `calls_per_sample` says how many calls one timed sample covered.
    `summary` is derived from the samples when not given, or given directly when only a
    summary exists (a histogram's windowed quantiles).
    """

    value: float
    unit: str
    provenance: Provenance
    samples: tuple[float, ...] = ()
    calls_per_sample: int = 1
    summary: Summary | None = None
    warnings: tuple[str, ...] = ()
    note: str = ""

    kind = "measurement"

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _check_finite("value", self.value))
        samples = tuple(_check_finite("sample", s) for s in self.samples)
        object.__setattr__(self, "samples", samples)
        object.__setattr__(self, "warnings", tuple(self.warnings))
        if self.calls_per_sample < 1:
            raise ValueError("calls_per_sample must be at least 1")
        if self.summary is None and samples:
            object.__setattr__(self, "summary", Summary.from_samples(samples))

    @property
    def n(self) -> int:
        """How many observations stand behind the value (1 for a single reading)."""
        return self.summary.n if self.summary is not None else 1

    @property
    def codes(self) -> frozenset[WarningCode]:
        """The codes of its warnings the tree acts on (probes.warning_codes)."""
        return frozenset(w.code for w in self.warnings if isinstance(w, CodedWarning))

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind, "value": self.value, "unit": self.unit, "provenance": self.provenance.to_dict()}
        if self.samples:
            d["samples"] = list(self.samples)
        if self.calls_per_sample != 1:
            d["calls_per_sample"] = self.calls_per_sample
        if self.summary is not None:
            d["summary"] = self.summary.to_dict()
        if self.warnings:
            # A coded warning keeps its code on disk: {"code": ..., "text": ...}; the rest are text.
            d["warnings"] = [
                {"code": str(w.code), "text": str(w)} if isinstance(w, CodedWarning) else str(w) for w in self.warnings
            ]
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        value, unit, provenance = d["value"], d["unit"], d["provenance"]  # KeyError: a missing field
        return cls(
            value=_number(value, "value"),
            unit=_text(unit, "unit"),
            provenance=Provenance.from_dict(provenance),
            samples=tuple(_number(s, "samples") for s in _list(d.get("samples", []), "samples")),
            calls_per_sample=_integer(d.get("calls_per_sample", 1), "calls_per_sample"),
            summary=Summary.from_dict(d["summary"]) if d.get("summary") is not None else None,
            warnings=tuple(_warning(w) for w in _list(d.get("warnings", []), "warnings")),
            note=_text(d.get("note", ""), "note"),
        )


def _warning(w: object) -> str:
    """A warning as written: text (coded from its first words where an older file wrote one the tree
    acts on), or {"code", "text"} (a code this version does not know leaves the text uncoded)."""
    if isinstance(w, dict):
        code, text = _text(w.get("code"), "warnings.code"), _text(w.get("text"), "warnings.text")
        try:
            return CodedWarning(WarningCode(code), text)
        except ValueError:  # a code of a newer version: the text stands, uncoded, and the figure is kept
            return text
    return legacy_coded(_text(w, "warnings"))


FactValue = str | int | float | bool


@dataclass(frozen=True)
class Fact:
    """An observed configuration value (not a measurement: it has no spread)."""

    value: FactValue
    provenance: Provenance
    note: str = ""

    kind = "fact"

    def __post_init__(self) -> None:
        if not isinstance(self.value, (str, int, float, bool)):
            raise TypeError(f"a Fact holds str, int, float or bool, not {type(self.value).__name__}")
        if isinstance(self.value, float):
            _check_finite("fact", self.value)

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind, "value": self.value, "provenance": self.provenance.to_dict()}
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Fact:
        value, provenance = d["value"], d["provenance"]  # KeyError: a missing field
        if not isinstance(value, (str, int, float, bool)):
            raise InvalidValue(f"field 'value' is {describe_json_value(value)}, expected a string, number or boolean")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            _number(value, "value")  # finite, and within a float's range
        return cls(value=value, provenance=Provenance.from_dict(provenance), note=_text(d.get("note", ""), "note"))


@dataclass(frozen=True)
class NotMeasured:
    """An explicit hole in the evidence: why nothing was measured, and how to measure it."""

    reason: str  # e.g. "no NVIDIA driver on this machine"
    hint: str = ""  # e.g. "run llm-diagnose on the GPU host"
    provenance: Provenance | None = None

    kind = "not-measured"

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind, "reason": self.reason}
        if self.hint:
            d["hint"] = self.hint
        if self.provenance is not None:
            d["provenance"] = self.provenance.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> NotMeasured:
        reason, prov = d["reason"], d.get("provenance")  # KeyError: a missing field
        return cls(
            reason=_text(reason, "reason"),
            hint=_text(d.get("hint", ""), "hint"),
            provenance=Provenance.from_dict(prov) if prov is not None else None,
        )


Result = Measurement | Fact | NotMeasured

_KINDS = {cls.kind: cls for cls in (Measurement, Fact, NotMeasured)}


def result_from_dict(d: dict) -> Result:
    """Rebuild a result from its JSON form.

    Raises:
        ValueError: not an object, an unknown kind, or a missing field (the structure is wrong).
        InvalidValue: a field holds a value of the wrong type, or a non-finite or impossible one.
    """
    if not isinstance(d, dict):
        raise ValueError(f"expected an object, got {describe_json_value(d)}")
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError(f"unknown result kind {kind!r:.40} (expected one of {sorted(_KINDS)})")
    try:
        return _KINDS[kind].from_dict(d)
    except KeyError as exc:
        raise ValueError(f"{kind} is missing the field {exc.args[0]!r}") from None
    except InvalidValue:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # the constructors' own checks (finite, n >= 1)
        raise InvalidValue(str(exc)) from None
