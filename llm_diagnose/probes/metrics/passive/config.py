"""Configuration facts the engine states in /metrics.

It produces the block size, prefix caching on or off, the KV cache dtype,
gpu_memory_utilization, the KV capacity in tokens, the KV cache's and the weights' size in
bytes, vLLM's own maximum concurrency, the context length, and whether speculative decoding
(with how many tokens) and KV offload are configured.

Why: a diagnosis needs the limits a load runs into (how many KV tokens, how many requests
fit) and the switches that change what other figures mean (prefix caching off explains a
hit rate that cannot be measured). vLLM states most of them as labels of
`vllm:cache_config_info`, summed over DP engines; SGLang and TensorRT-LLM as gauges. What no
metric carries comes back NotMeasured with where to read it instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from llm_diagnose.probes.metrics.engines import CONCEPTS, Product, Sel
from llm_diagnose.probes.metrics.passive.context import PassiveContext
from llm_diagnose.probes.metrics.window import label_values
from llm_diagnose.probes.quantities import (
    BLOCK_SIZE,
    GPU_MEMORY_UTILIZATION,
    KV_CACHE_BYTES,
    KV_CACHE_DTYPE,
    KV_CAPACITY_TOKENS,
    KV_MAX_CONCURRENCY,
    KV_OFFLOAD,
    MAX_MODEL_LEN,
    NUM_SPECULATIVE_TOKENS,
    PREFIX_CACHING,
    SPEC_DECODE,
    WEIGHTS_BYTES,
)
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Result

__all__ = ["config_facts", "info_label", "info_labels"]

GIB = 1 << 30


def config_facts(ctx: PassiveContext) -> dict[str, Result]:
    """Configuration and capacity facts; the capacity and size keys always come back, measured or not."""
    out: dict[str, Result] = {}
    infos = info_labels(ctx)
    if infos:
        _vllm_cache_config(ctx, infos, out)
    capacity = ctx.resolve("kv_capacity_tokens")  # SGLang / TRT-LLM gauges (vLLM: cache_config_info above)
    if capacity is not None and KV_CAPACITY_TOKENS not in out:
        value = ctx.window.latest(capacity, CONCEPTS["kv_capacity_tokens"].aggregate)
        if value is not None:
            note = "KV blocks x tokens per block" if isinstance(capacity, Product) else "engine gauge"
            out[KV_CAPACITY_TOKENS] = Measurement(
                value, "tokens", ctx.prov("prometheus-gauge", capacity.describe()), note=note
            )
    block = ctx.resolve("block_size")
    if block is not None and BLOCK_SIZE not in out:
        value = ctx.window.latest(block, "first")
        if value is not None:
            out[BLOCK_SIZE] = Fact(int(value), ctx.prov("prometheus-gauge", block.describe()))
    context = ctx.resolve("context_len")
    if context is not None:
        value = ctx.window.latest(context, "first")
        if value is not None:
            out[MAX_MODEL_LEN] = Fact(int(value), ctx.prov("prometheus-gauge", context.describe()))
    for concept, key in (("weights_gib", WEIGHTS_BYTES), ("kv_cache_gib", KV_CACHE_BYTES)):
        cand = ctx.resolve(concept)
        value = ctx.window.latest(cand, "sum") if cand is not None else None
        if cand is not None and value is not None and key not in out:
            out[key] = Measurement(
                value * GIB,
                "bytes",
                ctx.prov("prometheus-gauge", cand.describe()),
                note="engine-reported, GiB converted to bytes",
            )
    if WEIGHTS_BYTES not in out:
        out[WEIGHTS_BYTES] = NotMeasured(
            f"{ctx.engine or 'the engine'} does not expose the weights' size in /metrics",
            "the server log states it (vLLM: 'Model loading took X GiB')",
            ctx.prov("prometheus", ""),
        )
    if KV_CACHE_BYTES not in out:
        out[KV_CACHE_BYTES] = NotMeasured(
            f"{ctx.engine or 'the engine'} does not expose the KV cache's size in bytes"
            + (
                " (vLLM reports kv_cache_memory_bytes only when --kv-cache-memory-bytes sets it)"
                if ctx.engine == "vllm"
                else ""
            ),
            "kv.capacity_tokens gives its size in tokens; NVML on the GPU host shows device memory",
            ctx.prov("prometheus", ""),
        )
    if KV_CAPACITY_TOKENS not in out:
        out[KV_CAPACITY_TOKENS] = ctx.missing("kv_capacity_tokens")
    _spec_config(ctx, out)
    _offload_config(ctx, infos, out)
    return out


def info_labels(ctx: PassiveContext) -> list[dict[str, str]]:
    """The label sets of vLLM's cache_config_info (one per DP engine) on the latest page that has it."""
    cand = ctx.resolve("cache_config_info")
    scrape = ctx.window.last_scrape()
    if not isinstance(cand, Sel) or scrape is None:
        return []
    # The latest page that carries it: labels are static, but a restart may change them.
    for record in reversed(ctx.window.ok_records):
        assert record.scrape is not None
        found = label_values(record.scrape, cand.name)
        if found:
            return found
    return []


