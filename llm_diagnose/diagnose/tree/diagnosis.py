"""What a diagnosis is made of: answers, the path, recommendations, pitfalls.

All values are frozen and round-trip exactly through JSON (`Diagnosis.from_dict(d.to_dict())
== d`), so a CI script can match on the stable identifiers (docs/identifiers.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

from llm_diagnose.diagnose.tree.slo import SLO, ObjectiveCheck
from llm_diagnose.diagnose.tree.techniques.catalogue import TECHNIQUE_IDS, TECHNIQUE_ON_NODES

__all__ = [
    "QUESTIONS",
    "TECHNIQUES",
    "TECHNIQUE_ON_NODES",
    "PITFALLS",
    "AnswerValue",
    "Comparison",
    "Missing",
    "Step",
    "Answer",
    "Recommendation",
    "PitfallCheck",
    "SanityFinding",
    "HEADLINE_KINDS",
    "Diagnosis",
    "DIAGNOSIS_SCHEMA",
]

DIAGNOSIS_SCHEMA = "llm-diagnose/diagnosis"
DIAGNOSIS_VERSION = 1

QUESTIONS = ("Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "KV", "OB")
TECHNIQUES = TECHNIQUE_IDS  # read from the technique records (llm_diagnose.diagnose.tree.techniques)
PITFALLS = (
    "dynamic-prefix",
    "unstable-serialization",
    "batch-not-growing",
    "spec-decode-low-acceptance",
    "disaggregation-overhead",
    "weight-only-quantization",
    "warm-cache-benchmark",
)

AnswerValue = Literal["yes", "no", "unknown"]
Status = Literal["recommended", "in-place", "on-unverified", "not-working", "not-indicated", "unknown"]
# What the headline is about, most consequential first (see llm_diagnose.diagnose.tree.headline).
HEADLINE_KINDS = ("pitfall", "fix", "capacity", "use", "verify", "investigate", "none-found", "nothing-measured")


def _tuple_of(cls, items):
    return tuple(cls.from_dict(i) for i in items)


@dataclass(frozen=True)
class Comparison:
    """One comparison of a measured value against a named threshold."""

    threshold: str
    evidence: str
    value: float
    op: str  # ">=", ">", "<=", "<"
    limit: float
    holds: bool

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping) -> Comparison:
        return cls(
            str(d["threshold"]),
            str(d["evidence"]),
            float(d["value"]),
            str(d["op"]),
            float(d["limit"]),
            bool(d["holds"]),
        )

    def __str__(self) -> str:
        verdict = "holds" if self.holds else "does not hold"
        return f"{self.evidence} = {self.value:.4g} {self.op} {self.threshold} ({self.limit:.4g}): {verdict}"


@dataclass(frozen=True)
class Missing:
    """Evidence a node wanted and did not have, with what would measure it."""

    evidence: str
    reason: str
    hint: str = ""

    def to_dict(self) -> dict:
        return {"evidence": self.evidence, "reason": self.reason, "hint": self.hint}

    @classmethod
    def from_dict(cls, d: Mapping) -> Missing:
        return cls(str(d["evidence"]), str(d["reason"]), str(d.get("hint", "")))


@dataclass(frozen=True)
class Step:
    """One node the tree visited, and where it went from there."""

    node: str  # e.g. "Q2", "Q2.prefix-caching-on", "Q2.hit-rate-reaches-potential"
    outcome: str  # "yes", "no", "unknown"
    note: str = ""

    def to_dict(self) -> dict:
        return {"node": self.node, "outcome": self.outcome, "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping) -> Step:
        return cls(str(d["node"]), str(d["outcome"]), str(d.get("note", "")))


@dataclass(frozen=True)
class Answer:
    question: str
    title: str
    answer: AnswerValue
    confidence: float  # 0..1: how much the evidence supports the answer
    rationale: str
    comparisons: tuple[Comparison, ...] = ()
    evidence: tuple[str, ...] = ()  # keys read
    missing: tuple[Missing, ...] = ()
    verdict: str = ""  # a finer outcome, e.g. Q1 "does-not-fit" / "overloaded"

    def to_dict(self) -> dict:
        return {
            "question": self.question,
            "title": self.title,
            "answer": self.answer,
            "confidence": self.confidence,
            "rationale": self.rationale,
            "verdict": self.verdict,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "evidence": list(self.evidence),
            "missing": [m.to_dict() for m in self.missing],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Answer:
        return cls(
            question=str(d["question"]),
            title=str(d["title"]),
            answer=d["answer"],
            confidence=float(d["confidence"]),
            rationale=str(d["rationale"]),
            comparisons=_tuple_of(Comparison, d.get("comparisons", ())),
            evidence=tuple(d.get("evidence", ())),
            missing=_tuple_of(Missing, d.get("missing", ())),
            verdict=str(d.get("verdict", "")),
        )


@dataclass(frozen=True)
class Recommendation:
    technique: str
    status: Status
    question: str  # the node that led here
    reason: str
    settings: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (engine, settings) in engine order
    expect: str = ""  # which measurement should improve, and which way
    confidence: float = 0.0

    def settings_for(self, engine: str) -> tuple[str, ...]:
        return dict(self.settings).get(engine, ())

    def to_dict(self) -> dict:
        return {
            "technique": self.technique,
            "status": self.status,
            "question": self.question,
            "reason": self.reason,
            "settings": {e: list(s) for e, s in self.settings},
            "expect": self.expect,
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Recommendation:
        return cls(
            technique=str(d["technique"]),
            status=d["status"],
            question=str(d["question"]),
            reason=str(d["reason"]),
            settings=tuple((str(e), tuple(s)) for e, s in d.get("settings", {}).items()),
            expect=str(d.get("expect", "")),
            confidence=float(d.get("confidence", 0.0)),
        )


@dataclass(frozen=True)
class PitfallCheck:
    pitfall: str
    detected: bool | None  # None: could not be checked (see missing)
    title: str
    explanation: str
    fix: str = ""
    comparisons: tuple[Comparison, ...] = ()
    evidence: tuple[str, ...] = ()
    missing: tuple[Missing, ...] = ()

    def to_dict(self) -> dict:
        return {
            "pitfall": self.pitfall,
            "detected": self.detected,
            "title": self.title,
            "explanation": self.explanation,
            "fix": self.fix,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "evidence": list(self.evidence),
            "missing": [m.to_dict() for m in self.missing],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> PitfallCheck:
        return cls(
            pitfall=str(d["pitfall"]),
            detected=d["detected"],
            title=str(d["title"]),
            explanation=str(d["explanation"]),
            fix=str(d.get("fix", "")),
            comparisons=_tuple_of(Comparison, d.get("comparisons", ())),
            evidence=tuple(d.get("evidence", ())),
            missing=_tuple_of(Missing, d.get("missing", ())),
        )


@dataclass(frozen=True)
class SanityFinding:
    """Evidence that cannot be true, or contradicts other evidence (llm_diagnose.diagnose.tree.sanity)."""

    key: str
    problem: str

    def to_dict(self) -> dict:
        return {"key": self.key, "problem": self.problem}

    @classmethod
    def from_dict(cls, d: Mapping) -> SanityFinding:
        return cls(str(d["key"]), str(d["problem"]))


@dataclass(frozen=True)
class Diagnosis:
    engine: str  # the engine settings are shown for first ("unknown" shows all)
    bottleneck: str  # one line: the first thing to fix, or that nothing was found
    answers: tuple[Answer, ...]
    path: tuple[Step, ...]
    recommendations: tuple[Recommendation, ...]
    pitfalls: tuple[PitfallCheck, ...]
    thresholds: tuple[tuple[str, float], ...]
    evidence_digest: str  # sha256 of the evidence JSON this was computed from
    target: str = ""
    slo: SLO = SLO()  # what the latency answers were judged against (undeclared: the fixed thresholds)
    slo_checks: tuple[ObjectiveCheck, ...] = ()  # each objective, met or broken where the evidence shows it
    headline_kind: str = "none-found"  # one of HEADLINE_KINDS
    headline_subject: str = ""  # the pitfall or technique id the headline is about ("" for none/nothing)
    sanity: tuple[SanityFinding, ...] = ()  # impossible or contradictory evidence

    def answer(self, question: str) -> Answer:
        return next(a for a in self.answers if a.question == question)

    def recommendation(self, technique: str) -> Recommendation | None:
        return next((r for r in self.recommendations if r.technique == technique), None)

    def technique_on(self, technique: str) -> bool | None:
        """Whether the run saw the technique switched on (None: not seen, or not a switch)."""
        node = TECHNIQUE_ON_NODES.get(technique)
        outcome = next((s.outcome for s in self.path if s.node == node), "unknown")
        return {"yes": True, "no": False}.get(outcome)

    @property
    def settings_known(self) -> bool:
        """Whether the engine is known, so settings for it alone can be shown."""
        return self.engine not in ("", "unknown")

    @property
    def recommended(self) -> tuple[Recommendation, ...]:
        return tuple(r for r in self.recommendations if r.status == "recommended")

    @property
    def detected_pitfalls(self) -> tuple[PitfallCheck, ...]:
        return tuple(p for p in self.pitfalls if p.detected)

    @property
    def not_measured(self) -> tuple[Missing, ...]:
        """Every missing piece of evidence, once each, in the order the tree met them."""
        seen: dict[str, Missing] = {}
        for group in [a.missing for a in self.answers] + [p.missing for p in self.pitfalls]:
            for m in group:
                seen.setdefault(m.evidence, m)
        return tuple(seen.values())

    def to_dict(self) -> dict:
        return {
            "schema": DIAGNOSIS_SCHEMA,
            "version": DIAGNOSIS_VERSION,
            "target": self.target,
            "engine": self.engine,
            "bottleneck": self.bottleneck,
            "headline_kind": self.headline_kind,
            "headline_subject": self.headline_subject,
            "sanity": [f.to_dict() for f in self.sanity],
            "path": [s.to_dict() for s in self.path],
            "answers": [a.to_dict() for a in self.answers],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "pitfalls": [p.to_dict() for p in self.pitfalls],
            "not_measured": [m.to_dict() for m in self.not_measured],
            "thresholds": dict(self.thresholds),
            "slo": {**self.slo.to_dict(), "checks": [c.to_dict() for c in self.slo_checks]},
            "evidence_digest": self.evidence_digest,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping) -> Diagnosis:
        if d.get("schema") != DIAGNOSIS_SCHEMA:
            raise ValueError(f"field 'schema' must be {DIAGNOSIS_SCHEMA!r}, got {d.get('schema')!r}")
        if d.get("version") != DIAGNOSIS_VERSION:
            raise ValueError(f"field 'version' is {d.get('version')!r}; this tool reads version {DIAGNOSIS_VERSION}")
        try:
            return cls(
                engine=str(d["engine"]),
                bottleneck=str(d["bottleneck"]),
                answers=_tuple_of(Answer, d["answers"]),
                path=_tuple_of(Step, d["path"]),
                recommendations=_tuple_of(Recommendation, d["recommendations"]),
                pitfalls=_tuple_of(PitfallCheck, d["pitfalls"]),
                thresholds=tuple((str(k), float(v)) for k, v in d["thresholds"].items()),
                evidence_digest=str(d["evidence_digest"]),
                target=str(d.get("target", "")),
                # Older diagnoses have no "slo": they were judged against the fixed thresholds.
                slo=SLO.from_dict(d["slo"]) if d.get("slo") else SLO(),
                slo_checks=_tuple_of(ObjectiveCheck, (d.get("slo") or {}).get("checks", ())),
                # Older diagnoses have no headline fields or sanity findings.
                headline_kind=str(d.get("headline_kind", "none-found")),
                headline_subject=str(d.get("headline_subject", "")),
                sanity=_tuple_of(SanityFinding, d.get("sanity", ())),
            )
        except KeyError as exc:
            raise ValueError(f"diagnosis is missing the field {exc.args[0]!r}") from None
