"""Evidence from a window of the probe's metrics pages (`llmd_torch:` series).

The window is `llm_diagnose.probes.metrics.window.Window`, the same one the engine scrapes use: counters
become increases over the window (resets handled), histograms bucket increases, gauges the
last reading. What the probe's page says, as evidence keys:

- engine and configuration facts (engine.name "transformers" or "pytorch",
  config.continuous_batching, config.paged_kv, config.block_size) from `llmd_torch:probe_info`;
- KV accounting: kv.waste_fraction = 1 - used / allocated token-steps over the window, the
  mean allocated and used tokens per step, and for a paged cache its capacity and usage;
- batches and queue: batch.running_mean / running_max (sequences per forward), queue.waiting_mean;
- forward timings: median step time per phase (from histogram buckets: estimates, with the
  bucket bounds in the note), steps, and the share of the window spent in forwards;
- requests: output/prompt length statistics (bucket estimates) and throughput;
- memory: weights, KV cache, and on CUDA the caching allocator's allocated / reserved bytes
  and fragmentation (on CPU these are NotMeasured, with the reason).
"""

from __future__ import annotations

import math

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.metrics.engines import Sel
from llm_diagnose.probes.metrics.histogram import bucket_mean_stdev, histogram_quantile, summary_from_buckets
from llm_diagnose.probes.metrics.window import HistogramIncrease, Window, label_values
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result, Summary
from llm_diagnose.probes.torch_probe import metrics as M

__all__ = ["evidence_from_window"]

_METHOD = "torch-probe-scrape"
_HINT = "run the server under `llm-diagnose instrument -- ...` and send it traffic during the window"


