"""The HTML report: one self-contained page, viewable offline, plots inline as SVG.

The page loads nothing (no script, no stylesheet or font from elsewhere) and says so to the
browser: its Content-Security-Policy forbids every fetch and every script, so even text that
escaped escaping could not run. Every string from the evidence or the diagnosis passes
`html.escape`. The content and its order come from `llm_diagnose.diagnose.report.content.content`, the same
as the Markdown and JSON reports: verdict first, then the figures, the path through the
questions, the pitfalls, what was not measured, and the provenance. It is a function of loaded
data (the diagnosis, the evidence, the `RunFolder`): it opens no file.
"""

from __future__ import annotations

from html import escape

from llm_diagnose.diagnose.report import capacity
from llm_diagnose.diagnose.report.content import content
from llm_diagnose.diagnose.report.figures import Figure, figures
from llm_diagnose.diagnose.runfolder import RunFolder
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence

__all__ = ["render", "page", "table", "badge", "figure", "CSP"]

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;padding:1.2em;
color:#1d1d1f;line-height:1.45}
h1{font-size:1.5em;margin:.2em 0}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3{margin:.3em 0;font-size:1.1em}code{background:#f2f2f2;padding:.1em .3em;border-radius:3px;font-size:.92em}
.sub{color:#555}.bottleneck{font-size:1.2em;background:#fff8e5;border-left:5px solid #E69F00;padding:.6em .9em}
.failed{background:#fde8e8;border-left:5px solid #c00;padding:.6em .9em}
.rec{border:1px solid #ddd;border-radius:6px;padding:.6em .9em;margin:.6em 0}
.rec.not-working{border-left:5px solid #D55E00}.rec.recommended{border-left:5px solid #0072B2}
.badge{display:inline-block;font-size:.8em;padding:.05em .5em;border-radius:9px;background:#eee;margin-left:.4em}
.badge.recommended{background:#d6e9f7}.badge.not-working,.badge.detected,.badge.regression{background:#fbd9c9}
.badge.in-place,.badge.yes,.badge.met{background:#d3f0e6}.badge.on-unverified{background:#fff1c2}.badge.broken{background:#fbd9c9}.badge.unknown,.badge.not-checkable{background:#eee}
.figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:1em}
figure{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:.5em}
figcaption{font-size:.85em;color:#555}svg.plot{max-width:100%;height:auto}
.not-measured{background:#f6f6f6;border:1px dashed #aaa;border-radius:4px;padding:1.2em;color:#444}
table{border-collapse:collapse;width:100%;margin:.4em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}th{background:#f5f5f5}
.question{border:1px solid #e3e3e3;border-radius:6px;padding:.5em .9em;margin:.8em 0}
.steps{font-size:.9em;color:#333}.holds{color:#00734d}.fails{color:#9a3b00}
footer{margin-top:2em;color:#777;font-size:.85em}
"""


def badge(text: str) -> str:
    return f'<span class="badge {escape(text.replace(" ", "-"))}">{escape(text)}</span>'


def table(headers: list[str] | None, rows: list[list[str]], *, raw: bool = False) -> str:
    """A table; cells are escaped unless `raw` (cells already built from escaped parts).

    Without headers the first cell of each row is its header (a label: value table).
    """
    cell = (lambda c: c) if raw else escape
    if headers is None:
        body = "".join(
            f"<tr><th>{cell(row[0])}</th>" + "".join(f"<td>{cell(c)}</td>" for c in row[1:]) + "</tr>" for row in rows
        )
        return f"<table><tbody>{body}</tbody></table>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict(c: dict) -> str:
    out = [
        '<section id="verdict"><h2>Verdict</h2>',
        *(
            [f'<p class="{"failed" if r["failed"] else "sub"}"><strong>Requests:</strong> {escape(r["text"])}</p>']
            if (r := c["requests"])
            else []
        ),
        f'<p class="bottleneck"><strong>Bottleneck:</strong> {escape(c["bottleneck"])}</p>',
        f'<p class="sub">headline: <code>{escape(c["headline"]["kind"])}</code>'
        + (f" <code>{escape(c['headline']['subject'])}</code>" if c["headline"]["subject"] else "")
        + "</p>",
    ]
    if c["sanity"]:
        rows = [[f"<code>{escape(f['key'])}</code>", escape(f["problem"])] for f in c["sanity"]]
        out.append("<h3>Doubtful evidence</h3>" + table(["evidence", "problem"], rows, raw=True))
    if c["recommendations"]:
        out.append('<h3>Recommendations, in the tree\'s order</h3><ol class="recommendations">')
        for r in c["recommendations"]:
            settings = "".join(f"<li><code>{escape(e)}: {escape(s)}</code></li>" for e, s in r["settings"])
            out.append(
                f'<li class="rec {escape(r["status"])}"><h3>{escape(r["technique"])}{badge(r["status"])}</h3>'
                f'<p class="sub">from {escape(r["question"])}, confidence {r["confidence"]:.2f}</p>'
                f"<p><strong>Why:</strong> {escape(r['reason'])}</p>"
                f'<p><strong>Change:</strong></p><ul class="settings">{settings}</ul>'
                f"<p><strong>Expect:</strong> {escape(r['expect'])}</p></li>"
            )
        out.append("</ol>")
    else:
        out.append("<p>Recommendations: none.</p>")
    if c["in_place"]:
        out.append(f"<p><strong>In place:</strong> {escape(', '.join(c['in_place']))}</p>")
    if c["on_unverified"]:
        items = "".join(
            f"<li><code>{escape(u['technique'])}</code>: {escape(u['reason'])}</li>" for u in c["on_unverified"]
        )
        out.append(f"<p><strong>On, not verified:</strong></p><ul>{items}</ul>")
    detected = [p for p in c["pitfalls"] if p["status"] == "detected"]
    names = ", ".join(p["pitfall"] for p in detected) if detected else "none"
    out.append(f"<p><strong>Pitfalls detected:</strong> {escape(names)}</p>")
    out.append(_slo(c["slo"]))
    out.append("</section>")
    return "".join(out)


def _slo(slo: dict) -> str:
    source = f" ({escape(slo['source'])})" if slo["declared"] else ""
    out = [f'<div class="slo"><p><strong>Service-level objectives:</strong> {escape(slo["summary"])}{source}</p>']
    if slo["objectives"]:
        rows = [
            [escape(o["objective"]), escape(o["observed"]), badge(o["status"]), escape(o["how"])]
            for o in slo["objectives"]
        ]
        out.append(table(["objective", "observed", "status", "how"], rows, raw=True))
    out.append("</div>")
    return "".join(out)


def _figures(drawn: list[Figure]) -> str:
    out = ['<section id="plots"><h2>Evidence at a glance</h2><div class="figures">']
    out += [figure(f) for f in drawn]
    out.append("</div></section>")
    return "".join(out)


def figure(f: Figure, id_prefix: str = "fig-") -> str:
    """One figure: its plot, or the reason it is missing, with its title and caption."""
    body = f.svg if f.drawn else f'<div class="not-measured">not measured: {escape(f.missing)}</div>'
    state = "drawn" if f.drawn else "missing"
    caption = f"<figcaption>{escape(f.caption)}</figcaption>" if f.caption else ""
    return f'<figure id="{id_prefix}{escape(f.id)}" class="{state}"><h3>{escape(f.title)}</h3>{body}{caption}</figure>'


def _comparisons(comparisons: list[dict]) -> str:
    if not comparisons:
        return ""
    rows = [
        [
            escape(x["evidence"]),
            f"{x['value']:.4g}",
            escape(x["op"]),
            f"<code>{escape(x['threshold'])}</code> = {x['limit']:.4g}",
            f'<span class="{"holds" if x["holds"] else "fails"}">{"holds" if x["holds"] else "does not hold"}</span>',
        ]
        for x in comparisons
    ]
    return table(["evidence", "value", "", "threshold", "result"], rows, raw=True)


def _path(c: dict) -> str:
    out = ['<section id="path"><h2>Path through the questions</h2>']
    for q in c["questions"]:
        verdict = f" ({escape(q['verdict'])})" if q["verdict"] else ""
        out.append(
            f'<article class="question" id="q-{escape(q["question"])}">'
            f"<h3>{escape(q['question'])} {escape(q['title'])} {badge(q['answer'])}{verdict}</h3>"
            f'<p class="sub">confidence {q["confidence"]:.2f}</p><p>{escape(q["rationale"])}</p>'
        )
        out.append(_comparisons(q["comparisons"]))
        if q["evidence"]:
            rows = [
                [e["key"], e["value"], e["how"], "; ".join([e["note"]] + e.get("warnings", [])).strip("; ")]
                for e in q["evidence"]
            ]
            out.append(table(["evidence read", "value", "how it was measured", "note"], rows))
        if q["steps"]:
            items = "".join(
                f"<li><code>{escape(s['node'])}</code> = {escape(s['outcome'])}"
                + (f": {escape(s['note'])}" if s["note"] else "")
                + "</li>"
                for s in q["steps"]
            )
            out.append(f'<ul class="steps">{items}</ul>')
        out.append("</article>")
    out.append("</section>")
    return "".join(out)


def _pitfalls(c: dict) -> str:
    rows = [
        [
            f"<code>{escape(p['pitfall'])}</code><br>{escape(p['title'])}",
            badge(p["status"]),
            escape(p["explanation"]),
            escape(p["fix"]),
        ]
        for p in c["pitfalls"]
    ]
    return (
        '<section id="pitfalls"><h2>Pitfalls</h2>'
        + table(["pitfall", "status", "why", "fix"], rows, raw=True)
        + "</section>"
    )


def _not_measured(c: dict) -> str:
    if not c["not_measured"]:
        return (
            '<section id="not-measured"><h2>Not measured</h2>'
            "<p>Everything the tree asked for was measured.</p></section>"
        )
    rows = [[m["evidence"], m["reason"], m["hint"]] for m in c["not_measured"]]
    return (
        '<section id="not-measured"><h2>Not measured</h2>'
        + table(["evidence", "why not", "how to measure it"], rows)
        + "</section>"
    )


def _techniques(c: dict) -> str:
    rows = [f"<code>{escape(t)}</code> {badge(s)}" for t, s in c["technique_status"]]
    return '<section id="techniques"><h2>Every technique</h2><p>' + " &nbsp; ".join(rows) + "</p></section>"


def _provenance(c: dict) -> str:
    note = (
        "Prompt text is withheld (hashes and lengths only)."
        if c["prompts_withheld"]
        else "Prompt text is shown (asked for with --include-prompts)."
    )
    return (
        '<section id="provenance"><h2>Provenance</h2>'
        + table(None, c["provenance"])
        + f'<p class="sub">{escape(note)}</p></section>'
    )


def _capacity_plan(run: RunFolder | None) -> str:
    """The capacity-plan section, when `llm-diagnose plan --out` wrote one into the run folder."""
    return "" if run is None or run.capacity_plan is None else capacity.html_section(run.capacity_plan)


def render(
    diagnosis: Diagnosis,
    evidence: Evidence | None = None,
    *,
    run: RunFolder | None = None,
    include_prompts: bool = False,
) -> str:
    """The complete page, as text (UTF-8 when written); `run` is the loaded run folder, where there is one."""
    c = content(diagnosis, evidence, include_prompts=include_prompts, run=run)
    body = "".join(
        [
            f'<header><h1>{escape(c["title"])}</h1><p class="sub">engine {escape(c["engine"])}</p></header>',
            _verdict(c),
            _figures(figures(evidence, run)),
            _capacity_plan(run),
            _path(c),
            _pitfalls(c),
            _not_measured(c),
            _techniques(c),
            _provenance(c),
            "<footer>Written by llm-diagnose. Stable identifiers (Q1-Q6, KV, OB, techniques, pitfalls) are "
            "listed in docs/identifiers.md.</footer>",
        ]
    )
    return page(c["title"], body)


def page(title: str, body: str, extra_style: str = "") -> str:
    """A whole self-contained document around `body` (already escaped): the CSP, the style, the title.

    html.escape leaves control characters; they are written visibly (`\\x1b`), so a page that is
    `cat` to a terminal cannot drive it (control_chars).
    """
    return escape_controls(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}{extra_style}</style></head>"
        f"<body>{body}</body></html>\n"
    )
