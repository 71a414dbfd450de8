"""The terminal rendering of a diagnosis: verdict first, then the path and its evidence.

The engine line, the settings shown and the SLO summary come from the reports' shared content
model (`llm_diagnose.diagnose.report.content`), so the terminal and the reports cannot disagree.
The finished text goes through `control_chars.escape_controls`: a model name or a label from the
server can carry terminal escapes, and this text is printed and written to summary.txt.
"""

from __future__ import annotations

from llm_diagnose.diagnose.report.content import engine_line, requests_line, shown_settings, slo_summary
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q

_MARK = {
    "recommended": "+",
    "not-working": "!",
    "in-place": "=",
    "on-unverified": "~",
    "not-indicated": " ",
    "unknown": "?",
}
_SLO_MARK = {"broken": "!", "met": "=", "not judged": "?"}


def _engine_line(diagnosis: Diagnosis, evidence: Evidence | None) -> str:
    """The reports' engine line (report.content), and the model where it was observed."""
    model = evidence.fact(Q.ENGINE_MODEL) if evidence is not None else None
    return engine_line(diagnosis, evidence) + (f", model {model}" if model else "")


def render(diagnosis: Diagnosis, evidence: Evidence | None = None, *, verbose: bool = True) -> str:
    out: list[str] = []
    add = out.append
    add(f"llm-diagnose: {diagnosis.target or 'target'} ({_engine_line(diagnosis, evidence)})")
    add("")
    sent = requests_line(evidence)
    if sent is not None:
        add(f"Requests: {sent[0]}")
    add(f"Bottleneck: {diagnosis.bottleneck}")
    subject = f": {diagnosis.headline_subject}" if diagnosis.headline_subject else ""
    add(f"Headline: {diagnosis.headline_kind}{subject}")
    if diagnosis.sanity:
        add("Doubtful evidence (answers that read it have lower confidence):")
        for f in diagnosis.sanity:
            add(f"  ! {f.key}: {f.problem}")
    bad = evidence.measurement(Q.BAD_SAMPLES) if evidence is not None else None
    if bad is not None and bad.value > 0:  # impossible values the page carried: left out, never hidden
        add(f"Bad samples: {bad.note}")
    notes = evidence.fact(Q.ACTIVE_NOTES) if evidence is not None else None
    if isinstance(notes, str) and notes:  # experiments repeated, or kept without a verdict, and why
        add(f"Active run: {notes}")
    slo = slo_summary(diagnosis)
    source = f" ({slo['source']})" if slo["declared"] else ""
    add(f"SLO{source}: {slo['summary']}")
    for o in slo["objectives"]:
        how = f" [{o['how']}]" if o["how"] else ""
        add(f"  {_SLO_MARK[o['status']]} {o['objective']}: {o['observed']} ({o['status']}){how}")
    add("")
    active = [r for r in diagnosis.recommendations if r.status in ("recommended", "not-working")]
    if active:
        add("Recommendations, in the tree's order:")
        for i, r in enumerate(active, 1):
            add(f"  {i}. {r.technique} [{r.status}] from {r.question}, confidence {r.confidence:.2f}")
            add(f"     why: {r.reason}")
            for engine, setting in shown_settings(diagnosis, r):  # the engine's own where known
                add(f"     {engine}: {setting}")
            add(f"     expect: {r.expect}")
    else:
        add("Recommendations: none")
    in_place = [r.technique for r in diagnosis.recommendations if r.status == "in-place"]
    if in_place:
        add(f"In place: {', '.join(in_place)}")
    for r in diagnosis.recommendations:
        if r.status == "on-unverified":
            add(f"On, not verified: {r.technique}: {r.reason}")
    detected = diagnosis.detected_pitfalls
    add("")
    if detected:
        add("Pitfalls detected:")
        for p in detected:
            add(f"  ! {p.pitfall}: {p.explanation}")
            if p.fix:
                add(f"    fix: {p.fix}")
    else:
        unchecked = [p.pitfall for p in diagnosis.pitfalls if p.detected is None]
        add("Pitfalls detected: none" + (f" (not checkable here: {', '.join(unchecked)})" if unchecked else ""))
    if verbose:
        add("")
        add("Path through the tree:")
        answers = {a.question: a for a in diagnosis.answers}
        for step in diagnosis.path:
            if step.node in answers:
                a = answers[step.node]
                add(f"  {a.question} {a.title} -> {a.answer} (confidence {a.confidence:.2f})")
                add(f"     {a.rationale}")
                for c in a.comparisons:
                    add(f"     - {c}")
            else:
                note = f": {step.note}" if step.note else ""
                add(f"     > {step.node} = {step.outcome}{note}")
        missing = diagnosis.not_measured
        if missing:
            add("")
            add("Not measured:")
            for m in missing:
                add(f"  - {m.evidence}: {m.reason}" + (f" ({m.hint})" if m.hint else ""))
    add("")
    add("technique status: " + "  ".join(f"{_MARK[r.status]}{r.technique}" for r in diagnosis.recommendations))
    add("legend: + recommended  ! not working  = in place  ~ on, not verified  ? unknown")
    return escape_controls("\n".join(out) + "\n")
