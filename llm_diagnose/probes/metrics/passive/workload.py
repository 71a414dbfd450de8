"""What traffic the window carried: how much work, and of what shape.

It produces generated and prompt tokens per second, finished requests per second, and the
output-length p50/p99/CV and input-length p50 from the per-request length histograms.

Why: the same latency means different things under different loads. The rates say how much
work the server did, the lengths what kind (long outputs weigh on decode, long prompts on
prefill, a high CV says lengths vary widely). Rates keep their per-interval samples; lengths
are estimated from histogram buckets and say so.
"""

from __future__ import annotations

import math

from llm_diagnose.probes.metrics.histogram import bucket_mean_stdev
from llm_diagnose.probes.metrics.passive.context import (
    NO_TRAFFIC_HINT,
    PassiveContext,
    quantile_result,
    reset_warning,
    too_few,
)
from llm_diagnose.probes.quantities import (
    GEN_TOKENS_PER_S,
    INPUT_LEN_P50,
    OUTPUT_LEN_CV,
    OUTPUT_LEN_P50,
    OUTPUT_LEN_P99,
    PROMPT_TOKENS_PER_S,
    REQUESTS_PER_S,
)
from llm_diagnose.probes.results import Measurement, NotMeasured, Result

__all__ = ["request_lengths", "throughput"]


def throughput(ctx: PassiveContext) -> dict[str, Result]:
    """Generated tokens, prompt tokens and finished requests per second over the window."""
    out: dict[str, Result] = {}
    for concept, key in (
        ("generation_tokens", GEN_TOKENS_PER_S),
        ("prompt_tokens", PROMPT_TOKENS_PER_S),
        ("requests_finished", REQUESTS_PER_S),
    ):
        inc = ctx.counter(concept)
        if inc is None:
            out[key] = ctx.missing(concept)
        elif not inc.intervals:
            out[key] = too_few(ctx, inc.selector)
        else:
            out[key] = Measurement(
                inc.rate,
                "1/s",
                ctx.prov("prometheus-counter-delta", inc.selector),
                samples=tuple(i.rate for i in inc.intervals),
                warnings=ctx.warnings(reset_warning(inc)),
                note=f"{inc.total:.0f} over {inc.duration_s:.1f} s; samples: rate per scrape interval",
            )
    return out


def request_lengths(ctx: PassiveContext) -> dict[str, Result]:
    """Output-length p50/p99/CV and input-length p50 from the per-request length histograms."""
    no_requests = "no requests finished in the window; run longer or with --active"
    out: dict[str, Result] = {
        OUTPUT_LEN_P50: quantile_result(ctx, "output_length", 0.50, "tokens", no_requests),
        OUTPUT_LEN_P99: quantile_result(ctx, "output_length", 0.99, "tokens", no_requests),
        INPUT_LEN_P50: quantile_result(ctx, "input_length", 0.50, "tokens", no_requests),
    }
    for key in (OUTPUT_LEN_P50, OUTPUT_LEN_P99, INPUT_LEN_P50):
        r = out[key]
        if isinstance(r, Measurement):
            out[key] = Measurement(
                r.value,
                r.unit,
                r.provenance,
                summary=r.summary,
                warnings=r.warnings,
                note=r.note + "; estimated from the per-request length histogram's buckets",
            )
    out[OUTPUT_LEN_CV] = _length_cv(ctx, no_requests)
    return out


def _length_cv(ctx: PassiveContext, no_requests: str) -> Result:
    inc = ctx.histogram("output_length")
    if inc is None:
        return ctx.missing("output_length")
    prov = ctx.prov("prometheus-histogram-window", inc.selector)
    if not inc.intervals:
        return too_few(ctx, inc.selector)
    if inc.count <= 0:
        return NotMeasured(no_requests, NO_TRAFFIC_HINT, prov)
    mean = inc.sum / inc.count
    if mean <= 0:
        return NotMeasured("the finished requests produced no output tokens", NO_TRAFFIC_HINT, prov)
    nonempty = [
        (lo, hi)
        for (lo, _), (hi, c1), c0 in zip(
            [(0.0, 0.0)] + list(inc.buckets[:-1]), inc.buckets, [0.0] + [c for _, c in inc.buckets[:-1]]
        )
        if c1 - c0 > 0
    ]
    if len(nonempty) == 1 and math.isfinite(nonempty[0][1]):
        lo, hi = nonempty[0]
        bound = math.sqrt(max(0.0, (mean - lo) * (hi - mean))) / mean
        return Measurement(
            0.0,
            "ratio",
            prov,
            warnings=ctx.warnings("every output length fell in one histogram bucket: the spread inside it is unknown"),
            note=f"estimated from histogram buckets: all {inc.count:.0f} lengths in ({lo:g}, {hi:g}] with mean "
            f"{mean:.1f}; the CV is between 0 and {bound:.2f}",
        )
    est = bucket_mean_stdev(inc.buckets, inc.sum)
    assert est is not None
    _, sd = est
    return Measurement(
        sd / mean,
        "ratio",
        prov,
        warnings=ctx.warnings(reset_warning(inc)),
        note=f"estimated from histogram buckets (bucket midpoints around the exact mean {mean:.1f} "
        f"over {inc.count:.0f} requests); coarse buckets make it approximate",
    )
