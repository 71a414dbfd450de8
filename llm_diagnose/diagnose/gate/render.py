"""The gate's outputs: the terminal summary, JUnit XML for CI test reports, and JSON.

Pure functions of a `GateResult` (llm_diagnose.diagnose.gate.result); the Markdown summary for a
pull-request comment is `llm_diagnose.diagnose.report.markdown.render_gate`, beside the
Markdown escaping it shares with the reports. The terminal summary goes through
`control_chars.escape_controls`: run labels and rule details can carry terminal escapes.
"""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

from llm_diagnose.diagnose.gate.result import GateResult
from llm_diagnose.diagnose.text.control_chars import CONTROLS, escape_controls

__all__ = ["render_text", "render_junit", "render_json", "xml_safe"]


def render_text(result: GateResult, *, verbose: bool = False) -> str:
    """The terminal summary: the verdict, then every rule that is not a plain pass (all with verbose)."""
    out = [
        f"llm-diagnose gate: {result.verdict.upper()}",
        f"  baseline: {result.baseline_label}",
        f"  current:  {result.current_label}",
        "",
    ]
    shown = [o for o in result.ordered() if verbose or o.verdict not in ("pass", "skipped")]
    width = max((len(o.name) for o in shown), default=0)
    for o in shown:
        values = f"{o.baseline} -> {o.current}" if o.baseline or o.current else ""
        change = f"  change {o.change}" if o.change else ""
        tol = f"  (tolerance {o.tolerance})" if o.tolerance else ""
        out.append(f"  {o.verdict:<12} {o.name:<{width}}  {values}{change}{tol}")
        out.append(f"  {'':<12} {'':<{width}}  {o.detail}")
    if not shown:
        out.append("  every rule passed")
    out.append("")
    out.append(", ".join(f"{n} {v}" for v, n in result.counts().items() if n))
    out.extend(f"skipped lines: {s}" for s in result.skipped_lines)
    out.extend(result.notes)
    out.append(result.method_note())
    return escape_controls("\n".join(out) + "\n")


def render_json(result: GateResult) -> str:
    """The outcomes for machines (`GateResult.to_dict`), worst first."""
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"


_XML_NONCHARACTERS = re.compile("[\ufffe\uffff]")


def xml_safe(s: str) -> str:
    """XML 1.0 cannot carry C0 control characters even escaped: drop them, and the controls it does
    allow but a terminal obeys (CR, DEL, C1, bidi: control_chars.CONTROLS), since CI logs print this
    file. ElementTree escapes the rest."""
    return _XML_NONCHARACTERS.sub("", CONTROLS.sub("", s))


def render_junit(result: GateResult, *, timestamp: str | None = None, hostname: str | None = None) -> str:
    """JUnit XML (the Ant format CI systems read): one test case per rule.

    A regression is a <failure>; an inconclusive or skipped rule is <skipped> with the reason;
    everything else passes, with the figures in <system-out>. Lines of the run folders that
    could not be read are a `skipped_lines` property of the suite.
    """
    counts = result.counts()
    failures = counts["regression"]
    skipped = counts["inconclusive"] + counts["skipped"]
    stamp = timestamp or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    totals = {
        "tests": str(len(result.outcomes)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": "0",
    }
    root = ET.Element("testsuites", {"name": "llm-diagnose gate", **totals})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": "llm-diagnose gate",
            **totals,
            "timestamp": stamp,
            "hostname": xml_safe(hostname or socket.gethostname()),
        },
    )
    props = ET.SubElement(suite, "properties")
    properties = [
        ("baseline", result.baseline_label),
        ("current", result.current_label),
        ("verdict", result.verdict),
        ("method", result.method_note()),
    ]
    if result.skipped_lines:
        properties.append(("skipped_lines", "; ".join(result.skipped_lines)))
    for name, value in properties:
        ET.SubElement(props, "property", {"name": name, "value": xml_safe(value)})
    for o in result.outcomes:
        case = ET.SubElement(
            suite, "testcase", {"classname": f"llm-diagnose.gate.{o.kind}", "name": xml_safe(o.name), "time": "0"}
        )
        summary = xml_safe(f"{o.verdict}: {o.baseline} -> {o.current} {o.change} (tolerance {o.tolerance}); {o.detail}")
        if o.verdict == "regression":
            ET.SubElement(case, "failure", {"type": "regression", "message": xml_safe(o.detail)}).text = summary
        elif o.verdict in ("inconclusive", "skipped"):
            ET.SubElement(case, "skipped", {"message": xml_safe(f"{o.verdict}: {o.detail}")})
        ET.SubElement(case, "system-out").text = summary
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
