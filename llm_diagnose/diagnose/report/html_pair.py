"""Before and after side by side: one HTML page for two runs of one server (issue 16).

The page opens with verify's judgement of the change (what changed in the discovered
configuration, whether the workloads were comparable, each promised effect with its interval
and verdict, the side effects), the same result `llm-diagnose verify` prints, and then lays the
two diagnoses out in two columns: the bottleneck, the answers to the six questions, every
technique's status, and each figure of the single-run report beside its counterpart, so a
change shows as a row whose two halves differ. Like `html.render` it is a function of loaded
data and writes nothing; the page loads nothing either (same Content-Security-Policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.report.content import content
from llm_diagnose.diagnose.report.figures import figures
from llm_diagnose.diagnose.report.html import badge, figure, page, table
from llm_diagnose.diagnose.runfolder import RunFolder
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.verify import render as verify_render
from llm_diagnose.diagnose.verify.result import VerifyResult

if TYPE_CHECKING:
    from llm_diagnose.diagnose.commands.report import LoadedRun

__all__ = ["PairSide", "render_pair"]

_PAIR_STYLE = """
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em;align-items:start}
.pair>div{min-width:0}.pair h3.side{margin-top:0;color:#555}
.changed{background:#fff8e5}
.badge.delivered{background:#d3f0e6}.badge.made-it-worse{background:#fbd9c9}
.badge.no-measurable-effect,.badge.cannot-tell,.badge.not-comparable{background:#fff1c2}
"""


@dataclass(frozen=True)
class PairSide:
    """One run as loaded: its diagnosis and folder (figures read the folder's samples)."""

    diagnosis: Diagnosis
    folder: RunFolder

    @classmethod
    def of(cls, loaded: LoadedRun) -> PairSide:
        return cls(loaded.diagnosis, loaded.folder)


def _verify_section(result: VerifyResult) -> str:
    out = [
        f'<section id="verify"><h2>Did the change deliver? {badge(result.verdict)}</h2>',
        f'<p class="sub">before <code>{escape(result.before_label)}</code>, after '
        f"<code>{escape(result.after_label)}</code></p>",
    ]
    if result.change_note:
        out.append(f"<p><strong>Change (as noted):</strong> {escape(result.change_note)}</p>")
    rows = verify_render.config_rows(result)
    out.append("<h3>What changed (configuration discovered in each run)</h3>")
    out.append(table(verify_render.CONFIG_HEADERS, rows) if rows else "<p>Nothing discovered changed.</p>")
    judged = "".join(f"<li><code>{escape(a.technique)}</code>: {escape(a.why)}</li>" for a in result.adopted)
    out.append(f"<h3>Judged techniques</h3><ul>{judged or '<li>none</li>'}</ul>")
    same = "comparable" if result.comparability.comparable else "not comparable: no verdicts"
    out.append(f"<h3>Workload: {escape(same)}</h3>")
    if result.comparability.checks:
        out.append(table(verify_render.WORKLOAD_HEADERS, verify_render.workload_rows(result)))
    out += [f"<p>{escape(r)}</p>" for r in result.comparability.reasons]
    if result.comparability.comparable:
        out.append("<h3>Promised effects</h3>")
        if result.claims:
            rows = [[escape(c) for c in row[:-1]] + [badge(row[-1])] for row in verify_render.claim_rows(result)]
            out.append(table(verify_render.CLAIM_HEADERS, rows, raw=True))
            out += [f'<p class="sub"><code>{escape(c.claim.key)}</code>: {escape(c.basis)}</p>' for c in result.claims]
        else:
            out.append("<p>None to judge.</p>")
        out.append("<h3>Side effects</h3>")
        rows = verify_render.side_effect_rows(result)
        out.append(table(verify_render.SIDE_EFFECT_HEADERS, rows) if rows else "<p>None beyond the noise.</p>")
    out += [f'<p class="sub">{escape(n)}</p>' for n in (*result.notes, result.method) if n]
    out.append("</section>")
    return "".join(out)


def _row(left: str, right: str, changed: bool = False) -> str:
    mark = ' class="changed"' if changed else ""
    return f'<div class="pair"><div{mark}>{left}</div><div{mark}>{right}</div></div>'


def _answers(c: dict) -> str:
    rows = [
        [
            f"{escape(q['question'])} {escape(q['title'])}",
            badge(q["answer"]) + (f" ({escape(q['verdict'])})" if q["verdict"] else ""),
            f"{q['confidence']:.2f}",
            escape(q["rationale"]),
        ]
        for q in c["questions"]
    ]
    return table(["question", "answer", "confidence", "why"], rows, raw=True)


def _techniques(c: dict) -> str:
    return table(["technique", "status"], [[escape(t), badge(s)] for t, s in c["technique_status"]], raw=True)


def render_pair(before: PairSide, after: PairSide, result: VerifyResult) -> str:
    """The whole page for two runs: verify's result, then the two diagnoses column by column."""
    cb = content(before.diagnosis, before.folder.evidence, run=before.folder)
    ca = content(after.diagnosis, after.folder.evidence, run=after.folder)
    heads = _row(
        f'<h3 class="side">Before: <code>{escape(result.before_label)}</code></h3>',
        f'<h3 class="side">After: <code>{escape(result.after_label)}</code></h3>',
    )
    parts = [
        f'<header><h1>Before and after</h1><p class="sub">engine {escape(ca["engine"])}</p></header>',
        _verify_section(result),
        '<section id="side-by-side"><h2>The two diagnoses</h2>',
        heads,
        _row(
            f'<p class="bottleneck">{escape(cb["bottleneck"])}</p>',
            f'<p class="bottleneck">{escape(ca["bottleneck"])}</p>',
            cb["bottleneck"] != ca["bottleneck"],
        ),
        "<h3>Answers</h3>",
        _row(_answers(cb), _answers(ca)),
        "<h3>Every technique</h3>",
        _row(_techniques(cb), _techniques(ca), cb["technique_status"] != ca["technique_status"]),
        "</section>",
        '<section id="figures-side-by-side"><h2>Evidence at a glance, before | after</h2>',
    ]
    fb = {f.id: f for f in figures(before.folder.evidence, before.folder)}
    fa = {f.id: f for f in figures(after.folder.evidence, after.folder)}
    for fid in [*fb, *(i for i in fa if i not in fb)]:
        left = figure(fb[fid], "before-fig-") if fid in fb else "<p>not drawn for this run</p>"
        right = figure(fa[fid], "after-fig-") if fid in fa else "<p>not drawn for this run</p>"
        parts.append(_row(left, right))
    parts.append("</section>")
    parts.append(
        '<section id="provenance"><h2>Provenance</h2>'
        + _row(table(None, cb["provenance"]), table(None, ca["provenance"]))
        + "</section><footer>Written by llm-diagnose (report BEFORE AFTER).</footer>"
    )
    return page("llm-diagnose: before and after", "".join(parts), _PAIR_STYLE)
