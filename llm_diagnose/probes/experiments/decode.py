"""Decode latency (Q5): per-token latency at batch 1, then under increasing concurrency.

Batch 1 is the server's floor: one stream, nothing to share a step with. Each concurrency
level then starts that many streams together; the growth of the median gap with the batch
says how much a step slows as it fills (flat: memory-bound decode; linear: compute-bound).

With the server's metrics, the batch-1 phase is checked against the engine's own
inter-token histogram: both see the same requests, so their means must agree. When they do
not, the run says which side is suspect: a lagging client event loop points at the client;
a client that kept up points at the path between engine and socket (API server, proxy).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.common import (
    ExperimentContext,
    ExperimentOutcome,
    ServerDelta,
    burst_warning,
    fault_summary,
    gaps_of,
    not_measured,
    ratio_with_bootstrap_ci,
    send_until,
    timed_gaps_of,
)
from llm_diagnose.probes.experiments.plan import DecodePlan
from llm_diagnose.probes.experiments.sizing import STEP_SATURATION_BATCH
from llm_diagnose.probes.load.health import ClientHealth
from llm_diagnose.probes.load.records import RequestRecord, RequestSpec
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result, percentile
from llm_diagnose.probes.warning_codes import WarningCode, coded

__all__ = ["run_decode", "analyse_decode", "KEYS", "AGREEMENT_TOLERANCE", "AGREEMENT_SLACK_S"]

KEYS = (
    Q.DECODE_BATCH1_ITL_P50,
    Q.DECODE_BATCH1_ITL_P99,
    Q.DECODE_ITL_AT_CONCURRENCY,
    Q.DECODE_ITL_GROWTH,
    Q.DECODE_ITL_JUMP,
    Q.DECODE_SERVER_ITL_MEAN,
    Q.DECODE_CLIENT_SERVER_ITL_RATIO,
)
# Client and server means of the same gaps agree when within 25% + 1 ms of each other: the
# server stamps an output when its detokenizer emits it, the client when the socket read
# returns, so a fixed delivery delay (~0.1-1 ms on loopback) and the first/last gap differ.
AGREEMENT_TOLERANCE = 0.25
AGREEMENT_SLACK_S = 0.001
MIN_GAPS = 10
BATCH1_TIME_SHARE = 0.5
# Of the time left after batch 1, kept for the closing batch-1 bracket where the plan does not say
# (a hand-built plan; a sized one keeps the closing requests' planned time, DecodePlan.closing_s).
BATCH1_AFTER_TIME_SHARE = 0.15
# Mean batch-1 gap at the end against the start beyond this factor (either way): the host or
# the engine changed speed during the experiment, so the growth is not the batch's alone.
DRIFT_LIMIT = 1.5


def _spec(ctx: ExperimentContext, plan: DecodePlan, phase: str, i: int) -> RequestSpec:
    return RequestSpec(
        f"decode-{phase}-{i}",
        ctx.prompts.body(plan.prompt_tokens, ctx.rng, ctx.endpoint),
        plan.output_tokens,
        ctx.endpoint,
        "decode",
        phase,
        planned_prompt_tokens=plan.prompt_tokens,
    )


async def run_decode(ctx: ExperimentContext, plan: DecodePlan, deadline: float) -> ExperimentOutcome:
    driver = ctx.driver
    t0 = time.perf_counter()
    # Batch 1 may take at most its share of the time, so the concurrency levels still run on a slow server.
    batch1_until = t0 + (deadline - t0) * (BATCH1_TIME_SHARE if plan.concurrency_levels else 1.0)
    before = await ctx.scrape()
    after = None
    batch1: list[RequestRecord] = []
    levels: dict[int, list[RequestRecord]] = {}
    closing: list[RequestRecord] = []

    def analysed() -> ExperimentOutcome:  # what the phases done so far measured (late-bound: always current)
        return analyse_decode(ctx, batch1, levels, ServerDelta(before, after), closing)

    for i in range(plan.batch1_requests):
        if time.perf_counter() >= batch1_until:
            break
        record = await send_until(
            driver, _spec(ctx, plan, "batch-1", i), batch1_until, "decode: batch 1 ran past its share of the time"
        )
        if record is None:
            break
        batch1.append(record)
    after = await ctx.scrape()
    ctx.salvage = analysed  # batch 1 is done: a later phase that overruns cannot lose it
    # The closing batch-1 requests keep their planned time at the end (sized from the measured
    # speed), so the levels cannot eat it and a slow server still gets its bracket.
    now = time.perf_counter()
    keep = plan.closing_s if plan.closing_s is not None else (deadline - now) * BATCH1_AFTER_TIME_SHARE
    levels_until = max(now, deadline - keep)
    weights = [_level_weight(c) for c in plan.concurrency_levels]
    for k, c in enumerate(plan.concurrency_levels):
        now = time.perf_counter()
        if now >= levels_until or driver.guard.exhausted():
            break
        # Each level's share of the time left is in proportion to its planned step time: the top
        # level's steps are the slowest.
        share = (levels_until - now) * weights[k] / sum(weights[k:])
        tasks = [driver.start(_spec(ctx, plan, f"concurrency-{c}", i)) for i in range(c)]
        _, pending = await asyncio.wait(tasks, timeout=share)
        if pending:  # the gaps measured so far still count (the streams are stopped, not failed)
            await driver.stop_all(f"decode: concurrency {c} ran past its share of the time")
        levels[c] = driver.records_of("decode", f"concurrency-{c}")
    for i in range(plan.batch1_after_requests if levels else 0):
        if time.perf_counter() >= deadline:
            break
        record = await send_until(
            driver, _spec(ctx, plan, "batch-1-after", i), deadline, "decode: the closing batch 1 reached the deadline"
        )
        if record is None:
            break
        closing.append(record)
    return analysed()


def _level_weight(streams: int) -> float:
    """A level's planned step time relative to batch 1's (sizing's time model)."""
    return 1 + (streams - 1) / STEP_SATURATION_BATCH


def analyse_decode(
    ctx: ExperimentContext,
    batch1: list[RequestRecord],
    levels: dict[int, list[RequestRecord]],
    server: ServerDelta,
    closing: list[RequestRecord] | None = None,
) -> ExperimentOutcome:
    """`closing`: the batch-1 requests after the levels; with them the baseline brackets the
    levels and a change of speed during the experiment shows as drift (DRIFT_LIMIT)."""
    gaps = gaps_of(batch1)
    all_records = batch1 + [r for rs in levels.values() for r in rs]
    faults = fault_summary(all_records)
    warnings = tuple(w for w in (faults, burst_warning(gaps)) if w)
    if len(gaps) < MIN_GAPS:
        why = faults or f"only {len(gaps)} inter-token gaps at batch 1 (need {MIN_GAPS})"
        return ExperimentOutcome(
            not_measured(
                KEYS,
                f"decode latency not measured: {why}",
                "give the experiment more time or requests (--budget-seconds / --budget-requests): its batch-1 "
                "phase is sized from them"
                if not faults
                else "see the failed requests in requests.jsonl and the server's log",
            )
        )
    window = max((r.t_send + (r.t_end or 0.0) for r in batch1), default=0.0) - min(r.t_send for r in batch1)
    prov = ctx.provenance("decode", window)
    p50 = statistics.median(gaps)
    sorted_gaps = sorted(gaps)
    note = f"batch 1: {len(batch1)} streams, one at a time; gaps between token events as the client received them"
    results: dict[str, Result] = {
        Q.DECODE_BATCH1_ITL_P50: Measurement(p50, "s", prov, samples=tuple(gaps), warnings=warnings, note=note),
        Q.DECODE_BATCH1_ITL_P99: Measurement(
            percentile(sorted_gaps, 99), "s", prov, samples=tuple(gaps), warnings=warnings, note=note
        ),
    }
    # Growth with concurrency, from mean gaps: a mean is the stream's span over its tokens, so
    # tokens that arrive in bursts (a busy host) do not zero it the way they zero a median. A
    # stream that arrived whole has no span: it is left out (timed_gaps_of), and said.
    timed: dict[int, tuple[list[float], int]] = {1: timed_gaps_of(batch1 + (closing or []))}
    timed.update((c, timed_gaps_of(records)) for c, records in sorted(levels.items()))
    level_gaps = {c: g for c, (g, _) in timed.items() if len(g) >= MIN_GAPS}
    whole = {c: n for c, (_, n) in timed.items() if n}
    growth_warnings = warnings
    left_out = ""
    if whole:
        counts = ", ".join(f"{n} at {c} stream{'s' if c > 1 else ''}" for c, n in sorted(whole.items()))
        left_out = (
            f"streams that arrived whole (every gap under 50 us: nothing in them was timed) are left out of the "
            f"growth: {counts}"
        )
        growth_warnings = (*growth_warnings, left_out)
    # Drift from the timed batch-1 streams alone: a whole stream's zeros would read as a speed-up.
    start, end = timed_gaps_of(batch1)[0], timed_gaps_of(closing or [])[0]
    if end and start and statistics.fmean(end) > 0 and statistics.fmean(start) > 0:
        drift = statistics.fmean(start) / statistics.fmean(end)
        if max(drift, 1 / drift) > DRIFT_LIMIT:
            growth_warnings = (
                *growth_warnings,
                f"batch-1 gaps drifted {drift:.2f}x between the start ({statistics.fmean(start) * 1e3:.2f} ms) and "
                f"the end ({statistics.fmean(end) * 1e3:.2f} ms) of the experiment: the host or the engine "
                "changed speed, so the growth is not the batch's alone",
            )
    if len(level_gaps) > 1 and 1 in level_gaps:
        top = max(level_gaps)
        means = {c: statistics.fmean(g) for c, g in level_gaps.items()}
        curve = ", ".join(f"{c} streams {m * 1e3:.2f} ms" for c, m in sorted(means.items()))
        results[Q.DECODE_ITL_AT_CONCURRENCY] = Measurement(
            statistics.median(level_gaps[top]),
            "s",
            prov,
            samples=tuple(level_gaps[top]),
            warnings=warnings,
            note=f"median gap with {top} concurrent streams; mean gaps: {curve}",
        )
        growth, growth_summary = ratio_with_bootstrap_ci(
            level_gaps[top], level_gaps[1], seed=len(level_gaps[top]), statistic=statistics.fmean
        )
        results[Q.DECODE_ITL_GROWTH] = Measurement(
            growth,
            "ratio",
            prov,
            summary=growth_summary,
            warnings=growth_warnings,
            note=f"mean gap at {top} streams / at 1 ({curve}; batch 1 before and after the levels): near 1 "
            "means decode is memory-bound and batching is free; near the stream count means each step is "
            "compute-bound",
        )
        # Growth over the whole ladder is linear at worst for a compute-bound step, so on a ladder of
        # tens of streams a large growth is batching; a pathology is a rise steeper than the streams
        # between two neighbouring levels (the 10-100x from one stream to two).
        ladder = sorted(means)
        jumps = [((means[b] / means[a]) / (b / a), a, b) for a, b in zip(ladder, ladder[1:]) if means[a] > 0]
        if jumps:
            jump, low, high = max(jumps)
            results[Q.DECODE_ITL_JUMP] = Measurement(
                jump,
                "ratio",
                prov,
                warnings=growth_warnings,
                note=f"mean gap {means[high] * 1e3:.2f} ms at {high} streams against {means[low] * 1e3:.2f} ms at "
                f"{low}: {means[high] / means[low]:.3g}x for {high / low:.3g}x the streams",
            )
    else:
        why = "no concurrency level completed with enough gaps"
        if whole and levels:
            why = f"too few timed gaps at batch 1 or under concurrency ({left_out})"
        results.update(
            not_measured(
                (Q.DECODE_ITL_AT_CONCURRENCY, Q.DECODE_ITL_GROWTH, Q.DECODE_ITL_JUMP),
                why,
                "run it again on a less busy host, or read the engine's own ITL histogram" if whole and levels else "",
            )
        )
    agreement, agree = _server_agreement(ctx, batch1, gaps, server, prov)
    results.update(agreement)
    ratio = agreement.get(Q.DECODE_CLIENT_SERVER_ITL_RATIO)
    judge = None
    if agree is False and isinstance(ratio, Measurement):
        judge = lambda health: _who_is_right(ratio, health, p50)  # noqa: E731
    return ExperimentOutcome(results, median_gap_s=p50, judge=judge)


def _who_is_right(ratio: Measurement, health: ClientHealth, median_gap_s: float) -> dict[str, Result]:
    """Client and server disagree: say which to believe, from how the client fared."""
    lag = health.loop_lag_p99_s
    if health.warnings(median_gap_s):
        verdict: str = coded(
            WarningCode.CLIENT_STARVED,
            f"the client was starved (event-loop lag p99 {lag * 1e3:.1f} ms, {health.client_cpu_cores:.2f} "
            "cores): believe the server's histogram, not the client's gaps",
        )
    else:
        verdict = (
            f"the client kept up (event-loop lag p99 {lag * 1e3:.2f} ms): the delay is between the engine and "
            "the socket (API server, proxy, network), so clients really see these gaps"
        )
    return {Q.DECODE_CLIENT_SERVER_ITL_RATIO: replace(ratio, warnings=(*ratio.warnings, verdict))}


def _server_agreement(
    ctx: ExperimentContext, batch1: list[RequestRecord], gaps: list[float], server: ServerDelta, prov: Provenance
) -> tuple[dict[str, Result], bool | None]:
    """The engine's mean ITL beside the client's, and whether they agree (None: not compared)."""
    keys = (Q.DECODE_SERVER_ITL_MEAN, Q.DECODE_CLIENT_SERVER_ITL_RATIO)
    if not server.available:
        return not_measured(keys, "no server metrics around the batch-1 phase", "give the server's /metrics URL"), None
    itl = server.histogram_mean("itl")
    if itl is None:
        return not_measured(
            keys,
            f"the server's metrics ({server.engine or 'unknown engine'}) have no inter-token "
            "histogram, or it saw no observations",
        ), None
    mean_server, count = itl
    ours = len(gaps)
    generated = server.counter("generation_tokens")
    received = sum(r.tokens_out for r in batch1)
    if generated is not None and generated > 1.5 * received + 10:
        why = (
            f"the server generated {generated:.0f} tokens while the batch-1 phase received {received}: other "
            "traffic shares its histogram, so the means cannot be compared"
        )
        return not_measured(keys, why), None
    mean_client = statistics.fmean(gaps)
    ratio = mean_client / mean_server if mean_server > 0 else None
    server_prov = Provenance(method="prometheus-histogram-delta", source=prov.source, window_s=prov.window_s)
    out: dict[str, Result] = {
        Q.DECODE_SERVER_ITL_MEAN: Measurement(
            mean_server,
            "s",
            server_prov,
            note=f"{count:.0f} observations of the engine's ITL histogram over "
            f"the batch-1 phase (the client measured {ours} gaps)",
        )
    }
    if ratio is None:
        out[Q.DECODE_CLIENT_SERVER_ITL_RATIO] = NotMeasured("the server's mean ITL is zero")
        return out, None
    agree = abs(mean_client - mean_server) <= AGREEMENT_TOLERANCE * mean_server + AGREEMENT_SLACK_S
    warnings = (
        ()
        if agree
        else (
            f"client mean gap {mean_client * 1e3:.2f} ms and the server's mean ITL {mean_server * 1e3:.2f} ms disagree "
            f"(beyond {AGREEMENT_TOLERANCE:.0%} + {AGREEMENT_SLACK_S * 1e3:g} ms): see the client's loop lag to tell a "
            "starved client from a slow delivery path",
        )
    )
    out[Q.DECODE_CLIENT_SERVER_ITL_RATIO] = Measurement(
        ratio,
        "ratio",
        prov,
        warnings=warnings,
        note=f"client mean gap {mean_client * 1e3:.2f} ms / server mean ITL {mean_server * 1e3:.2f} ms "
        f"({'agree' if agree else 'disagree'} within {AGREEMENT_TOLERANCE:.0%} + {AGREEMENT_SLACK_S * 1e3:g} ms)",
    )
    return out, agree
