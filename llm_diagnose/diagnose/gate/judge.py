"""The performance gate: compare a current run with a baseline and tell a regression from noise.

Each metric rule is compared by the comparison core (`llm_diagnose.diagnose.compare.metric`:
the bootstrap interval of the change, the medians' intervals of summaries, or plain values, with
the client/engine and host cross-checks); a regression then becomes what the rule's severity says
(a warning, say, on a shared runner). The current run's own share of failed requests is held
against the registry's `max_failed_fraction`, whatever the baseline did.

Diagnosis rules compare the two diagnoses: a newly detected pitfall, an answer that changed,
a technique newly recommended (or found not working), a technique that was in place and is
not any more (seen turned off, or no longer needed) are regressions by default. A technique in
place before that the current run could not verify (its switch not seen off: too little
traffic to tell, say) follows the unknown-answer rule, inconclusive by default, as does an
answer that changed between weak answers (confidence at most `min_confidence`).

`GateResult.exit_code()` follows `llm_diagnose.diagnose.errors.ExitCode`: 0 no regression, 1 regression,
5 inconclusive when asked to fail on it.

Around it, one job each: the run folders are read by `llm_diagnose.diagnose.runfolder.RunFolder`
(their per-request records become measurements in
`llm_diagnose.diagnose.compare.request_measurements`); the rules are `llm_diagnose.diagnose.gate.rules`;
the value types (`RunData`, `GateResult`) are `llm_diagnose.diagnose.gate.result`; the text, JSON
and JUnit outputs are `llm_diagnose.diagnose.gate.render`, the Markdown one
`llm_diagnose.diagnose.report.markdown.render_gate`.
"""

from __future__ import annotations

from dataclasses import replace

from llm_diagnose.diagnose.compare.metric import Compared, compare_metric
from llm_diagnose.diagnose.compare.outcome import Outcome, Verdict
from llm_diagnose.diagnose.compare.request_measurements import REQUEST_FAILED_FRACTION
from llm_diagnose.diagnose.compare.rules import MetricRule
from llm_diagnose.diagnose.gate.result import GateResult, RunData
from llm_diagnose.diagnose.gate.rules import GateRules
from llm_diagnose.diagnose.text.values import ACTIVE_STATUSES, UNSETTLED_STATUSES, format_value
from llm_diagnose.diagnose.tree.diagnosis import PITFALLS, QUESTIONS, TECHNIQUE_ON_NODES, TECHNIQUES, Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence

__all__ = ["compare", "judge_rule", "compare_diagnoses", "failure_ceiling", "FAILURE_CEILING", "NOTHING_COMPARED"]

NOTHING_COMPARED = "gate.nothing_compared"  # the outcome of two runs with no compared quantity between them


# --- metric rules -------------------------------------------------------------------------------
def judge_rule(rule: MetricRule, base_ev: Evidence, cur_ev: Evidence, rules: GateRules) -> Outcome:
    """One metric rule compared (`compare_metric`); a regression then becomes what the rule's
    severity says (a warning, say, on a shared runner)."""
    outcome = compare_metric(rule, base_ev, cur_ev, rules.settings)
    severity = rule.severity or rules.severity
    if outcome.verdict != "regression" or severity == "regression":
        return outcome
    note = " (ignored by the rules)" if severity == "ignore" else f" (a {severity} by the rules)"
    return replace(outcome, verdict=_AS_VERDICT[severity], detail=outcome.detail + note)


# --- failed requests --------------------------------------------------------------------------------
FAILURE_CEILING = "requests.failed_fraction:ceiling"  # the outcome of the current run's own failures


def failure_ceiling(base_ev: Evidence, cur_ev: Evidence, rules: GateRules) -> Outcome | None:
    """The current run's share of failed requests against the registry's `max_failed_fraction`
    (`CompareSettings.failed_too_often`, as verify's note).

    A regression where it is above the ceiling, whatever the baseline did: a server that fails
    its requests fails the gate even where it failed them before (the comparison rule of the same
    key says whether it got worse). None where the current run sent no request (a passive run).
    """
    cur = cur_ev.measurement(REQUEST_FAILED_FRACTION)
    if cur is None:
        return None
    ceiling = rules.settings.max_failed_fraction
    base = base_ev.measurement(REQUEST_FAILED_FRACTION)
    common: Compared = {
        "name": FAILURE_CEILING,
        "kind": "metric",
        "baseline": "not sent" if base is None else format_value(base.value, "fraction"),
        "current": format_value(cur.value, "fraction"),
        "tolerance": f"at most {ceiling:.0%} of the requests sent",
    }
    if not rules.settings.failed_too_often(cur.value):
        return Outcome(verdict="pass", detail=f"{cur.note}: within the ceiling", **common)
    before = "" if base is None else f" (the baseline: {base.note})"
    return Outcome(
        verdict="regression",
        detail=f"{cur.note}, above the ceiling of {ceiling:.0%}{before}: the server failed what it was sent, "
        "and the latencies above cover only the requests it answered; see the run's requests.jsonl (fault, "
        "fault_detail) and the server's log",
        **common,
    )


# --- diagnosis rules ------------------------------------------------------------------------------
_AS_VERDICT: dict[str, Verdict] = {
    "regression": "regression",
    "inconclusive": "inconclusive",
    "warning": "warning",
    "ignore": "pass",
}


def _severity(setting: str, detail: str, name: str, baseline: str, current: str) -> Outcome:
    suffix = " (ignored by the rules)" if setting == "ignore" else ""
    return Outcome(name, "diagnosis", _AS_VERDICT[setting], baseline, current, detail=detail + suffix)


