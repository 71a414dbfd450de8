"""The report's content as data: what every report format says, formatted and redacted once.

`content(diagnosis, evidence)` builds one plain dict in the reading order of the console
report (verdict, recommendations with their settings and expected gain, the path through
the questions with the evidence and thresholds behind each answer, the pitfalls, what was
not measured and how to measure it, the run's provenance). The JSON report is this dict;
the HTML and Markdown reports lay it out, so the three formats cannot disagree and the
redaction below is applied in one place.

Prompt text never reaches a report unless asked for (`include_prompts=True`): a string Fact
on a prompt key (any key naming "prompt") is shown as its SHA-256 prefix and length, notes on
such keys likewise, and any occurrence of those strings in other texts (a pitfall quoting a
note) is replaced by the same marker. Escaping is the renderers' job; this layer hands them
plain text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.text.control_chars import escape_controls_in_json
from llm_diagnose.diagnose.text.values import ACTIVE_STATUSES, UNSETTLED_STATUSES, format_value
from llm_diagnose.diagnose.tree.diagnosis import Comparison, Diagnosis, Recommendation
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Result

if TYPE_CHECKING:
    from llm_diagnose.diagnose.runfolder import RunFolder

__all__ = [
    "REPORT_SCHEMA",
    "REPORT_VERSION",
    "ACTIVE_STATUSES",
    "UNSETTLED_STATUSES",
    "content",
    "render",
    "format_value",
    "format_result",
    "engine_line",
    "shown_settings",
    "redact_marker",
    "slo_summary",
    "prompt_scrubber",
    "requests_line",
]

REPORT_SCHEMA = "llm-diagnose/report"
REPORT_VERSION = 1
_MIN_SCRUB_LEN = 8  # shorter strings are too likely to be ordinary words to scrub everywhere


def redact_marker(text: str) -> str:
    """What stands in for a prompt: enough to match two reports, nothing to read."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return f"[prompt text withheld: sha256 {digest}, {len(text)} chars]"


def _is_prompt_key(key: str) -> bool:
    return "prompt" in key.lower()


class _Redactor:
    """Finds the prompt strings in the evidence, then withholds them wherever they appear."""

    def __init__(self, evidence: Evidence | None, include_prompts: bool) -> None:
        self.active = not include_prompts
        self.secrets: dict[str, str] = {}
        if evidence is None or not self.active:
            return
        for key, r in evidence.items.items():
            if not _is_prompt_key(key):
                continue
            texts = [r.value] if isinstance(r, Fact) and isinstance(r.value, str) else []
            texts += [getattr(r, "note", "")]
            for text in texts:
                if text and len(text) >= _MIN_SCRUB_LEN:
                    self.secrets[text] = redact_marker(text)

    def key_text(self, key: str, text: str) -> str:
        """A string that belongs to `key`: withheld whole when the key is a prompt key."""
        if self.active and text and _is_prompt_key(key):
            return redact_marker(text)
        return self(text)

    def __call__(self, text: str) -> str:
        # Longest first, so a prompt that contains another is replaced whole.
        for secret in sorted(self.secrets, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, self.secrets[secret])
        return text


def prompt_scrubber(*evidence: Evidence | None, include_prompts: bool = False) -> Callable[[str], str]:
    """Withholds the prompt strings of all these runs' evidence wherever they appear in a text
    (for text built outside `content`, such as verify's claims on the before/after page)."""
    scrub = _Redactor(None, include_prompts)
    for ev in evidence:
        scrub.secrets.update(_Redactor(ev, include_prompts).secrets)
    return scrub


def format_result(result: Result, key: str = "") -> str:
    """One result as a short phrase: value and unit, sample count, or why it is missing."""
    if isinstance(result, Measurement):
        text = format_value(result.value, result.unit)
        if result.summary is not None and result.summary.n > 1:
            text += f" (n={result.summary.n})"
        return text
    if isinstance(result, Fact):
        if isinstance(result.value, bool):
            return "on" if result.value else "off"
        return str(result.value)
    return f"not measured: {result.reason}"


# --- the pieces ----------------------------------------------------------------------------
def shown_settings(diagnosis: Diagnosis, rec: Recommendation) -> list[tuple[str, str]]:
    """(engine, setting) pairs: the engine's own where it is known, every engine's otherwise."""
    own = diagnosis.settings_known and rec.settings_for(diagnosis.engine)
    engines = [diagnosis.engine] if own else [e for e, _ in rec.settings]
    return [(e, s) for e in engines for s in rec.settings_for(e)]


def _comparison(c: Comparison) -> dict:
    return {
        "evidence": c.evidence,
        "value": c.value,
        "op": c.op,
        "threshold": c.threshold,
        "limit": c.limit,
        "holds": c.holds,
        "text": str(c),
    }


