"""Healthy servers: every question answered, nothing to do. The headline says "none found" and
no technique is recommended. Each evidence set is complete enough that no question is left open."""

from __future__ import annotations

from tests.scenarios.engines import H100_80GB as H100
from tests.scenarios.engines import setting
from tests.scenarios.model import Scenario

_NOTHING = (
    "quantization",
    "parallelism",
    "prefix-caching",
    "continuous-batching",
    "paged-attention",
    "speculative-decoding",
    "chunked-prefill",
    "pd-disaggregation",
    "kv-offload",
    "offline-batch",
    "scale-out",
)


def _chat_server(**over: object) -> dict:
    """A vLLM V1 chat server under moderate load with every feature it needs already on."""
    ev: dict = {
        "engine.name": "vllm",
        "engine.version": "0.6.0",
        "workload.interactive": True,
        "config.continuous_batching": True,
        "config.paged_kv": True,
        "config.chunked_prefill": True,
        "config.prefix_caching": True,
        "config.spec_decode": False,
        "config.pd_disaggregation": False,
        "config.kv_offload": False,
        "config.weight_quantization": "none",
        "config.kv_cache_dtype": "auto",
        "config.tensor_parallel_size": setting(1),
        "memory.device_count": setting(1),
        "config.gpu_memory_utilization": setting(0.9),
        "kv.preemptions": 0,
        "queue.waiting_mean": 0.0,
        "kv.waste_fraction": 0.03,
        "outputs.length_cv": 0.9,
        "prefix.potential_fraction": 0.35,
        "prefix.hit_rate": 0.31,
        "prefix.lru_fraction_at_capacity": 0.34,
        "prefix.queried_tokens": 2_400_000,
        "interference.itl_inflation": 1.12,
        "latency.ttft_p50_s": 0.09,
    }
    ev.update(over)
    return ev


