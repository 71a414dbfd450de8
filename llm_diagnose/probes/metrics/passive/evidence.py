"""Passive evidence: what a window of /metrics scrapes says, keyed by llm_diagnose.probes.quantities.

Nothing here sends a request: it reads the engine's own counters, gauges and histograms
over the window. Every key in `PASSIVE_KEYS` comes back, either measured or as an explicit
NotMeasured saying why (no such metric in this engine or version, no traffic in the window,
too few scrapes) and how to get it.

Statistics are over the window, never lifetime: counters as increases (resets handled),
histograms as bucket increases, gauges as the per-scrape readings (sampled at the scrape
interval, so bursts shorter than that can be missed).

This module only orchestrates: it builds the `PassiveContext`, runs one producer per evidence
family and merges their keys with discovery's facts. Each producer reads the context and
returns its keys:
- window_facts: the window (length, completeness, bad samples) and the engine's identity;
- config: configuration facts (block size, prefix caching, KV capacity and sizes,
  speculative decoding and KV offload configured or not);
- kv_batch: load level (KV usage, running/waiting, concurrency, batch cap, the fullest
  engine step, preemptions);
- prefix: the prefix-cache hit rate and the tokens looked up;
- latency: ITL/TTFT/end-to-end/queue-time/prefill-time/running-time quantiles and the
  decode-time share;
- spec: speculative-decoding acceptance rate and length;
- interference: prompt-token rate vs inter-token latency, rank-correlated;
- workload: token and request rates, output and input lengths;
- context: what they all share (the context, warnings, histogram quantiles).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llm_diagnose.probes.metrics.engines import ENGINE_METRICS, detect_engine
from llm_diagnose.probes.metrics.passive.config import config_facts
from llm_diagnose.probes.metrics.passive.context import PassiveContext
from llm_diagnose.probes.metrics.passive.interference import interference
from llm_diagnose.probes.metrics.passive.kv_batch import kv_and_batch
from llm_diagnose.probes.metrics.passive.latency import latency
from llm_diagnose.probes.metrics.passive.prefix import prefix_cache
from llm_diagnose.probes.metrics.passive.spec import speculative
from llm_diagnose.probes.metrics.passive.window_facts import bad_samples, identity, window_facts
from llm_diagnose.probes.metrics.passive.workload import request_lengths, throughput
from llm_diagnose.probes.metrics.window import Window
from llm_diagnose.probes.quantities import (
    BAD_SAMPLES,
    BLOCK_SIZE,
    CONCURRENCY_MEAN,
    CONTINUOUS_BATCHING,
    DECODE_TIME_SHARE,
    E2E_P50,
    ENGINE_NAME,
    GEN_TOKENS_PER_S,
    GPU_MEMORY_UTILIZATION,
    INFERENCE_TIME_P50,
    INPUT_LEN_P50,
    ITL_P50,
    ITL_P99,
    KV_CACHE_BYTES,
    KV_CACHE_DTYPE,
    KV_CAPACITY_TOKENS,
    KV_OFFLOAD,
    KV_USAGE_MEAN,
    KV_USAGE_P95,
    LIVE_WINDOW_COMPLETE,
    LIVE_WINDOW_S,
    OUTPUT_LEN_CV,
    OUTPUT_LEN_P50,
    OUTPUT_LEN_P99,
    PAGED_KV,
    PREEMPTION_RATE,
    PREEMPTIONS,
    PREFILL_TIME_P50,
    PREFIX_CACHING,
    PREFIX_HIT_RATE,
    PREFIX_QUERIED_TOKENS,
    PROMPT_ITL_CORRELATION,
    PROMPT_TOKENS_PER_S,
    QUEUE_TIME_P50,
    REQUESTS_PER_S,
    RUNNING_CAP_ESTIMATE,
    RUNNING_MAX,
    RUNNING_MEAN,
    SPEC_ACCEPTANCE_LENGTH,
    SPEC_ACCEPTANCE_RATE,
    SPEC_DECODE,
    STEP_TOKENS_MAX,
    TTFT_P50,
    TTFT_P99,
    WAITING_MEAN,
    WEIGHTS_BYTES,
)
from llm_diagnose.probes.results import Fact, NotMeasured, Result

if TYPE_CHECKING:  # discovery imports this package: a runtime import would be circular
    from llm_diagnose.probes.discovery import Discovered

__all__ = ["passive_evidence", "PASSIVE_KEYS"]

PASSIVE_KEYS = (
    ENGINE_NAME,
    LIVE_WINDOW_S,
    LIVE_WINDOW_COMPLETE,
    BAD_SAMPLES,
    CONTINUOUS_BATCHING,
    PAGED_KV,
    PREFIX_CACHING,
    BLOCK_SIZE,
    KV_CACHE_DTYPE,
    GPU_MEMORY_UTILIZATION,
    KV_OFFLOAD,
    SPEC_DECODE,
    KV_CAPACITY_TOKENS,
    KV_CACHE_BYTES,
    WEIGHTS_BYTES,
    KV_USAGE_P95,
    KV_USAGE_MEAN,
    PREEMPTIONS,
    PREEMPTION_RATE,
    WAITING_MEAN,
    RUNNING_MEAN,
    RUNNING_MAX,
    RUNNING_CAP_ESTIMATE,
    STEP_TOKENS_MAX,
    CONCURRENCY_MEAN,
    QUEUE_TIME_P50,
    PREFIX_HIT_RATE,
    PREFIX_QUERIED_TOKENS,
    ITL_P50,
    ITL_P99,
    TTFT_P50,
    TTFT_P99,
    E2E_P50,
    PREFILL_TIME_P50,
    INFERENCE_TIME_P50,
    DECODE_TIME_SHARE,
    SPEC_ACCEPTANCE_RATE,
    SPEC_ACCEPTANCE_LENGTH,
    PROMPT_ITL_CORRELATION,
    GEN_TOKENS_PER_S,
    PROMPT_TOKENS_PER_S,
    REQUESTS_PER_S,
    OUTPUT_LEN_P50,
    OUTPUT_LEN_P99,
    OUTPUT_LEN_CV,
    INPUT_LEN_P50,
)


def passive_evidence(window: Window, discovered: Discovered | None = None) -> dict[str, Result]:
    """Evidence from a scrape window; `discovered` (from llm_diagnose.probes.discovery.discover) adds its facts.

    Measured values override discovery's NotMeasured entries; discovery's facts stay where
    the metrics say nothing.
    """
    facts: Mapping[str, Result] = getattr(discovered, "facts", {}) or {}
    first = window.first_scrape()
    engine = getattr(discovered, "engine", None) or (detect_engine(first).engine if first is not None else None)
    ctx = PassiveContext(
        window, engine, getattr(discovered, "version_tuple", None), ENGINE_METRICS.get(engine or "", {})
    )
    out: dict[str, Result] = dict(facts)

    if first is None:
        hole = NotMeasured(
            f"no successful scrape in the window ({window.describe()})",
            "check the metrics URL and that the server is up",
            ctx.prov("prometheus", ""),
        )
        for key in PASSIVE_KEYS:
            if key not in out or isinstance(out[key], NotMeasured):
                out[key] = hole
        out[LIVE_WINDOW_COMPLETE] = Fact(False, ctx.prov("scrape-loop", ""), note=window.describe())
        return out

    produced: dict[str, Result] = {}
    for producer in (
        window_facts,
        identity,
        config_facts,
        kv_and_batch,
        prefix_cache,
        latency,
        speculative,
        interference,
        throughput,
        request_lengths,
    ):
        produced.update(producer(ctx))
    for key, result in produced.items():
        if key not in out or isinstance(out[key], NotMeasured) or not isinstance(result, NotMeasured):
            out[key] = result
    out[BAD_SAMPLES] = bad_samples(ctx)  # after the producers: they find the negative gauge readings
    return out
