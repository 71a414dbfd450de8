"""Speculative decoding (Q5): decode speed and acceptance with the engine's spec-decode on.

Requests ask for usage in every chunk (vLLM's `continuous_usage_stats`), so the client knows
how many tokens each streamed event carried: with speculative decoding an engine step emits
the accepted drafts plus one token together, so tokens per event estimates the mean
acceptance length even without the server's counters. With the counters, acceptance rate
and mean acceptance length come from llm_diagnose.probes.metrics' passive evidence over the experiment
(accepted / drafted tokens; 1 + accepted / drafts, bonus token included, as vLLM's own
SpecDecodingProm defines them).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.common import (
    ExperimentContext,
    ExperimentOutcome,
    ServerDelta,
    fault_summary,
    not_measured,
    with_warnings,
)
from llm_diagnose.probes.experiments.plan import SpecPlan
from llm_diagnose.probes.load.records import RequestRecord, RequestSpec
from llm_diagnose.probes.results import Measurement, NotMeasured, Result

__all__ = ["run_spec", "analyse_spec", "KEYS", "MULTI_TOKEN_EVENTS"]

KEYS = (Q.SPEC_TOKENS_PER_S, Q.SPEC_TOKENS_PER_EVENT, Q.SPEC_ACTIVE_ACCEPTANCE_RATE, Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH)
# The engine's acceptance over the experiment's own window, under the experiment's names.
_ACCEPTANCE = (
    (Q.SPEC_ACCEPTANCE_RATE, Q.SPEC_ACTIVE_ACCEPTANCE_RATE),
    (Q.SPEC_ACCEPTANCE_LENGTH, Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH),
)
MULTI_TOKEN_EVENTS = 1.05  # more tokens per event than this: steps emit several tokens (spec decoding)


async def run_spec(ctx: ExperimentContext, plan: SpecPlan, deadline: float) -> ExperimentOutcome:
    driver = ctx.driver
    before = await ctx.scrape()
    specs = [
        RequestSpec(
            f"spec-{i}",
            ctx.prompts.body(plan.prompt_tokens, ctx.rng, ctx.endpoint),
            plan.output_tokens,
            ctx.endpoint,
            "spec",
            "decode",
            continuous_usage=True,
            planned_prompt_tokens=plan.prompt_tokens,
        )
        for i in range(plan.requests)
    ]
    # What completed so far, with the counters up to now unknown: an overrun keeps the finished streams.
    ctx.salvage = lambda: analyse_spec(ctx, plan, driver.records_of("spec"), ServerDelta(before, None))
    for start in range(0, len(specs), plan.concurrency):
        if time.perf_counter() >= deadline:
            break
        tasks = [driver.start(s) for s in specs[start : start + plan.concurrency]]
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        if pending:
            await driver.stop_all("spec: ran past the experiment's time")
    after = await ctx.scrape()
    return analyse_spec(ctx, plan, driver.records_of("spec"), ServerDelta(before, after))


def analyse_spec(
    ctx: ExperimentContext, plan: SpecPlan, records: list[RequestRecord], server: ServerDelta
) -> ExperimentOutcome:
    done = [r for r in records if r.completed and len(r.event_times) >= 2]
    faults = fault_summary(records)
    warnings = (faults,) if faults else ()
    if not done:
        return ExperimentOutcome(
            not_measured(KEYS, "no request completed with two or more token events" + (f": {faults}" if faults else ""))
        )
    prov = ctx.provenance("spec")
    rates = [
        (r.tokens_out - 1) / (r.event_times[-1] - r.event_times[0])
        for r in done
        if r.event_times[-1] > r.event_times[0]
    ]
    events = sum(len(r.event_times) for r in done)
    tokens = sum(r.tokens_out for r in done)
    per_event = tokens / events
    counted = all(len(r.event_tokens) == len(r.event_times) for r in done)
    results: dict[str, Result] = {
        Q.SPEC_TOKENS_PER_S: Measurement(
            statistics.median(rates),
            "1/s",
            prov,
            samples=tuple(rates),
            warnings=warnings,
            note="decode tokens per second of one stream (first to last token)",
        ),
        Q.SPEC_TOKENS_PER_EVENT: Measurement(
            per_event,
            "tokens",
            prov,
            warnings=warnings,
            note=f"{tokens} tokens in {events} streamed events"
            + ("" if counted else "; the server sent no per-chunk usage, so each event counts as one token"),
        ),
    }
    # Acceptance from the engine's counters (llm_diagnose.probes.metrics computes it, for every engine).
    passive = server.passive()
    engine_said = False  # the counters answered, with a figure or with why there is none
    for engine_key, key in _ACCEPTANCE:
        found = passive.get(engine_key)
        if isinstance(found, Measurement):
            results[key] = with_warnings({key: found}, warnings)[key]
        elif found is not None:
            results[key] = found  # the engine says why (not configured, nothing drafted)
        else:
            results[key] = NotMeasured(
                "acceptance needs the engine's counters (no metrics scraper)", "give the server's /metrics URL"
            )
        engine_said = engine_said or found is not None
    if per_event > 1.0 and engine_said and not isinstance(results[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH], Measurement):
        # Seen on vLLM CPU without speculative decoding: its API server, behind on a busy
        # host, merges the deltas of several steps into one streamed event (vLLM's
        # RequestOutputCollector does so whenever the consumer lags).
        results.update(
            with_warnings(
                {Q.SPEC_TOKENS_PER_EVENT: results[Q.SPEC_TOKENS_PER_EVENT]},
                (
                    f"{per_event:.2f} tokens per event although the engine reports no speculative decoding: the server "
                    "merged the outputs of several steps into one event while its front end fell behind",
                ),
            )
        )
    elif not isinstance(results[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH], Measurement):
        if counted and per_event >= MULTI_TOKEN_EVENTS:
            results[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH] = Measurement(
                per_event,
                "tokens",
                prov,
                warnings=warnings,
                note="estimated as tokens per streamed event: each engine step sends its accepted drafts and its "
                "bonus token together (an upper bound: a front end that falls behind also merges steps)",
            )
        elif counted:
            results[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH] = NotMeasured(
                "one token per streamed event"
                + ("" if server.available else " and no engine counters")
                + ": speculative decoding does not appear to be on",
                "start the engine with --speculative-config to test it",
            )
    gaps = [g for r in done for g in r.gaps_s]
    return ExperimentOutcome(results, median_gap_s=statistics.median(gaps) if gaps else None)
