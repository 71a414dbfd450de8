"""Latency evidence from the engine's histograms over the window.

It produces ITL p50/p99, TTFT p50/p99, end-to-end p50, queue-time p50, the engine-side prefill
and running times (vLLM's request_prefill_time / request_inference_time: scheduling to first and
to last token, so queueing is left out of both), and the share of request time spent decoding.

Why: these are the symptoms a diagnosis explains. Each quantile comes from the bucket
increases over the window (never lifetime totals), with a note on how the bucket bounds
limit it. The decode-time share says whether finished requests spent their time generating
or before their first token.
"""

from __future__ import annotations

from llm_diagnose.probes.metrics.passive.context import (
    NO_TRAFFIC_HINT,
    PassiveContext,
    quantile_result,
    reset_warning,
    too_few,
)
from llm_diagnose.probes.quantities import (
    DECODE_TIME_SHARE,
    E2E_P50,
    INFERENCE_TIME_P50,
    ITL_P50,
    ITL_P99,
    PREFILL_TIME_P50,
    QUEUE_TIME_P50,
    TTFT_P50,
    TTFT_P99,
)
from llm_diagnose.probes.results import Measurement, NotMeasured, Result

__all__ = ["latency"]


def latency(ctx: PassiveContext) -> dict[str, Result]:
    """ITL, TTFT, end-to-end and queue-time quantiles over the window, and the decode-time share."""
    no_requests = "no requests finished in the window; run longer or with --active"
    out: dict[str, Result] = {
        ITL_P50: quantile_result(ctx, "itl", 0.50, "s", "no output tokens were generated in the window"),
        ITL_P99: quantile_result(ctx, "itl", 0.99, "s", "no output tokens were generated in the window"),
        TTFT_P50: quantile_result(ctx, "ttft", 0.50, "s", "no request got its first token in the window"),
        TTFT_P99: quantile_result(ctx, "ttft", 0.99, "s", "no request got its first token in the window"),
        E2E_P50: quantile_result(ctx, "e2e", 0.50, "s", no_requests),
        QUEUE_TIME_P50: quantile_result(ctx, "queue_time", 0.50, "s", no_requests),
        PREFILL_TIME_P50: quantile_result(ctx, "prefill_time", 0.50, "s", no_requests),
        INFERENCE_TIME_P50: quantile_result(ctx, "inference_time", 0.50, "s", no_requests),
    }
    out[DECODE_TIME_SHARE] = _decode_share(ctx, no_requests)
    return out


def _decode_share(ctx: PassiveContext, no_requests: str) -> Result:
    e2e = ctx.histogram("e2e")
    if e2e is None:
        return ctx.missing("e2e")
    decode = ctx.histogram("decode_time")
    ttft = ctx.histogram("ttft") if decode is None else None
    part = decode if decode is not None else ttft
    what = f"{part.selector if part is not None else '?'} / {e2e.selector}"
    prov = ctx.prov("prometheus-histogram-window", what)
    if not e2e.intervals:
        return too_few(ctx, e2e.selector)
    if e2e.count <= 0 or e2e.sum <= 0:
        return NotMeasured(no_requests, NO_TRAFFIC_HINT, prov)
    if decode is not None:
        share, note = decode.sum / e2e.sum, "sum of decode times / sum of end-to-end latencies of the finished requests"
    elif ttft is not None:
        share = 1.0 - ttft.sum / e2e.sum
        note = "1 - (sum of TTFT / sum of end-to-end latency): queueing counts as non-decode time"
    else:
        return ctx.missing("decode_time")
    return Measurement(
        min(1.0, max(0.0, share)), "fraction", prov, warnings=ctx.warnings(reset_warning(e2e)), note=note
    )