def compare_diagnoses(base: Diagnosis, cur: Diagnosis, rules: GateRules) -> list[Outcome]:
    r = rules.diagnosis
    out: list[Outcome] = []
    b_pit, c_pit = {p.pitfall: p for p in base.pitfalls}, {p.pitfall: p for p in cur.pitfalls}
    shown = {True: "detected", False: "not detected", None: "not checkable"}
    for pid in PITFALLS:
        b_seen = b_pit[pid].detected if pid in b_pit else None
        c_seen = c_pit[pid].detected if pid in c_pit else None
        name, bs, cs = f"pitfall:{pid}", shown[b_seen], shown[c_seen]
        if c_seen is True and b_seen is not True:
            out.append(_severity(r.new_pitfall, f"newly detected: {c_pit[pid].explanation}", name, bs, cs))
        elif b_seen is True and c_seen is False:
            out.append(Outcome(name, "diagnosis", "improvement", bs, cs, detail="no longer detected"))
        elif b_seen is True and c_seen is None:
            out.append(_severity(r.unknown_answer, "detected before, not checkable now", name, bs, cs))
        else:
            out.append(
                Outcome(
                    name,
                    "diagnosis",
                    "pass",
                    bs,
                    cs,
                    detail="detected in both runs (not new)" if b_seen and c_seen else "unchanged",
                )
            )
    b_ans, c_ans = {a.question: a for a in base.answers}, {a.question: a for a in cur.answers}
    for q in QUESTIONS:
        b = b_ans[q].answer if q in b_ans else "unknown"
        c = c_ans[q].answer if q in c_ans else "unknown"
        name = f"answer:{q}"
        if b == c:
            out.append(Outcome(name, "diagnosis", "pass", b, c, detail="unchanged"))
        elif "unknown" in (b, c):
            why = c_ans[q].rationale if q in c_ans else "not answered"
            out.append(_severity(r.unknown_answer, f"answer {b} -> {c}: {why}", name, b, c))
        elif (sure := min(b_ans[q].confidence, c_ans[q].confidence)) <= r.min_confidence:
            # A flip between weak answers (a passive correlation, thin evidence) is noise until shown otherwise.
            out.append(
                _severity(
                    r.unknown_answer,
                    f"answer changed {b} -> {c} at low confidence ({sure:.2f} <= "
                    f"{r.min_confidence:g}): {c_ans[q].rationale}",
                    name,
                    b,
                    c,
                )
            )
        else:
            out.append(_severity(r.changed_answer, f"answer changed {b} -> {c}: {c_ans[q].rationale}", name, b, c))
    b_rec = {x.technique: x.status for x in base.recommendations}
    c_rec = {x.technique: x for x in cur.recommendations}
    for t in TECHNIQUES:
        was = b_rec.get(t, "unknown")
        now = c_rec[t].status if t in c_rec else "unknown"
        name = f"technique:{t}"
        if now in ACTIVE_STATUSES and was not in ACTIVE_STATUSES:
            out.append(_severity(r.new_recommendation, f"now {now}: {c_rec[t].reason}", name, was, now))
        elif (
            was == "in-place"
            and now in UNSETTLED_STATUSES
            and t in TECHNIQUE_ON_NODES
            and cur.technique_on(t) is not False
        ):
            # Knowing less is not a regression: a switch not seen off, in a run that could not tell
            # whether it still works (too little traffic in its window, say), is the unknown-answer
            # rule's case. Seen off, or a technique the tree records no switch for (quantization,
            # parallelism, disaggregation can read "unknown" while seen off), it is a lost technique.
            why = c_rec[t].reason if t in c_rec else "not in the current diagnosis"
            out.append(_severity(r.unknown_answer, f"in place before, now {now}: {why}", name, was, now))
        elif was == "in-place" and now != "in-place":
            why = c_rec[t].reason if t in c_rec else "not in the current diagnosis"
            out.append(_severity(r.lost_technique, f"in place before, now {now}: {why}", name, was, now))
        elif was in ACTIVE_STATUSES and now not in ACTIVE_STATUSES:
            out.append(Outcome(name, "diagnosis", "improvement", was, now, detail=f"no longer {was}"))
        else:
            out.append(
                Outcome(name, "diagnosis", "pass", was, now, detail="unchanged" if was == now else f"{was} -> {now}")
            )
    return out


def compare(
    baseline: RunData, current: RunData, rules: GateRules | None = None, notes: tuple[str, ...] = ()
) -> GateResult:
    rules = rules or GateRules()
    outcomes = [judge_rule(rule, baseline.evidence, current.evidence, rules) for rule in rules.metrics]
    if outcomes and all(o.verdict == "skipped" for o in outcomes):
        # Two runs that measured nothing the rules compare agree on nothing: not a pass.
        outcomes.append(
            Outcome(
                NOTHING_COMPARED,
                "metric",
                "inconclusive",
                detail=f"neither run measured any of the {len(rules.metrics)} quantities the rules compare, so no "
                "performance was compared: check that both runs scraped the server (their summary.txt) and "
                "rerun them (llm-diagnose run; --active adds per-request latencies)",
            )
        )
    ceiling = failure_ceiling(baseline.evidence, current.evidence, rules)
    if ceiling is not None:
        outcomes.append(ceiling)
    outcomes += compare_diagnoses(baseline.diagnosis, current.diagnosis, rules)
    skipped = tuple(
        f"{side}: {line}" for side, run in (("baseline", baseline), ("current", current)) for line in run.skipped_lines
    )
    return GateResult(tuple(outcomes), rules, baseline.label or "baseline", current.label or "current", notes, skipped)
