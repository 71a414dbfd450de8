"""Prefill/decode contention (Q6) must know the scale.

Chunked prefill comes first. When contention survives it, the chunk is tuned next (vLLM
--max-num-batched-tokens, SGLang --chunked-prefill-size). Disaggregation is for deployments past a
named prefill load and device count, where KV transfer and routing pay for themselves; below that it
only adds them. Disaggregation that costs more in KV transfer than it saves is a pitfall, and a
passive correlation on a near-idle server never drives the headline.
"""

from __future__ import annotations

from tests.scenarios.engines import GIB, H20_96GB, H100_80GB, SGLANG, VLLM_V1, setting
from tests.scenarios.model import Scenario

SCENARIOS = [
    Scenario(
        id="q6-scale-contention-survives-large-chunk-one-device",
        title="One DGX box, chunked prefill at the 8192-token default: decoding stream drops to 0.2 tok/s",
        source="https://github.com/blazux/qwen3.8-Flash-DGX/issues/9",
        source_says=(
            "Maintainer reproduced: while two cold ~72k-token prompts prefill (~110 s), a decoding client gets "
            "0.2 tok/s (one token every 5-7 s), then 26-29 tok/s after. Cause named: with chunked prefill every "
            "step that holds a prefill chunk carries one token per decoding request, and a chunk of 8,192 tokens "
            "(--max-num-batched-tokens 8192, the default) takes ~3.5 s on this model; memory pressure makes it "
            "worse."
        ),
        evidence={
            **VLLM_V1,
            "config.max_num_batched_tokens": setting(8192),
            "memory.device_count": setting(1),
            "config.tensor_parallel_size": setting(1),
            "batch.running_mean": 2.5,
            "load.concurrency_mean": 3.0,
            "inputs.length_p50": 72000,
            "decode.itl_p50_s": 0.036,
            "decode.itl_p99_s": 5.0,
            "interference.itl_baseline_p50_s": 0.036,
            "interference.itl_during_prefill_p50_s": 3.5,
            "interference.itl_inflation": 3.5 / 0.036,
            "throughput.prompt_tokens_per_s": 1300.0,
        },
        verdict=(
            "Chunked prefill is on, but an 8192-token chunk takes seconds on this device: cut "
            "--max-num-batched-tokens (e.g. 1024-2048) so each step is short; disaggregation makes no sense on "
            "one box."
        ),
        statuses={"chunked-prefill": "not-working", "pd-disaggregation": "not-indicated"},
        headline=("fix", "chunked-prefill"),
        not_recommended=("pd-disaggregation", "speculative-decoding"),
        answers={"Q6": "yes"},
        classes=("q6-scale", "headline"),
    ),
    Scenario(
        id="q6-scale-survives-small-chunk-at-8-gpus-disaggregate",
        title="Llama-70B on 8xH100, 2k-token prompts, chunk already 512: streams still 2.8x slower",
        source="https://github.com/vllm-project/vllm/pull/6170",
        source_says=(
            "Author's measurements for vLLM's disaggregated prefill: for long context (input >= 1k tokens with "
            "128 output tokens) disaggregated prefilling should be used instead of chunked prefill; with "
            "Llama 70B at tp=4 on 8xH100 (4 GPUs prefill, 4 decode), 2048-token inputs, the KV-transfer overhead "
            "was about 31 ms on average (maximum about 40 ms)."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Meta-Llama-3-70B-Instruct",
            "config.tensor_parallel_size": setting(8),
            "memory.device_count": setting(8),
            "memory.weights_fraction": 141e9 / H100_80GB,
            "memory.device_total_bytes": 8 * H100_80GB,
            "config.max_num_batched_tokens": setting(512),
            "config.pd_disaggregation": False,
            "batch.running_mean": 64.0,
            "load.concurrency_mean": 66.0,
            "kv.usage_p95": 0.6,
            "queue.waiting_mean": 0.3,
            "inputs.length_p50": 2048,
            "outputs.length_p50": 128,
            "throughput.prompt_tokens_per_s": 30000.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.16,
            "interference.itl_inflation": 2.8,
        },
        verdict=(
            "Prefill load is heavy (30k prompt tokens/s of 2k-token prompts), the chunk is already small, and "
            "eight GPUs can be split: run separate prefill and decode instances."
        ),
        statuses={"pd-disaggregation": "recommended"},
        headline=("use", "pd-disaggregation"),
        answers={"Q6": "yes"},
        classes=("q6-scale", "headline"),
    ),
    Scenario(
        id="q6-scale-one-device-no-disaggregation",
        title="Llama-8B on one GPU, chunked prefill on, streams 2.4x slower during prefills",
        source="https://docs.vllm.ai/en/latest/features/disagg_prefill/",
        source_says=(
            "vLLM docs: disaggregated prefilling lets TTFT and ITL be tuned separately and controls tail ITL; "
            "chunked prefill with a proper chunk size can achieve the same goal, although the right chunk size is "
            "hard to find; disaggregated prefill DOES NOT improve throughput. It runs at least two vLLM "
            "instances, one for prefill and one for decode, connected by a KV connector."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_fraction": 16e9 / (48 * GIB),
            "config.max_num_batched_tokens": setting(4096),
            "config.pd_disaggregation": False,
            "batch.running_mean": 24.0,
            "load.concurrency_mean": 24.5,
            "kv.usage_p95": 0.45,
            "inputs.length_p50": 3000,
            "throughput.prompt_tokens_per_s": 2500.0,
            "decode.itl_p50_s": 0.021,
            "decode.itl_p99_s": 0.12,
            "interference.itl_inflation": 2.4,
        },
        verdict=(
            "Contention survives a 4096-token chunk on a single GPU: lower --max-num-batched-tokens first; "
            "disaggregation would need a second instance and a KV transfer for a load one GPU carries."
        ),
        statuses={"chunked-prefill": "not-working", "pd-disaggregation": "not-indicated"},
        headline=("fix", "chunked-prefill"),
        not_recommended=("pd-disaggregation",),
        classes=("q6-scale", "headline"),
    ),
    Scenario(
        id="q6-scale-disaggregation-made-ttft-worse",
        title="4 prefill + 4 decode H20s for 1k-token prompts and 6-token answers: TTFT rose a lot",
        source="https://github.com/kvcache-ai/Mooncake/issues/62",
        source_says=(
            "Reporter: Qwen2.5-72B-Instruct-GPTQ-Int4 on 8xH20 (4 prefill, 4 decode), input 1024, output 6. At "
            "qps 10 mean ITL was much larger disaggregated than not, driven by the first decode token; at low qps "
            "TTFT increased a lot. Maintainer: in disaggregated prefilling the first token's time consists of the "
            "prefill, the KVCache transfer, and the first run of the decode stage."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4",
            "config.weight_quantization": "gptq_marlin",
            "config.pd_disaggregation": True,
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(8),
            "memory.device_total_bytes": 8 * H20_96GB,
            "inputs.length_p50": 1024,
            "outputs.length_p50": 6,
            "pd.kv_transfer_ttft_share": 0.4,
            "latency.ttft_p50_s": 0.45,
        },
        verdict=(
            "For 1k-token prompts and tiny answers the KV transfer is a large share of TTFT and there is no "
            "decode stream to protect: go back to colocated instances with chunked prefill."
        ),
        statuses={"pd-disaggregation": "not-working"},
        headline=("pitfall", "disaggregation-overhead"),
        pitfalls={"disaggregation-overhead": True},
        classes=("q6-scale", "headline"),
    ),
    Scenario(
        id="q6-scale-disaggregation-working-long-prompts",
        title="SGLang 1P1D on A10 servers for 8k-token prompts: ~30% lower ITL at equal throughput",
        source="https://github.com/sgl-project/sglang/pull/4880",
        source_says=(
            "PR author evaluated Mooncake-backed P/D disaggregation on two A10 servers (Qwen2.5-7B-Instruct-GPTQ-"
            "Int4, TP 4, 8192-token inputs, 512-token outputs, 1 request/s): against two regular instances, 1P1D "
            "gave about 30% lower ITL while keeping comparable total throughput."
        ),
        evidence={
            **SGLANG,
            "engine.model": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
            "config.pd_disaggregation": True,
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(8),
            "inputs.length_p50": 8192,
            "outputs.length_p50": 512,
            "pd.kv_transfer_ttft_share": 0.06,
            "decode.itl_p50_s": 0.0072,
            "decode.itl_p99_s": 0.011,
        },
        verdict="Disaggregation does what it is for on 8k-token prompts and the transfer is cheap: keep it.",
        statuses={"pd-disaggregation": "in-place"},
        pitfalls={"disaggregation-overhead": False},
        not_recommended=("chunked-prefill",),
        classes=("q6-scale", "healthy"),
    ),
    Scenario(
        id="q6-scale-loaded-dp8-itl-follows-prompt-rate",
        title="DeepSeek-R1 on 8 GB200 ranks below saturation: median ITL 275 ms against a 32 ms decode floor",
        source="https://github.com/vllm-project/vllm/pull/44558",
        source_says=(
            "vLLM PR adding a prefill step cadence (DeepSeek-R1-0528 FP4 with FP8 KV, DP=8/TP=1 with expert "
            "parallelism on 2xGB200; 1k-token inputs, 200-token outputs at 24 req/s, below saturation): baseline "
            "P50 ITL 274.9 ms and mean TTFT 813 ms; letting prefills into only every second step removed prefill "
            "interference from most decode steps, P50 ITL fell to 32.1 ms (the CUDA-graph decode floor, ~32 ms) "
            "and throughput stayed flat (22.43 vs 22.59 req/s)."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "deepseek-ai/DeepSeek-R1-0528",
            "config.weight_quantization": "modelopt_fp4",
            "config.kv_cache_dtype": "fp8",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(8),
            "inputs.length_p50": 1000,
            "outputs.length_p50": 200,
            "throughput.requests_per_s": 22.43,
            "throughput.prompt_tokens_per_s": 22430.0,
            "throughput.generation_tokens_per_s": 4486.0,
            "batch.running_mean": 1150.0,  # ~24 req/s x ~48 s per request, over the 8 ranks
            "load.concurrency_mean": 1160.0,
            "queue.waiting_mean": 0.4,
            "kv.usage_p95": 0.5,
            "kv.preemptions": 0,
            "latency.ttft_p50_s": 0.813,
            "decode.itl_p50_s": 0.275,
            "interference.prompt_itl_correlation": 0.8,
        },
        verdict=(
            "ITL follows the prompt rate at a load the ranks carry: prefills stretch the decode steps, so chunked "
            "prefill alone is not bounding them; confirm with the active interference experiment and tune prefill "
            "scheduling (chunk size, prefill cadence) before adding replicas or disaggregating."
        ),
        statuses={"chunked-prefill": "on-unverified"},
        not_recommended=("scale-out", "pd-disaggregation", "speculative-decoding"),
        max_confidence={"Q6": 0.6},
        classes=("q6-scale", "headline"),
    ),
    Scenario(
        id="q6-scale-passive-correlation-on-idle-server",
        title="One request at a time: the 1.3 s first gap of each long prompt correlates ITL with prompt rate",
        source="https://github.com/vllm-project/vllm/issues/15106",
        source_says=(
            "Reporter sends one 5k-token prompt at a time to a vLLM server with chunked prefill and "
            "max_num_batched_tokens 2k: the first streamed chunk (role only) comes after 0.9 s, the first content "
            "token 1.3 s later (the rest of the prefill), then every token takes 0.02 s. The long first gap is "
            "how the chat endpoint emits its first chunk, not decode being slow."
        ),
        evidence={
            **VLLM_V1,
            "config.max_num_batched_tokens": setting(2048),
            "memory.device_count": setting(1),
            "batch.running_mean": 0.3,
            "load.concurrency_mean": 0.3,
            "kv.usage_p95": 0.04,
            "queue.waiting_mean": 0.0,
            "kv.preemptions": 0,
            "outputs.length_cv": 0.4,
            "inputs.length_p50": 5000,
            "throughput.generation_tokens_per_s": 15.0,
            "decode.itl_p50_s": 0.02,
            "decode.itl_p99_s": 0.024,
            "interference.prompt_itl_correlation": 0.72,
            "config.spec_decode": False,
        },
        verdict=(
            "A rank correlation over a near-idle window (a third of a request in flight) cannot show streams "
            "stalled by other prompts: nothing to do here; measure interference actively under load before "
            "touching the chunk or disaggregating."
        ),
        headline=("none-found", ""),
        not_recommended=("chunked-prefill", "pd-disaggregation", "speculative-decoding"),
        max_confidence={"Q6": 0.3},
        classes=("q6-scale", "headline", "unknown"),
    ),
]
