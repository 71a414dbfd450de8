"""Pitfalls recognised by what a setting does, not by its name.

Weight-only quantization (compressed-tensors W4A16, AWQ, GPTQ, bitsandbytes) dequantizes weights in
every GEMM: it pays at a small, memory-bound batch and costs time at a large, compute-bound one;
FP8 W8A8 quantizes activations too and is not weight-only. An FP4 KV cache is a quantized KV
cache. KV offload that brings the live hit rate near the workload's potential is working. A varying
prompt head is judged by the share of the cache's misses it causes. Memory left over while requests
wait means a scheduler limit caps the batch, and a full KV cache with a free sequence slot does not.
"""

from __future__ import annotations

from llm_diagnose.probes.quantities import decode_bound_key
from tests.scenarios.engines import A100_80GB, B200_180GB, GIB, H100_80GB, SGLANG, VLLM_V1, setting
from tests.scenarios.model import Scenario

SCENARIOS = [
    Scenario(
        id="pitfall-scheme-compressed-tensors-w4a16-large-batch",
        title="Mistral-Small-24B as compressed-tensors AWQ W4A16 on H100 serves slower than BF16",
        source="https://github.com/vllm-project/llm-compressor/issues/2793",
        source_says=(
            "Reporter quantized Mistral 3.2 24B with llm-compressor's AWQ W4A16 scheme and found it slower than "
            "FP16 on an H100 under vLLM V1. Maintainer: there is no guarantee W4A16 beats bfloat16, particularly "
            "in compute-bound cases; W4A16 is really for memory-bound cases, the dequantizing matmul has overhead, "
            "and FP8 pathways may be better outside that regime."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "eve-esa/EVE-Instruct-awq-asym2",
            "config.weight_quantization": "compressed-tensors W4A16",
            "config.kv_cache_dtype": "auto",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 14e9 / H100_80GB,
            "kv.usage_p95": 0.55,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 96.0,
            decode_bound_key(128): "compute",
        },
        verdict=(
            "At ~96 sequences per step the W4A16 GEMMs are compute-bound and pay for dequantization: serve the "
            "BF16 model or an FP8 W8A8 checkpoint instead."
        ),
        statuses={"quantization": "not-working"},
        pitfalls={"weight-only-quantization": True},
        classes=("pitfall-scheme",),
    ),
    Scenario(
        id="pitfall-scheme-awq-large-batch",
        title="AWQ model benchmarked at vLLM's default 256-sequence cap: dequantization dominates",
        source="https://github.com/vllm-project/vllm/issues/1545",
        source_says=(
            "In the thread on AWQ speed in vLLM, a user reports that apart from the first token the AWQ model is "
            "2-3x faster than FP16 at a small batch, and that for throughput benchmarks --max-num-seqs must be set "
            "to a small value like 32/64/96, because for an AWQ model de-quantization becomes a negative when the "
            "batch size is too large."
        ),
        evidence={
            **VLLM_V1,
            "config.weight_quantization": "awq",
            "config.max_num_seqs": setting(256),
            "memory.device_count": setting(1),
            "memory.weights_fraction": 7.3e9 / A100_80GB,
            "kv.usage_p95": 0.7,
            "batch.running_mean": 200.0,
            decode_bound_key(256): "compute",
        },
        verdict=(
            "At ~200 sequences per step AWQ's dequantization costs more than its smaller weights save: use FP16 "
            "(or FP8 W8A8) for this throughput job, or keep AWQ only for small-batch serving."
        ),
        statuses={"quantization": "not-working"},
        pitfalls={"weight-only-quantization": True},
        classes=("pitfall-scheme",),
    ),
    Scenario(
        id="pitfall-scheme-awq-small-batch-fine",
        title="INT4 AWQ for a single-user assistant at batch 1-2: weight-only quantization is the right pick",
        source="https://nvidia.github.io/Model-Optimizer/guides/_choosing_quant_methods.html",
        source_says=(
            "NVIDIA Model Optimizer guide: at small batch (<= 4) inference is memory-bound, limited by loading "
            "weights, and weight-only methods such as INT4 AWQ give superior performance; at large batch (>= 16) "
            "both bandwidth and compute matter and quantizing weights and activations (FP8 first) is recommended."
        ),
        evidence={
            **VLLM_V1,
            "config.weight_quantization": "awq_marlin",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 40e9 / H100_80GB,
            "kv.usage_p95": 0.08,
            "queue.waiting_mean": 0.0,
            "kv.preemptions": 0,
            "batch.running_mean": 1.5,
            "load.concurrency_mean": 1.5,
            decode_bound_key(1): "memory",
            decode_bound_key(2): "memory",
        },
        verdict="Weight-only INT4 is exactly right for memory-bound decode at one or two streams: nothing to fix.",
        statuses={"quantization": "in-place"},
        pitfalls={"weight-only-quantization": False},
        classes=("pitfall-scheme", "healthy"),
    ),
    Scenario(
        id="pitfall-scheme-bitsandbytes-offline-batch",
        title="Llama-3.2-1B in bitsandbytes 4-bit, offline generation on A100: 71 s against 45 s unquantized",
        source="https://github.com/vllm-project/vllm/issues/9535",
        source_says=(
            "Reporter ran offline inference with vllm.LLM on a dataset on an A100-80GB: the original "
            "Llama-3.2-1B took 45 s, the bitsandbytes 4-bit model (in-flight or unsloth-quantized) 71 s."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.2-1B-Instruct",
            "config.weight_quantization": "bitsandbytes",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 1.0e9 / A100_80GB,
            "kv.usage_p95": 0.3,
            "batch.running_mean": 180.0,
        },
        verdict=(
            "A 1B model needs no memory saving on an 80 GB GPU, and at a batch of ~180 bitsandbytes' weight-only "
            "dequantization only slows it: serve it unquantized."
        ),
        statuses={"quantization": "not-working"},
        pitfalls={"weight-only-quantization": True},
        classes=("pitfall-scheme",),
    ),
    Scenario(
        id="pitfall-scheme-fp8-w8a8-large-batch-not-weight-only",
        title="FP8 W8A8 with an FP8 KV cache at 128 sequences per step",
        source="https://nvidia.github.io/Model-Optimizer/guides/_choosing_quant_methods.html",
        source_says=(
            "NVIDIA Model Optimizer guide: for large-batch serving (batch >= 16) choose a method that quantizes "
            "weights and activations with lower-precision compute kernels; prioritise FP8 first, which costs very "
            "little accuracy and gives strong performance."
        ),
        evidence={
            **VLLM_V1,
            "config.weight_quantization": "fp8",
            "config.kv_cache_dtype": "fp8",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 8.5e9 / H100_80GB,
            "kv.usage_p95": 0.6,
            "queue.waiting_mean": 0.0,
            "kv.preemptions": 0,
            "batch.running_mean": 128.0,
            decode_bound_key(128): "compute",
        },
        verdict="FP8 W8A8 computes in FP8 and is the recommended scheme at this batch: no quantization pitfall.",
        statuses={"quantization": "in-place"},
        pitfalls={"weight-only-quantization": False},
        classes=("pitfall-scheme", "healthy"),
    ),
    Scenario(
        id="pitfall-scheme-compressed-tensors-fp8-w8a8-same-method-name",
        title="compressed-tensors FP8 W8A8 checkpoint at 96 sequences: same method name, not weight-only",
        source="https://github.com/vllm-project/llm-compressor/issues/2793",
        source_says=(
            "In the W4A16 slowdown thread the llm-compressor maintainer explains that W4A16 is for memory-bound "
            "cases because the dequantizing matmul has overhead, and that FP8 pathways are better outside that "
            "regime."
        ),
        evidence={
            **VLLM_V1,
            "config.weight_quantization": "compressed-tensors W8A8-FP8",
            "config.kv_cache_dtype": "auto",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 24e9 / H100_80GB,
            "kv.usage_p95": 0.55,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 96.0,
            decode_bound_key(128): "compute",
        },
        verdict=(
            "The same compressed-tensors method with an FP8 W8A8 scheme quantizes activations too: it is the fix "
            "for the compute-bound regime, not a weight-only pitfall."
        ),
        pitfalls={"weight-only-quantization": False},
        not_recommended=("quantization",),
        classes=("pitfall-scheme",),
    ),
    Scenario(
        id="pitfall-scheme-nvfp4-kv-counts-as-quantized",
        title="NVFP4 weights and NVFP4 KV cache on B200, KV full and requests queueing under load",
        source="https://developer.nvidia.com/blog/optimizing-inference-for-long-context-and-large-batch-sizes-with-nvfp4-kv-cache",
        source_says=(
            "NVIDIA blog: NVFP4 KV cache quantization on Blackwell cuts the KV-cache memory footprint by up to 50% "
            "against FP8 and can effectively double context budgets, enabling larger batches and longer sequences "
            "with under 1% accuracy loss."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "nvidia/Llama-3.3-70B-Instruct-FP4",
            "config.weight_quantization": "modelopt_fp4",
            "config.kv_cache_dtype": "nvfp4",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_bytes": 40e9,
            "memory.device_total_bytes": B200_180GB,
            "memory.weights_fraction": 40e9 / B200_180GB,
            "kv.usage_p95": 0.97,
            "kv.preemptions": 35,
            "queue.waiting_mean": 9.0,
            "batch.running_mean": 210.0,
            "load.concurrency_mean": 219.0,
            "throughput.generation_tokens_per_s": 9000.0,
        },
        verdict=(
            "Weights and KV cache are already 4-bit and the model uses a fifth of the GPU; the KV cache fills "
            "because of load: add replicas or cap admissions, not more quantization."
        ),
        statuses={"quantization": "in-place"},
        headline=("capacity", "scale-out"),
        not_recommended=("quantization", "parallelism"),
        classes=("pitfall-scheme", "fit", "headline"),
    ),
    Scenario(
        id="pitfall-kv-offload-on-hit-rate-near-potential",
        title="LMCache CPU offload under a capped GPU KV cache keeps hits near what the workload shares",
        source="https://kvgate.vercel.app/",
        source_says=(
            "Benchmark of LMCache CPU KV offload in front of vLLM (Llava-OneVision-7B, 40 distinct 1024x1024 "
            "images over 80 requests, GPU KV cache capped so the working set overflows): at the tightest cap "
            "vLLM's own prefix-cache hit rate fell to ~41% while CPU offload kept the KV warm; offload cut TTFT "
            "p50 from 1393 ms to 249 ms and doubled throughput."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "llava-hf/llava-onevision-qwen2-7b-ov-hf",
            "config.kv_offload": True,
            "prefix.potential_fraction": 0.50,  # each of 40 images is seen twice in 80 requests
            "prefix.lru_fraction_at_capacity": None,
            "prefix.hit_rate": 0.41,  # vLLM's own (GPU) prefix-cache hits, as the source reports them
            "prefix.queried_tokens": 520000,
            "kv.usage_p95": 0.95,
        },
        verdict=(
            "Offload is on and even the GPU tier's own hits reach four fifths of what the workload can share, "
            "the offload tier serving more: it works, nothing to add."
        ),
        statuses={"kv-offload": "in-place", "prefix-caching": "in-place"},
        classes=("pitfall-scheme", "healthy"),
    ),
    Scenario(
        id="pitfall-kv-offload-on-local-counters-blind",
        title="LMCache CPU offload on for 50 repeated 10k-token documents: query round no faster, 0 hit tokens",
        source="https://github.com/LMCache/LMCache/issues/1741",
        source_says=(
            "Reporter (LMCache 0.3.7, vLLM 0.10.2, GH200, Llama-3.3-70B-Instruct at TP2 with LMCacheConnectorV1 and "
            "LMCACHE_MAX_LOCAL_CPU_SIZE=60) ran long_doc_qa with 50 documents of 10,000 tokens, repeated once in "
            "tile mode: the query round's mean TTFT (2.856 s) equals the warmup round's, and LMCache logs "
            "'hit tokens: 0'."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.3-70B-Instruct",
            "config.tensor_parallel_size": setting(2),
            "memory.device_count": setting(2),
            "memory.device_total_bytes": 2 * 96 * GIB,
            "memory.weights_fraction": 141e9 / (96 * GIB),
            "config.kv_offload": True,
            "kv.capacity_tokens": 85000,
            # Every document comes back after the 49 others (~500k tokens): the GPU cache alone cannot
            # keep it, an offload tier of 60 GB can.
            "prefix.potential_fraction": 0.50,
            "prefix.lru_fraction_at_capacity": 0.0,
            "prefix.hit_rate": 0.0,
            "prefix.queried_tokens": 1.0e6,
            "latency.ttft_p50_s": 2.856,
        },
        verdict=(
            "The repeats are too far apart for the GPU cache, which is what the offload tier is for; vLLM's own "
            "counters cannot show what that tier serves, so offload is on but unverified: read LMCache's hit "
            "counters (here they say 0, so its setup needs fixing), and do not blame the prefix cache."
        ),
        statuses={"kv-offload": "on-unverified", "prefix-caching": "in-place"},
        classes=("pitfall-scheme", "unknown"),
    ),
    Scenario(
        id="pitfall-dynamic-head-most-of-the-misses",
        title="Per-session ids in the system prompt: a small share of tokens, most of the cache misses",
        source="https://github.com/HybridAIOne/hybridclaw/issues/1517",
        source_says=(
            "A per-session context block (platform, session id, user id) sits a quarter of the way into the "
            "system prompt, so the byte-identical rest of it and the tool definitions never hit across sessions: "
            "the first model call of every new session is a full cache write of ~30-36k tokens, while calls "
            "within a session still hit, which hides the problem in single-session testing."
        ),
        evidence={
            "config.prefix_caching": True,
            "prefix.potential_fraction": 0.79,  # within-session reuse of the growing conversation
            "prompts.dynamic_prefix_fraction": 0.15,  # the shared prompt re-sent on each session's first call
            "prefix.hit_rate": 0.77,
            "prefix.queried_tokens": 2.4e6,
            "inputs.length_p50": 40000,
        },
        verdict=(
            "Only 15% of prompt tokens sit behind the varying head, but they are about 70% of what the cache "
            "misses: move the session block out of the system prompt (after the static part)."
        ),
        headline=("pitfall", "dynamic-prefix"),
        pitfalls={"dynamic-prefix": True},
        classes=("pitfall-scheme", "headline"),
    ),
    Scenario(
        id="pitfall-near-zero-hits-datetime-first",
        title="A per-minute timestamp at the start of the system prompt: every turn misses the prefix cache",
        source="https://github.com/Mintplex-Labs/anything-llm/issues/6398",
        source_says=(
            "The default system prompt starts with 'The current date and time is {datetime}', which changes at "
            "every minute boundary; prefix caching (vLLM, llama.cpp, Ollama, provider caches) is prefix-based, so "
            "the rest of the system prompt, RAG context and chat history are invalidated, and in practice every "
            "turn is a miss."
        ),
        evidence={
            **VLLM_V1,
            "prefix.hit_rate": 0.01,
            "prefix.queried_tokens": 1.8e6,
            "prefix.potential_fraction": 0.03,
            "prompts.dynamic_prefix_fraction": 0.82,
        },
        verdict=(
            "The cache is on but the prompt defeats it: put the timestamp after the static content (or drop its "
            "minutes) and most of every prompt becomes a hit."
        ),
        statuses={"prefix-caching": "not-working"},
        headline=("pitfall", "dynamic-prefix"),
        pitfalls={"dynamic-prefix": True},
        classes=("pitfall-scheme", "headline"),
    ),
    Scenario(
        id="pitfall-unstable-json-key-order-tools",
        title="Clients send the same tool schema with keys in a different order: equal prompts hash apart",
        source="https://github.com/sgl-project/sglang/pull/34553",
        source_says=(
            "SGLang PR: clients send semantically equal tool definitions with different JSON key orders, so the "
            "rendered prompts differ and cannot share the prefix cache; in the authors' production trace the same "
            "search tool arrived with its 'properties' and 'required' keys swapped between two requests."
        ),
        evidence={
            **SGLANG,
            "prefix.hit_rate": 0.22,
            "prefix.queried_tokens": 3.1e6,
            "prefix.potential_fraction": 0.26,
            "prompts.unstable_serialization_fraction": 0.18,
        },
        verdict=(
            "Tool schemas arrive with changing key order: serialise them with sorted keys at the client (or "
            "normalise on the server) and the shared tool block becomes a hit."
        ),
        headline=("pitfall", "unstable-serialization"),
        pitfalls={"unstable-serialization": True},
        classes=("pitfall-scheme", "headline"),
    ),
    Scenario(
        id="pitfall-batch-full-kv-not-a-scheduler-cap",
        title="1M-token context, max_num_seqs 4: requests queue at 2 running because the KV pool is full",
        source="https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks/issues/43",
        source_says=(
            "With MAX_MODEL_LEN=1000000 and MAX_NUM_SEQS=4, interactive traffic queues with only 1-2 requests "
            "running; the queue reason is capacity (the KV pool), not the sequence slots: kv_cache_size_tokens "
            "1,526,178 and kv_cache_max_concurrency 1.53, i.e. the pool fits ~1.5 full-length requests."
        ),
        evidence={
            **VLLM_V1,
            "engine.max_model_len": setting(1_000_000),
            "config.max_num_seqs": setting(4),
            "kv.capacity_tokens": 1_526_178,
            "kv.max_concurrency": 1.53,
            "batch.running_mean": 2.0,
            "batch.running_max": 2,
            "queue.waiting_mean": 1.0,
            "kv.usage_p95": 0.96,
            "kv.preemptions": 0,
            "inputs.length_p50": 400000,
        },
        verdict=(
            "The batch stops at two because a few long contexts fill the KV pool, not because of a scheduler "
            "limit: lower max_model_len for the interactive lane or add KV capacity; raising max_num_seqs does "
            "nothing."
        ),
        pitfalls={"batch-not-growing": False},
        verdicts={"Q1": "kv-too-small"},
        not_recommended=("scale-out",),  # each instance lacks room: replicas of it do not fix that
        classes=("pitfall-scheme", "fit"),
    ),
]
