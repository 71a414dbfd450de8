"""Prefix-cache effect (Q2): a repeated prefix against prompts salted so nothing can be cached.

Phases, one request at a time so each TTFT is a clean prefill:
- fresh: prompts of the same length, each salted at its START with its own nonce, so no
  block of any of them can be in the cache, however warm it is from earlier runs;
- warm-up: one prompt whose prefix starts with a nonce drawn for this run (new to the
  cache, so a warm cache from an earlier run cannot fool the result), which puts it there;
- repeated: that prefix again, each time with a different short suffix.

Hits come from `usage.prompt_tokens_details.cached_tokens` where every response reported it
(vLLM: --enable-prompt-tokens-details): they are this run's own requests, whatever else the
server serves. Otherwise from the engine's counters between scrapes (token granular: vLLM
counts queried and hit prompt tokens), which count other clients' prompts too. A cache hits
in whole blocks (128 tokens on vLLM CPU), so a repeated prompt's hit rate is at most its full blocks / its length.
"""

from __future__ import annotations

import statistics
import time

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.common import ExperimentContext, ExperimentOutcome, ServerDelta, fault_summary
from llm_diagnose.probes.experiments.plan import PrefixPlan
from llm_diagnose.probes.load.prompts import Prompt
from llm_diagnose.probes.load.records import RequestRecord, RequestSpec
from llm_diagnose.probes.results import Measurement, NotMeasured, Result

__all__ = ["run_prefix", "analyse_prefix", "KEYS", "PhaseHits", "hits_from"]

KEYS = (Q.PREFIX_ACTIVE_REPEATED_HIT_RATE, Q.PREFIX_ACTIVE_SALTED_HIT_RATE, Q.PREFIX_ACTIVE_TTFT_SPEEDUP)


class PhaseHits:
    """Prompt tokens queried and hit in one phase, and where the numbers came from."""

    def __init__(self, queried: float | None, hits: float | None, source: str) -> None:
        self.queried, self.hits, self.source = queried, hits, source

    @property
    def rate(self) -> float | None:
        if self.queried is None or self.hits is None or self.queried <= 0:
            return None
        return self.hits / self.queried


def hits_from(records: list[RequestRecord], delta: ServerDelta, shared: bool = False) -> PhaseHits:
    """The cached_tokens the responses reported, where every completed one did: they are this
    run's own requests, whatever else the server serves. Else the server's counters between the
    phase's scrapes, which count every client's prompts (`shared`: others were seen in flight)."""
    reported = [r for r in records if r.completed and r.cached_tokens is not None and r.prompt_tokens]
    if reported and len(reported) == sum(r.completed for r in records):
        return PhaseHits(
            sum(r.prompt_tokens or 0 for r in reported),
            sum(r.cached_tokens or 0 for r in reported),
            "usage.prompt_tokens_details.cached_tokens of the responses",
        )
    passive = delta.passive()
    queried, rate = passive.get(Q.PREFIX_QUERIED_TOKENS), passive.get(Q.PREFIX_HIT_RATE)
    if isinstance(queried, Measurement):
        hits = rate.value * queried.value if isinstance(rate, Measurement) else (0.0 if queried.value == 0 else None)
        if hits is not None:
            whose = ": server-wide, other clients' prompts included" if shared else ""
            return PhaseHits(queried.value, hits, f"{delta.engine} prefix-cache counters between scrapes{whose}")
    return PhaseHits(None, None, "no prefix-cache counters on the server and no cached_tokens in the responses")


