"""The capacity-plan section of the reports: a table of scenarios and a plot of goodput against replicas.

It renders the plan as `llm-diagnose plan` wrote it (`capacity-plan.json`, the dict of
`CapacityPlan.to_dict()`, read by `RunFolder.capacity_plan`), so a report needs no model or
simulation to show it. Every string is escaped by the format's own helpers (html.escape,
markdown.cell) before it is laid out.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from llm_diagnose.diagnose.report.svg import BLUE, GREEN, GREY, ORANGE, PURPLE, Chart
from llm_diagnose.diagnose.runfolder import CAPACITY_PLAN as PLAN_FILE  # the run folder reads it (RunFolder)
from llm_diagnose.diagnose.text.control_chars import escape_controls

__all__ = ["PLAN_FILE", "console_text", "markdown_lines", "html_section", "goodput_svg"]

_COLORS = (BLUE, GREEN, ORANGE, PURPLE)


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}/s"


def _replicas(s: Mapping[str, Any]) -> str:
    """The replica count, or past the plan's bound its words (capacity.plan.MAX_REPLICAS)."""
    if s.get("replicas_more_than"):
        return f"more than {s['replicas_more_than']:,}"
    return "-" if s["replicas"] is None else str(s["replicas"])


def _goodput_cell(s: Mapping[str, Any]) -> str:
    """The goodput as the plan stands behind it: measured or modelled, clipped to the ceiling, extrapolated."""
    g = s["goodput_per_replica_rps"]
    if g is None:
        return "no rate in range"
    bound = {"at-least": "at least ", "below-range": "below "}.get(s["bound"], "")
    text = f"{bound}{_rate(g)}"
    if s.get("source") == "measured":
        text += " measured"
    if s.get("extrapolation"):
        low, high = s.get("goodput_low_rps"), s.get("goodput_high_rps")
        text += f" (extrapolated: {'below range' if low is None else _rate(low)} to {_rate(high)}"
        text += ", the high end the engine's ceiling)" if s.get("clipped_to_ceiling") else ")"
    elif s.get("clipped_to_ceiling"):
        text += " (the engine's ceiling)"
    return text