def evidence_from_window(window: Window) -> dict[str, Result]:
    """Evidence keys from a window of at least two successful scrapes of the probe's side port."""
    last = window.last_scrape()
    if last is None or not last.has(M.PROBE_INFO):
        return {}
    prov = Provenance(method=_METHOD, source=window.source, window_s=window.duration_s)
    fact_prov = Provenance(method="torch-probe-info", source=window.source)
    items: dict[str, Result] = {}

    def measured(
        key: str, value: float | None, unit: str, note: str = "", reason: str = "", summary: Summary | None = None
    ) -> None:
        if value is None or not math.isfinite(value):
            items[key] = NotMeasured(reason or "the probe recorded nothing for it in the window", _HINT, prov)
        else:
            items[key] = Measurement(value, unit, prov, summary=summary, note=note)

    info = (label_values(last, M.PROBE_INFO) or [{}])[0]
    items[Q.ENGINE_NAME] = Fact(info.get("engine", "pytorch"), fact_prov)
    if info.get("engine_version"):
        items[Q.ENGINE_VERSION] = Fact(info["engine_version"], fact_prov)
    if info.get("model"):
        items[Q.ENGINE_MODEL] = Fact(info["model"], fact_prov)
    cb = info.get("continuous_batching")
    if cb in ("true", "false"):
        how = "paged scheduler steps observed" if cb == "true" else "forwards inside plain generate() calls"
        items[Q.CONTINUOUS_BATCHING] = Fact(cb == "true", fact_prov, note=how)
    layout = info.get("kv_layout", "unknown")
    if layout != "unknown":
        items[Q.PAGED_KV] = Fact(layout == "paged", fact_prov, note=f"KV cache layout: {layout}")
    block = window.latest(Sel(M.KV_BLOCK_SIZE))
    if block is not None:
        items[Q.BLOCK_SIZE] = Fact(int(block), fact_prov)

    # --- KV accounting -------------------------------------------------------------------
    steps = window.counter(Sel(M.KV_STEPS)).total
    allocated = window.counter(Sel(M.KV_ALLOCATED_STEPS)).total
    used = window.counter(Sel(M.KV_USED_STEPS)).total
    layers = window.latest(Sel(M.KV_LAYERS)) or 1.0
    if steps > 0 and allocated > 0:
        measured(
            Q.KV_WASTE_FRACTION,
            1.0 - used / allocated,
            "fraction",
            note=f"{layout} KV cache over {steps:.0f} forward steps: 1 - used / allocated token slots",
        )
        measured(Q.KV_ALLOCATED_TOKENS_MEAN, allocated / steps / layers, "tokens", note="mean over forward steps")
        measured(Q.KV_USED_TOKENS_MEAN, used / steps / layers, "tokens", note="mean over forward steps")
    else:
        for key in (Q.KV_WASTE_FRACTION, Q.KV_ALLOCATED_TOKENS_MEAN, Q.KV_USED_TOKENS_MEAN):
            measured(key, None, "", reason="no forward step with a recognised KV cache in the window")
    capacity = window.latest(Sel(M.KV_CAPACITY))
    if capacity:
        items[Q.KV_CAPACITY_TOKENS] = Measurement(capacity, "tokens", prov, note="paged pool")
        if steps > 0:
            measured(
                Q.KV_USAGE_MEAN,
                allocated / steps / layers / capacity,
                "fraction",
                note="blocks held by requests / pool, mean over steps",
            )
        waiting = window.counter(Sel(M.WAITING_STEPS)).total
        if steps > 0:
            measured(Q.WAITING_MEAN, waiting / steps, "count", note="mean over scheduler steps")

    # --- batches and forward timings --------------------------------------------------------
    batches = window.histogram(Sel(M.BATCH_SEQUENCES))
    if batches.count > 0:
        measured(Q.RUNNING_MEAN, batches.sum / batches.count, "count", note="sequences per forward pass, mean")
        measured(
            Q.RUNNING_MAX,
            _highest_edge(batches),
            "count",
            note="largest batch: upper edge of the highest non-empty bucket (exact up to 8)",
        )
    else:
        measured(Q.RUNNING_MEAN, None, "", reason="no forward pass in the window")
    forwards = window.histogram(Sel(M.FORWARD_SECONDS))
    measured(Q.FORWARD_STEPS, forwards.count, "count")
    if window.duration_s > 0 and forwards.count > 0:
        measured(
            Q.FORWARD_BUSY_FRACTION,
            min(1.0, forwards.sum / window.duration_s),
            "fraction",
            note=f"{forwards.sum:.3g} s of forwards in {window.duration_s:.3g} s",
        )
    for key, phase in (
        (Q.FORWARD_DECODE_P50, "decode"),
        (Q.FORWARD_PREFILL_P50, "prefill"),
        (Q.FORWARD_MIXED_P50, "mixed"),
    ):
        h = window.histogram(Sel(M.FORWARD_SECONDS, (("phase", phase),)))
        q = histogram_quantile(0.5, h.buckets) if h.count > 0 else None
        if q is None:
            measured(key, None, "", reason=f"no {phase} step in the window")
            continue
        measured(
            key,
            q.value,
            "s",
            summary=summary_from_buckets(h.buckets, h.sum),
            note=f"{h.count:.0f} {phase} steps; median {q.bound_note}",
        )

    # --- requests ------------------------------------------------------------------------------
    out_len = window.histogram(Sel(M.REQUEST_GENERATION_TOKENS))
    in_len = window.histogram(Sel(M.REQUEST_PROMPT_TOKENS))
    if out_len.count > 0:
        _lengths(items, out_len, Q.OUTPUT_LEN_P50, Q.OUTPUT_LEN_P99, Q.OUTPUT_LEN_CV, prov)
        if window.duration_s > 0:
            measured(Q.GEN_TOKENS_PER_S, out_len.sum / window.duration_s, "1/s", note="tokens of finished requests")
            measured(Q.REQUESTS_PER_S, out_len.count / window.duration_s, "1/s")
    if in_len.count > 0:
        _lengths(items, in_len, Q.INPUT_LEN_P50, None, None, prov)

    # --- memory ------------------------------------------------------------------------------
    for key, name in (
        (Q.WEIGHTS_BYTES, M.WEIGHTS_BYTES),
        (Q.KV_CACHE_BYTES, M.KV_BYTES),
        (Q.DEVICE_TOTAL_BYTES, M.DEVICE_TOTAL),
    ):
        value = window.latest(Sel(name))
        if value is not None:
            items[key] = Measurement(value, "bytes", prov)
    reserved = window.latest(Sel(M.ALLOC_RESERVED))
    alloc = window.latest(Sel(M.ALLOC_ALLOCATED))
    if reserved is None or alloc is None:
        device = info.get("device", "")
        why = (
            f"the model runs on {device or 'an unknown device'}: only the CUDA caching allocator keeps a "
            "reserved pool (on CPU see process_resident_memory_bytes)"
        )
        for key in (Q.ALLOCATOR_ALLOCATED_BYTES, Q.ALLOCATOR_RESERVED_BYTES, Q.ALLOCATOR_FRAGMENTATION):
            items[key] = NotMeasured(why, "run the server on a CUDA device", prov)
    else:
        items[Q.ALLOCATOR_ALLOCATED_BYTES] = Measurement(alloc, "bytes", prov)
        items[Q.ALLOCATOR_RESERVED_BYTES] = Measurement(reserved, "bytes", prov)
        if reserved > 0:
            items[Q.ALLOCATOR_FRAGMENTATION] = Measurement(
                1.0 - alloc / reserved, "fraction", prov, note="reserved but not allocated, last scrape"
            )
    return items


def _highest_edge(h: HistogramIncrease) -> float:
    below = 0.0
    top = 0.0
    for edge, cumulative in h.buckets:
        if cumulative > below:
            top = edge
        below = cumulative
    if math.isinf(top):  # overflow bucket: the largest finite edge is a lower bound
        finite = [e for e, _ in h.buckets if math.isfinite(e)]
        top = finite[-1] if finite else 0.0
    return top


def _lengths(
    items: dict[str, Result],
    h: HistogramIncrease,
    p50_key: str,
    p99_key: str | None,
    cv_key: str | None,
    prov: Provenance,
) -> None:
    note = f"{h.count:.0f} finished requests; estimated from histogram buckets"
    summary = summary_from_buckets(h.buckets, h.sum)
    p50 = histogram_quantile(0.5, h.buckets)
    if p50 is not None:
        items[p50_key] = Measurement(p50.value, "tokens", prov, summary=summary, note=note)
    p99 = histogram_quantile(0.99, h.buckets) if p99_key else None
    if p99_key and p99 is not None:
        items[p99_key] = Measurement(p99.value, "tokens", prov, note=note)
    mean_sd = bucket_mean_stdev(h.buckets, h.sum)
    if cv_key and mean_sd is not None and mean_sd[0] > 0:
        items[cv_key] = Measurement(mean_sd[1] / mean_sd[0], "ratio", prov, note=note + " (midpoints)")
