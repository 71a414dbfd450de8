"""Property tests: the tree is total and deterministic; evidence and diagnosis JSON round-trip."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.diagnosis import PITFALLS, QUESTIONS, TECHNIQUES, Diagnosis
from diagnose.evidence import Evidence, Target
from diagnose.tree import diagnose
from probes.quantities import CATALOGUE
from probes.results import Fact, Measurement, NotMeasured, Provenance

KEYS = sorted(CATALOGUE)
finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)

provenance = st.builds(
    Provenance, method=text, source=text, taken_at=st.just("2026-12-02T00:00:00.000+00:00"),
    timer=st.none() | text, window_s=st.none() | st.floats(0, 1e6, allow_nan=False),
)
measurement = st.builds(
    Measurement, value=finite, unit=text, provenance=provenance,
    samples=st.lists(finite, max_size=6).map(tuple), calls_per_sample=st.integers(1, 1000),
    warnings=st.lists(text, max_size=2).map(tuple), note=text,
)
fact = st.builds(Fact, value=st.booleans() | text | st.integers(-10**9, 10**9) | finite, provenance=provenance)
not_measured = st.builds(NotMeasured, reason=text, hint=text, provenance=st.none() | provenance)
result = st.one_of(measurement, fact, not_measured)
evidence = st.builds(
    Evidence,
    target=st.builds(Target, url=st.none() | text, label=text),
    items=st.dictionaries(st.sampled_from(KEYS) | text, result, max_size=25),
    created_at=st.just("2026-12-02T00:00:00.000+00:00"), tool=st.just("t"), host=st.just("h"),
)


@settings(max_examples=200, deadline=None)
@given(evidence)
def test_tree_is_total(ev):
    d = diagnose(ev)
    assert tuple(a.question for a in d.answers) == QUESTIONS
    assert all(a.answer in ("yes", "no", "unknown") for a in d.answers)
    assert sorted(r.technique for r in d.recommendations) == sorted(TECHNIQUES)
    assert sorted(p.pitfall for p in d.pitfalls) == sorted(PITFALLS)
    assert all(0.0 <= a.confidence <= 1.0 for a in d.answers)


@settings(max_examples=80, deadline=None)
@given(evidence)
def test_tree_is_deterministic(ev):
    assert diagnose(ev).to_json() == diagnose(Evidence.from_json(ev.to_json())).to_json()


@settings(max_examples=150, deadline=None)
@given(evidence)
def test_evidence_json_round_trips_exactly(ev):
    again = Evidence.from_json(ev.to_json())
    assert again == ev
    assert again.to_json() == ev.to_json()


@settings(max_examples=60, deadline=None)
@given(evidence)
def test_diagnosis_json_round_trips_exactly(ev):
    d = diagnose(ev)
    again = Diagnosis.from_dict(json.loads(d.to_json()))
    assert again == d


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(0, 50))
def test_fuller_kv_cache_never_turns_q1_from_no_to_yes(low, high, preempted):
    low, high = sorted((low, high))
    def q1(usage):
        return diagnose(Evidence(Target(), {"kv.usage_p95": Measurement(usage, "fraction", Provenance("t", "t")),
                                            "kv.preemptions": Measurement(preempted, "count", Provenance("t", "t"))})).answer("Q1").answer
    assert not (q1(low) == "no" and q1(high) == "yes")