def info_label(labels: Mapping[str, str], name: str) -> str | None:
    """An info label's value, None where it is absent or says None."""
    value = labels.get(name)
    return None if value in (None, "None", "") else value


def _vllm_cache_config(ctx: PassiveContext, infos: list[dict[str, str]], out: dict[str, Result]) -> None:
    labels = infos[0]  # every DP engine shares one CacheConfig; engine "0" comes first
    prov = ctx.prov("prometheus-info-labels", "vllm:cache_config_info")
    if (bs := info_label(labels, "block_size")) is not None and bs.isdigit():
        out[BLOCK_SIZE] = Fact(int(bs), prov)
    if (pc := info_label(labels, "enable_prefix_caching")) in ("True", "False"):
        out[PREFIX_CACHING] = Fact(pc == "True", prov, note=f"enable_prefix_caching={pc}")
    if (dtype := info_label(labels, "cache_dtype")) is not None:
        out[KV_CACHE_DTYPE] = Fact(dtype, prov, note="'auto' means the model's dtype")
    if (util := info_label(labels, "gpu_memory_utilization")) is not None:
        try:
            out[GPU_MEMORY_UTILIZATION] = Fact(float(util), prov)
        except ValueError:
            pass
    # Capacity per DP engine: kv_cache_size_tokens (>=0.24, right for hybrid models too), else
    # num_gpu_blocks x block_size; summed over engines.
    tokens, how = 0, None
    for info in infos:
        size = info_label(info, "kv_cache_size_tokens")
        blocks, bsz = info_label(info, "num_gpu_blocks"), info_label(info, "block_size")
        if size is not None and _is_number(size):
            tokens += int(float(size))
            how = "kv_cache_size_tokens"
        elif blocks is not None and bsz is not None and blocks.isdigit() and bsz.isdigit():
            tokens += int(blocks) * int(bsz)
            how = how or "num_gpu_blocks x block_size"
    if how:
        per = f" over {len(infos)} DP engines" if len(infos) > 1 else ""
        out[KV_CAPACITY_TOKENS] = Measurement(float(tokens), "tokens", prov, note=f"{how}{per}")
    # vLLM's own "maximum concurrency" figure (requests of max_model_len tokens, >=0.24), summed over engines.
    conc = [float(c) for info in infos if (c := info_label(info, "kv_cache_max_concurrency")) and _is_number(c)]
    if conc:
        out[KV_MAX_CONCURRENCY] = Measurement(
            math.fsum(conc),
            "requests",
            prov,
            note="kv_cache_max_concurrency: requests of max_model_len tokens the KV cache holds at once",
        )
    mem = [float(m) for info in infos if (m := info_label(info, "kv_cache_memory_bytes")) and _is_number(m)]
    if mem:
        out[KV_CACHE_BYTES] = Measurement(
            math.fsum(mem),
            "bytes",
            prov,
            note="kv_cache_memory_bytes as configured (--kv-cache-memory-bytes, or VLLM_CPU_KVCACHE_SPACE on CPU)",
        )


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _spec_config(ctx: PassiveContext, out: dict[str, Result]) -> None:
    if ctx.engine != "vllm":
        return
    drafts = ctx.resolve("spec_draft_tokens") or ctx.resolve("spec_acceptance_rate_gauge")
    prov = ctx.prov("metric-presence", "vllm:spec_decode_*")
    if drafts is not None:
        out[SPEC_DECODE] = Fact(True, prov, note="spec_decode metrics are present")
        # vLLM V1 registers one per-position acceptance counter for each drafted position at
        # start-up (v1/spec_decode/metrics.py), so counting them gives k even on an idle server.
        scrape = ctx.window.last_scrape()
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        positions = {s.label("position") for s in scrape.series(name)} - {None} if scrape is not None else set()
        if positions:
            out[NUM_SPECULATIVE_TOKENS] = Fact(
                len(positions),
                ctx.prov("metric-presence", name),
                note="one per-position acceptance counter per drafted position",
            )
    else:
        out[SPEC_DECODE] = Fact(
            False,
            prov,
            note="inferred: vLLM registers spec_decode metrics only when "
            "--speculative-config is set, and none are present",
        )


def _offload_config(ctx: PassiveContext, infos: list[dict[str, str]], out: dict[str, Result]) -> None:
    scrape = ctx.window.last_scrape()
    names = scrape.names() if scrape is not None else frozenset()
    offload_series = sorted(
        n for n in names if n.startswith(("vllm:kv_offload_", "vllm:simple_kv_offload_", "trtllm_kv_cache_offload_"))
    )
    size = info_label(infos[0], "kv_offloading_size") if infos else None
    if size is not None or offload_series:
        why = f"kv_offloading_size={size}" if size is not None else f"offload metrics present ({offload_series[0]})"
        out[KV_OFFLOAD] = Fact(True, ctx.prov("prometheus-info-labels", "offload configuration"), note=why)
    elif infos and "kv_offloading_size" in infos[0]:
        out[KV_OFFLOAD] = Fact(
            False,
            ctx.prov("prometheus-info-labels", "vllm:cache_config_info"),
            note="kv_offloading_size=None and no offload metrics; a connector set with "
            "--kv-transfer-config (LMCache, ...) shows as external_prefix_cache_* hits",
        )