def _evidence_rows(evidence: Evidence | None, keys: Iterable[str], scrub: _Redactor) -> list[dict]:
    rows: list[dict] = []
    for key in keys:
        if evidence is None:
            rows.append({"key": key, "value": "(evidence file not available)", "how": "", "note": ""})
            continue
        r = evidence.get(key)
        value = format_result(r)
        if isinstance(r, Fact) and isinstance(r.value, str):
            value = scrub.key_text(key, value)
        prov = r.provenance
        how = f"{prov.method} from {prov.source}" if prov is not None else ""
        note = scrub.key_text(key, getattr(r, "note", "") or "")
        warnings = list(r.warnings) if isinstance(r, Measurement) else []
        rows.append(
            {
                "key": key,
                "value": scrub(value),
                "how": scrub(how),
                "note": note,
                "warnings": [scrub(w) for w in warnings],
            }
        )
    return rows


def requests_line(evidence: Evidence | None) -> tuple[str, bool] | None:
    """What became of the requests an active run sent, and whether any failed: the first thing
    every output says after the target, so a server that failed half its requests never reads
    as a fast one. None for a passive run (it sent nothing)."""
    failed = evidence.measurement(Q.ACTIVE_FAILED_FRACTION) if evidence is not None else None
    sent = evidence.measurement(Q.ACTIVE_REQUESTS_SENT) if evidence is not None else None
    if failed is None or sent is None:
        return None
    n = int(sent.value)
    lost = round(failed.value * n)
    if not lost:
        return f"{n} sent, none failed", False
    return f"{lost} of {n} sent FAILED ({failed.value:.0%}; {failed.note})", True


def engine_line(diagnosis: Diagnosis, evidence: Evidence | None) -> str:
    """The engine and its version, as every report names it."""
    if evidence is None:
        return diagnosis.engine
    version = evidence.fact(Q.ENGINE_VERSION)
    return diagnosis.engine + (f" {version}" if version else "")


def _gpu(evidence: Evidence) -> str:
    total = evidence.get(Q.DEVICE_TOTAL_BYTES)
    if isinstance(total, Measurement):
        return f"{total.provenance.source}, {format_value(total.value, 'bytes')}"
    return f"none measured ({total.reason})" if isinstance(total, NotMeasured) else "none measured"


def _window(evidence: Evidence) -> str:
    window = evidence.measurement(Q.LIVE_WINDOW_S)
    lengths = [
        r.provenance.window_s for r in evidence.items.values() if isinstance(r, Measurement) and r.provenance.window_s
    ]
    length = window.value if window is not None else (max(lengths) if lengths else None)
    taken = sorted(
        r.provenance.taken_at for r in evidence.items.values() if isinstance(r, Measurement) and r.provenance.taken_at
    )
    span = f"{taken[0]} to {taken[-1]}" if taken else "no timed measurement"
    if length is None:
        return span
    complete = evidence.fact(Q.LIVE_WINDOW_COMPLETE)
    tail = "" if complete is not False else ", ended early (the server stopped answering)"
    return f"{length:.1f} s of scrapes ({span}){tail}"


def _provenance(
    diagnosis: Diagnosis, evidence: Evidence | None, run: RunFolder | None, scrub: _Redactor
) -> list[list[str]]:
    rows = [["target", diagnosis.target or "(not recorded)"], ["engine", engine_line(diagnosis, evidence)]]
    if evidence is not None:
        model = evidence.fact(Q.ENGINE_MODEL)
        rows += [
            ["model", str(model) if model is not None else "(not observed)"],
            ["GPU", _gpu(evidence)],
            ["window", _window(evidence)],
            ["evidence written", f"{evidence.created_at} on host {evidence.host or '?'}"],
            ["tool version", evidence.tool or "?"],
        ]
        notes = evidence.fact(Q.ACTIVE_NOTES)  # repeats after a starved client, figures without a verdict
        if isinstance(notes, str) and notes:
            rows.append(["active run", notes])
    else:
        rows.append(["evidence", "not available (report made from diagnosis.json alone)"])
    rows.append(["evidence sha256", diagnosis.evidence_digest])
    if run is not None and run.skipped:  # a sample that shrank says so
        rows.append(["skipped lines", "; ".join(run.skipped_notes())])
    return [[label, scrub(value)] for label, value in rows]


def slo_summary(diagnosis: Diagnosis) -> dict:
    """The SLO the diagnosis was judged against, and each objective met, broken or not judged."""
    slo, checks = diagnosis.slo, diagnosis.slo_checks
    if not slo.declared:
        summary = (
            "none declared: Q5 judges decode latency against the fixed q5.max_itl_* thresholds "
            "(declare objectives with --slo or an [slo] table)"
        )
    elif not checks:
        summary = (
            f"the workload is declared {'interactive' if slo.interactive else 'offline'}, with no latency objective"
        )
    else:
        broken = sum(c.met is False for c in checks)
        unjudged = sum(c.met is None for c in checks)
        summary = f"{broken} of {len(checks)} objective(s) broken" if broken else "every objective judged is met"
        if unjudged:
            summary += f", {unjudged} not judged (the evidence does not show that percentile)"
    return {
        "declared": slo.declared,
        "source": slo.source,
        "interactive": slo.interactive,
        "summary": summary,
        "objectives": [
            {
                "objective": c.objective.label,
                "key": c.objective.key,
                "status": c.status,
                "observed": c.observed_text,
                "evidence": c.evidence,
                "how": c.how,
            }
            for c in checks
        ],
    }


