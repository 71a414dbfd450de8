"""Unknown stays unknown: a technique that is on but unverified is "on-unverified", not "in place
and working"; a setting that could not be seen is not "off"."""

from __future__ import annotations

from llm_diagnose.probes.results import Measurement
from tests.evidence_builders import PROV
from tests.scenarios.engines import A100_80GB as A100_80
from tests.scenarios.engines import setting
from tests.scenarios.model import Scenario

# What the live probe makes of SGLang's cache_hit_rate gauge (llm_diagnose/probes/metrics/passive/):
# the mean of its readings, marked as an engine-computed gauge rather than a windowed token ratio.
_SGLANG_GAUGE_ZEROS = Measurement(
    0.0,
    "fraction",
    PROV,
    samples=(0.0,) * 12,
    warnings=("engine-computed gauge, not a windowed token ratio: mean of its readings",),
)

SCENARIOS = [
    Scenario(
        id="unknown-sglang-eagle-on-without-acceptance-metrics",
        title="SGLang with EAGLE speculative decoding: acceptance is not among the metrics the tool scrapes",
        source="https://github.com/sgl-project/sglang/pull/11144",
        source_says=(
            "An SGLang PR adds speculative-decoding acceptance rate (accepted / draft tokens) and average "
            "acceptance length per verification pass, tracked per request and reported in the final request "
            "log line, because without them results with speculative decoding were hard to understand."
        ),
        evidence={
            "engine.name": "sglang",
            "engine.version": "0.5.3",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "config.spec_decode": True,
            "config.spec_method": "eagle",
            "config.num_speculative_tokens": setting(4),
            "spec.acceptance_rate": None,
            "spec.mean_acceptance_length": None,
            "spec.itl_speedup": None,
            "decode.itl_p50_s": 0.009,
            "decode.itl_p99_s": 0.03,
            "batch.running_mean": 4.0,
            "load.concurrency_mean": 4.0,
        },
        verdict=(
            "EAGLE is on but nothing measured whether its drafts are accepted: on and unverified, not "
            "'in place and working'; acceptance per verify step (or ITL with it off vs on) would verify it."
        ),
        statuses={"speculative-decoding": "on-unverified"},
        pitfalls={"spec-decode-low-acceptance": None},
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-disaggregation-on-without-transfer-metrics",
        title="Prefill/decode disaggregation over NIXL is on; KV transfer time per request is not observable",
        source="https://github.com/llm-d/llm-d/pull/2368",
        source_says=(
            "llm-d documents vLLM's NIXL transfer metrics so operators can diagnose P/D transfers without "
            "reverse engineering the dashboard, and states that these metrics are aggregated over TP ranks "
            "and not correlated with individual requests."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-70B-Instruct",
            "config.pd_disaggregation": True,
            "config.chunked_prefill": True,
            "pd.kv_transfer_ttft_share": None,
            "latency.ttft_p50_s": 0.42,
            "decode.itl_p50_s": 0.024,
            "decode.itl_p99_s": 0.061,
            "interference.itl_inflation": None,
        },
        verdict=(
            "Disaggregation is on, but how much of TTFT the KV transfer costs was not measured: on and "
            "unverified, not 'in place and working'; NIXL transfer time against TTFT would verify it."
        ),
        statuses={"pd-disaggregation": "on-unverified"},
        pitfalls={"disaggregation-overhead": None},
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-prefix-cache-zero-hits-block-larger-than-shared-prompt",
        title=(
            "Prefix caching on, 0 hits over millions of queried tokens, no trace: no sharing, or a "
            "prefix under one block?"
        ),
        source="https://github.com/vllm-project/vllm/issues/54607",
        source_says=(
            "vLLM 0.27.1 reported prefix_cache_hits_total at exactly 0 on traffic where another engine hit "
            "49.3%: the shared system prompt (~240 tokens) was shorter than the model's 784-token KV block, "
            "and only full blocks are cached. 'queries > 0, hits = 0' looks the same whether the workload "
            "shares no prefix or shares one too short to cache, and those need different responses."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.27.1",
            "config.prefix_caching": True,
            "config.block_size": setting(784),
            "prefix.hit_rate": 0.0,
            "prefix.queried_tokens": 3_100_000,
            "prefix.potential_fraction": None,
            "prompts.dynamic_prefix_fraction": None,
            "inputs.length_p50": 900,
        },
        verdict=(
            "A zero hit rate without the prompts cannot say whether requests share prefixes (here they "
            "did, under one 784-token block): prefix caching is on and unverified; a trace (--trace) or "
            "the active prefix experiment would tell."
        ),
        statuses={"prefix-caching": "on-unverified"},
        answers={"Q2": "unknown"},
        pitfalls={"dynamic-prefix": None},
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-sglang-radix-cache-default-not-visible",
        title="SGLang server: the radix prefix cache is on by default, and no hit rate is shown",
        source="https://github.com/sgl-project/sglang/issues/30755",
        source_says=(
            "On SGLang 0.5.14 (H20) the reporter finds no prefix-cache percentage in the console even with "
            "--enable-cache-report and asks whether prefix caching must be enabled by hand; the answer: the "
            "radix cache is enabled by default."
        ),
        evidence={
            "engine.name": "sglang",
            "engine.version": "0.5.14",
            "config.prefix_caching": None,
            "prefix.hit_rate": None,
            "prefix.queried_tokens": None,
            "prefix.potential_fraction": None,
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
        },
        verdict=(
            "The radix cache is on by SGLang's default, so it must not be recommended as if off; whether "
            "it hits is unmeasured: on and unverified until hit counters or a trace show it."
        ),
        statuses={"prefix-caching": "on-unverified"},
        not_recommended=("prefix-caching",),
        answers={"Q2": "unknown"},
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-weight-quantization-invisible",
        title="An AWQ checkpoint served without --quantization: the method is never visible to the tool",
        source="https://github.com/kaito-project/kaito/pull/2007",
        source_says=(
            "Kaito's AWQ support parses quantization_config from the model's config.json and deliberately "
            "does not pass --quantization to vLLM, because vLLM auto-selects the kernel (awq_marlin, awq, "
            "awq_triton) from the checkpoint; AWQ shrinks the weights, not the KV cache."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/Qwen3-8B-AWQ",
            "config.weight_quantization": None,
            "config.kv_cache_dtype": "auto",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_bytes": 5.9e9,
            "memory.device_total_bytes": float(A100_80),
            "memory.weights_fraction": 5.9e9 / A100_80,
            "kv.usage_p95": 0.42,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 48,
            "load.concurrency_mean": 48,
            "decode.itl_p50_s": 0.031,
            "decode.itl_p99_s": 0.07,
        },
        verdict=(
            "The quantization method was not observed (the checkpoint carries it), so whether a weight-only "
            "scheme slows this 48-request batch cannot be judged; unseen is not 'none'."
        ),
        pitfalls={"weight-only-quantization": None},
        not_recommended=("quantization",),
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-chunked-prefill-on-by-default-vllm-v1",
        title="vLLM V1 server, chunked prefill not in the visible config, no interference measured",
        source="https://discuss.vllm.ai/t/why-is-chunked-prefill-always-enabled-in-v1/1628",
        source_says=(
            "On the vLLM forum: in vLLM V1 chunked prefill is always enabled by design, even when the user "
            "unsets it on the command line (PR #11061); the optimization guide says 'In vLLM V1, chunked "
            "prefill is always enabled by default'."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.9.1",
            "config.chunked_prefill": None,
            "config.max_num_batched_tokens": None,
            "interference.itl_inflation": None,
            "interference.prompt_itl_correlation": None,
            "decode.itl_p50_s": 0.014,
            "decode.itl_p99_s": 0.09,
        },
        verdict=(
            "Chunked prefill is on in any vLLM V1 server, so recommending '--enable-chunked-prefill' is "
            "wrong; whether its chunk bounds the stall was not measured: on and unverified."
        ),
        statuses={"chunked-prefill": "on-unverified"},
        not_recommended=("chunked-prefill", "pd-disaggregation"),
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-lmcache-offload-on-without-its-metrics",
        title="KV offload through LMCache is on; its hit counters are missing from /metrics",
        source="https://github.com/LMCache/LMCache/issues/729",
        source_says=(
            "LMCache metrics were missing from vLLM's /metrics; they appeared only after starting `vllm serve` "
            "with PROMETHEUS_MULTIPROC_DIR set (per an LMCache contributor, following the thread in #621)."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/Qwen2.5-7B-Instruct",
            "config.kv_offload": True,
            "config.prefix_caching": True,
            # From the trace: an unlimited cache would serve 60% of prompt tokens, an LRU cache of the
            # GPU's size 31%; the GPU-local hit rate alone cannot show what the offload tier adds.
            "prefix.potential_fraction": 0.60,
            "prefix.lru_fraction_at_capacity": 0.31,
            "prefix.hit_rate": 0.29,
            "prefix.queried_tokens": 5_200_000,
            "trace.requests": 20_000,
        },
        verdict=(
            "The GPU prefix cache hits what its size allows (29% against 31% for an LRU cache of that "
            "size); what the CPU tier adds is unmeasured: offload is on and unverified (external hit "
            "counters would verify it), not 'not working'."
        ),
        statuses={"kv-offload": "on-unverified", "prefix-caching": "in-place"},
        classes=("unknown",),
    ),
    Scenario(
        id="unknown-sglang-hit-rate-gauge-reads-zero",
        title="SGLang 0.4.5 radix cache on a workload that shares half its prompt: the hit-rate gauge reads 0",
        source="https://github.com/sgl-project/sglang/issues/5625",
        source_says=(
            "In SGLang the cache_hit_rate gauge is reset to 0 after decoding, so the value read is almost always "
            "0 and the gauge is barely usable; the reporter asks for hit and query counters, as vLLM replaced "
            "its hit-rate gauge with queries and hits counters."
        ),
        evidence={
            "engine.name": "sglang",
            "engine.version": "0.4.5.post3",
            "config.prefix_caching": True,
            "prefix.hit_rate": _SGLANG_GAUGE_ZEROS,
            "prefix.queried_tokens": None,
            "prefix.potential_fraction": 0.45,
            "prefix.lru_fraction_at_capacity": 0.43,
            "trace.requests": 8000,
        },
        verdict=(
            "A gauge that resets to 0 after every decode says nothing about hits: the radix cache is on "
            "and unverified, not broken; hit and query counters (or the active prefix experiment) would tell."
        ),
        statuses={"prefix-caching": "on-unverified"},
        not_recommended=("kv-offload",),
        classes=("unknown", "confidence"),
    ),
]
