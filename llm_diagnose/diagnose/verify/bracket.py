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

from llm_diagnose.diagnose.compare.metric import compare_metric
from llm_diagnose.diagnose.compare.rules import DEFAULT_METRICS
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.host_load import host_load_change
from llm_diagnose.diagnose.verify.judge import (
    RunSide,
    claimed_keys,
    compare_workloads,
    config_diff,
    judge_technique,
    side_effects,
    verify,
)
from llm_diagnose.diagnose.verify.result import ClaimResult, Comparability, SideEffect, VerifyResult

__all__ = ["verify_bracketed", "bracket_claim", "bracket_side_effects", "aa_drift"]


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
    """Harmful against both controls: harmful. Harmful against one only (whatever the other saw):
    not attributed, with both. Otherwise what BEFORE's comparison showed."""
    by_before = {s.name: s for s in against_before}
    by_control = {s.name: s for s in against_control}
    out: list[SideEffect] = []
    for name in [*by_before, *(n for n in by_control if n not in by_before)]:
        b, c = by_before.get(name), by_control.get(name)
        if b is not None and c is not None and b.harmful and c.harmful:
            out.append(replace(b, detail=f"{b.detail}; against CONTROL too: {c.change or 'detected'}"))
        elif (b is not None and b.harmful) or (c is not None and c.harmful):
            harm, other = (b, c) if b is not None and b.harmful else (c, b)
            assert harm is not None
            where, elsewhere = ("BEFORE", "CONTROL") if harm is b else ("CONTROL", "BEFORE")
            if other is not None:
                moved = "worse, not attributed" if not other.attributed else "better"
                there = f"{other.change or other.after} ({moved})"
            else:
                there = "not new there" if harm.kind == "pitfall" else "no move beyond the noise"
            out.append(
                replace(
                    harm,
                    harmful=False,
                    attributed=False,
                    detail=f"{harm.detail} (against {where}); against {elsewhere}: {there}. The two runs of "
                    "BEFORE's configuration disagree, so it is the server instances', not attributed to the change",
                )
            )
        elif b is not None:
            out.append(b)
    return tuple(out)


def aa_drift(before: RunSide, control: RunSide, settings: CompareSettings) -> str:
    """What moved between two runs of one configuration (the default metrics), in one note."""
    moved = [
        f"{rule.key} {o.change}"
        for rule in DEFAULT_METRICS
        if (o := compare_metric(rule, before.evidence, control.evidence, settings)).verdict
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


def same_run(before: RunSide, control: RunSide) -> str | None:
    """How CONTROL is BEFORE itself rather than another run of it, or None: the same folder, or a
    copy (every request record the same, send times and token arrivals included; for passive
    runs, the same evidence). Two runs never time a request alike to the tenth of a microsecond."""
    try:
        if before.folder.path.resolve() == control.folder.path.resolve():
            return "the same folder"
    except OSError:
        pass
    b_req, c_req = before.folder.requests, control.folder.requests
    if b_req or c_req:
        return "the same requests, timed alike to the microsecond: a copy" if b_req == c_req else None
    b_ev, c_ev = before.folder.evidence, control.folder.evidence
    if b_ev is not None and c_ev is not None and b_ev.to_dict() == c_ev.to_dict():
        return "the same evidence, item for item: a copy"
    return None


def verify_bracketed(
    before: RunSide,
    after: RunSide,
    control: RunSide,
    *,
    change_note: str = "",
    settings: CompareSettings | None = None,
) -> VerifyResult:
    """`verify(before, after)`, bracketed by `control` (a second run of BEFORE's configuration).

    The claims against CONTROL are BEFORE's (the techniques the BEFORE/AFTER diff adopted), and its
    side effects leave out the same claimed keys, so the two comparisons judge the same things.
    """
    settings = settings or CompareSettings()
    same = same_run(before, control)
    if same is not None:
        raise UsageError(
            f"--control {control.label} is BEFORE itself ({same}), so there would be no A/A check: pass a second "
            "run of BEFORE's configuration, on a fresh server"
        )
    differs = [c for c in config_diff(before.evidence, control.evidence) if c.set_differently]
    if differs:
        shown = ", ".join(f"{c.key} {c.before or '-'} vs {c.after or '-'}" for c in differs)
        raise UsageError(
            f"--control {control.label} is not a run of BEFORE's configuration ({shown}): pass a run of the "
            "same server settings as BEFORE, on a fresh server"
        )
    result = verify(before, after, change_note=change_note, settings=settings)
    notes = [*result.notes, aa_drift(before, control, settings)]
    if (host := host_load_change(control.evidence, after.evidence)) is not None:
        notes.append(f"CONTROL against AFTER: the host changed under the server: {host}")
    result = replace(result, control_label=control.label, notes=tuple(notes))
    if not result.comparability.comparable:
        return result
    workload = compare_workloads(control, after, settings.tolerances)
    if not workload.comparable:
        reasons = tuple(f"CONTROL against AFTER: {r}" for r in workload.reasons)
        return replace(
            result,
            comparability=Comparability(False, result.comparability.checks, (*result.comparability.reasons, *reasons)),
            claims=(),
            side_effects=(),
        )
    judged = {
        (c.technique, c.claim.key): c
        for t in result.adopted
        for c in judge_technique(t.technique, control.evidence, after.evidence, settings)
    }
    claims = tuple(bracket_claim(c, judged.get((c.technique, c.claim.key))) for c in result.claims)
    against_control = side_effects(control, after, claimed_keys(result.claims), settings, result.config)
    return replace(result, claims=claims, side_effects=bracket_side_effects(result.side_effects, against_control))
