"""Hand-built evidence for tests of the decision tree.

`build(**items)` takes evidence keys with dots replaced by double underscores, or a dict:
floats and ints become Measurements, bools and strings Facts, None a NotMeasured.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance

PROV = Provenance(method="hand-built", source="test", taken_at="2026-12-02T00:00:00.000+00:00")
# Live (client-timed) keys the tree judges by their interval (Reading.live): a plain number given
# for one is built as a well-sampled experiment's result, with a +-3% interval around it; build
# an open one with `live(value, low, high)`.
LIVE_KEYS = frozenset({Q.SHORT_WAIT_FOR_LONG, Q.ITL_INFLATION})
LIVE_PROV = Provenance(method="active-probe/hand-built", source="test", taken_at="2026-12-02T00:00:00.000+00:00")
LIVE_SPREAD = (0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03)


def live(value: float, low: float | None = None, high: float | None = None, *, warnings=()) -> Measurement:
    """A live measurement with an interval: [low, high] when given, else +-3% of value."""
    if low is None or high is None:
        samples = tuple(value * f for f in LIVE_SPREAD)
    else:  # seven samples whose median interval (order statistics) is [low, high]
        samples = (low, low, value, value, value, high, high)
    m = Measurement(float(value), "ratio", LIVE_PROV, samples=samples, warnings=tuple(warnings))
    assert m.summary is not None
    return m


def result(value, key: str = ""):
    if value is None:
        return NotMeasured(reason="not measured in this test", hint="test hint", provenance=PROV)
    if isinstance(value, (bool, str)):
        return Fact(value, PROV)
    if isinstance(value, (Measurement, Fact, NotMeasured)):  # ready-made results travel as they are
        return value
    if key in LIVE_KEYS:
        return live(float(value))
    return Measurement(float(value), "unit", PROV)


def build(items: dict | None = None, **kw) -> Evidence:
    merged = dict(items or {})
    merged.update({k.replace("__", "."): v for k, v in kw.items()})
    return Evidence(
        Target(url="test://hand-built"),
        {k: result(v, k) for k, v in merged.items()},
        created_at="2026-12-02T00:00:00.000+00:00",
        tool="test",
        host="test",
    )


def sampled(values, unit="unit") -> Measurement:
    """A measurement whose value is the median of samples (so it carries spread)."""
    m = Measurement(0.0, unit, PROV, samples=tuple(values))
    return Measurement(m.summary.median, unit, PROV, samples=tuple(values))
