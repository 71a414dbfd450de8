"""The decision tree: evidence in, a diagnosis out, with the path it took.

Every question is answered (real systems combine techniques); then each question's branch
decides the status of its techniques, looking at what the engine already runs:

- recommended: the tree says it would help and it is not on;
- in-place: it is on and the evidence says it works (or that nothing asks more of it);
- on-unverified: it is on (or on by the engine's default), but what would show it works was
  not measured; the reason says what would;
- not-working: it is on but the evidence says it does not help (a pitfall says why);
- not-indicated: nothing calls for it; unknown: the question could not be answered.

A setting that could not be seen is never read as off. Each question is one module
(llm_diagnose.diagnose.tree.questions), asked and walked in the order of
`questions.catalogue.QUESTIONS`; recommendations keep that order: Q1 (quantization, parallelism,
scale-out), Q2, ..., Q6, then KV offload and offline batch. Evidence is sanity-checked first
(llm_diagnose.diagnose.tree.sanity); answers that read flagged evidence lose confidence, as do
answers read from experiments run beside other clients' traffic (tree.other_traffic). The
headline is the most consequential finding (llm_diagnose.diagnose.tree.headline).
`diagnose(evidence)` is a pure function: the same evidence, thresholds and SLO give the same
diagnosis, byte for byte.

The SLO (`diagnose(evidence, thresholds, slo=SLO(...))`, undeclared by default) is what the
latency answers are judged against: Q5 asks whether decode latency breaks the ITL objective,
Q6 notes whether its stalls break the ITL/TTFT objectives, and a workload declared offline
with no latency objective leads to offline batch. The diagnosis records the SLO and each
objective met or broken where the evidence shows it.
"""

from __future__ import annotations

import hashlib

from llm_diagnose.diagnose.tree.branch import Branches
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis, Step
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.headline import headline
from llm_diagnose.diagnose.tree.idle_window import idle_live_answers
from llm_diagnose.diagnose.tree.other_traffic import beside_other_traffic
from llm_diagnose.diagnose.tree.pitfalls import check_all
from llm_diagnose.diagnose.tree.questions.catalogue import QUESTIONS, ask_all
from llm_diagnose.diagnose.tree.remedy import nothing_measured_remedy
from llm_diagnose.diagnose.tree.sanity import check as sanity_check
from llm_diagnose.diagnose.tree.sanity import doubt_pitfalls, doubt_recommendations, lower_confidence
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["diagnose"]


def diagnose(evidence: Evidence, thresholds: Thresholds | None = None, *, slo: SLO | None = None) -> Diagnosis:
    th = thresholds or Thresholds()
    slo = slo or SLO()
    sanity = sanity_check(evidence, th)
    asked = beside_other_traffic(ask_all(evidence, th, slo), evidence, th)
    answers = {a.question: a for a in lower_confidence(asked, sanity, th)}
    pitfalls = doubt_pitfalls(check_all(evidence, th, answers), sanity)
    b = Branches(evidence, th, answers, {p.pitfall: p for p in pitfalls}, slo)
    path: list[Step] = []
    for question in QUESTIONS:
        b.steps = []
        question.walk(b)
        a = answers[question.id]
        path.append(Step(question.id, a.answer, a.rationale))
        path.extend(b.steps)
    b.recs = doubt_recommendations(b.recs, answers, sanity)
    engine = evidence.fact(Q.ENGINE_NAME)
    digest = hashlib.sha256(evidence.to_json().encode()).hexdigest()
    checks = slo.check_evidence(evidence)
    kind, subject, line = headline(
        b.recs,
        answers,
        pitfalls,
        checks,
        th["confidence.headline_min"],
        idle_live_answers(evidence, th, answers),
        b.findings,
        nothing_measured_remedy(evidence),
    )
    if kind == "none-found" and sanity:
        # "Nothing found" must not read as "all is well" when some evidence was set aside as impossible.
        line += f"; doubtful evidence set aside ({', '.join(sorted({f.key for f in sanity}))}): see sanity findings"
    return Diagnosis(
        engine=str(engine) if engine else "unknown",
        bottleneck=line,
        answers=tuple(answers.values()),
        path=tuple(path),
        recommendations=tuple(b.recs),
        pitfalls=pitfalls,
        thresholds=tuple(sorted(th.values.items())),
        evidence_digest=digest,
        target=evidence.target.url or evidence.target.label,
        slo=slo,
        slo_checks=checks,
        headline_kind=kind,
        headline_subject=subject,
        sanity=sanity,
    )