def _rows(plan: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for s in plan["scenarios"]:
        rows.append(
            [
                s["name"],
                _goodput_cell(s),
                _replicas(s),
                "-" if s["gpus"] is None else str(s["gpus"]),
                s["assumption"],
            ]
        )
    return rows


def _error_text(plan: Mapping[str, Any]) -> str:
    err = plan.get("model_error")
    if not err or err.get("max_abs_error") is None:
        text = "model error: not validated (no held-back measurements)"
    else:
        text = f"model error against what the server did (held-back requests), {err['summary']}"
    if plan.get("model_error_at_plan"):
        text += f"; where the plan runs: {plan['model_error_at_plan']}"
    return text


def _bounds_lines(plan: Mapping[str, Any]) -> list[str]:
    """The engine's ceiling and the model's fitted range, each where the plan has it."""
    out = []
    today = plan["scenarios"][0] if plan.get("scenarios") else {}
    if today.get("ceiling"):
        out.append(f"engine ceiling (no goodput above it is printed): {today['ceiling']}")
    fitted = (plan.get("model") or {}).get("fitted_range")
    if fitted:
        out.append(
            f"model fitted on: 1-{fitted['max_sequences']} sequences, up to {fitted['max_step_tokens']:,} tokens a "
            f"step and {fitted['max_rate_rps']:.3g} requests/s; beyond that a goodput is marked extrapolated"
        )
    for s in plan.get("scenarios", []):
        if s.get("per_sequence_cost_note"):
            out.append(f"{s['name']}: {s['per_sequence_cost_note']}")
    return out


def _measured_text(plan: Mapping[str, Any]) -> str | None:
    m = plan.get("measured_goodput")
    if not m or not m.get("measured"):
        return None
    live, pred, before = m["measured"], m.get("predicted") or {}, m.get("predicted_before_search") or {}

    def one(s: dict) -> str:
        if s["bound"] == "below-range":
            low = min((t["rate_rps"] for t in s["trials"]), default=None)
            return "no trial judged" if low is None else f"below {low:.3g}/s"
        return ("at least " if s["bound"] == "at-least" else "") + _rate(s["goodput_rps"])

    text = (
        f"goodput of one replica, same workload and SLO: measured {one(live)} "
        f"({len(live['trials'])} live trials), predicted {one(pred) if pred else '-'} by the plan's model for "
        "the same trials"
    )
    if before:
        text += f" ({one(before)} by the model fitted before the search)"
    at = m.get("error_at_rate") or {}
    return text + (f"; {at['summary']}" if at.get("summary") else "")


def console_text(plan: Mapping[str, Any]) -> str:
    out = [
        f"Capacity plan for {plan['target_rps']:g} requests/s under {', '.join(plan['slo'])}",
        f"  workload: {plan['workload']}",
        f"  model: step = {plan['model']['fixed_s'] * 1e3:.3f} ms + {plan['model']['per_seq_s'] * 1e3:.4f} ms x "
        f"sequences + {plan['model']['per_prefill_token_s'] * 1e6:.3f} us x prefill tokens; front end "
        f"{plan['model']['request_overhead_s'] * 1e3:.2f} ms per request, one at a time, and "
        f"{plan['model'].get('request_latency_s', 0.0) * 1e3:.2f} ms of overlapping latency",
        f"  {_error_text(plan)}",
        *(f"  {line}" for line in _bounds_lines(plan)),
        f"  GPUs per replica: {plan['tensor_parallel_size']} ({plan['tensor_parallel_source']})",
    ]
    if (m := _measured_text(plan)) is not None:
        out.append(f"  {m}")
    out.append("")
    width = max(len(r[0]) for r in _rows(plan))
    out.append(f"  {'scenario':<{width}}  {'goodput/replica':>16}  {'replicas':>8}  {'GPUs':>5}  assumption")
    for name, g, reps, gpus, why in _rows(plan):
        out.append(f"  {name:<{width}}  {g:>16}  {reps:>8}  {gpus:>5}  {why}")
    out.append("")
    out += [f"  assumes: {a}" for a in plan.get("assumptions", [])]
    out += [f"  note: {n}" for n in plan.get("notes", [])]
    return escape_controls("\n".join(out) + "\n")  # the workload's and the server's words, shown not obeyed


def markdown_lines(plan: Mapping[str, Any]) -> list[str]:
    from llm_diagnose.diagnose.text.markdown_text import cell, text

    out = [
        "### Capacity plan",
        "",
        text(
            f"Target {plan['target_rps']:g} requests/s under {', '.join(plan['slo'])}; workload "
            f"{plan['workload']}; {plan['tensor_parallel_size']} GPU(s) per replica "
            f"({plan['tensor_parallel_source']})."
        ),
        "",
        text(_error_text(plan)) + ".",
        "",
        *(f"- {text(line)}" for line in _bounds_lines(plan)),
        "",
    ]
    if (m := _measured_text(plan)) is not None:
        out += [text(m) + ".", ""]
    out += ["| scenario | goodput per replica | replicas | GPUs | assumption |", "|---|---|---|---|---|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in _rows(plan)]
    out += [""] + [f"- {text(a)}" for a in plan.get("assumptions", []) + plan.get("notes", [])] + [""]
    return out


def goodput_svg(plan: Mapping[str, Any]) -> str | None:
    """Goodput of R replicas against R, one line per scenario, with the target as a horizontal line."""
    lines = []
    for s in plan["scenarios"]:
        g = s["goodput_per_replica_rps"]
        if g:
            lines.append((s["name"], g))
    if not lines:
        return None
    needed = [s["replicas"] for s in plan["scenarios"] if s["replicas"]]
    top = max(4, min(64, max(needed, default=1) + 1))
    target = plan["target_rps"]
    ymax = max(max(g * top for _, g in lines), target) * 1.08
    chart = Chart(
        "Goodput against replicas",
        "replicas",
        "goodput (requests/s meeting the SLO)",
        (0.5, top + 0.5),
        (0, ymax),
        x_ticks=list(range(1, top + 1, max(1, top // 10))),
    )
    chart.hline(target, GREY, label=f"target {target:g}/s")
    for (name, g), color in zip(lines, _COLORS * 4):
        xs = list(range(1, top + 1))
        chart.line(xs, [r * g for r in xs], color, label=f"{name} ({g:.3g}/s per replica)")
        chart.points(xs, [r * g for r in xs], color, r=2.6, opacity=1)
    return chart.svg()


def html_section(plan: Mapping[str, Any]) -> str:
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in _rows(plan))
    table = (
        "<table><thead><tr><th>scenario</th><th>goodput per replica</th><th>replicas</th><th>GPUs</th>"
        f"<th>assumption</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    plot = goodput_svg(plan)
    figure = (
        (
            f'<figure id="fig-goodput-replicas" class="drawn"><h3>Goodput against replicas</h3>{plot}'
            "<figcaption>R replicas sustain R x one replica's goodput (random load balancing of Poisson "
            "arrivals)</figcaption></figure>"
        )
        if plot
        else ""
    )
    measured = _measured_text(plan)
    notes = "".join(f"<li>{escape(x)}</li>" for x in plan.get("assumptions", []) + plan.get("notes", []))
    return (
        f'<section id="capacity-plan"><h2>Capacity plan</h2>'
        f"<p>Target <strong>{plan['target_rps']:g} requests/s</strong> under "
        f"{escape(', '.join(plan['slo']))}; workload {escape(plan['workload'])}; "
        f"{escape(str(plan['tensor_parallel_size']))} GPU(s) per replica "
        f"({escape(plan['tensor_parallel_source'])}).</p><p>{escape(_error_text(plan))}.</p>"
        + "".join(f"<p>{escape(line)}.</p>" for line in _bounds_lines(plan))
        + (f"<p>{escape(measured)}.</p>" if measured else "")
        + table
        + figure
        + f"<ul>{notes}</ul></section>"
    )