def _pitfall_status(detected: bool | None) -> str:
    return {True: "detected", False: "not detected", None: "not checkable"}[detected]


# --- the whole ----------------------------------------------------------------------------
def content(
    diagnosis: Diagnosis,
    evidence: Evidence | None = None,
    *,
    include_prompts: bool = False,
    run: RunFolder | None = None,
) -> dict:
    """Everything a report shows, in reading order, as plain (unescaped, redacted) text.

    `run`, the loaded run folder where there is one, adds how its files were read (lines skipped).
    """
    scrub = _Redactor(evidence, include_prompts)
    answers = {a.question: a for a in diagnosis.answers}
    steps: dict[str, list[dict]] = {}
    current = None
    for step in diagnosis.path:
        if step.node in answers:
            current = step.node
        elif current is not None:
            steps.setdefault(current, []).append({"node": step.node, "outcome": step.outcome, "note": scrub(step.note)})
    recommendations = [
        {
            "technique": r.technique,
            "status": r.status,
            "question": r.question,
            "confidence": r.confidence,
            "reason": scrub(r.reason),
            "settings": [[e, s] for e, s in shown_settings(diagnosis, r)],
            "expect": scrub(r.expect),
        }
        for r in diagnosis.recommendations
        if r.status in ACTIVE_STATUSES
    ]
    questions = [
        {
            "question": a.question,
            "title": a.title,
            "answer": a.answer,
            "confidence": a.confidence,
            "verdict": a.verdict,
            "rationale": scrub(a.rationale),
            "comparisons": [_comparison(c) for c in a.comparisons],
            "evidence": _evidence_rows(evidence, a.evidence, scrub),
            "steps": steps.get(a.question, []),
        }
        for a in diagnosis.answers
    ]
    pitfalls = [
        {
            "pitfall": p.pitfall,
            "status": _pitfall_status(p.detected),
            "title": p.title,
            "explanation": scrub(p.explanation),
            "fix": scrub(p.fix),
            "comparisons": [_comparison(c) for c in p.comparisons],
        }
        for p in diagnosis.pitfalls
    ]
    return {
        "schema": REPORT_SCHEMA,
        "version": REPORT_VERSION,
        "title": f"llm-diagnose: {scrub(diagnosis.target) or 'target'}",
        "engine": engine_line(diagnosis, evidence),
        "requests": None if (line := requests_line(evidence)) is None else {"text": line[0], "failed": line[1]},
        "bottleneck": scrub(diagnosis.bottleneck),
        "headline": {"kind": diagnosis.headline_kind, "subject": diagnosis.headline_subject},
        "sanity": [{"key": f.key, "problem": scrub(f.problem)} for f in diagnosis.sanity],
        "slo": slo_summary(diagnosis),
        "recommendations": recommendations,
        "in_place": [r.technique for r in diagnosis.recommendations if r.status == "in-place"],
        "on_unverified": [
            {"technique": r.technique, "reason": scrub(r.reason)}
            for r in diagnosis.recommendations
            if r.status == "on-unverified"
        ],
        "technique_status": [[r.technique, r.status] for r in diagnosis.recommendations],
        "questions": questions,
        "pitfalls": pitfalls,
        "not_measured": [
            {"evidence": m.evidence, "reason": scrub(m.reason), "hint": scrub(m.hint)} for m in diagnosis.not_measured
        ],
        "provenance": _provenance(diagnosis, evidence, run, scrub),
        "prompts_withheld": scrub.active,
    }


def _scrub_all(obj, scrub: _Redactor):
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {k: _scrub_all(v, scrub) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub_all(v, scrub) for v in obj]
    return obj


def render(
    diagnosis: Diagnosis,
    evidence: Evidence | None = None,
    *,
    include_prompts: bool = False,
    run: RunFolder | None = None,
) -> str:
    """The JSON report: the content above, plus the complete diagnosis for machines, and the
    capacity plan (`llm-diagnose plan --out`) where the run folder has one."""
    doc = content(diagnosis, evidence, include_prompts=include_prompts, run=run)
    scrub = _Redactor(evidence, include_prompts)
    doc["diagnosis"] = _scrub_all(diagnosis.to_dict(), scrub)
    if run is not None and run.capacity_plan is not None:
        doc["capacity_plan"] = _scrub_all(run.capacity_plan, scrub)
    # ensure_ascii=False keeps non-ASCII text readable; the controls json leaves raw become \uXXXX.
    return escape_controls_in_json(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
