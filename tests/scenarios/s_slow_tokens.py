"""Slow tokens have three causes, and speculative decoding fixes only one.

Decode that is memory-bound at a small batch leaves compute idle: drafts are nearly free and
speculative decoding helps. Decode that is compute-bound at a large batch pays for every drafted
token: speculative decoding hurts. Tail stalls that come from prefills are question Q6. Once it is
on, speculative decoding is judged by the tokens each verify step emits against the number drafted
and the draft's cost, and by ITL with it on against off where that was measured, not by the
per-token acceptance rate alone. Speculative decoding is recommended only where the served gap is
close to the measured step (issue 25; the causes above the step are in s_time_per_token.py).
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes.quantities import decode_bound_key, decode_floor_key
from tests.scenarios.engines import A100_80GB, H100_80GB, SGLANG, VLLM_V1, setting, speculation
from tests.scenarios.model import Scenario

SCENARIOS = [
    Scenario(
        id="slow-tokens-memory-bound-small-batch-spec-helps",
        title="70B on 4xA100 at two streams misses a 15 ms ITL objective; decode is memory-bound",
        source="https://docs.vllm.ai/en/v0.32.0/features/speculative_decoding/adaptive_verification/",
        source_says=(
            "vLLM's speculative-decoding docs: speculative decoding buys fewer decode steps with more compute. "
            "At batch size 1 that is a good trade, because the GPU is memory-bound with spare compute and extra "
            "draft tokens are close to free; at batch size 256 draft tokens compete with real tokens for compute "
            "and throughput drops."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.1-70B-Instruct",
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(4),
            "memory.weights_bytes": 141e9,
            "memory.device_total_bytes": 4 * A100_80GB,
            "memory.weights_fraction": 141e9 / A100_80GB,  # all weights over one device; TP=4 splits them
            "kv.usage_p95": 0.10,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 1.6,
            "load.concurrency_mean": 1.6,
            "decode.itl_p50_s": 0.022,
            "decode.itl_p99_s": 0.027,
            "decode.time_share": 0.92,
            decode_bound_key(1): "memory",
            decode_bound_key(2): "memory",
            decode_bound_key(4): "memory",
            # The step, as `microbench --config <70B>/config.json --run RUN` gives it where the roofline is
            # measured (issue 25): one device's TP-4 shard reads 141 GB / 4 = 35 GB of weights per step; at
            # the ~1.75 TB/s a copy kernel reaches on an A100-80GB (2.04 TB/s datasheet) that is 20 ms.
            "machine.memcpy_bytes_per_s": 1.75e12,
            decode_floor_key(1): 35.3e9 / 1.75e12,
            decode_floor_key(2): 35.3e9 / 1.75e12,
            "config.spec_decode": False,
            "throughput.generation_tokens_per_s": 70.0,
        },
        slo=SLO.from_flags(["itl:p50:15ms"]),
        verdict=(
            "Decode at under two streams is memory-bound, 22 ms per token against a 20 ms step, and misses the ITL "
            "objective: add speculative decoding (EAGLE or a draft model); nothing else here is wrong."
        ),
        statuses={"speculative-decoding": "recommended"},
        headline=("use", "speculative-decoding"),
        answers={"Q5": "yes"},
        path={"Q5.served-close-to-step": "yes"},
        classes=("slow-tokens", "headline"),
    ),
    Scenario(
        id="slow-tokens-compute-bound-large-batch-spec-hurts",
        title="70B on 4xA100 at ~240 running sequences, tokens slow, decode compute-bound",
        source="https://docs.vllm.ai/en/latest/features/speculative_decoding/dynamic_speculative_decoding/",
        source_says=(
            "vLLM's dynamic speculative decoding docs: verifying K draft tokens per sequence makes the effective "
            "batch BS*K; once that goes beyond a critical batch size speculative decoding makes decode speed "
            "(TPOT) worse. The example configuration keeps K=3 at 1-64 concurrent sequences, K=1 at 65-128 and "
            "K=0 (no speculation) at 129-512."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.1-70B-Instruct",
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(4),
            "memory.weights_bytes": 141e9,
            "memory.device_total_bytes": 4 * A100_80GB,
            "memory.weights_fraction": 141e9 / A100_80GB,
            "kv.usage_p95": 0.74,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.2,
            "batch.running_mean": 240.0,
            "load.concurrency_mean": 240.2,
            "decode.itl_p50_s": 0.062,
            "decode.itl_p99_s": 0.095,
            "decode.time_share": 0.85,
            decode_bound_key(64): "memory",
            decode_bound_key(128): "memory",
            decode_bound_key(256): "compute",
            "config.spec_decode": False,
        },
        verdict=(
            "Tokens are slow because each step carries ~240 sequences and decode is compute-bound there: "
            "speculative decoding would add verify work and make it worse; run fewer sequences per replica or "
            "add devices."
        ),
        statuses={"speculative-decoding": "not-indicated"},
        headline=("capacity", "scale-out"),
        not_recommended=("speculative-decoding",),
        answers={"Q5": "yes"},
        classes=("slow-tokens", "headline"),
    ),
    Scenario(
        id="slow-tokens-p99-stalls-from-prefill-not-spec",
        title="Mistral-7B on one A100 without chunked prefill: median ITL fine, p99 stalls over a second",
        source="https://www.zhongzhuzhou.org/blog/2026-05-20-sarathiserve-technical-review-en/",
        source_says=(
            "Review of Sarathi-Serve (OSDI'24): with iteration-level batching that admits new prompts eagerly, "
            "every time a prompt joins the GPU pauses all ongoing decodes to run its prefill, giving multi-second "
            "generation stalls; chunked prefills plus stall-free batching remove them, and for Mistral-7B on one "
            "A100 serving capacity rose 2.6x at the same tail-latency target."
        ),
        evidence={
            **VLLM_V1,
            "config.chunked_prefill": False,
            "config.prefix_caching": False,
            "engine.model": "mistralai/Mistral-7B-Instruct-v0.2",
            "memory.device_count": setting(1),
            "memory.weights_bytes": 14.5e9,
            "memory.device_total_bytes": A100_80GB,
            "memory.weights_fraction": 14.5e9 / A100_80GB,
            "kv.usage_p95": 0.55,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.1,
            "batch.running_mean": 28.0,
            "load.concurrency_mean": 28.1,
            "inputs.length_p50": 1800,
            "decode.itl_p50_s": 0.022,
            "decode.itl_p99_s": 1.1,
            "interference.itl_inflation": 6.0,
            decode_bound_key(32): "memory",
            "config.spec_decode": False,
        },
        verdict=(
            "The median inter-token gap is fine; the p99 stalls are prefills stopping the running streams: "
            "turn on chunked prefill; speculative decoding does nothing for them and disaggregation is not needed "
            "on one GPU."
        ),
        statuses={"chunked-prefill": "recommended"},
        headline=("use", "chunked-prefill"),
        not_recommended=("speculative-decoding", "pd-disaggregation"),
        answers={"Q6": "yes"},
        classes=("slow-tokens", "q6-scale", "headline"),
    ),
    Scenario(
        id="slow-tokens-eagle-long-draft-mostly-rejected-but-worth-it",
        title="EAGLE with 4 draft tokens: 73% of drafts rejected, yet 2.08 tokens per verify step",
        source="https://github.com/vllm-project/vllm/pull/16035",
        source_says=(
            "Benchmark in the vLLM V1 EAGLE PR (Llama-3-8B-Instruct with an EAGLE head, MT-Bench, max_num_seqs 1): "
            "vanilla 128.64 tok/s; num_spec_tokens 2: 175.49 tok/s, acceptance length 1.89; num_spec_tokens 4: "
            "165.65 tok/s, acceptance length 2.08, i.e. 28% faster than vanilla."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Meta-Llama-3-8B-Instruct",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 16e9 / H100_80GB,
            "config.max_num_seqs": setting(1),
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            decode_bound_key(1): "memory",
            **speculation("eagle", 4),
            "spec.mean_acceptance_length": 2.08,
            "spec.acceptance_rate": (2.08 - 1) / 4,  # 0.27 of drafted tokens accepted
            "decode.itl_p50_s": 1 / 165.65,
        },
        verdict=(
            "2.08 tokens per verify step from a one-layer EAGLE head at batch 1 is a clear win although three "
            "drafts in four are rejected: speculative decoding works; k=2 would be slightly better."
        ),
        statuses={"speculative-decoding": "in-place"},
        pitfalls={"spec-decode-low-acceptance": False},
        classes=("slow-tokens",),
    ),
    Scenario(
        id="slow-tokens-eagle-measured-faster-on-vs-off",
        title="EAGLE with 2 draft tokens measured 1.36x faster than plain decoding, 45% of drafts accepted",
        source="https://github.com/vllm-project/vllm/pull/16035",
        source_says=(
            "Same PR benchmark: with num_spec_tokens 2 the EAGLE run reached 175.49 tok/s against 128.64 tok/s "
            "vanilla (36% faster) at an acceptance length of 1.89, measured side by side on MT-Bench with "
            "max_num_seqs 1."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Meta-Llama-3-8B-Instruct",
            "memory.device_count": setting(1),
            "config.max_num_seqs": setting(1),
            "batch.running_mean": 1.0,
            **speculation("eagle", 2),
            "spec.mean_acceptance_length": 1.89,
            "spec.acceptance_rate": (1.89 - 1) / 2,  # 0.445
            "spec.itl_speedup": 175.49 / 128.64,  # ITL off / on, measured side by side
            "decode.itl_p50_s": 1 / 175.49,
        },
        verdict="Measured on against off, speculative decoding makes decode 1.36x faster: it works, keep it.",
        statuses={"speculative-decoding": "in-place"},
        pitfalls={"spec-decode-low-acceptance": False},
        classes=("slow-tokens",),
    ),
    Scenario(
        id="slow-tokens-ngram-at-600-running-sequences",
        title="N-gram speculation on Qwen3-32B-FP8 with ~600 running requests is slower than without",
        source="https://github.com/vllm-project/vllm/issues/19254",
        source_says=(
            "Reporter: n-gram speculative decoding makes Qwen3-32B-FP8 slower than plain decoding on vLLM 0.9.0.1. "
            "The logs show 337-629 running requests, GPU KV cache usage 9.5-17.6%, draft acceptance rate "
            "38.8-61.0% and mean acceptance length 2.16-2.83 with three drafted positions."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "Qwen/Qwen3-32B-FP8",
            "config.weight_quantization": "fp8",
            "batch.running_mean": 600.0,
            "kv.usage_p95": 0.176,
            "prefix.hit_rate": 0.006,
            **speculation("ngram", 3),
            "spec.acceptance_rate": 0.487,
            "spec.mean_acceptance_length": 2.46,
        },
        verdict=(
            "At ~600 sequences per step decode is likely compute-bound, where verifying three drafts per "
            "sequence can cost more than the 1.46 extra tokens it wins; the counters alone cannot settle it: "
            "measure ITL with speculation off (as the reporter did) and turn it off at this load if slower."
        ),
        statuses={"speculative-decoding": "on-unverified", "quantization": "in-place"},
        pitfalls={"spec-decode-low-acceptance": None},
        classes=("slow-tokens",),
    ),
    Scenario(
        id="slow-tokens-ngram-low-acceptance-on-prose",
        title="N-gram speculation on ordinary prose: 11% of drafts accepted, no speedup",
        source="https://github.com/kekzl/imp/pull/1460",
        source_says=(
            "Measured on one server and model with speculation at default settings: ordinary prose without "
            "speculation 89.1 tok/s; with n-gram 89.4 tok/s at 11.2% draft acceptance; repeating a text verbatim "
            "876.5 tok/s at 98.3% acceptance. Speculation pays where continuations are predictable, not on prose."
        ),
        evidence={
            "config.continuous_batching": True,
            "config.paged_kv": True,
            "batch.running_mean": 1.0,
            **speculation("ngram"),
            "spec.acceptance_rate": 0.112,
            "spec.itl_speedup": 89.4 / 89.1,
            "decode.itl_p50_s": 1 / 89.4,
        },
        verdict=(
            "Prompt-lookup drafts almost never match free-form prose: speculation adds nothing here; turn it off "
            "for this workload or use a trained draft (EAGLE)."
        ),
        statuses={"speculative-decoding": "not-working"},
        pitfalls={"spec-decode-low-acceptance": True},
        classes=("slow-tokens",),
    ),
    Scenario(
        id="slow-tokens-spec-measured-slower-than-plain",
        title="Qwen2-7B with n-gram speculation (k=5) decodes at 61.8 tok/s against 69.8 tok/s without",
        source="https://github.com/vllm-project/vllm/issues/8439",
        source_says=(
            "Reporter ran Qwen2-7B-Instruct on one GPU twice, plain and with n-gram speculation "
            "(num_speculative_tokens 5, ngram_prompt_lookup_max 4): plain decoded at 69.79 tok/s, speculative at "
            "61.79 tok/s, for 1000 and 947 output tokens."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "Qwen/Qwen2-7B-Instruct",
            "memory.device_count": setting(1),
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            **speculation("ngram", 5),
            "spec.acceptance_rate": None,
            "spec.mean_acceptance_length": None,
            "spec.itl_speedup": 61.79 / 69.79,  # 0.885: slower with it on
            "decode.itl_p50_s": 1 / 61.79,
        },
        verdict=(
            "Measured side by side, speculation makes decode 12% slower: that is the finding; turn it off (or "
            "lower num_speculative_tokens) before anything else."
        ),
        statuses={"speculative-decoding": "not-working"},
        headline=("pitfall", "spec-decode-low-acceptance"),
        pitfalls={"spec-decode-low-acceptance": True},
        classes=("slow-tokens", "headline"),
    ),
    Scenario(
        id="slow-tokens-eagle-at-tp4-no-gain",
        title="SGLang EAGLE on QwQ-32B at TP4: 59 tok/s with it, 61 tok/s without",
        source="https://github.com/sgl-project/sglang/issues/6949",
        source_says=(
            "In an SGLang issue on EAGLE slowing inference, the reporter (with an EAGLE draft trained for QwQ-32B "
            "and an acceptance length they judged fine) measured one stream: tp=1 with EAGLE 30 tok/s, without 21 "
            "tok/s; tp=4 with EAGLE 59 tok/s, without 61 tok/s."
        ),
        evidence={
            **SGLANG,
            "engine.model": "Qwen/QwQ-32B",
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(4),
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            **speculation("eagle"),
            "spec.itl_speedup": 59 / 61,
            "decode.itl_p50_s": 1 / 59,
        },
        verdict=(
            "At TP4 the drafts no longer pay (measured 3% slower): turn EAGLE off for this TP4 deployment, or "
            "serve TP1 replicas, where it measured 1.4x faster."
        ),
        statuses={"speculative-decoding": "not-working"},
        pitfalls={"spec-decode-low-acceptance": True},
        classes=("slow-tokens",),
    ),
    Scenario(
        id="slow-tokens-spec-on-without-acceptance-counters",
        title="Draft-model speculation on, stats logging disabled: acceptance never seen",
        source="https://github.com/vllm-project/vllm/issues/7301",
        source_says=(
            "Reporter runs Qwen-7B with Qwen-1_8B as the draft (num_speculative_tokens 1) and cannot see any "
            "acceptance-rate metrics; the engine was started with disable_log_stats=True."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "Qwen/Qwen-7B",
            **speculation("draft_model", 1),
            "spec.acceptance_rate": None,
            "spec.mean_acceptance_length": None,
            "spec.itl_speedup": None,
        },
        verdict=(
            "Speculation is on but nothing shows whether drafts are accepted: on, not verified; enable stats "
            "(drop disable_log_stats) or measure ITL with it on and off."
        ),
        statuses={"speculative-decoding": "on-unverified"},
        pitfalls={"spec-decode-low-acceptance": None},
        classes=("slow-tokens", "unknown"),
    ),
    Scenario(
        id="slow-tokens-overloaded-server-spec-not-the-fix",
        title="8B on one H100 with the KV cache full, 50 waiting and preemptions; tokens slow at batch 40",
        source="https://docs.vllm.ai/en/v0.32.0/features/speculative_decoding/adaptive_verification/",
        source_says=(
            "vLLM's speculative-decoding docs: speculative decoding buys fewer decode steps with more compute; it "
            "pays when the GPU is memory-bound with spare compute, and as load grows draft tokens compete with "
            "real tokens (and each drafted token needs its KV slot)."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "memory.weights_bytes": 16e9,
            "memory.device_total_bytes": H100_80GB,
            "memory.weights_fraction": 16e9 / H100_80GB,
            "kv.capacity_tokens": 450_000.0,
            "inputs.length_p50": 2_000.0,
            "outputs.length_p50": 400.0,
            "kv.usage_p95": 1.0,
            "kv.preemptions": 49.0,
            "queue.waiting_mean": 53.0,
            "batch.running_mean": 40.0,
            "load.concurrency_mean": 93.0,
            "decode.itl_p50_s": 0.070,
            "decode.itl_p99_s": 0.110,
            "decode.time_share": 0.85,
            "config.spec_decode": False,
            "throughput.generation_tokens_per_s": 570.0,
        },
        verdict=(
            "The server is over capacity: the KV cache is full, requests queue and are preempted, so tokens are slow "
            "from overload. Add replicas or admission limits; speculative decoding would take KV slots from a full "
            "cache."
        ),
        statuses={"speculative-decoding": "not-indicated", "scale-out": "recommended"},
        headline=("capacity", "scale-out"),
        verdicts={"Q1": "overloaded"},
        not_recommended=("quantization",),
        classes=("slow-tokens", "fit", "headline"),
    ),
]
