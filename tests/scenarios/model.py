"""One scenario of the corpus: a situation, its source, its evidence, and what must be said."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.slo import SLO
from tests.evidence_builders import build

__all__ = ["Scenario", "check"]


@dataclass(frozen=True)
class Scenario:
    id: str  # stable, kebab-case, prefixed by its class: "q1-small-model-heavy-load"
    title: str  # one line a reader of the table understands
    source: str  # URL of the public source (engine issue, discussion, blog post, paper)
    source_says: str  # the symptoms the reporter gave and the cause the maintainers named
    evidence: Mapping[str, object]  # key -> value for tests.evidence_builders.build (None: NotMeasured;
    #   numeric configuration as tests.scenarios.engines.setting(n), a Fact, as discovery reports it)
    verdict: str  # what a senior engineer says, one sentence
    statuses: Mapping[str, str] = field(default_factory=dict)  # technique -> expected status
    headline: tuple[str, str] | None = None  # (headline_kind, headline_subject)
    not_recommended: tuple[str, ...] = ()  # techniques that must not be "recommended"
    answers: Mapping[str, str] = field(default_factory=dict)  # question -> "yes" / "no" / "unknown"
    verdicts: Mapping[str, str] = field(default_factory=dict)  # question -> Answer.verdict
    max_confidence: Mapping[str, float] = field(default_factory=dict)  # question -> ceiling
    pitfalls: Mapping[str, bool | None] = field(default_factory=dict)  # pitfall -> detected
    sanity_keys: tuple[str, ...] = ()  # evidence keys the diagnosis must flag as impossible
    not_flagged: tuple[str, ...] = ()  # sound evidence keys the diagnosis must NOT flag (e.g. weights_fraction 1.6)
    path: Mapping[str, str] = field(default_factory=dict)  # path node -> outcome ("yes" / "no" / "unknown")
    slo: SLO | None = None
    classes: tuple[str, ...] = ()  # issue-13 classes covered: "fit", "unknown", "slow-tokens", ...
    known_wrong: str = ""  # why llm-diagnose still gets this case wrong (the test expects it to fail until fixed)

    def expectations(self) -> int:
        """How many things the scenario checks (each status, answer, verdict, ... counts once)."""
        return (
            len(self.statuses)
            + (self.headline is not None)
            + len(self.not_recommended)
            + len(self.answers)
            + len(self.verdicts)
            + len(self.max_confidence)
            + len(self.pitfalls)
            + len(self.sanity_keys)
            + len(self.not_flagged)
            + len(self.path)
        )

    def evidence_object(self) -> Evidence:
        return build(dict(self.evidence))

    def run(self) -> Diagnosis:
        return diagnose(self.evidence_object(), slo=self.slo)


def check(s: Scenario, d: Diagnosis) -> list[str]:
    """Every way the diagnosis departs from the scenario's expectation (empty: it agrees)."""
    wrong: list[str] = []
    for technique, status in s.statuses.items():
        rec = d.recommendation(technique)
        got = rec.status if rec else "absent"
        if got != status:
            wrong.append(f"{technique}: expected {status}, got {got}")
    if s.headline is not None:
        got_h = (getattr(d, "headline_kind", "?"), getattr(d, "headline_subject", "?"))
        if tuple(got_h) != tuple(s.headline):
            wrong.append(f"headline: expected {s.headline[0]}:{s.headline[1]}, got {got_h[0]}:{got_h[1]}")
    for technique in s.not_recommended:
        rec = d.recommendation(technique)
        if rec is not None and rec.status == "recommended":
            wrong.append(f"{technique}: must not be recommended")
    for q, answer in s.answers.items():
        if d.answer(q).answer != answer:
            wrong.append(f"{q}: expected answer {answer}, got {d.answer(q).answer}")
    for q, verdict in s.verdicts.items():
        if d.answer(q).verdict != verdict:
            wrong.append(f"{q}: expected verdict {verdict}, got {d.answer(q).verdict or '-'}")
    for q, ceiling in s.max_confidence.items():
        if d.answer(q).confidence > ceiling:
            wrong.append(f"{q}: confidence {d.answer(q).confidence} above {ceiling}")
    by_id = {p.pitfall: p for p in d.pitfalls}
    for pitfall, detected in s.pitfalls.items():
        got_p = by_id[pitfall].detected if pitfall in by_id else "absent"
        if got_p != detected:
            wrong.append(f"pitfall {pitfall}: expected detected={detected}, got {got_p}")
    flagged = {f.key for f in getattr(d, "sanity", ())}
    for key in s.sanity_keys:
        if key not in flagged:
            wrong.append(f"sanity: {key} not flagged")
    for key in s.not_flagged:
        if key in flagged:
            wrong.append(f"sanity: {key} flagged, but its value is possible")
    steps = {step.node: step.outcome for step in d.path}
    for node, outcome in s.path.items():
        if steps.get(node) != outcome:
            wrong.append(f"path {node}: expected {outcome}, got {steps.get(node, 'absent')}")
    return wrong
