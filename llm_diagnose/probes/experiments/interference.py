"""Prefill/decode interference (Q6): steady decode streams, then long prompts injected at known times.

Timeline: `streams` decode streams start and run alone for `baseline_s` (their gaps after a
short warm-up are the baseline); then one long prompt (one output token) at a time, every
`inject_every_s` or as soon as the previous one has its token, alternating between the plan's
prompt lengths, for `injection_s`, and past it until `min_prefills` have their token while the
time cap allows. A prefill window runs from an injection's send to its first
token. A steady-stream gap that overlaps a prefill window is a gap "during prefill".

- inflation = mean gap during prefills / mean baseline gap, with a bootstrap interval that
  resamples both sets (interference.itl_inflation, the tree's Q6 figure). The mean, not the
  median: a prefill typically stalls one step of each stream among several normal ones, and
  the streams' slowdown (tokens delivered per second while a prompt is being prefilled) is
  what the mean gap measures; a median would hide the stall it is looking for;
- stall = the longest gap inside a window minus the mean baseline gap, per injection; its
  growth from the shorter to the longer prompt says whether the engine bounds it: an
  unchunked prefill stalls decode for the whole prompt (stall doubles with the prompt), a
  chunked one for one chunk (stall stays flat once the prompt exceeds the chunk).

Injection times go to events.jsonl as they happen (`prefill-injected`, then `prefill-done`, or
`prefill-stopped` for one still running when the phase ended).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.common import (
    ExperimentContext,
    ExperimentOutcome,
    burst_warning,
    fault_summary,
    not_measured,
    ratio_with_bootstrap_ci,
)
from llm_diagnose.probes.experiments.plan import InterferencePlan
from llm_diagnose.probes.load.faults import FaultKind
from llm_diagnose.probes.load.records import RequestRecord, RequestSpec
from llm_diagnose.probes.results import Measurement, Result

__all__ = ["run_interference", "analyse_interference", "KEYS", "WARMUP_S", "BOUNDED_GROWTH"]

KEYS = (
    Q.ITL_INFLATION,
    Q.INTERFERENCE_BASELINE_ITL_P50,
    Q.INTERFERENCE_DURING_ITL_P50,
    Q.INTERFERENCE_STALL_MAX,
    Q.INTERFERENCE_STALL_GROWTH,
)
WARMUP_S = 0.3  # the streams' own prefills and the first steps are not the baseline
MIN_BASELINE_GAPS = 10
MIN_DURING_GAPS = 3
# Stall growth when the prompt doubles: ~2 grows with the prompt (unchunked), ~1 bounded.
BOUNDED_GROWTH = 1.4


async def run_interference(ctx: ExperimentContext, plan: InterferencePlan, deadline: float) -> ExperimentOutcome:
    driver = ctx.driver
    t_start = time.perf_counter()
    phase_over = asyncio.Event()

    async def steady_stream(slot: int) -> None:
        for k in range(1 + plan.stream_restarts):
            if phase_over.is_set() or time.perf_counter() >= deadline:
                return
            spec = RequestSpec(
                f"interference-steady-{slot}-{k}",
                ctx.prompts.body(plan.stream_prompt_tokens, ctx.rng, ctx.endpoint),
                plan.stream_output_tokens,
                ctx.endpoint,
                "interference",
                "steady",
                planned_prompt_tokens=plan.stream_prompt_tokens,
            )
            if await driver.send(spec) is None:
                return

    async def inject(k: int) -> float | None:
        """Send injection k; its prefill time (send to first token) if it completed cleanly."""
        n_tokens = plan.prompt_tokens[k % len(plan.prompt_tokens)]
        spec = RequestSpec(
            driver.attempt_id(f"interference-inject-{k}"),  # the id the events must carry
            ctx.prompts.body(n_tokens, ctx.rng, ctx.endpoint),
            1,
            ctx.endpoint,
            "interference",
            "inject",
            tag=str(n_tokens),
            planned_prompt_tokens=n_tokens,
        )
        sent: list[float] = []

        def injected(t_send: float) -> None:  # written when the request leaves, not when it was due
            sent.append(t_send)
            ctx.events.event(
                "prefill-injected",
                experiment="interference",
                request_id=spec.request_id,
                prompt_tokens=n_tokens,
                t_send=round(t_send, 7),
            )

        try:
            record = await driver.send(spec, on_sent=injected)
        except asyncio.CancelledError:
            # Still prefilling when the phase ended: on file as such (its record says stopped-by-client).
            # One cancelled while it waited for the budget was never sent, and has no event.
            if sent:
                ctx.events.event("prefill-stopped", experiment="interference", request_id=spec.request_id)
            raise
        if record is None:
            return None
        ctx.events.event(
            "prefill-done",
            experiment="interference",
            request_id=spec.request_id,
            t_send=round(record.t_send, 7),
            t_first_token=None if record.ttft_s is None else round(record.t_send + record.ttft_s, 7),
            fault=None if record.fault is None else record.fault.value,
        )
        return record.ttft_s if record.fault is None else None

    completed: list[float] = []  # each clean prefill's time, send to first token

    async def injector(first: float, end: float) -> None:
        # One prompt at a time, the next no sooner than `inject_every_s` after the previous was
        # due: each prefill window then holds exactly one prefill, so the stall per prompt length
        # is that prompt's own, and a slow engine gets fewer injections rather than a pile-up.
        # Past `end`, a slow engine still gets up to `min_prefills` completed ones, as long as
        # the longest prefill seen so far would finish before the deadline.
        for k in range(plan.injections):
            due = max(first + k * plan.inject_every_s, time.perf_counter())
            if due >= end and (len(completed) >= plan.min_prefills or due + max(completed, default=0.0) >= deadline):
                return
            await asyncio.sleep(due - time.perf_counter())
            if (prefill_s := await inject(k)) is not None:
                completed.append(prefill_s)

    ctx.events.event("interference-baseline", experiment="interference", streams=plan.streams)
    for i in range(plan.streams):
        driver.start_coroutine(steady_stream(i))  # tracked by the driver; stop_all ends them
    await asyncio.sleep(max(0.0, t_start + plan.baseline_s - time.perf_counter()))
    # The injections are timed from when this task actually woke up, not from when it should
    # have: on a busy 2-core host the wake-up was once seconds late, and a schedule fixed in
    # advance then fired every prompt at once, after the phase it belonged to was over.
    baseline_end = time.perf_counter()
    end = min(baseline_end + plan.injection_s, deadline)
    ctx.events.event(
        "interference-injections",
        experiment="interference",
        every_s=plan.inject_every_s,
        late_s=round(baseline_end - t_start - plan.baseline_s, 3),
    )
    task = driver.start_coroutine(injector(baseline_end, end))
    await asyncio.wait([task], timeout=max(0.0, deadline - time.perf_counter()))  # the last prefill may finish
    phase_over.set()
    await driver.stop_all("interference: phase over")
    return analyse_interference(
        ctx,
        plan,
        driver.records_of("interference", "steady"),
        driver.records_of("interference", "inject"),
        t_start,
        baseline_end,
    )


def analyse_interference(
    ctx: ExperimentContext,
    plan: InterferencePlan,
    steady: list[RequestRecord],
    injected: list[RequestRecord],
    t_start: float,
    baseline_end: float,
) -> ExperimentOutcome:
    windows = [
        (r.t_send, r.t_send + r.ttft_s, int(r.tag or 0)) for r in injected if r.ttft_s is not None and r.fault is None
    ]
    baseline: list[float] = []
    during: list[float] = []
    stall = [0.0] * len(windows)
    for r in steady:
        if r.fault is not None and r.fault is not FaultKind.STOPPED_BY_CLIENT:
            continue
        times = r.absolute_event_times()
        for a, b in zip(times, times[1:]):
            if b < t_start + WARMUP_S:
                continue
            if b <= baseline_end:
                baseline.append(b - a)
                continue
            hit = False
            for i, (w0, w1, _) in enumerate(windows):
                if a < w1 and b > w0:
                    hit = True
                    stall[i] = max(stall[i], b - a)
            if hit:
                during.append(b - a)
    faults = fault_summary(steady + injected)
    warnings = tuple(w for w in (faults, burst_warning(baseline)) if w)
    if len(baseline) < MIN_BASELINE_GAPS or len(during) < MIN_DURING_GAPS or not windows:
        why = (
            f"{len(baseline)} baseline gaps (need {MIN_BASELINE_GAPS}), {len(during)} gaps during "
            f"{len(windows)} completed prefills (need {MIN_DURING_GAPS})"
        ) + (f"; {faults}" if faults else "")
        return ExperimentOutcome(
            not_measured(KEYS, f"interference not measured: {why}", "give the experiment more time (--budget-seconds)")
        )
    base_mean = statistics.fmean(baseline)
    if base_mean <= 0:
        return ExperimentOutcome(not_measured(KEYS, "the baseline gaps are all zero (all tokens came in one burst)"))
    window_s = max(w1 for _, w1, _ in windows) - t_start
    prov = ctx.provenance("interference", window_s)
    value, summary = ratio_with_bootstrap_ci(during, baseline, seed=len(during), statistic=statistics.fmean)
    stalls: dict[int, list[float]] = {}
    for (_, _, n_tokens), s in zip(windows, stall):
        stalls.setdefault(n_tokens, []).append(max(0.0, s - base_mean))
    by_length = {n: statistics.median(v) for n, v in sorted(stalls.items())}
    lengths = ", ".join(f"{n} tokens: {s * 1e3:.1f} ms" for n, s in by_length.items())
    context = (
        f"{plan.streams} steady streams; {len(windows)} prefills injected; baseline {len(baseline)} gaps, "
        f"during prefills {len(during)} gaps"
    )
    results: dict[str, Result] = {
        Q.ITL_INFLATION: Measurement(
            value,
            "ratio",
            prov,
            samples=tuple(d / base_mean for d in during),
            summary=summary,
            warnings=warnings,
            note=f"mean gap during prefills {statistics.fmean(during) * 1e3:.1f} ms / mean baseline gap "
            f"{base_mean * 1e3:.1f} ms (how much the streams slow while a prompt is prefilled); interval: "
            f"bootstrap of both means ({summary.ci_level:.0%}); {context}",
        ),
        Q.INTERFERENCE_BASELINE_ITL_P50: Measurement(
            statistics.median(baseline), "s", prov, samples=tuple(baseline), warnings=warnings, note=context
        ),
        Q.INTERFERENCE_DURING_ITL_P50: Measurement(
            statistics.median(during), "s", prov, samples=tuple(during), warnings=warnings, note=context
        ),
        Q.INTERFERENCE_STALL_MAX: Measurement(
            max(max(v) for v in stalls.values()),
            "s",
            prov,
            samples=tuple(s for v in stalls.values() for s in v),
            warnings=warnings,
            note=f"longest gap in a prefill window minus the mean baseline gap; median per prompt length: {lengths}",
        ),
    }
    if len(by_length) >= 2 and min(by_length.values()) > 0:
        short, long_ = min(by_length), max(by_length)
        growth = by_length[long_] / by_length[short]
        verdict = (
            "bounded: the stall did not grow with the prompt, so prefill is chunked (or scheduled apart)"
            if growth < BOUNDED_GROWTH
            else "unbounded: the stall grew with the prompt, so each prefill runs whole inside a decode step"
        )
        results[Q.INTERFERENCE_STALL_GROWTH] = Measurement(
            growth,
            "ratio",
            prov,
            warnings=warnings,
            note=f"median stall at {long_} / at {short} prompt tokens ({lengths}); {verdict}",
        )
    else:
        results.update(
            not_measured(
                (Q.INTERFERENCE_STALL_GROWTH,),
                "needs stalls at two prompt lengths" + ("" if len(by_length) >= 2 else " (only one length completed)"),
            )
        )
    # The verdict rests on the stalls (a prefill's worth of time), not on one baseline gap: a
    # client lag that is a good share of a gap hardly moves a ratio of means over hundreds of them.
    stall_scale = statistics.median(s for v in stalls.values() for s in v)
    return ExperimentOutcome(
        results,
        median_gap_s=statistics.median(baseline) or base_mean,
        verdict_scale_s=stall_scale if stall_scale > 0 else None,
    )
