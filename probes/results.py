"""Measurement results: small immutable values that carry their statistics and provenance.

Three kinds of result exist, and nothing downstream may confuse them:

- `Measurement`: a number that was measured, with its unit, its raw samples (or a summary
  where only a summary exists, e.g. a histogram), and how, where and when it was taken.
- `Fact`: a configuration value that was observed (an engine flag, a model name, a dtype).
- `NotMeasured`: an explicit hole, with the reason and a hint on how to fill it. A missing
  measurement is never zero.

Standard library only, so the decision tree and its tests need neither numpy nor torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Union

__all__ = [
    "Provenance",
    "Summary",
    "Measurement",
    "Fact",
    "NotMeasured",
    "Result",
    "now_iso",
    "percentile",
    "result_to_dict",
    "result_from_dict",
]


def now_iso() -> str:
    """The current UTC time as ISO-8601 with milliseconds (what every provenance records)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def percentile(sorted_values: list[float] | tuple[float, ...], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100], on sorted input."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def _median_ci(sorted_values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    Uses the normal approximation to the binomial(n, 1/2) for the ranks, which is what
    latency samples (skewed, heavy-tailed) need: no normality of the values is assumed.
    """
    n = len(sorted_values)
    if n < 3:
        return float(sorted_values[0]), float(sorted_values[-1])
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    half = z * math.sqrt(n) / 2
    lo = max(0, int(math.floor(n / 2 - half)))
    hi = min(n - 1, int(math.ceil(n / 2 + half)) - 1)
    return float(sorted_values[lo]), float(sorted_values[hi])


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
    def from_dict(cls, d: dict) -> "Provenance":
        return cls(
            method=str(d["method"]),
            source=str(d["source"]),
            taken_at=str(d["taken_at"]),
            timer=d.get("timer"),
            window_s=None if d.get("window_s") is None else float(d["window_s"]),
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
    def from_samples(cls, samples: list[float] | tuple[float, ...], ci_level: float = 0.95) -> "Summary":
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
    def from_dict(cls, d: dict) -> "Summary":
        return cls(**{k: (int(d[k]) if k == "n" else float(d[k])) for k in cls.__dataclass_fields__ if k in d})


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

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind, "value": self.value, "unit": self.unit, "provenance": self.provenance.to_dict()}
        if self.samples:
            d["samples"] = list(self.samples)
        if self.calls_per_sample != 1:
            d["calls_per_sample"] = self.calls_per_sample
        if self.summary is not None:
            d["summary"] = self.summary.to_dict()
        if self.warnings:
            d["warnings"] = list(self.warnings)
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        return cls(
            value=float(d["value"]),
            unit=str(d["unit"]),
            provenance=Provenance.from_dict(d["provenance"]),
            samples=tuple(float(s) for s in d.get("samples", ())),
            calls_per_sample=int(d.get("calls_per_sample", 1)),
            summary=Summary.from_dict(d["summary"]) if d.get("summary") else None,
            warnings=tuple(str(w) for w in d.get("warnings", ())),
            note=str(d.get("note", "")),
        )


FactValue = Union[str, int, float, bool]


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
    def from_dict(cls, d: dict) -> "Fact":
        value = d["value"]
        if not isinstance(value, (str, int, float, bool)):
            raise ValueError(f"fact value must be a string, number or boolean, got {type(value).__name__}")
        return cls(value=value, provenance=Provenance.from_dict(d["provenance"]), note=str(d.get("note", "")))


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
    def from_dict(cls, d: dict) -> "NotMeasured":
        prov = d.get("provenance")
        return cls(reason=str(d["reason"]), hint=str(d.get("hint", "")), provenance=Provenance.from_dict(prov) if prov else None)


Result = Union[Measurement, Fact, NotMeasured]

_KINDS = {cls.kind: cls for cls in (Measurement, Fact, NotMeasured)}


def result_to_dict(result: Result) -> dict:
    return result.to_dict()


def result_from_dict(d: dict) -> Result:
    """Rebuild a result from its JSON form; raises ValueError naming what is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"expected an object, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"unknown result kind {kind!r} (expected one of {sorted(_KINDS)})")
    try:
        return _KINDS[kind].from_dict(d)
    except KeyError as exc:
        raise ValueError(f"{kind} is missing the field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind}: {exc}") from None