SCENARIOS = [
    Scenario(
        id="healthy-llama8b-h100-sharegpt",
        title="vLLM 0.6.0 serving Llama 3 8B on one H100 to ShareGPT-like chat, all within target",
        source="https://blog.vllm.ai/2024/09/05/perf-update.html",
        source_says=(
            "The vLLM v0.6.0 performance update measured Llama 3 8B on 1x H100 on ShareGPT (500 prompts, "
            "202 input and 179 output tokens on average): 2.7x the throughput and 5x faster TPOT of v0.5.3 "
            "once CPU overhead stopped leaving the GPU idle; under light load Llama 3 8B generates a token "
            "every 13 ms."
        ),
        evidence=_chat_server(
            **{
                "engine.model": "meta-llama/Meta-Llama-3-8B-Instruct",
                "memory.weights_bytes": 16.1e9,
                "memory.device_total_bytes": float(H100),
                "memory.weights_fraction": 16.1e9 / H100,
                "kv.capacity_tokens": 445_000,
                "inputs.length_p50": 200,
                "outputs.length_p50": 180,
                "kv.usage_p95": 0.41,
                "batch.running_mean": 24,
                "load.concurrency_mean": 24,
                "throughput.generation_tokens_per_s": 1700.0,
                "decode.itl_p50_s": 0.013,
                "decode.itl_p99_s": 0.034,
            }
        ),
        verdict="Everything it needs is on and working and latency is within target: nothing to change.",
        headline=("none-found", ""),
        not_recommended=_NOTHING,
        verdicts={"Q1": "fits"},
        classes=("healthy",),
    ),
    Scenario(
        id="healthy-llama70b-tp4-h100",
        title="vLLM 0.6.0 serving Llama 3 70B on 4x H100 (TP=4), within target",
        source="https://blog.vllm.ai/2024/09/05/perf-update.html",
        source_says=(
            "The same v0.6.0 update measured Llama 3 70B on 4x H100 on ShareGPT: 1.8x the throughput and 2x "
            "lower TPOT than v0.5.3."
        ),
        evidence=_chat_server(
            **{
                "engine.model": "meta-llama/Meta-Llama-3-70B-Instruct",
                "config.tensor_parallel_size": setting(4),
                "memory.device_count": setting(4),
                "memory.weights_bytes": 141e9,
                "memory.device_total_bytes": 4.0 * H100,
                "memory.weights_fraction": 141e9 / H100,  # 1.65 of one GPU, 0.41 of each of the four
                "kv.capacity_tokens": 470_000,
                "inputs.length_p50": 300,
                "outputs.length_p50": 250,
                "kv.usage_p95": 0.28,
                "batch.running_mean": 32,
                "load.concurrency_mean": 32,
                "throughput.generation_tokens_per_s": 1150.0,
                "decode.itl_p50_s": 0.027,
                "decode.itl_p99_s": 0.071,
            }
        ),
        verdict=(
            "The 70B model fits four GPUs with room, the cache hits what the prompts share, latency is "
            "fine: nothing to do."
        ),
        headline=("none-found", ""),
        not_recommended=_NOTHING,
        verdicts={"Q1": "fits"},
        not_flagged=("memory.weights_fraction",),
        classes=("healthy", "fit"),
    ),
    Scenario(
        id="healthy-eagle3-spec-decode-at-low-qps",
        title="EAGLE-3 speculative decoding on a low-QPS 8B server: ~2.9 tokens per step, ITL 1.8x better",
        source="https://docs.vllm.ai/en/v0.19.0/features/speculative_decoding/",
        source_says=(
            "vLLM's speculative decoding guide: it reduces inter-token latency under medium-to-low QPS, "
            "memory-bound workloads; model-based methods such as EAGLE give the best latency reduction, "
            "rated high gain at low QPS."
        ),
        evidence=_chat_server(
            **{
                "engine.version": "0.19.0",
                "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
                "config.spec_decode": True,
                "config.spec_method": "eagle3",
                "config.num_speculative_tokens": setting(3),
                "spec.acceptance_rate": 0.63,
                "spec.mean_acceptance_length": 2.9,
                "spec.itl_speedup": 1.8,
                "memory.weights_bytes": 16.9e9,
                "memory.device_total_bytes": float(H100),
                "memory.weights_fraction": 16.9e9 / H100,
                "kv.capacity_tokens": 420_000,
                "inputs.length_p50": 500,
                "outputs.length_p50": 400,
                "kv.usage_p95": 0.03,
                "batch.running_mean": 3,
                "load.concurrency_mean": 3,
                "throughput.generation_tokens_per_s": 390.0,
                "decode.itl_p50_s": 0.0075,
                "decode.itl_p99_s": 0.02,
                "decode.bound_b4": "memory",
            }
        ),
        verdict=(
            "Speculative decoding is on, accepts ~1.9 of 3 drafts per step and measurably speeds decode at "
            "this batch: in place and working, nothing to change."
        ),
        statuses={"speculative-decoding": "in-place"},
        headline=("none-found", ""),
        not_recommended=_NOTHING,
        pitfalls={"spec-decode-low-acceptance": False},
        classes=("healthy",),
    ),
    Scenario(
        id="healthy-long-document-qa-prefix-cache-hits",
        title="Long-document Q&A with automatic prefix caching: the live hit rate reaches what the prompts share",
        source="https://docs.vllm.ai/en/v0.6.6/automatic_prefix_caching/apc.html",
        source_says=(
            "vLLM's Automatic Prefix Caching caches the KV of existing queries so a new query sharing the same "
            "prefix skips its computation; the documented example asks several questions about one long "
            "markdown table, the second query reusing the first one's prefix."
        ),
        evidence=_chat_server(
            **{
                "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
                "memory.weights_bytes": 16.1e9,
                "memory.device_total_bytes": float(H100),
                "memory.weights_fraction": 16.1e9 / H100,
                "kv.capacity_tokens": 445_000,
                "inputs.length_p50": 6000,
                "outputs.length_p50": 150,
                "prefix.potential_fraction": 0.82,
                "prefix.hit_rate": 0.79,
                "prefix.lru_fraction_at_capacity": 0.80,
                "kv.usage_p95": 0.09,
                "batch.running_mean": 5,
                "load.concurrency_mean": 5,
                "throughput.generation_tokens_per_s": 480.0,
                "decode.itl_p50_s": 0.019,
                "decode.itl_p99_s": 0.05,
            }
        ),
        verdict="The prefix cache serves 79% of prompt tokens out of a possible 82%: working; nothing to add.",
        statuses={"prefix-caching": "in-place"},
        headline=("none-found", ""),
        not_recommended=_NOTHING,
        classes=("healthy",),
    ),
    Scenario(
        id="healthy-v1-prefix-cache-on-nothing-to-share",
        title="vLLM V1 with prefix caching on by default, 0.3% hits, and a trace showing prompts share nothing",
        source="https://blog.vllm.ai/2025/01/27/v1-alpha-release.html",
        source_says=(
            "vLLM V1's prefix caching costs less than 1% of throughput even when the cache hit rate is 0% and "
            "improves performance several times when it is high; thanks to the near-zero overhead, V1 enables "
            "prefix caching by default."
        ),
        evidence=_chat_server(
            **{
                "engine.version": "0.8.5",
                "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
                "memory.weights_bytes": 16.1e9,
                "memory.device_total_bytes": float(H100),
                "memory.weights_fraction": 16.1e9 / H100,
                "kv.capacity_tokens": 445_000,
                "inputs.length_p50": 900,
                "outputs.length_p50": 700,
                # Distinct documents, one request each: an unlimited cache would serve 1% of prompt tokens.
                "prefix.potential_fraction": 0.01,
                "prefix.lru_fraction_at_capacity": 0.01,
                "prompts.dynamic_prefix_fraction": 0.0,
                "prefix.hit_rate": 0.003,
                "prefix.queried_tokens": 2_100_000,
                "trace.requests": 2400,
                "kv.usage_p95": 0.38,
                "batch.running_mean": 20,
                "load.concurrency_mean": 20,
                "throughput.generation_tokens_per_s": 1500.0,
                "decode.itl_p50_s": 0.013,
                "decode.itl_p99_s": 0.035,
            }
        ),
        verdict=(
            "Near-zero hits are right for prompts that share nothing, and the cache costs under 1%: leave "
            "it on, nothing to fix or recommend."
        ),
        statuses={"prefix-caching": "in-place"},
        headline=("none-found", ""),
        not_recommended=_NOTHING,
        pitfalls={"dynamic-prefix": False},
        classes=("healthy", "unknown"),
    ),
]
