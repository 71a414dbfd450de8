"""The headline is the most consequential finding.

A detected pitfall (something on that works against the server) outranks a technique that could
merely help, and a server whose techniques all do their job gets no headline fix at all, whatever
a single counter such as the per-token acceptance rate looks like on its own.
"""

from __future__ import annotations

from llm_diagnose.probes.quantities import decode_bound_key
from tests.scenarios.engines import A100_80GB, SGLANG, VLLM_V1, setting, speculation
from tests.scenarios.model import Scenario

SCENARIOS = [
    Scenario(
        id="headline-batch-cap-outranks-spec-decoding",
        title="max_num_seqs 4 on a box whose KV pool holds ~45 typical requests; tokens also slow",
        source="https://github.com/MiaAI-Lab/Qwen3.8-Flash-Next-Single-DGX-Spark/issues/19",
        source_says=(
            "The shipped MAX_NUM_SEQS=4 caps concurrency at 4 sequences; measured on the same model and hardware, "
            "a low --max-num-seqs makes aggregate throughput flatline in a way indistinguishable from GPU "
            "saturation: 33 tok/s aggregate at 2 sequences against 267 tok/s at 48. The fp8 KV pool holds ~1.43M "
            "tokens, ~45x a typical 32k request."
        ),
        evidence={
            **VLLM_V1,
            "config.max_num_seqs": setting(4),
            "memory.device_count": setting(1),
            "kv.capacity_tokens": 1_430_000,
            "kv.usage_p95": 0.09,
            "kv.preemptions": 0,
            "batch.running_mean": 4.0,
            "batch.running_max": 4,
            "queue.waiting_mean": 8.0,
            "load.concurrency_mean": 12.0,
            "inputs.length_p50": 32000,
            "decode.itl_p50_s": 0.06,
            "decode.itl_p99_s": 0.08,
            decode_bound_key(4): "memory",
            "config.spec_decode": False,
        },
        verdict=(
            "Requests wait while 90% of the KV cache is idle: raise --max-num-seqs first; that, not a faster "
            "decode, is what holds throughput down."
        ),
        headline=("pitfall", "batch-not-growing"),
        pitfalls={"batch-not-growing": True},
        classes=("headline", "pitfall-scheme"),
    ),
    Scenario(
        id="headline-weight-only-pitfall-outranks-spec-decoding",
        title="Llama-2-13B AWQ at batch 256 decodes at half the FP16 speed; tokens are slow",
        source="https://github.com/casper-hansen/AutoAWQ/issues/106",
        source_says=(
            "Reporter (Llama-2-13B): at batch size <= 32 AWQ decoding is slightly better than FP16, at batch size "
            "256 it is 50% of FP16. Maintainer: this is expected; at larger batch sizes quantization is generally "
            "compute-bound, and dequantizing the weights slows it down."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-2-13b-chat-hf",
            "config.weight_quantization": "awq",
            "memory.device_count": setting(1),
            "memory.weights_fraction": 7.3e9 / A100_80GB,
            "kv.usage_p95": 0.72,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.2,
            "batch.running_mean": 256.0,
            "load.concurrency_mean": 256.2,
            "decode.itl_p50_s": 0.09,
            "decode.itl_p99_s": 0.14,
            decode_bound_key(256): "compute",
            "config.spec_decode": False,
        },
        verdict=(
            "AWQ's dequantization halves decode speed at this batch: go back to FP16 (or FP8 W8A8); speculative "
            "decoding would add verify work to a compute-bound step and is not the answer."
        ),
        headline=("pitfall", "weight-only-quantization"),
        pitfalls={"weight-only-quantization": True},
        not_recommended=("speculative-decoding",),
        classes=("headline", "pitfall-scheme", "slow-tokens"),
    ),
    Scenario(
        id="headline-eagle-low-per-token-rate-nothing-to-fix",
        title="SGLang EAGLE-2 with 8 draft steps: 3.76 tokens per verify step at 230 tok/s, one stream",
        source="https://github.com/sgl-project/sglang/pull/4247",
        source_says=(
            "Benchmarks in SGLang's EAGLE-3 PR (Llama 3.1 8B, 80 benchmark questions, --speculative-num-steps 8, "
            "with CUDA graphs): EAGLE-2 230.08 tok/s at acceptance length 3.76; EAGLE-3 378.57 tok/s at 5.39."
        ),
        evidence={
            **SGLANG,
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "memory.device_count": setting(1),
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            "kv.usage_p95": 0.03,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "outputs.length_cv": 0.3,
            **speculation("eagle", 8),
            "spec.mean_acceptance_length": 3.76,
            "spec.acceptance_rate": (3.76 - 1) / 8,  # 0.345 of drafted tokens
            "decode.itl_p50_s": 1 / 230.08,
            "decode.itl_p99_s": 0.007,
            decode_bound_key(1): "memory",
        },
        verdict=(
            "Almost four tokens per verify step from a cheap EAGLE head at batch 1 is a healthy speedup and ITL "
            "is 4 ms: nothing to fix (EAGLE-3 heads would do better still)."
        ),
        headline=("none-found", ""),
        statuses={"speculative-decoding": "in-place"},
        pitfalls={"spec-decode-low-acceptance": False},
        classes=("headline", "slow-tokens", "healthy"),
    ),
]
