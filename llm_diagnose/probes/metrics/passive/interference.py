"""Prefill-decode interference, seen passively: does ITL rise with the prompt-token rate?

It produces the Spearman rank correlation, across scrape intervals, between the rate of
(computed) prompt tokens and that interval's mean inter-token latency.

Why: when new prompts' prefill shares iterations with decoding, ITL rises with the prompt
rate; a clear positive correlation hints at it without sending a request. It is correlational
and noisy with few intervals (none below MIN_CORRELATION_INTERVALS, a warning below
FEW_CORRELATION_INTERVALS); an active experiment measures the inflation itself.
"""

from __future__ import annotations

from llm_diagnose.probes.metrics.engines import Sel
from llm_diagnose.probes.metrics.passive.context import NO_TRAFFIC_HINT, PassiveContext
from llm_diagnose.probes.quantities import PROMPT_ITL_CORRELATION
from llm_diagnose.probes.results import Measurement, NotMeasured, Result
from llm_diagnose.probes.stats import spearman

__all__ = ["FEW_CORRELATION_INTERVALS", "MIN_CORRELATION_INTERVALS", "interference"]

MIN_CORRELATION_INTERVALS = 6  # fewer intervals than this give a rank correlation of little meaning
FEW_CORRELATION_INTERVALS = 20  # below this, warn that the correlation is noisy


def interference(ctx: PassiveContext) -> dict[str, Result]:
    """Rank correlation of the prompt-token rate with the mean ITL, interval by interval."""
    prompt_c = ctx.resolve("prompt_tokens_computed") or ctx.resolve("prompt_tokens")
    itl_c = ctx.resolve("itl")
    if not isinstance(prompt_c, Sel) or not isinstance(itl_c, Sel):
        return {PROMPT_ITL_CORRELATION: ctx.missing("itl" if itl_c is None else "prompt_tokens")}
    prompts, itl = ctx.window.counter(prompt_c), ctx.window.histogram(itl_c)
    prov = ctx.prov("prometheus-interval-correlation", f"rate({prompt_c.describe()}) vs mean {itl_c.describe()}")
    pairs = [(p.rate, s / c) for p, (_, _, c, s) in zip(prompts.intervals, itl.intervals) if c > 0]
    if len(pairs) < MIN_CORRELATION_INTERVALS:
        return {
            PROMPT_ITL_CORRELATION: NotMeasured(
                f"only {len(pairs)} scrape intervals had decode steps (need {MIN_CORRELATION_INTERVALS})",
                NO_TRAFFIC_HINT,
                prov,
            )
        }
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
    if rho is None:
        return {
            PROMPT_ITL_CORRELATION: NotMeasured(
                "the prompt-token rate (or the mean ITL) did not vary across intervals: nothing to correlate",
                "a mixed workload (new prompts arriving during decoding) shows interference; try --active",
                prov,
            )
        }
    warns = (
        []
        if len(pairs) >= FEW_CORRELATION_INTERVALS
        else [f"only {len(pairs)} intervals: the rank correlation is noisy"]
    )
    computed = "computed prompt tokens (cache hits excluded)" if prompt_c.where else "prompt tokens"
    return {
        PROMPT_ITL_CORRELATION: Measurement(
            rho,
            "ratio",
            prov,
            warnings=ctx.warnings(*warns),
            note=f"Spearman rank correlation over {len(pairs)} scrape intervals of {computed}/s vs that interval's "
            "mean inter-token latency; passive and correlational: an active experiment measures the inflation",
        )
    }
