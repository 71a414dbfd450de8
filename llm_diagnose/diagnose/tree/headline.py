"""The headline: the most consequential finding, its kind, its subject, and one line saying it.

Ranked: a detected pitfall (`pitfall`) > a technique that is on and not working (`fix`) >
an overloaded server that needs replicas or admission limits (`capacity`) > the most
consequential recommended technique (`use`) > a technique that is on but unverified under a
question that found its problem (`verify`) > a problem a question found that no technique of the
catalogue fixes, to investigate (`investigate`, its subject the question: Q5's overhead above the
decode step, say) > nothing to do among the questions answered (`none-found`) > too little
measured to say (`nothing-measured`, said as such). The line
quotes the finding's own reason, so it cannot contradict it. A technique finding headlines only
where the answer that decided it is above confidence.headline_min; one held back for that is
still named, with its confidence, so a headline of "none found" or "nothing measured" never
contradicts a finding on the path below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_diagnose.diagnose.tree.diagnosis import Answer, PitfallCheck, Recommendation
from llm_diagnose.diagnose.tree.remedy import DEFAULT_REMEDY
from llm_diagnose.diagnose.tree.slo import ObjectiveCheck
from llm_diagnose.diagnose.tree.techniques.catalogue import TECHNIQUE_RANK

__all__ = ["headline", "PITFALL_RANK"]

# Most consequential first: what slows every request or caps throughput, before what costs a share
# (the techniques' order is each record's `rank`: llm_diagnose.diagnose.tree.techniques).
PITFALL_RANK = (
    "spec-decode-low-acceptance",
    "batch-not-growing",
    "disaggregation-overhead",
    "weight-only-quantization",
    "dynamic-prefix",
    "unstable-serialization",
    "warm-cache-benchmark",
)
# Answers that come from configuration or a declaration, not from a measurement of the server.
_NOT_MEASURED_VERDICTS = ("paged", "untested", "offline")


def _rank(order: Sequence[str], item: str) -> int:
    return order.index(item) if item in order else len(order)


def _measured(answers: Mapping[str, Answer], least: float, not_counted: frozenset[str]) -> list[str]:
    return [
        q
        for q, a in answers.items()
        if q != "OB"
        and q not in not_counted
        and a.answer != "unknown"
        and a.verdict not in _NOT_MEASURED_VERDICTS
        and a.confidence > least
    ]


def headline(
    recs: Sequence[Recommendation],
    answers: Mapping[str, Answer],
    pitfalls: Sequence[PitfallCheck],
    checks: Sequence[ObjectiveCheck] = (),
    least: float = 0.5,
    not_counted: frozenset[str] = frozenset(),
    findings: Sequence[tuple[str, str]] = (),
    remedy: str = DEFAULT_REMEDY,
) -> tuple[str, str, str]:
    """(headline_kind, headline_subject, bottleneck text); answers at or below confidence
    `least` (confidence.headline_min), and the questions in `not_counted` (answered only from
    the live window of a near-idle server), do not count as measured. `findings`: (question,
    line) for problems no technique fixes, headlined as `investigate` where that question's
    answer is firmer than `least`. `remedy`: what would measure something, said where nothing was
    (tree.remedy, from what the run already did)."""
    detected = sorted((p for p in pitfalls if p.detected), key=lambda p: _rank(PITFALL_RANK, p.pitfall))
    if detected:
        p = detected[0]
        return "pitfall", p.pitfall, f"pitfall {p.pitfall}: {p.explanation} -> {p.fix}"
    # A finding headlines only where the answer that decided it is firmer than `least` (doubtful
    # or thin evidence must not set the headline); one held back is named where the headline
    # would otherwise say nothing was found.
    held = _held_back(recs, answers, least)
    recs = [r for r in recs if r.question not in answers or answers[r.question].confidence > least]
    broken = sorted((r for r in recs if r.status == "not-working"), key=lambda r: _rank(TECHNIQUE_RANK, r.technique))
    if broken:
        r = broken[0]
        return "fix", r.technique, f"{r.question}: {r.reason} -> fix {r.technique}"
    scale = next((r for r in recs if r.technique == "scale-out" and r.status == "recommended"), None)
    if scale is not None:
        return (
            "capacity",
            "scale-out",
            f"{scale.question}: {scale.reason} -> scale out (more replicas or admission limits)",
        )
    wanted = sorted((r for r in recs if r.status == "recommended"), key=lambda r: _rank(TECHNIQUE_RANK, r.technique))
    if wanted:
        r = wanted[0]
        return "use", r.technique, f"{r.question}: {r.reason} -> use {r.technique}"
    # A technique that is on but unverified under a question that found the problem it addresses:
    # "none found" would contradict that answer, so the headline says what to verify.
    check = sorted(
        (
            r
            for r in recs
            if r.status == "on-unverified" and r.question in answers and answers[r.question].answer == "yes"
        ),
        key=lambda r: _rank(TECHNIQUE_RANK, r.technique),
    )
    if check:
        r = check[0]
        q = answers[r.question]
        return (
            "verify",
            r.technique,
            (f"{r.question}: {q.rationale}; {r.technique} is {r.reason} -> verify {r.technique}"),
        )
    found = next(
        ((q, line) for q, line in findings if q in answers and answers[q].confidence > least and q not in not_counted),
        None,
    )
    if found is not None:
        return "investigate", found[0], f"{found[0]}: {found[1]}"
    unknown = [q for q, a in answers.items() if a.answer == "unknown"]
    slo_broken = [c.objective.label for c in checks if c.met is False]
    # Nothing the tree knows fixes it, but the reader must not take "none" for "all is well".
    slo_tail = f"; yet the SLO breaks ({', '.join(slo_broken)})" if slo_broken else ""
    if not _measured(answers, least, not_counted):
        weak = [
            q
            for q, a in answers.items()
            if q != "OB" and a.answer != "unknown" and a.verdict not in _NOT_MEASURED_VERDICTS
        ]
        if not_counted:
            weak.append("a near-idle server")
        what = (
            f"nothing was measured that answers the questions firmly ({', '.join(weak)} rest on thin or doubtful "
            "evidence)"
            if weak
            else "nothing was measured that answers the questions"
        )
        return (
            "nothing-measured",
            "",
            (f"{what}: {remedy}" + slo_tail + held),
        )
    tail = f"; {len(unknown)} question(s) could not be answered: {', '.join(unknown)}" if unknown else ""
    nothing = "no bottleneck found firmly enough to headline" if held else "no bottleneck found"
    return "none-found", "", f"{nothing} among the questions answered" + tail + slo_tail + held


def _held_back(recs: Sequence[Recommendation], answers: Mapping[str, Answer], least: float) -> str:
    """'; not the headline: Q6 found ...' for the most consequential finding whose answer is at or
    below `least`, or "" when there is none: the headline must not read as if the path found nothing."""
    weak = sorted(
        (
            r
            for r in recs
            if r.status in ("not-working", "recommended")
            and r.question in answers
            and answers[r.question].confidence <= least
        ),
        key=lambda r: (r.status != "not-working", _rank(TECHNIQUE_RANK, r.technique)),
    )
    if not weak:
        return ""
    r = weak[0]
    a = answers[r.question]
    more = f" ({len(weak) - 1} more held back the same way)" if len(weak) > 1 else ""
    settle = f"; to settle it: {a.missing[0].hint}" if a.missing and a.missing[0].hint else ""
    return (
        f"; not the headline: {r.question} found {r.technique} {r.status} ({r.reason}), but its answer's "
        f"confidence {a.confidence:.2f} is at or below the headline's {least:.2f}{settle}{more}"
    )