async def run_prefix(ctx: ExperimentContext, plan: PrefixPlan, deadline: float) -> ExperimentOutcome:
    driver, p, ep = ctx.driver, ctx.prompts, ctx.endpoint
    body = p.body(plan.prefix_tokens, ctx.rng, ep)
    run_prefix_ = p.join(p.nonce(ep), body)  # new to the cache: salted for this run

    def spec(name: str, phase: str, prompt: Prompt) -> RequestSpec:
        return RequestSpec(
            f"prefix-{name}",
            prompt,
            plan.output_tokens,
            ep,
            "prefix",
            phase,
            planned_prompt_tokens=plan.prefix_tokens + plan.suffix_tokens,
        )

    async def phase(name: str, prompts: list[Prompt]) -> list[RequestRecord]:
        out = []
        for i, prompt in enumerate(prompts):
            if time.perf_counter() >= deadline:
                break
            record = await driver.send(spec(f"{name}-{i}", name, prompt))
            if record is None:
                break
            out.append(record)
        return out

    def suffix() -> Prompt:
        return p.body(plan.suffix_tokens, ctx.rng, ep)

    fresh: list[RequestRecord] = []
    repeated: list[RequestRecord] = []
    s0 = s1 = s2 = s3 = None

    def analysed() -> ExperimentOutcome:  # the phases done so far (late-bound: always current)
        shared = ctx.others_max > 0
        return analyse_prefix(
            ctx,
            plan,
            fresh,
            repeated,
            hits_from(fresh, ServerDelta(s0, s1), shared),
            hits_from(repeated, ServerDelta(s2, s3), shared),
        )

    s0 = await ctx.scrape()
    fresh = await phase("fresh", [p.join(p.nonce(ep), body, suffix()) for _ in range(plan.fresh_requests)])
    s1 = await ctx.scrape()
    ctx.salvage = analysed  # the salted phase is done: an overrun later keeps it
    await phase("warm-up", [p.join(run_prefix_, suffix())])
    s2 = await ctx.scrape()
    repeated = await phase("repeated", [p.join(run_prefix_, suffix()) for _ in range(plan.repeated_requests)])
    s3 = await ctx.scrape()
    return analysed()


def _prompt_length(plan: PrefixPlan, records: list[RequestRecord]) -> str:
    """The prompts' length as the server counted it (usage.prompt_tokens), else as planned, and which."""
    counted = [r.prompt_tokens for r in records if r.prompt_tokens]
    if counted:
        return (
            f"prompts of {int(statistics.median(counted))} tokens as the server counted them, prefix and salt included"
        )
    return f"a {plan.prefix_tokens}-token prefix as planned: the server reported no usage.prompt_tokens"


def analyse_prefix(
    ctx: ExperimentContext,
    plan: PrefixPlan,
    fresh: list[RequestRecord],
    repeated: list[RequestRecord],
    fresh_hits: PhaseHits,
    repeated_hits: PhaseHits,
) -> ExperimentOutcome:
    faults = fault_summary(fresh + repeated)
    warnings: tuple[str, ...] = (faults,) if faults else ()
    if not ctx.prompts.exact_for(ctx.endpoint):
        warnings += (f"prompt lengths are estimates ({ctx.prompts.describe()})",)
    prov = ctx.provenance("prefix")
    results: dict[str, Result] = {}
    for key, hits, what in (
        (Q.PREFIX_ACTIVE_REPEATED_HIT_RATE, repeated_hits, "repeats of a prefix cached by a warm-up request"),
        (Q.PREFIX_ACTIVE_SALTED_HIT_RATE, fresh_hits, "prompts salted at their start"),
    ):
        rate = hits.rate
        if rate is None:
            results[key] = NotMeasured(
                f"prefix-cache hits not measured: {hits.source}",
                "give the server's /metrics, or start vLLM with --enable-prompt-tokens-details",
            )
        else:
            results[key] = Measurement(
                rate,
                "fraction",
                prov,
                warnings=warnings,
                note=f"{hits.hits:.0f} of {hits.queried:.0f} prompt tokens hit, {what}; from {hits.source}",
            )
    ttft_fresh = [r.ttft_s for r in fresh if r.completed and r.ttft_s is not None]
    ttft_repeated = [r.ttft_s for r in repeated if r.completed and r.ttft_s is not None]
    if ttft_fresh and ttft_repeated and statistics.median(ttft_repeated) > 0:
        speedup = statistics.median(ttft_fresh) / statistics.median(ttft_repeated)
        results[Q.PREFIX_ACTIVE_TTFT_SPEEDUP] = Measurement(
            speedup,
            "ratio",
            prov,
            samples=tuple(statistics.median(ttft_fresh) / t for t in ttft_repeated),
            warnings=warnings,
            note=f"median TTFT of salted prompts {statistics.median(ttft_fresh) * 1e3:.1f} ms / of repeated-prefix "
            f"prompts {statistics.median(ttft_repeated) * 1e3:.1f} ms ({_prompt_length(plan, fresh + repeated)})",
        )
    else:
        results[Q.PREFIX_ACTIVE_TTFT_SPEEDUP] = NotMeasured(
            f"TTFT not measured in both phases ({len(ttft_fresh)} salted, {len(ttft_repeated)} repeated completed)"
            + (f"; {faults}" if faults else "")
        )
    return ExperimentOutcome(results)
