"""Prefill/decode interference (Q6): steady decode streams, then long prompts injected at known times.

Timeline: `streams` decode streams start and run alone for `baseline_s` (their gaps after a
short warm-up are the baseline); then one long prompt (one output token) at a time, every
`inject_every_s` or as soon as the previous one has its token, alternating between the plan's
prompt lengths, for `injection_s`, and past it until `min_prefills` have their token while the
time cap allows. A prefill window runs from an injection's send to its first
token. A steady-stream gap that overlaps a prefill window is a gap "during prefill".

- inflation = mean gap during prefills / mean baseline gap, with a bootstrap interval that
  resamples the injections (the gaps in one prefill window share its stall: one observation,
  not many) and the baseline gaps (interference.itl_inflation, the tree's Q6 figure). The mean,
  not the median: a prefill typically stalls one step of each stream among several normal ones,
  and the streams' slowdown (tokens delivered per second while a prompt is being prefilled) is
  what the mean gap measures; a median would hide the stall it is looking for;
- stall = the longest gap inside a window minus the mean baseline gap, per injection; its
  growth from the shorter prompt (sized under the engine's step token budget) to the longer
  (sized well over it) says whether the engine bounds it: an unchunked prefill stalls decode for
  the whole prompt (the stall grows with the prompt), a chunked one for one chunk (it stays flat
  once the prompt exceeds the chunk). Where the context or the time allowed no prompt over the
  budget, the growth says so and does not claim to test chunking.

Prompt lengths are the server's own count (usage.prompt_tokens) where it reports one: text
prompts sized without /tokenize are estimates, and the figures say which they used.

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

__all__ = ["run_interference", "analyse_interference", "KEYS", "BOUNDED_GROWTH"]

KEYS = (
    Q.ITL_INFLATION,
    Q.INTERFERENCE_BASELINE_ITL_P50,
    Q.INTERFERENCE_DURING_ITL_P50,
    Q.INTERFERENCE_STALL_MAX,
    Q.INTERFERENCE_STALL_GROWTH,
)
MIN_BASELINE_GAPS = 10
MIN_DURING_GAPS = 3
# Stall growth from the shorter prompt (under the step budget) to the longer (over it): ~1 when
# chunking bounds the stall to one step's worth, about the prompts' length ratio when it does not
# (the plan's 0.9 and 3 step budgets: 1.1 against 3.3; sizing.SHORT_OF_STEP, LONG_OVER_STEP).
BOUNDED_GROWTH = 1.4


async def run_interference(ctx: ExperimentContext, plan: InterferencePlan, deadline: float) -> ExperimentOutcome:
    driver = ctx.driver
    t_start = time.perf_counter()
    phase_over = asyncio.Event()
    slack = max(deadline, ctx.slack_until)  # see the injector: the run's time no later experiment needs

    async def steady_stream(slot: int) -> None:
        for k in range(1 + plan.stream_restarts):
            if phase_over.is_set() or time.perf_counter() >= slack:
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
        # the longest prefill seen so far would finish before the run's slack runs out
        # (`ctx.slack_until`: the phase's own deadline, or later where the budget has time that no
        # later experiment needs). The plan's prefill is a linear estimate from one calibration
        # request; on vLLM CPU 1,020 and 2,040-token prefills beside 4 decoding streams took 1.8 s
        # and 4.6 s against 0.4 s and 0.8 s planned, and the deadline came after two of six.
        for k in range(plan.injections):
            due = max(first + k * plan.inject_every_s, time.perf_counter())
            if due >= end and (len(completed) >= plan.min_prefills or due + max(completed, default=0.0) >= slack):
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

    def analysed() -> ExperimentOutcome:  # the baseline and the injections completed so far
        return analyse_interference(
            ctx,
            plan,
            driver.records_of("interference", "steady"),
            driver.records_of("interference", "inject"),
            t_start,
            baseline_end,
        )

    ctx.salvage = analysed  # the baseline is done: an overrun keeps it and the prefills that completed
    task = driver.start_coroutine(injector(baseline_end, end))
    # The injector ends itself: at its slots' end with its minimum of prefills, or when the next would
    # not finish within the slack; the last prefill may finish meanwhile.
    await asyncio.wait([task], timeout=max(0.0, slack - time.perf_counter()))
    phase_over.set()
    await driver.stop_all("interference: phase over")
    return analysed()


def _lengths(injected: list[RequestRecord]) -> tuple[dict[int, int], bool]:
    """Each planned prompt length -> the length the server counted (median of usage.prompt_tokens), and
    whether every length is the server's count (text prompts without /tokenize are estimates)."""
    counted: dict[int, list[int]] = {}
    for r in injected:
        if r.prompt_tokens:
            counted.setdefault(int(r.tag or 0), []).append(r.prompt_tokens)
    planned = {int(r.tag or 0) for r in injected}
    lengths = {n: int(statistics.median(counted[n])) if n in counted else n for n in planned}
    return lengths, planned <= set(counted)


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
    length_of, counted = _lengths(injected)
    baseline: list[float] = []
    during: list[float] = []
    by_injection: dict[int, list[float]] = {}  # the gaps each prefill window holds: they share its stall
    stall = [0.0] * len(windows)
    for r in steady:
        if r.fault is not None and r.fault is not FaultKind.STOPPED_BY_CLIENT:
            continue
        times = r.absolute_event_times()
        for a, b in zip(times, times[1:]):
            if b < t_start + plan.warmup_s:
                continue
            if b <= baseline_end:
                baseline.append(b - a)
                continue
            hit = [i for i, (w0, w1, _) in enumerate(windows) if a < w1 and b > w0]
            for i in hit:
                stall[i] = max(stall[i], b - a)
            if hit:
                during.append(b - a)
                by_injection.setdefault(hit[0], []).append(b - a)
    faults = fault_summary(steady + injected)
    warnings = tuple(w for w in (faults, burst_warning(baseline)) if w)
    if len(baseline) < MIN_BASELINE_GAPS or len(during) < MIN_DURING_GAPS or not windows:
        why = (
            f"{len(baseline)} baseline gaps (need {MIN_BASELINE_GAPS}), {len(during)} gaps during "
            f"{len(windows)} completed prefills (need {MIN_DURING_GAPS})"
        ) + (f"; {faults}" if faults else "")
        return ExperimentOutcome(
            not_measured(
                KEYS,
                f"interference not measured: {why}",
                "see the failed requests in requests.jsonl and the server's log"
                if faults
                else "give the experiment more time (--budget-seconds): its injections are sized from it",
            )
        )
    base_mean = statistics.fmean(baseline)
    if base_mean <= 0:
        return ExperimentOutcome(not_measured(KEYS, "the baseline gaps are all zero (all tokens came in one burst)"))
    window_s = max(w1 for _, w1, _ in windows) - t_start
    prov = ctx.provenance("interference", window_s)
    groups = list(by_injection.values())
    # Gaps in one prefill window share its stall: the interval resamples injections, not gaps
    # (with a single injection there is nothing to resample between, and it says so).
    value, summary = ratio_with_bootstrap_ci(
        during,
        baseline,
        seed=len(during),
        statistic=statistics.fmean,
        numerator_groups=groups if len(groups) > 1 else None,
    )
    interval_how = (
        f"bootstrap resampling the {len(groups)} injections (their gaps move together) and the baseline gaps"
        if len(groups) > 1
        else "bootstrap of single gaps (one injection only: too narrow, its gaps are not independent)"
    )
    inflation_warnings = warnings if len(groups) > 1 else (*warnings, f"one injection only: {interval_how}")
    stalls: dict[int, list[float]] = {}
    for (_, _, n_tokens), s in zip(windows, stall):
        stalls.setdefault(n_tokens, []).append(max(0.0, s - base_mean))
    by_length = {n: statistics.median(v) for n, v in sorted(stalls.items())}
    lengths = ", ".join(f"{length_of.get(n, n)} tokens: {s * 1e3:.1f} ms" for n, s in by_length.items())
    counted_how = (
        "prompt lengths as the server counted them (usage.prompt_tokens)"
        if counted
        else "prompt lengths as planned (the server reported no usage.prompt_tokens)"
    )
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
            warnings=inflation_warnings,
            note=f"mean gap during prefills {statistics.fmean(during) * 1e3:.1f} ms / mean baseline gap "
            f"{base_mean * 1e3:.1f} ms (how much the streams slow while a prompt is prefilled); interval: "
            f"{interval_how} ({summary.ci_level:.0%}); {context}",
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
            note=f"longest gap in a prefill window minus the mean baseline gap; median per prompt length: {lengths} "
            f"({counted_how})",
        ),
    }
    if len(by_length) >= 2 and min(by_length.values()) > 0:
        growth_note = _stall_growth(plan, by_length, length_of)
        results[Q.INTERFERENCE_STALL_GROWTH] = Measurement(
            growth_note[0], "ratio", prov, warnings=warnings, note=f"{growth_note[1]} ({lengths}; {counted_how})"
        )
    else:
        results.update(
            not_measured(
                (Q.INTERFERENCE_STALL_GROWTH,),
                "needs stalls at two prompt lengths" + ("" if len(by_length) >= 2 else " (only one length completed)"),
                "give the experiment more time (--budget-seconds): it injects both lengths in turn",
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


def _stall_growth(plan: InterferencePlan, by_length: dict[int, float], length_of: dict[int, int]) -> tuple[float, str]:
    """The stall's growth from the shorter prompt to the longer, and what it says about chunking."""
    short, long_ = min(by_length), max(by_length)
    growth = by_length[long_] / by_length[short]
    step = plan.step_tokens
    actual_short, actual_long = length_of.get(short, short), length_of.get(long_, long_)
    if step is not None and actual_short < step < actual_long:
        scope = (
            f"the shorter prompt fits one step of the step budget ({step} tokens, {plan.step_tokens_source}) and the "
            "longer must be chunked"
        )
        verdict = (
            "bounded: the stall did not grow with the prompt, so prefill is chunked (or scheduled apart)"
            if growth < BOUNDED_GROWTH
            else "unbounded: the stall grew with the prompt, so each prefill runs whole inside a decode step"
        )
    else:
        budget = f"the step budget ({step} tokens, {plan.step_tokens_source})" if step else "the step budget (unknown)"
        scope = f"the prompts do not straddle {budget}, so this does not test whether chunking bounds the stall"
        verdict = (
            "the stall did not grow with the prompt"
            if growth < BOUNDED_GROWTH
            else "the stall grew with the prompt: a prefill within one step stalls decode for its whole length"
        )
    return growth, f"median stall at {actual_long} / at {actual_short} prompt tokens; {scope}; {verdict}"
