"""verify's outputs: the terminal text, JSON, JUnit XML (like the gate's) and Markdown.

Pure functions of a `VerifyResult` (llm_diagnose.diagnose.verify.result). The text and Markdown
outputs go through `control_chars.escape_controls`: labels and notes can carry terminal escapes.
"""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

# XML 1.0 cannot carry control characters even escaped: the gate drops them, and so does verify.
from llm_diagnose.diagnose.gate.render import xml_safe
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.diagnose.text.markdown_text import cell, code, text
from llm_diagnose.diagnose.verify.result import SideEffect, VerifyResult

__all__ = [
    "render_text",
    "render_json",
    "render_junit",
    "render_markdown",
    "config_rows",
    "claim_rows",
    "workload_rows",
    "side_effect_rows",
    "CONFIG_HEADERS",
    "CLAIM_HEADERS",
    "WORKLOAD_HEADERS",
    "SIDE_EFFECT_HEADERS",
]

CONFIG_HEADERS = ["setting", "before", "after", "change", "technique"]
CLAIM_HEADERS = ["technique", "claim", "before", "after", "change [interval]", "verdict"]
WORKLOAD_HEADERS = ["workload", "before", "after", "difference", "tolerance", "same?"]
SIDE_EFFECT_HEADERS = ["what", "before", "after", "change", "", "detail"]


def config_rows(result: VerifyResult) -> list[list[str]]:
    return [[c.key, c.before or "-", c.after or "-", c.change, c.technique or "-"] for c in result.config if c.changed]


def claim_rows(result: VerifyResult) -> list[list[str]]:
    return [
        [c.technique, c.claim.describe(), c.before or "-", c.after or "-", c.change or "-", c.verdict]
        for c in result.claims
    ]


def workload_rows(result: VerifyResult) -> list[list[str]]:
    def same(w) -> str:
        return ("yes" if w.comparable else "NO") + ("" if w.deciding else " (shown only)")

    return [[w.name, w.before, w.after, w.difference, w.tolerance, same(w)] for w in result.comparability.checks]


def side_effect_label(s: SideEffect) -> str:
    """ "harmful"; "worse, not attributed" (the change cannot act there); "" (better, or a pitfall gone)."""
    return "harmful" if s.harmful else "" if s.attributed else "worse, not attributed"


_TEXT_LABEL = {"harmful": "HARM", "": "also", "worse, not attributed": "NOT ATTRIBUTED"}


def side_effect_rows(result: VerifyResult) -> list[list[str]]:
    return [[s.name, s.before, s.after, s.change, side_effect_label(s), s.detail] for s in result.side_effects]


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return indent + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def render_text(result: VerifyResult) -> str:
    """The terminal summary: verdict, what changed, the workload check, the claims, the side effects."""
    out = [
        f"llm-diagnose verify: {result.verdict.upper()}",
        f"  before: {result.before_label}",
        f"  after:  {result.after_label}",
    ]
    if result.control_label:
        out.append(f"  control: {result.control_label} (BEFORE's configuration again: AFTER judged against both)")
    if result.change_note:
        out.append(f"  change (as noted): {result.change_note}")
    out += ["", "What changed (configuration discovered in each run):"]
    rows = config_rows(result)
    out += _table(CONFIG_HEADERS, rows) if rows else ["  nothing discovered changed"]
    out += ["", "Judged techniques:"]
    out += [f"  {a.technique}: {a.why}" for a in result.adopted] or ["  none"]
    out += ["", f"Workload: {'comparable' if result.comparability.comparable else 'NOT COMPARABLE'}"]
    if result.comparability.checks:
        out += _table(WORKLOAD_HEADERS, workload_rows(result))
    out += [f"  {r}" for r in result.comparability.reasons]
    if not result.comparability.comparable:
        out += ["  no verdicts: the runs did not put the same load on the server"]
    else:
        out += ["", "Claims:"]
        out += _table(CLAIM_HEADERS, claim_rows(result)) if result.claims else ["  none to judge"]
        out += [f"  {c.claim.key}: {c.basis}" for c in result.claims if c.basis]
        out += ["", "Side effects:"]
        out += [
            f"  {_TEXT_LABEL[side_effect_label(s)]}  {s.name}  {s.before} -> {s.after}  {s.change}  {s.detail}".rstrip()
            for s in result.side_effects
        ] or ["  none beyond the noise"]
        if result.slo:
            out += ["", "SLO checks:"] + [f"  {s.objective}: before {s.before}; after {s.after}" for s in result.slo]
        counts = ", ".join(f"{n} {v}" for v, n in result.counts().items() if n)
        if counts:
            out += ["", counts]
    out += ["", *result.notes, result.method]
    return escape_controls("\n".join(out).rstrip("\n") + "\n")


