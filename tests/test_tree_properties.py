"""Property tests: the tree is total and deterministic; evidence and diagnosis JSON round-trip."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import HEADLINE_KINDS, PITFALLS, QUESTIONS, TECHNIQUES, Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes.quantities import CATALOGUE
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance

KEYS = sorted(CATALOGUE)
finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)

provenance = st.builds(
    Provenance,
    method=text,
    source=text,
    taken_at=st.just("2026-12-02T00:00:00.000+00:00"),
    timer=st.none() | text,
    window_s=st.none() | st.floats(0, 1e6, allow_nan=False),
)
measurement = st.builds(
    Measurement,
    value=finite,
    unit=text,
    provenance=provenance,
    samples=st.lists(finite, max_size=6).map(tuple),
    calls_per_sample=st.integers(1, 1000),
    warnings=st.lists(text, max_size=2).map(tuple),
    note=text,
)
fact = st.builds(Fact, value=st.booleans() | text | st.integers(-(10**9), 10**9) | finite, provenance=provenance)
not_measured = st.builds(NotMeasured, reason=text, hint=text, provenance=st.none() | provenance)
result = st.one_of(measurement, fact, not_measured)
evidence = st.builds(
    Evidence,
    target=st.builds(Target, url=st.none() | text, label=text),
    items=st.dictionaries(st.sampled_from(KEYS) | text, result, max_size=25),
    created_at=st.just("2026-12-02T00:00:00.000+00:00"),
    tool=st.just("t"),
    host=st.just("h"),
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
    assert all(
        r.status in ("recommended", "in-place", "on-unverified", "not-working", "not-indicated", "unknown")
        for r in d.recommendations
    )
    assert d.headline_kind in HEADLINE_KINDS


@settings(max_examples=150, deadline=None)
@given(evidence)
def test_headline_names_a_finding_of_its_own_kind(ev):
    d = diagnose(ev)
    status = {r.technique: r.status for r in d.recommendations}
    if d.headline_kind == "pitfall":
        assert d.headline_subject in {p.pitfall for p in d.detected_pitfalls}
    elif d.headline_kind == "fix":
        assert status[d.headline_subject] == "not-working" and not d.detected_pitfalls
    elif d.headline_kind in ("capacity", "use"):
        assert status[d.headline_subject] == "recommended"
        assert "not-working" not in status.values() and not d.detected_pitfalls
    elif d.headline_kind == "verify":
        assert (
            status[d.headline_subject] == "on-unverified"
            and d.answer(d.recommendation(d.headline_subject).question).answer == "yes"
        )
    elif d.headline_kind == "investigate":
        # A problem a question found that no technique fixes (Q5: overhead above the step, growth with
        # concurrency): the subject is that question, and nothing a technique fixes outranked it.
        assert d.headline_subject in QUESTIONS and d.answer(d.headline_subject).answer != "unknown"
        assert "recommended" not in status.values() or all(
            d.answer(r.question).confidence <= dict(d.thresholds)["confidence.headline_min"]
            for r in d.recommendations
            if r.status == "recommended"
        )
    else:
        # Only a recommendation whose deciding answer is too doubtful (<= confidence.headline_min) may go unheadlined.
        least = dict(d.thresholds)["confidence.headline_min"]
        assert d.headline_subject == "" and all(
            d.answer(r.question).confidence <= least for r in d.recommendations if r.status == "recommended"
        )


@settings(max_examples=150, deadline=None)
@given(evidence)
def test_answers_reading_flagged_evidence_lose_confidence(ev):
    d = diagnose(ev)
    flagged = {f.key for f in d.sanity}
    cap = dict(d.thresholds)["confidence.sanity"]
    for a in d.answers:
        if flagged & (set(a.evidence) | {m.evidence for m in a.missing}):
            assert a.confidence <= cap


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
@given(st.floats(0, 1), st.floats(0, 1), st.integers(0, 50), st.floats(0, 20))
def test_fuller_kv_cache_never_turns_an_overload_into_a_fit(low, high, preempted, waiting):
    low, high = sorted((low, high))

    def q1(usage):
        p = Provenance("t", "t")
        items = {
            "kv.usage_p95": Measurement(usage, "fraction", p),
            "kv.preemptions": Measurement(preempted, "count", p),
            "queue.waiting_mean": Measurement(waiting, "count", p),
        }
        return diagnose(Evidence(Target(), items)).answer("Q1").verdict

    assert not (q1(low) == "overloaded" and q1(high) != "overloaded")


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 8), st.integers(1, 8), st.integers(1, 4))
def test_more_devices_never_turn_a_fit_into_a_misfit(weights, tp, pp):
    def q1(t):
        p = Provenance("t", "t")
        return (
            diagnose(
                Evidence(
                    Target(),
                    {
                        "memory.weights_fraction": Measurement(weights, "fraction", p),
                        "config.tensor_parallel_size": Fact(t, p),
                        "config.pipeline_parallel_size": Fact(pp, p),
                    },
                )
            )
            .answer("Q1")
            .answer
        )

    assert not (q1(tp) == "yes" and q1(tp + 1) == "no")
