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

from collections.abc import Callable
from dataclasses import dataclass
from html import escape

from llm_diagnose.diagnose.report.content import content, prompt_scrubber
from llm_diagnose.diagnose.report.figures import figures
from llm_diagnose.diagnose.report.html import badge, figure, page, table
from llm_diagnose.diagnose.runfolder import LoadedRun, RunFolder
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.verify import render as verify_render
from llm_diagnose.diagnose.verify.result import VerifyResult

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


def _verify_section(result: VerifyResult, scrub: Callable[[str], str]) -> str:
    """verify's result, every text through `scrub` (prompt strings withheld) and then escaped."""

    def t(text: str) -> str:
        return escape(scrub(text))

    def rows(cells: list[list[str]]) -> list[list[str]]:
        return [[scrub(c) for c in row] for row in cells]

    out = [
        f'<section id="verify"><h2>Did the change deliver? {badge(result.verdict)}</h2>',
        f'<p class="sub">before <code>{t(result.before_label)}</code>, after <code>{t(result.after_label)}</code></p>',
    ]
    if result.change_note:
        out.append(f"<p><strong>Change (as noted):</strong> {t(result.change_note)}</p>")
    config = rows(verify_render.config_rows(result))
    out.append("<h3>What changed (configuration discovered in each run)</h3>")
    out.append(table(verify_render.CONFIG_HEADERS, config) if config else "<p>Nothing discovered changed.</p>")
    judged = "".join(f"<li><code>{t(a.technique)}</code>: {t(a.why)}</li>" for a in result.adopted)
    out.append(f"<h3>Judged techniques</h3><ul>{judged or '<li>none</li>'}</ul>")
    same = "comparable" if result.comparability.comparable else "not comparable: no verdicts"
    out.append(f"<h3>Workload: {escape(same)}</h3>")
    if result.comparability.checks:
        out.append(table(verify_render.WORKLOAD_HEADERS, rows(verify_render.workload_rows(result))))
    out += [f"<p>{t(r)}</p>" for r in result.comparability.reasons]
    if result.comparability.comparable:
        out.append("<h3>Promised effects</h3>")
        if result.claims:
            claims = [
                [escape(c) for c in row[:-1]] + [badge(row[-1])] for row in rows(verify_render.claim_rows(result))
            ]
            out.append(table(verify_render.CLAIM_HEADERS, claims, raw=True))
            out += [f'<p class="sub"><code>{t(c.claim.key)}</code>: {t(c.basis)}</p>' for c in result.claims]
        else:
            out.append("<p>None to judge.</p>")
        out.append("<h3>Side effects</h3>")
        effects = rows(verify_render.side_effect_rows(result))
        out.append(table(verify_render.SIDE_EFFECT_HEADERS, effects) if effects else "<p>None beyond the noise.</p>")
        if result.slo:
            slo = [[scrub(x.objective), x.before, x.after] for x in result.slo]
            out.append("<h3>SLO checks</h3>" + table(["objective", "before", "after"], slo))
    out += [f'<p class="sub">{t(n)}</p>' for n in (*result.notes, result.method) if n]
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


def _answers_shown(c: dict) -> list[tuple[str, str, str]]:
    return [(q["question"], q["answer"], q["verdict"]) for q in c["questions"]]


def render_pair(before: PairSide, after: PairSide, result: VerifyResult, *, include_prompts: bool = False) -> str:
    """The whole page for two runs: verify's result, then the two diagnoses column by column.

    Rows whose two halves differ (the bottleneck, the answers, the techniques' status) are shaded.
    Prompt text is withheld everywhere unless `include_prompts`, as in the one-run report.
    """
    evb, eva = before.folder.evidence, after.folder.evidence
    cb = content(before.diagnosis, evb, run=before.folder, include_prompts=include_prompts)
    ca = content(after.diagnosis, eva, run=after.folder, include_prompts=include_prompts)
    scrub = prompt_scrubber(evb, eva, include_prompts=include_prompts)
    heads = _row(
        f'<h3 class="side">Before: <code>{escape(scrub(result.before_label))}</code></h3>',
        f'<h3 class="side">After: <code>{escape(scrub(result.after_label))}</code></h3>',
    )
    engines = cb["engine"] if cb["engine"] == ca["engine"] else f"{cb['engine']} (before), {ca['engine']} (after)"
    parts = [
        f'<header><h1>Before and after</h1><p class="sub">engine {escape(engines)}</p></header>',
        _verify_section(result, scrub),
        '<section id="side-by-side"><h2>The two diagnoses</h2>',
        heads,
        _row(
            f'<p class="bottleneck">{escape(cb["bottleneck"])}</p>',
            f'<p class="bottleneck">{escape(ca["bottleneck"])}</p>',
            cb["bottleneck"] != ca["bottleneck"],
        ),
        "<h3>Answers</h3>",
        _row(_answers(cb), _answers(ca), _answers_shown(cb) != _answers_shown(ca)),
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