def render_json(result: VerifyResult) -> str:
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"


def _junit_outcome(s: SideEffect) -> str:
    return "failure" if s.harmful else "pass" if s.attributed else "skipped"


def render_junit(result: VerifyResult, *, timestamp: str | None = None, hostname: str | None = None) -> str:
    """JUnit XML, one test case per claim and per side effect: made worse (or a harmful side effect)
    is a <failure>, cannot tell is <skipped>; runs that are not comparable give one skipped case."""
    cases: list[tuple[str, str, str, str]] = []  # (classname, name, outcome, message)
    if not result.comparability.comparable:
        why = "; ".join(result.comparability.reasons)
        cases.append(("llm-diagnose.verify.workload", "comparable", "skipped", f"not comparable: {why}"))
    for c in result.claims:
        outcome = {"made-it-worse": "failure", "cannot-tell": "skipped"}.get(c.verdict, "pass")
        message = f"{c.verdict}: {c.claim.describe()}: {c.before} -> {c.after} {c.change}; {c.basis}"
        cases.append((f"llm-diagnose.verify.{c.technique}", c.claim.key, outcome, message))
    for s in result.side_effects:
        message = f"{s.name}: {s.before} -> {s.after} {s.change}; {s.detail}"
        cases.append(("llm-diagnose.verify.side-effect", s.name, _junit_outcome(s), message))
    failures = sum(c[2] == "failure" for c in cases)
    skipped = sum(c[2] == "skipped" for c in cases)
    totals = {"tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped), "time": "0"}
    stamp = timestamp or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    root = ET.Element("testsuites", {"name": "llm-diagnose verify", **totals})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": "llm-diagnose verify",
            **totals,
            "timestamp": stamp,
            "hostname": xml_safe(hostname or socket.gethostname()),
        },
    )
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("before", result.before_label),
        ("after", result.after_label),
        ("verdict", result.verdict),
        ("change", result.change_note),
        ("method", result.method),
    ):
        ET.SubElement(props, "property", {"name": name, "value": xml_safe(value)})
    for classname, name, outcome, message in cases:
        case = ET.SubElement(suite, "testcase", {"classname": xml_safe(classname), "name": xml_safe(name), "time": "0"})
        if outcome == "failure":
            ET.SubElement(case, "failure", {"type": "made-it-worse", "message": xml_safe(message)}).text = xml_safe(
                message
            )
        elif outcome == "skipped":
            ET.SubElement(case, "skipped", {"message": xml_safe(message)})
        ET.SubElement(case, "system-out").text = xml_safe(message)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return out + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def render_markdown(result: VerifyResult) -> str:
    """A summary for a pull-request comment."""
    out = [f"## llm-diagnose verify: {result.verdict}", ""]
    out.append(f"Before: {code(result.before_label)} · after: {code(result.after_label)}")
    if result.control_label:
        out.append(f"Control (BEFORE's configuration again): {code(result.control_label)}")
    if result.change_note:
        out.append(f"Change (as noted): {text(result.change_note)}")
    out += ["", "### What changed", ""]
    rows = config_rows(result)
    out += _md_table(CONFIG_HEADERS, rows) if rows else ["Nothing discovered changed.", ""]
    out += [f"- {code(a.technique)}: {text(a.why)}" for a in result.adopted] + [""]
    out += [
        "### Workload",
        "",
        "Comparable." if result.comparability.comparable else "**Not comparable**: no verdicts.",
    ]
    out += [""] + (_md_table(WORKLOAD_HEADERS, workload_rows(result)) if result.comparability.checks else [])
    out += [f"- {text(r)}" for r in result.comparability.reasons]
    if result.comparability.comparable:
        out += ["", "### Claims", ""]
        out += _md_table(CLAIM_HEADERS, claim_rows(result)) if result.claims else ["None to judge.", ""]
        if result.side_effects:
            out += ["### Side effects", ""]
            out += _md_table(SIDE_EFFECT_HEADERS, side_effect_rows(result))
        if result.slo:
            out += ["### SLO checks", ""] + _md_table(
                ["objective", "before", "after"], [[s.objective, s.before, s.after] for s in result.slo]
            )
    out += [f"_{text(n)}_" for n in result.notes] + ["", f"_{text(result.method)}_"]
    return escape_controls("\n".join(out).rstrip("\n") + "\n")
