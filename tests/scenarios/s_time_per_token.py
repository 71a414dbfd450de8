"""Where the served time per token goes: the step, or overhead above it (issue 25).

Slow tokens at a small batch were blamed on decode, and speculative decoding was the answer. In
real reports they came from work outside the GPU step (a structured-output mask on the CPU, eager
dispatch, the API server's detokenizer), from the interconnect, from a pathology that appears with
a second stream, or from stalls in the tail. Q5 now sets the served gap against the decode step of
the same model (`llm-diagnose microbench --config ... --run RUN`): close to a memory-bound step,
drafts help; far above it, the overhead is the finding, with its likely sources; without the step
it says what would settle it.

The microbenchmark figures in these scenarios are what `microbench` gives for the named model's
shapes on the named device (weights per device over the copy bandwidth a kernel reaches there;
graph and eager steps where stated), computed here from the published shapes: the sources give
the served figures, not the step.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, Provenance
from tests.evidence_builders import PROV
from tests.scenarios.engines import A100_80GB, H100_80GB, SGLANG, VLLM_V1, setting, speculation
from tests.scenarios.model import Scenario

GIB = 1024**3


def step(seconds: float, method: str) -> Measurement:
    """A decode step as the microbenchmark reports it: `cuda-graph-replay` (the hardware's step on a
    GPU) or `cpu-timer` (eager: the host clock around each call, dispatch included)."""
    return Measurement(seconds, "s", Provenance(method=method, source="microbench (scenario)", taken_at=PROV.taken_at))


VLLM_V0 = {"engine.name": "vllm", "config.continuous_batching": True, "config.paged_kv": True}

# Qwen1.5-14B: hidden 5120, 40 layers, 40 heads (no GQA), intermediate 13696, vocab 152064: 13.4 G
# linear weights, 26.8 GB in bf16, and 0.82 MB of KV per token. At batch 8 over ~700 cached tokens a
# step reads ~31 GB; an H100 SXM copy kernel reaches ~2.9 TB/s (3.35 datasheet): a 10.8 ms floor.
QWEN14B_H100 = {
    **VLLM_V0,
    "engine.model": "Qwen/Qwen1.5-14B-Chat",
    "memory.device_count": setting(1),
    "memory.weights_fraction": 26.8e9 / H100_80GB,
    "batch.running_mean": 10.0,
    "load.concurrency_mean": 10.0,
    "queue.waiting_mean": 0.0,
    "kv.preemptions": 0,
    "machine.memcpy_bytes_per_s": 2.9e12,
    Q.decode_floor_key(8): 31.4e9 / 2.9e12,
    Q.decode_bound_key(8): "memory",
    "config.spec_decode": False,
}

SCENARIOS = [
    Scenario(
        id="tpt-guided-json-far-above-the-step",
        title="Qwen1.5-14B on an H100, 10 concurrent guided_json requests: 160 ms per token against a ~11 ms step",
        source="https://github.com/vllm-project/vllm/issues/3567",
        source_says=(
            "Reporter (H100 80GB, qwen-1.5-14B-chat, vLLM's OpenAI server): at 10 concurrent requests the median "
            "token time is ~20 ms without guided_json and ~160 ms with it; at ~100 running requests 75 ms against "
            "1700 ms. Profiling in the thread finds the time in the guided-decoding logits processor on the CPU "
            "(the FSM's allowed-token list turned into a tensor for every token)."
        ),
        evidence={**QWEN14B_H100, "decode.itl_p50_s": 0.160},
        verdict=(
            "Each token takes 15x the decode step: the time is outside the GPU step (the structured-output mask "
            "on the CPU); speculative decoding or quantization would shorten a step that is not the problem."
        ),
        statuses={"speculative-decoding": "not-indicated"},
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding", "quantization"),
        answers={"Q5": "yes"},
        path={"Q5.step-measured": "yes", "Q5.served-close-to-step": "no"},
        classes=("slow-tokens", "time-per-token", "headline"),
    ),
    Scenario(
        id="tpt-same-server-without-guided-json-nothing-to-fix",
        title="The same Qwen1.5-14B server without guided_json: 20 ms per token at 10 concurrent requests",
        source="https://github.com/vllm-project/vllm/issues/3567",
        source_says=(
            "Same report: without guided_json the median token time at 10 concurrent requests is ~20 ms (GPU "
            "utilization well below 100%)."
        ),
        evidence={**QWEN14B_H100, "decode.itl_p50_s": 0.020},
        verdict="20 ms per token is within an interactive target: nothing to fix in decode.",
        statuses={"speculative-decoding": "not-indicated"},
        headline=("none-found", ""),
        answers={"Q5": "no"},
        path={"Q5.step-measured": "yes"},
        classes=("time-per-token", "healthy"),
    ),
    Scenario(
        id="tpt-eager-thinker-cuda-graphs-off",
        title="Qwen2.5-Omni-7B thinker served with enforce_eager on an A800: 22 ms per token, 13 ms with graphs",
        source="https://github.com/vllm-project/vllm-omni/issues/7960",
        source_says=(
            "Reporter: vllm-omni's deploy YAML sets enforce_eager: true for the thinker and talker on CUDA. On 2x "
            "A800 80GB the 7B thinker's TPOT is ~22-23 ms eager and ~13 ms with CUDA graphs on (the talker ~20 ms "
            "-> ~5.4-6 ms), same outputs; on an H200 the 3B gains 4.3x."
        ),
        evidence={
            **VLLM_V0,
            "engine.model": "Qwen/Qwen2.5-Omni-7B",
            "memory.device_count": setting(1),
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            "decode.itl_p50_s": 0.022,
            # The thinker's decoder (Qwen2.5-7B shapes) reads 14.1 GB per step: 8.1 ms at the ~1.75 TB/s an
            # A800-80GB copy reaches; graph-replayed ~10.5 ms, launched eagerly from Python ~24 ms.
            "machine.memcpy_bytes_per_s": 1.75e12,
            Q.decode_floor_key(1): 14.1e9 / 1.75e12,
            Q.decode_step_latency_key(1): step(0.0105, "cuda-graph-replay"),
            Q.decode_eager_step_latency_key(1): step(0.024, "cpu-timer"),
            Q.decode_bound_key(1): "memory",
            "config.spec_decode": False,
        },
        slo=SLO.from_flags(["itl:p50:15ms"]),  # what graph mode reached on the same GPUs (13 ms), with a margin
        verdict=(
            "The served gap sits at the eager step, twice the graph-replayed one: the engine launches every kernel "
            "from Python; turn CUDA graphs on (drop enforce_eager). Speculative decoding is not the fix."
        ),
        statuses={"speculative-decoding": "not-indicated"},
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding", "quantization"),
        path={"Q5.served-close-to-step": "no"},
        classes=("slow-tokens", "time-per-token"),
    ),
    Scenario(
        id="tpt-detokenizer-client-gap-at-batch-96",
        title="SGLang decode at batch 96: clients see 110 ms between tokens, the scheduler's own step is 60 ms",
        source="https://github.com/sgl-project/sglang/issues/12972",
        source_says=(
            "Reporter (PD deployment): ITL matches decode batch / decode gen throughput at batch <= 32, but at "
            "batch 96 the benchmarked ITL is ~110 ms against ~60 ms from the scheduler's figures. SGLang "
            "maintainers later traced client-side ITL far above scheduler-side ITL at large batches to the "
            "tokenizer/detokenizer processes (sgl-project/sglang#23393, fixed in #23409)."
        ),
        evidence={
            **SGLANG,
            "batch.running_mean": 96.0,
            "load.concurrency_mean": 96.0,
            "decode.itl_p50_s": 0.110,
            "decode.server_itl_mean_s": 0.060,
            "decode.client_server_itl_ratio": 110 / 60,
            "config.spec_decode": False,
        },
        verdict=(
            "Nearly half of each token's gap is spent after the scheduler, in detokenizing and streaming: scale "
            "the tokenizer/detokenizer side; a faster step (drafts, quantization) would not close that gap."
        ),
        statuses={"speculative-decoding": "not-indicated"},
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding", "quantization"),
        path={"Q5.delivery-gap": "yes"},
        classes=("slow-tokens", "time-per-token"),
    ),
    Scenario(
        id="tpt-second-long-context-stream-collapses-decode",
        title="One long-context stream decodes at 22-40 tok/s; with two in decode each drops to ~2 tok/s",
        source="https://github.com/tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark/issues/14",
        source_says=(
            "Reporter (vLLM on two DGX Spark, MTP k=3, 25-100K-token prompts): one request alone decodes at 22-40 "
            "tok/s; the moment two requests are in decode the aggregate collapses to ~4 tok/s (each ~2), with "
            "uniform prompts and at k=1 too. Root cause named: the sparse-attention indexer's decode path off "
            "SM100 has no varlen kernel, so every sequence pays a full-context indexer row per draft token."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "GLM-5.3-Flash-NVFP4",
            "decode.itl_p50_s": 1 / 30,
            "decode.itl_growth_with_concurrency": (1 / 2) / (1 / 30),  # 500 ms gaps at two streams vs ~33 ms
            **speculation("mtp", 3),
            "spec.acceptance_rate": 0.6,
        },
        verdict=(
            "Tokens slow down 15x as soon as a second stream decodes: a kernel pathology at batch > 1, to "
            "investigate (or cap --max-num-seqs 1 meanwhile); not a technique to add."
        ),
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding", "scale-out"),
        path={"Q5.sharp-growth-with-concurrency": "yes"},
        classes=("slow-tokens", "time-per-token"),
    ),
    Scenario(
        id="tpt-tp8-over-pcie-l20",
        title="Qwen1.5-72B on 8x L20 (PCIe, no NVLink) at TP 8: 48 ms per token, 39 ms on an earlier release",
        source="https://github.com/vllm-project/vllm/issues/4852",
        source_says=(
            "Reporter: Qwen1.5-72B on 8x L20, TPOT 48 ms on the latest vLLM against 39 ms on v0.4.0.post1 "
            "(1024-token prompts, one request at a time); a maintainer's later build brought it back to 39 ms "
            "(eager mode). The L20 is a PCIe card: TP 8 all-reduces cross PCIe twice per layer."
        ),
        evidence={
            **VLLM_V0,
            "engine.model": "Qwen/Qwen1.5-72B-Chat",
            "config.tensor_parallel_size": setting(8),
            "memory.device_count": setting(8),
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            "decode.itl_p50_s": 0.048,
            # One TP-8 shard of Qwen1.5-72B reads 142 GB / 8 = 17.8 GB per step: 22.8 ms at the ~0.78 TB/s a
            # copy reaches on an L20 (864 GB/s datasheet).
            "machine.memcpy_bytes_per_s": 0.78e12,
            Q.decode_floor_key(1): 17.8e9 / 0.78e12,
            Q.decode_bound_key(1): "memory",
            "config.spec_decode": False,
        },
        slo=SLO.from_flags(["itl:p50:40ms"]),  # the 39 ms the same deployment reached before
        verdict=(
            "Each token takes twice what one device's shard needs: the 8-way all-reduce over PCIe and the per-step "
            "overhead are the time, not the step; neither drafts nor quantization fix that (fewer devices per "
            "replica would)."
        ),
        statuses={"speculative-decoding": "not-indicated"},
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding", "quantization"),
        path={"Q5.served-close-to-step": "no"},
        classes=("slow-tokens", "time-per-token"),
    ),
    Scenario(
        id="tpt-itl-objective-missed-step-not-measured",
        title="70B on 4xA100 at two streams misses a 15 ms ITL objective; the step was never measured",
        source="https://docs.vllm.ai/en/v0.32.0/features/speculative_decoding/adaptive_verification/",
        source_says=(
            "vLLM's speculative-decoding docs: speculative decoding buys fewer decode steps with more compute; it "
            "pays when the GPU is memory-bound with spare compute. Whether 22 ms per token is the step or overhead "
            "above it is not in the served figures."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.1-70B-Instruct",
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(4),
            "memory.weights_bytes": 141e9,
            "memory.device_total_bytes": 4 * A100_80GB,
            "memory.weights_fraction": 141e9 / A100_80GB,
            "kv.usage_p95": 0.10,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 1.6,
            "load.concurrency_mean": 1.6,
            "decode.itl_p50_s": 0.022,
            "decode.itl_p99_s": 0.027,
            "config.spec_decode": False,
        },
        slo=SLO.from_flags(["itl:p50:15ms"]),
        verdict=(
            "Tokens miss the objective, but without the decode step nobody can say whether drafts would help: "
            "measure the step (microbench from the config) before choosing speculative decoding."
        ),
        statuses={"speculative-decoding": "unknown"},
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding",),
        answers={"Q5": "yes"},
        path={"Q5.step-measured": "no"},
        classes=("slow-tokens", "time-per-token", "unknown"),
    ),
    Scenario(
        id="tpt-long-prompt-tail-not-the-step",
        title="100K-token prompts at two streams on TP8: median ITL 22 ms, p99 310 ms",
        source="https://github.com/vllm-project/vllm/pull/51653",
        source_says=(
            "Benchmark in a vLLM PR (Kimi-K3, 8x MI355X, TP8, ~100K-token prompts): at concurrency 1 ITL p50 21.5 "
            "ms and p99 21.7 ms; at concurrency 2 p50 22.5 ms but p99 310 ms, rising to 373 ms at 32, while TTFT "
            "runs to tens of seconds: the other stream's long prefill."
        ),
        evidence={
            **VLLM_V1,
            "config.tensor_parallel_size": setting(8),
            "memory.device_count": setting(8),
            "batch.running_mean": 2.0,
            "load.concurrency_mean": 2.0,
            "inputs.length_p50": 100_000.0,
            "decode.itl_p50_s": 0.02248,
            "decode.itl_p99_s": 0.310,
            "config.spec_decode": False,
        },
        verdict=(
            "The median gap is fine and the p99 is 14x it: prefill chunks of the other stream's 100K-token prompt "
            "stall decode; measure the interference and tune the chunk; drafts would not touch the tail."
        ),
        statuses={"speculative-decoding": "unknown"},
        headline=("investigate", "Q5"),
        not_recommended=("speculative-decoding",),
        answers={"Q5": "yes"},
        path={"Q5.tail-above-median": "yes"},
        classes=("slow-tokens", "time-per-token", "q6-scale"),
    ),
]
