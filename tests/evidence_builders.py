"""Hand-built evidence for tests of the decision tree.

`build(**items)` takes evidence keys with dots replaced by double underscores, or a dict:
floats and ints become Measurements, bools and strings Facts, None a NotMeasured.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance

PROV = Provenance(method="hand-built", source="test", taken_at="2026-12-02T00:00:00.000+00:00")


def result(value):
    if value is None:
        return NotMeasured(reason="not measured in this test", hint="test hint", provenance=PROV)
    if isinstance(value, (bool, str)):
        return Fact(value, PROV)
    if isinstance(value, (Measurement, Fact, NotMeasured)):  # ready-made results travel as they are
        return value
    return Measurement(float(value), "unit", PROV)


def build(items: dict | None = None, **kw) -> Evidence:
    merged = dict(items or {})
    merged.update({k.replace("__", "."): v for k, v in kw.items()})
    return Evidence(
        Target(url="test://hand-built"),
        {k: result(v) for k, v in merged.items()},
        created_at="2026-12-02T00:00:00.000+00:00",
        tool="test",
        host="test",
    )


def sampled(values, unit="unit") -> Measurement:
    """A measurement whose value is the median of samples (so it carries spread)."""
    m = Measurement(0.0, unit, PROV, samples=tuple(values))
    return Measurement(m.summary.median, unit, PROV, samples=tuple(values))
