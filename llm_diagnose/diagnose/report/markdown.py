"""Markdown reports for pull-request comments and CI summaries (GitHub-flavoured tables).

Two documents: `render(diagnosis, evidence)`, the diagnosis report (the same content and
order as the HTML report, without plots: PR comments do not show inline SVG), and
`render_gate(result)`, the gate's summary. Every string from the evidence, the diagnosis or
a rules file goes through `cell()` or `text()`, which escape what Markdown or the HTML a
Markdown renderer lets through would act on: pipes (they split table cells), backticks,
emphasis and link characters, angle brackets and ampersands, and newlines. Each finished
document goes through `control_chars.escape_controls` (terminal escapes in a model name or a label
shown, not obeyed, where the file is printed in a CI log).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_diagnose.diagnose.report import capacity
from llm_diagnose.diagnose.report.content import content
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.diagnose.text.markdown_text import cell, code, text
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence

if TYPE_CHECKING:  # gate imports nothing from here; the types are only for annotations
    from llm_diagnose.diagnose.gate.result import GateResult
    from llm_diagnose.diagnose.runfolder import RunFolder

__all__ = ["render", "render_gate", "cell", "text", "code"]


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Rows are already escaped (with `cell` or `code`)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out + [""]


def render(
    diagnosis: Diagnosis,
    evidence: Evidence | None = None,
    *,
    include_prompts: bool = False,
    run: RunFolder | None = None,
) -> str:
    """The diagnosis report; with the loaded run folder, its capacity plan and lines skipped too."""
    c = content(diagnosis, evidence, include_prompts=include_prompts, run=run)
    out = [
        f"## {text(c['title'])}",
        "",
        f"engine {text(c['engine'])}",
        "",
        *([f"**Requests:** {text(c['requests']['text'])}", ""] if c["requests"] else []),
        f"**Bottleneck:** {text(c['bottleneck'])}",
        "",
        f"**Headline:** {code(c['headline']['kind'])}"
        + (f" {code(c['headline']['subject'])}" if c["headline"]["subject"] else ""),
        "",
    ]
    if c["sanity"]:
        out += ["### Doubtful evidence", ""]
        out += _table(["evidence", "problem"], [[code(f["key"]), cell(f["problem"])] for f in c["sanity"]])
    slo = c["slo"]
    out += [f"**SLO:** {text(slo['summary'])}" + (f" ({text(slo['source'])})" if slo["declared"] else ""), ""]
    if slo["objectives"]:
        out += _table(
            ["objective", "observed", "status", "how"],
            [[cell(o["objective"]), cell(o["observed"]), cell(o["status"]), cell(o["how"])] for o in slo["objectives"]],
        )
    if c["recommendations"]:
        out += ["### Recommendations", ""]
        rows = [
            [
                str(i),
                code(r["technique"]),
                cell(r["status"]),
                cell(r["question"]),
                f"{r['confidence']:.2f}",
                "<br>".join(f"{cell(e)}: {code(s)}" for e, s in r["settings"]) or " ",
                cell(r["expect"]),
            ]
            for i, r in enumerate(c["recommendations"], 1)
        ]
        out += _table(["#", "technique", "status", "from", "confidence", "change", "expect"], rows)
        out += [f"{i}. {code(r['technique'])}: {text(r['reason'])}" for i, r in enumerate(c["recommendations"], 1)]
        out.append("")
    else:
        out += ["Recommendations: none.", ""]
    if c["in_place"]:
        out += ["In place: " + ", ".join(code(t) for t in c["in_place"]), ""]
    if c["on_unverified"]:
        out += [
            "On, not verified: "
            + "; ".join(f"{code(u['technique'])} ({text(u['reason'])})" for u in c["on_unverified"]),
            "",
        ]
    out += ["### Pitfalls", ""]
    out += _table(
        ["pitfall", "status", "why", "fix"],
        [[code(p["pitfall"]), cell(p["status"]), cell(p["explanation"]), cell(p["fix"])] for p in c["pitfalls"]],
    )
    out += ["<details><summary>Path through the questions</summary>", ""]
    rows = []
    for q in c["questions"]:
        evidence_text = "; ".join(x["text"] for x in q["comparisons"]) or "; ".join(
            f"{e['key']} = {e['value']}" for e in q["evidence"]
        )
        rows.append(
            [
                code(q["question"]),
                cell(q["title"]),
                cell(q["answer"] + (f" ({q['verdict']})" if q["verdict"] else "")),
                f"{q['confidence']:.2f}",
                cell(q["rationale"]),
                cell(evidence_text),
            ]
        )
    out += _table(["question", "asks", "answer", "confidence", "why", "evidence against thresholds"], rows)
    out += ["</details>", ""]
    if c["not_measured"]:
        out += ["### Not measured", ""]
        out += _table(
            ["evidence", "why not", "how to measure it"],
            [[code(m["evidence"]), cell(m["reason"]), cell(m["hint"])] for m in c["not_measured"]],
        )
    out += ["### Provenance", ""]
    out += _table(["", ""], [[cell(k), cell(v)] for k, v in c["provenance"]])
    if run is not None and run.capacity_plan is not None:
        out += capacity.markdown_lines(run.capacity_plan)
    return escape_controls("\n".join(out))


def render_gate(result: GateResult) -> str:
    """The gate's summary for a CI job page or a pull-request comment."""
    counts = result.counts()
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    out = [
        f"## llm-diagnose gate: {result.verdict.upper()}",
        "",
        text(tally),
        "",
        *[line for s in result.skipped_lines for line in (text(f"skipped lines: {s}"), "")],
        f"baseline: {code(result.baseline_label)}  ",
        f"current: {code(result.current_label)}",
        "",
    ]
    rows = [
        [
            code(o.name),
            f"**{cell(o.verdict)}**" if o.verdict in ("regression", "inconclusive") else cell(o.verdict),
            cell(o.baseline),
            cell(o.current),
            cell(o.change),
            cell(o.tolerance),
            cell(o.detail),
        ]
        for o in result.ordered()
    ]
    out += _table(["rule", "verdict", "baseline", "current", "change (CI)", "tolerance", "how"], rows)
    out.append(text(result.method_note()))
    return escape_controls("\n".join(out) + "\n")
