"""Output-length heterogeneity under concurrency (Q3): do short requests wait for long ones?

Each round starts `peers` requests, then (a moment later, so the peers are admitted first)
one short probe request. A warm-up round of each kind comes first and is not analysed. Control
rounds give the peers the probe's own short length; test rounds give them a long one. Control
and test rounds alternate, so drift hits both alike.

slowdown = median probe latency beside long peers / median beside short peers, at the same
number in flight. Normalising by the control (rather than by the probe alone) removes the
cost of a fuller batch, which continuous and static batching both pay, and keeps what only
static batching adds: a short request held until the longest in its batch is done. A
continuously batching engine gives about 1; a static-batching or one-at-a-time server gives
about long/short.

A probe still running when the experiment's time runs out has waited at least that long:
its elapsed time enters as a lower bound, and the result says so.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.common import (
    ExperimentContext,
    ExperimentOutcome,
    fault_summary,
    not_measured,
    ratio_with_bootstrap_ci,
)
from llm_diagnose.probes.experiments.plan import HeterogeneityPlan
from llm_diagnose.probes.load.faults import FaultKind
from llm_diagnose.probes.load.records import RequestRecord, RequestSpec
from llm_diagnose.probes.results import Measurement, Result

__all__ = ["run_heterogeneity", "analyse_heterogeneity", "KEYS", "PROBE_DELAY_S"]

KEYS = (Q.SHORT_WAIT_FOR_LONG, Q.BATCHING_SHORT_ALONE_E2E)
PROBE_DELAY_S = 0.05  # the probe follows its peers by this much, so it arrives while they occupy the server


async def run_heterogeneity(ctx: ExperimentContext, plan: HeterogeneityPlan, deadline: float) -> ExperimentOutcome:
    driver = ctx.driver

    def spec(name: str, phase: str, tag: str, max_tokens: int) -> RequestSpec:
        return RequestSpec(
            f"heterogeneity-{name}",
            ctx.prompts.body(plan.prompt_tokens, ctx.rng, ctx.endpoint),
            max_tokens,
            ctx.endpoint,
            "heterogeneity",
            phase,
            tag=tag,
            planned_prompt_tokens=plan.prompt_tokens,
        )

    # The rounds completed so far, should a later one overrun the experiment's deadline.
    ctx.salvage = lambda: analyse_heterogeneity(ctx, plan, driver.records_of("heterogeneity"))
    for i in range(plan.alone_rounds):
        if (
            time.perf_counter() >= deadline
            or await driver.send(spec(f"alone-{i}", "alone", "probe", plan.short_tokens)) is None
        ):
            break
    # Each round gets an equal share of the time left, so a slow server still runs both kinds.
    warmup = [(f"warmup-{phase}", i) for i in range(plan.warmup_rounds) for phase in ("short-peers", "long-peers")]
    rounds = warmup + [(phase, i) for i in range(plan.rounds) for phase in ("short-peers", "long-peers")]
    for k, (phase, i) in enumerate(rounds):
        now = time.perf_counter()
        if now >= deadline or driver.guard.exhausted():
            break
        peer_tokens = plan.short_tokens if phase.endswith("short-peers") else plan.long_tokens
        tasks = [driver.start(spec(f"{phase}-{i}-peer-{j}", phase, "peer", peer_tokens)) for j in range(plan.peers)]
        tasks.append(
            driver.start(spec(f"{phase}-{i}-probe", phase, "probe", plan.short_tokens), at=now + PROBE_DELAY_S)
        )
        share = (deadline - now) / (len(rounds) - k)
        _, pending = await asyncio.wait(tasks, timeout=max(PROBE_DELAY_S * 2, share))
        if pending:
            await driver.stop_all(f"heterogeneity: round {phase} {i} ran past its share of the time")
    return analyse_heterogeneity(ctx, plan, driver.records_of("heterogeneity"))


def _probe_latencies(records: list[RequestRecord], phase: str) -> tuple[list[float], int]:
    """Probe latencies of a phase, and how many are lower bounds (probes stopped while waiting)."""
    values, censored = [], 0
    for r in records:
        if r.phase != phase or r.tag != "probe":
            continue
        if r.completed and r.e2e_s is not None:
            values.append(r.e2e_s)
        elif r.fault is FaultKind.STOPPED_BY_CLIENT and r.t_end is not None:
            values.append(r.t_end)
            censored += 1
    return values, censored


def analyse_heterogeneity(
    ctx: ExperimentContext, plan: HeterogeneityPlan, records: list[RequestRecord]
) -> ExperimentOutcome:
    control, control_censored = _probe_latencies(records, "short-peers")
    test, test_censored = _probe_latencies(records, "long-peers")
    alone, _ = _probe_latencies(records, "alone")
    faults = fault_summary(records)
    warnings = [faults] if faults else []
    results: dict[str, Result] = {}
    prov = ctx.provenance(
        "heterogeneity",
        max((r.t_send + (r.t_end or 0) for r in records), default=0.0) - min((r.t_send for r in records), default=0.0),
    )
    if alone:
        results[Q.BATCHING_SHORT_ALONE_E2E] = Measurement(
            statistics.median(alone),
            "s",
            prov,
            samples=tuple(alone),
            warnings=tuple(warnings),
            note=f"a {plan.short_tokens}-token request with nothing else in flight",
        )
    else:
        results.update(not_measured((Q.BATCHING_SHORT_ALONE_E2E,), "no probe completed alone"))
    if not control or not test or control_censored == len(control):
        why = f"{len(control)} probes beside short peers, {len(test)} beside long peers completed"
        results.update(
            not_measured(
                (Q.SHORT_WAIT_FOR_LONG,),
                f"short-request slowdown not measured: {why}" + (f"; {faults}" if faults else ""),
                "see the failed requests in requests.jsonl and the server's log"
                if faults
                else "run it again: its rounds are sized from the speed measured at the start, and the server was "
                "slower than that during them (raise --budget-seconds where the plan said it ran below its "
                "natural size)",
            )
        )
        return ExperimentOutcome(results)
    value, summary = ratio_with_bootstrap_ci(test, control, seed=len(test))
    if test_censored:
        warnings.append(
            f"{test_censored} of {len(test)} probes beside long peers had not finished when their time "
            "ran out: their waits are lower bounds, so the slowdown is at least this"
        )
    if control_censored:
        warnings.append(
            f"{control_censored} probes beside short peers did not finish in time: the control is itself a lower bound"
        )
    results[Q.SHORT_WAIT_FOR_LONG] = Measurement(
        value,
        "ratio",
        prov,
        samples=tuple(t / statistics.median(control) for t in test),
        summary=summary,
        warnings=tuple(warnings),
        note=(
            f"median latency of a {plan.short_tokens}-token request beside {plan.peers} peers of {plan.long_tokens} "
            f"tokens / beside {plan.peers} peers of {plan.short_tokens} tokens (same number in flight); "
            f"about 1: continuous batching; about {plan.long_tokens / plan.short_tokens:.0f}: the short one waits "
            "for the long ones (static batching)"
        ),
    )
    # The shortest interval this verdict rests on is a probe's whole latency beside short peers:
    # the client's lag is judged against it (ClientHealth.starved).
    return ExperimentOutcome(results, verdict_scale_s=statistics.median(control))
