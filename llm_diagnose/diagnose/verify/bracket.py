"""A/B/A: verify AFTER against two runs of BEFORE's configuration (`verify BEFORE AFTER --control RUN`).

With one run on each side, an interval from the per-request samples covers the noise within each
run, not the difference between two server instances or the host under them: two fresh vLLM CPU
servers of one configuration read -33% [-42%, -21%] apart in median time per token
(benchmarks/bench_instance_drift.py; the engine's ITL mean 3.19 vs 2.22 ms). A second run of BEFORE's
configuration (CONTROL, on a fresh server) measures that difference, and AFTER is judged against
both runs, as an A/B experiment bracketed by two controls:

- a claim keeps its verdict only where it is the same against BEFORE and against CONTROL;
  otherwise it is `cannot-tell`, with both changes: the two controls differ by more than the
  claim's effect can be told from;
- a side effect is harmful only where it is harmful against both; harmful against one only, it
  is shown not attributed (the instances differ, not the change);
- the A/A comparison itself (BEFORE against CONTROL, the gate's default metrics) goes into the
  notes: what moved between two instances of one configuration.

CONTROL must run BEFORE's configuration (no setting switched or changed between them) and put
the same load on the server as AFTER, or there is nothing to bracket with.
"""

from __future__ import annotations

from dataclasses import replace

from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.gate import compare_metric
from llm_diagnose.diagnose.gate_rules import DEFAULT_METRICS, GateRules, GateSettings
from llm_diagnose.diagnose.verify.judge import RunSide, config_diff, verify
from llm_diagnose.diagnose.verify.result import ClaimResult, Comparability, SideEffect, VerifyResult

__all__ = ["verify_bracketed", "bracket_claim", "bracket_side_effects", "aa_drift"]

_SETTING_CHANGES = ("turned-on", "turned-off", "changed")  # a fact seen in one run only is discovery, not setting


def bracket_claim(against_before: ClaimResult, against_control: ClaimResult | None) -> ClaimResult:
    """One claim judged against both controls: its verdict where they agree, else cannot-tell."""
    a, b = against_before, against_control
    if b is None:
        return replace(a, verdict="cannot-tell", basis=f"{a.basis}; not judged against CONTROL, so not bracketed")
    if a.verdict == b.verdict:
        return replace(a, basis=f"{a.basis}; against CONTROL too: {b.change or b.after} ({b.verdict})")
    return replace(
        a,
        verdict="cannot-tell",
        basis=f"{a.basis}; against BEFORE {a.verdict} ({a.change or a.after}), against CONTROL {b.verdict} "
        f"({b.before} -> {b.after} {b.change}): the two runs of BEFORE's configuration differ by more than this "
        "claim can be told from, so the change cannot be told from the difference between server instances",
    )


def bracket_side_effects(
    against_before: tuple[SideEffect, ...], against_control: tuple[SideEffect, ...]
) -> tuple[SideEffect, ...]:
    """Side effects harmful against both controls stay harmful; harmful against one only are not attributed."""
    harm_b = {s.name: s for s in against_before if s.harmful}
    harm_c = {s.name: s for s in against_control if s.harmful}
    seen_c = {s.name: s for s in against_control}
    out: list[SideEffect] = []
    for s in against_before:
        if not s.harmful:
            out.append(s)
        elif s.name in harm_c:
            out.append(replace(s, detail=f"{s.detail}; against CONTROL too: {harm_c[s.name].change or 'detected'}"))
        else:
            other = seen_c.get(s.name)
            there = f"moved {other.change}, not harmful there" if other is not None else "did not move beyond the noise"
            out.append(
                replace(
                    s,
                    harmful=False,
                    attributed=False,
                    detail=f"{s.detail}; but against CONTROL (BEFORE's configuration again) it {there}: "
                    "the server instances differ, not attributed to the change",
                )
            )
    for name, s in harm_c.items():
        if name not in harm_b and name not in {x.name for x in against_before}:
            out.append(
                replace(
                    s,
                    harmful=False,
                    attributed=False,
                    detail=f"{s.detail}, against CONTROL only; against BEFORE it did not move beyond the noise: "
                    "the server instances differ, not attributed to the change",
                )
            )
    return tuple(out)


def aa_drift(before: RunSide, control: RunSide, settings: GateSettings) -> str:
    """What moved between two runs of one configuration (the gate's default metrics), in one note."""
    rules = GateRules(settings=settings)
    moved = [
        f"{rule.key} {o.change}"
        for rule in DEFAULT_METRICS
        if (o := compare_metric(rule, before.evidence, control.evidence, rules)).verdict
        in ("regression", "improvement")
        and o.interval is not None
    ]
    if not moved:
        return (
            f"A/A: BEFORE and CONTROL ({control.label}) ran the same configuration and agree within the gate's "
            "tolerances on every metric compared"
        )
    return (
        f"A/A: BEFORE and CONTROL ({control.label}) ran the same configuration and still differ beyond the noise "
        f"in {'; '.join(moved)}: a change that size between two server instances is not the change's"
    )


def verify_bracketed(
    before: RunSide,
    after: RunSide,
    control: RunSide,
    *,
    change_note: str = "",
    settings: GateSettings | None = None,
) -> VerifyResult:
    """`verify(before, after)`, bracketed by `control` (a second run of BEFORE's configuration)."""
    settings = settings or GateSettings()
    differs = [c for c in config_diff(before.evidence, control.evidence) if c.change in _SETTING_CHANGES]
    if differs:
        shown = ", ".join(f"{c.key} {c.before or '-'} vs {c.after or '-'}" for c in differs)
        raise UsageError(
            f"--control {control.label} is not a run of BEFORE's configuration ({shown}): pass a run of the "
            "same server settings as BEFORE, on a fresh server"
        )
    result = verify(before, after, change_note=change_note, settings=settings)
    other = verify(control, after, change_note=change_note, settings=settings)
    result = replace(result, control_label=control.label, notes=(*result.notes, aa_drift(before, control, settings)))
    if not result.comparability.comparable:
        return result
    if not other.comparability.comparable:
        reasons = tuple(f"CONTROL against AFTER: {r}" for r in other.comparability.reasons)
        return replace(
            result,
            comparability=Comparability(False, result.comparability.checks, (*result.comparability.reasons, *reasons)),
            claims=(),
            side_effects=(),
        )
    judged = {(c.technique, c.claim.key): c for c in other.claims}
    claims = tuple(bracket_claim(c, judged.get((c.technique, c.claim.key))) for c in result.claims)
    return replace(result, claims=claims, side_effects=bracket_side_effects(result.side_effects, other.side_effects))
