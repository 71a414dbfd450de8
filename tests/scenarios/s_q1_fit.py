"""Q1 scenarios: the model fits, is overloaded, does not fit, or leaves too little KV cache.

Fit is judged per device (tensor and pipeline parallelism split the weights) and by the KV
capacity the engine reserved, counted in this workload's typical requests; overload (KV full,
queueing, preemptions while the model fits) is a capacity finding, not "quantize".

Device memory comes from tests/scenarios/engines.py; where the source logs vLLM's own total
(23.58 GiB on an RTX 3090) that figure is used.
"""

from __future__ import annotations

from tests.scenarios.engines import A100_80GB as A100_80
from tests.scenarios.engines import GIB, RTX3090_24GB, setting
from tests.scenarios.engines import H100_80GB as H100
from tests.scenarios.engines import L40_48GB as L40
from tests.scenarios.model import Scenario

RTX3090_USABLE = 23.58 * GIB  # what vLLM logs as total_gpu_memory on an RTX 3090

SCENARIOS = [
    Scenario(
        id="q1-small-model-heavy-load-overloaded",
        title="An 8B model under a 1000-request benchmark: KV full and 475 waiting, weights a fifth of the GPU",
        source="https://github.com/vllm-project/vllm/pull/25787",
        source_says=(
            "A vLLM maintainer ran `vllm bench throughput --model NousResearch/Hermes-3-Llama-3.1-8B "
            "--num-prompts 1000 --input-len 1024 --output-len 1024` and logged 'Running: 260 reqs, Waiting: "
            "475 reqs, GPU KV cache usage: 100.0%' at ~7100 generated tokens/s: a small model whose KV cache "
            "is full because hundreds of requests run at once (GPU not named in the PR; an H100 80 GB assumed)."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "NousResearch/Hermes-3-Llama-3.1-8B",
            "engine.max_model_len": setting(131072),
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.gpu_memory_utilization": setting(0.9),
            "memory.weights_bytes": 16.1e9,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 16.1e9 / H100,
            # ~54 GiB of KV at 128 KiB per token; the engine's own figure is per max_model_len (131072).
            "kv.capacity_tokens": 445_000,
            "kv.max_concurrency": 3.4,
            "inputs.length_p50": 1024,
            "outputs.length_p50": 1024,
            "kv.usage_p95": 1.0,
            "kv.preemptions": 180,
            "queue.waiting_mean": 475,
            "batch.running_mean": 260,
            "load.concurrency_mean": 735,
            "throughput.generation_tokens_per_s": 7097.7,
        },
        verdict=(
            "The model fits with room to spare (weights ~19% of the GPU, the cache holds ~200 of these "
            "2k-token requests); the full cache and the queue are load: add replicas or cap admission "
            "(--max-num-seqs), fp8 KV is a capacity lever; quantizing the weights is not the fix."
        ),
        verdicts={"Q1": "overloaded"},
        answers={"Q1": "yes"},
        statuses={"scale-out": "recommended"},
        not_recommended=("quantization", "parallelism"),
        classes=("fit",),
    ),
    Scenario(
        id="q1-tp4-70b-fp8-fits-per-device",
        title="Llama 3 70B FP8 on 4x H100 with TP=4: all weights are 84% of one GPU, a fifth of each",
        source="https://github.com/vllm-project/vllm/issues/8089",
        source_says=(
            "Llama 3 70B FP8 served with vLLM on H100s with tensor parallelism 4 (the reporter saw no gain "
            "going beyond TP=4); a maintainer (youkaichao) answered that an unnecessarily large TP size hurts "
            "through communication overhead, and that the '# GPU blocks' log times the block size gives the "
            "tokens the KV cache holds."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Meta-Llama-3-70B-Instruct-FP8",
            "config.tensor_parallel_size": setting(4),
            "config.pipeline_parallel_size": setting(1),
            "memory.device_count": setting(4),
            "config.gpu_memory_utilization": setting(0.9),
            "config.weight_quantization": "fp8",
            "config.kv_cache_dtype": "auto",
            "memory.weights_bytes": 72e9,
            "memory.device_total_bytes": 4.0 * H100,
            "memory.weights_fraction": 72e9 / H100,  # all weights over ONE device: 0.84
            "kv.capacity_tokens": 680_000,  # ~56 GB per GPU x 4 at 320 KiB per token (bf16 KV, GQA 8)
            "inputs.length_p50": 2000,
            "outputs.length_p50": 1000,
            "kv.usage_p95": 0.15,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 30,
            "load.concurrency_mean": 30,
            "throughput.generation_tokens_per_s": 950.0,
        },
        verdict=(
            "The weights are 84% of one GPU but split four ways (21% per GPU), and the cache holds ~225 "
            "of these 3k-token requests while 30 run: the model fits; nothing to quantize or split further."
        ),
        verdicts={"Q1": "fits"},
        answers={"Q1": "yes"},
        not_recommended=("quantization", "parallelism", "scale-out"),
        classes=("fit",),
    ),
    Scenario(
        id="q1-405b-tp8-pp2-fits-per-device",
        title="Llama 3.1 405B BF16 over 2 nodes x 8 H100 (TP=8, PP=2): 9.5 GPUs of weights, 59% of each",
        source="https://docs.vllm.ai/en/v0.8.3/serving/distributed_serving.html",
        source_says=(
            "vLLM's distributed serving guide: a model too large for one node uses tensor parallelism within "
            "a node and pipeline parallelism across nodes; with 16 GPUs in 2 nodes, tensor parallel size 8 and "
            "pipeline parallel size 2; add GPUs and nodes until there is enough memory to hold the model."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-405B-Instruct",
            "config.tensor_parallel_size": setting(8),
            "config.pipeline_parallel_size": setting(2),
            "memory.device_count": setting(16),
            "config.gpu_memory_utilization": setting(0.9),
            "config.weight_quantization": "none",
            "memory.weights_bytes": 812e9,
            "memory.device_total_bytes": 16.0 * H100,
            "memory.weights_fraction": 812e9 / H100,  # 9.5: all weights over one GPU
            "kv.capacity_tokens": 700_000,  # ~23 GB per GPU x 16 at ~504 KiB per token
            "inputs.length_p50": 1800,
            "outputs.length_p50": 600,
            "kv.usage_p95": 0.32,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.1,
            "batch.running_mean": 48,
            "load.concurrency_mean": 48,
            "throughput.generation_tokens_per_s": 1400.0,
        },
        verdict=(
            "Split over 16 GPUs each holds 59% of the weights, and the cache keeps ~290 typical requests "
            "while 48 run: the model fits as deployed; 'does not fit one device' would be wrong."
        ),
        verdicts={"Q1": "fits"},
        answers={"Q1": "yes"},
        not_recommended=("quantization", "parallelism"),
        not_flagged=("memory.weights_fraction",),  # 9.5 of one GPU is the model's size, not bad input
        classes=("fit", "sanity"),
    ),
    Scenario(
        id="q1-70b-bf16-one-a100-does-not-fit",
        title="Llama 3 70B BF16 on a single A100 80 GB: ~140 GB of weights, OOM at load",
        source="https://github.com/vllm-project/vllm/issues/5711",
        source_says=(
            "Loading Llama 3 70B on one A100 failed with CUDA OOM; a maintainer (mgoin) answered that at BF16 "
            "it needs ~140 GB just for the weights, so at least 2x A100 80GB (more for KV cache), or a 4-bit "
            "GPTQ version of ~40 GB on one GPU."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Meta-Llama-3-70B-Instruct",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.weight_quantization": "none",
            "memory.weights_bytes": 141e9,
            "memory.device_total_bytes": float(A100_80),
            "memory.weights_fraction": 141e9 / A100_80,  # 1.64
        },
        verdict="The weights alone are 1.6 GPUs: split them (TP=2 or more) or quantize to 4 bits to fit one GPU.",
        verdicts={"Q1": "does-not-fit"},
        answers={"Q1": "no"},
        statuses={"parallelism": "recommended", "quantization": "recommended"},
        not_flagged=("memory.weights_fraction",),  # above 1 is what "does not fit" means, not bad input
        classes=("fit", "sanity"),
    ),
    Scenario(
        id="q1-70b-w8a8-one-h100-tight",
        title="Llama 3.1 70B W8A8 on one H100 at gpu-memory-utilization 0.98: weights 86%, 22k KV tokens",
        source="https://github.com/vllm-project/vllm/pull/12569",
        source_says=(
            "A vLLM maintainer (mgoin) served neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8 with "
            "--max-model-len 2048 --gpu-memory-utilization 0.98: 'Loading model weights took 67.7229 GB', "
            "'# GPU blocks: 1381', 'Maximum concurrency for 2048 tokens per request: 10.79x'."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8",
            "engine.max_model_len": setting(2048),
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.gpu_memory_utilization": setting(0.98),
            "config.weight_quantization": "compressed-tensors",
            "config.kv_cache_dtype": "auto",
            "memory.weights_bytes": 67.7229 * GIB,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 67.7229 * GIB / H100,  # 0.85
            "kv.capacity_tokens": 1381 * 16,
            "kv.max_concurrency": 10.79,
        },
        verdict=(
            "Even at W8A8 the weights take 85% of the GPU and leave ~22k KV tokens (11 requests of "
            "2k): tight; quantize the KV cache (fp8) or spread over two GPUs for room."
        ),
        verdicts={"Q1": "tight"},
        answers={"Q1": "no"},
        not_recommended=("scale-out",),
        classes=("fit",),
    ),
    Scenario(
        id="q1-8b-rtx3090-long-rag-kv-too-small",
        title="Llama 3.1 8B on an RTX 3090 with 12k-token prompts: the KV cache holds 2.5 requests",
        source="https://github.com/vllm-project/vllm/issues/10517",
        source_says=(
            "Llama-3.1-8B-Instruct on an RTX 3090 (total_gpu_memory=23.58GiB, gpu_memory_utilization=0.90): "
            "'Loading model weights took 14.9888 GB', kv_cache_size=3.81GiB, '# GPU blocks: 1952', "
            "'Maximum concurrency for 20000 tokens per request: 1.56x'; at 29k max-model-len the engine "
            "refuses to start because one sequence no longer fits the KV cache."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "engine.max_model_len": setting(20000),
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.gpu_memory_utilization": setting(0.9),
            "config.kv_cache_dtype": "auto",
            "memory.weights_bytes": 14.9888 * GIB,
            "memory.device_total_bytes": RTX3090_USABLE,
            "memory.weights_fraction": 14.9888 / 23.58,
            "kv.capacity_tokens": 1952 * 16,
            "kv.max_concurrency": 1.56,
            "inputs.length_p50": 12000,
            "outputs.length_p50": 600,
            "kv.usage_p95": 0.98,
            "kv.preemptions": 14,
            "queue.waiting_mean": 3.6,
            "batch.running_mean": 2.4,
            "load.concurrency_mean": 6.0,
            "throughput.generation_tokens_per_s": 95.0,
        },
        verdict=(
            "31k KV tokens hold only ~2.5 of these 12.6k-token requests: the KV cache is too small for "
            "this workload (fp8 KV doubles it; a larger GPU or TP=2 more), whatever the load."
        ),
        verdicts={"Q1": "kv-too-small"},
        answers={"Q1": "no"},
        classes=("fit",),
    ),
    Scenario(
        id="q1-qwq32b-fp8-l40-reasoning-kv-too-small",
        title="QwQ-32B FP8 on one L40 48 GB: two reasoning requests fill the KV cache",
        source="https://github.com/vllm-project/vllm/issues/14412",
        source_says=(
            "QwQ-32B-FP8-Dynamic on a single L40 48 GB (vLLM V1, --max-num-seqs 20 --max_model_len 32000 "
            "--gpu-memory-utilization 0.95); the reporter asks why only two requests bring the GPU KV cache "
            "usage to 100% and what decides the KV cache size."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/QwQ-32B-FP8-Dynamic",
            "engine.max_model_len": setting(32000),
            "config.max_num_seqs": setting(20),
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.gpu_memory_utilization": setting(0.95),
            "config.weight_quantization": "fp8",
            "config.kv_cache_dtype": "auto",
            "memory.weights_bytes": 34e9,
            "memory.device_total_bytes": float(L40),
            "memory.weights_fraction": 34e9 / L40,  # 0.70
            "kv.capacity_tokens": 35_800,
            "kv.max_concurrency": 1.12,  # ~9.4 GB at 256 KiB per token
            "inputs.length_p50": 400,
            "outputs.length_p50": 12000,
            "kv.usage_p95": 1.0,
            "kv.preemptions": 9,
            "queue.waiting_mean": 8.0,
            "batch.running_mean": 2.2,
            "load.concurrency_mean": 10.2,
            "throughput.generation_tokens_per_s": 48.0,
        },
        verdict=(
            "Weights take 70% of the L40 and the rest holds ~36k tokens, under three 12k-token reasoning "
            "requests: the KV cache is too small for this workload (fp8 KV, a second GPU)."
        ),
        verdicts={"Q1": "kv-too-small"},
        answers={"Q1": "no"},
        pitfalls={"batch-not-growing": False},
        classes=("fit",),
    ),
    Scenario(
        id="q1-two-running-preempted-at-82pct-kv-too-small",
        title="Requests move from running to pending while KV usage reads 82%: two requests fill the cache",
        source="https://github.com/vllm-project/vllm/issues/3094",
        source_says=(
            "Testing with many concurrent users, requests change from Running to Pending (never Swapped) "
            "while the log shows 'Running: 2 reqs, Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: "
            "82.1%'; closed as a duplicate of #2853 (model and GPU not given; a 7B FP16 model on a 24 GB "
            "GPU assumed)."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-2-7b-chat-hf",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_bytes": 13.5e9,
            "memory.device_total_bytes": float(RTX3090_24GB),
            "memory.weights_fraction": 13.5e9 / RTX3090_24GB,
            "kv.capacity_tokens": 15_000,  # ~7.9 GB at 512 KiB per token (MHA, 32 heads)
            "inputs.length_p50": 3500,
            "outputs.length_p50": 1500,
            # A gauge scraped every few seconds: the moments the cache ran out fall between scrapes.
            "kv.usage_p95": 0.86,
            "kv.preemptions": 9,
            "queue.waiting_mean": 3.0,
            "batch.running_mean": 2.0,
            "load.concurrency_mean": 5.0,
            "throughput.generation_tokens_per_s": 55.0,
        },
        verdict=(
            "Preemptions with KV p95 at 86% are the cache running out between scrapes; at 15k tokens it "
            "holds three 5k-token requests: the KV cache is too small for this workload."
        ),
        verdicts={"Q1": "kv-too-small"},
        answers={"Q1": "no"},
        classes=("fit",),
    ),
    Scenario(
        id="q1-preemptions-under-saturation-line-overloaded",
        title="An 8B chat server on an H100 preempts 37 times while sampled KV p95 reads 88%",
        source="https://docs.vllm.ai/en/v0.9.1/configuration/optimization.html",
        source_says=(
            "vLLM's tuning guide: when the KV cache is insufficient for all batched requests vLLM preempts "
            "requests (warning 'Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode because there "
            "is not enough KV cache space') and recomputes them later, which hurts end-to-end latency; "
            "remedies: raise gpu_memory_utilization, lower max_num_seqs or max_num_batched_tokens, raise "
            "tensor_parallel_size; monitor the preemption count through the Prometheus metrics."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "engine.max_model_len": setting(32768),
            "config.max_num_seqs": setting(256),
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.gpu_memory_utilization": setting(0.9),
            "memory.weights_bytes": 16.1e9,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 16.1e9 / H100,
            "kv.capacity_tokens": 445_000,
            "kv.max_concurrency": 13.6,
            "inputs.length_p50": 1500,
            "outputs.length_p50": 1200,
            "kv.usage_p95": 0.88,
            "kv.preemptions": 37,
            "queue.waiting_mean": 6.5,
            "batch.running_mean": 150,
            "load.concurrency_mean": 156.5,
            "throughput.generation_tokens_per_s": 5200.0,
        },
        verdict=(
            "Preemptions and a queue with KV p95 just under 90% still mean the cache ran out; the model "
            "fits (weights 19%, ~165 typical requests fit), so this is load: add replicas or cap "
            "--max-num-seqs, fp8 KV as a capacity lever."
        ),
        verdicts={"Q1": "overloaded"},
        answers={"Q1": "yes"},
        statuses={"scale-out": "recommended"},
        headline=("capacity", "scale-out"),
        not_recommended=("quantization", "parallelism"),
        classes=("fit",),
    ),
    Scenario(
        id="q1-one-request-near-idle-untested",
        title="KV cache usage is 'very low' on a server that runs one request at a time",
        source="https://github.com/vllm-project/vllm/issues/5626",
        source_says=(
            "Asked why GPU KV cache usage stays very low, a maintainer (richardliaw) answered that with only "
            "one request running the KV cache is unlikely to fill up (model and GPU not given; a 7B model on "
            "an A100 80 GB assumed)."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-2-7b-chat-hf",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_bytes": 13.5e9,
            "memory.device_total_bytes": float(A100_80),
            "memory.weights_fraction": 13.5e9 / A100_80,
            "kv.capacity_tokens": 110_000,
            "inputs.length_p50": 600,
            "outputs.length_p50": 350,
            "kv.usage_p95": 0.012,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            "throughput.generation_tokens_per_s": 38.0,
        },
        verdict=(
            "The weights fit, but one request at a time never tested how many the server can hold: "
            "'fits' with low confidence, and nothing to scale."
        ),
        verdicts={"Q1": "untested"},
        answers={"Q1": "yes"},
        max_confidence={"Q1": 0.5},
        not_recommended=("scale-out", "quantization", "parallelism"),
        classes=("fit", "confidence"),
    ),
    Scenario(
        id="q1-70b-fp8-data-parallel-2-weights-not-split",
        title="Llama 3.1 70B FP8 as two data-parallel replicas on 2x H100: each GPU still holds all 72 GB",
        source="https://docs.vllm.ai/en/v0.12.0/serving/data_parallel_deployment/",
        source_says=(
            "vLLM's data parallel deployment replicates the model weights across separate instances/GPUs to "
            "process independent batches of requests; each DP rank is a separate engine core, combinable "
            "with tensor parallelism inside each rank."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
            "engine.max_model_len": setting(8192),
            "config.tensor_parallel_size": setting(1),
            "config.pipeline_parallel_size": setting(1),
            "memory.device_count": setting(2),
            "config.gpu_memory_utilization": setting(0.9),
            "config.weight_quantization": "fp8",
            "config.kv_cache_dtype": "auto",
            "memory.weights_bytes": 72e9,
            "memory.device_total_bytes": 2.0 * H100,
            "memory.weights_fraction": 72e9 / H100,  # 0.84 of each GPU: replicas do not split weights
            "kv.capacity_tokens": 9_800,
            "kv.max_concurrency": 1.2,  # per replica, ~3 GB at 320 KiB/token
            "inputs.length_p50": 1500,
            "outputs.length_p50": 400,
            "kv.usage_p95": 0.93,
            "kv.preemptions": 3,
            "queue.waiting_mean": 1.2,
            "batch.running_mean": 8,
            "load.concurrency_mean": 9.2,
        },
        verdict=(
            "Two GPUs as two replicas each carry the whole 72 GB: 84% of every device, ~5 typical "
            "requests of KV per replica: tight; dividing the weights by the device count would be wrong "
            "(TP=2 in one replica would halve them)."
        ),
        verdicts={"Q1": "tight"},
        answers={"Q1": "no"},
        not_recommended=("scale-out",),
        classes=("fit",),
    ),
    Scenario(
        id="q1-qwen3-14b-32k-prompts-kv-too-small-from-engine-figure",
        title="Qwen3-14B with 32.6k-token prompts; the engine logs 'Maximum concurrency for 32,768 tokens: 1.30x'",
        source="https://github.com/LMCache/LMCache/issues/1739",
        source_says=(
            "A single-GPU vLLM test of Qwen3-14B logs 'Available KV cache memory: 6.51 GiB', 'GPU KV cache size: "
            "42,656 tokens' and 'Maximum concurrency for 32,768 tokens per request: 1.30x'; the reporter sends "
            "32,600-token prompts so that one prompt takes ~70% of the GPU KV cache and a second evicts the "
            "first (GPU not named; a 48 GB card assumed)."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/Qwen3-14B",
            "engine.max_model_len": setting(32768),
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "config.gpu_memory_utilization": setting(0.9),
            "memory.weights_bytes": 29.5e9,
            "memory.device_total_bytes": float(L40),
            "memory.weights_fraction": 29.5e9 / L40,
            # Only the engine's own figure: capacity = 1.30 x 32,768 tokens.
            "kv.capacity_tokens": None,
            "kv.max_concurrency": 1.30,
            "inputs.length_p50": 32600,
            "outputs.length_p50": 1,
            "kv.usage_p95": 0.76,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.6,
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.6,
        },
        verdict=(
            "The engine's own figure says the cache holds 1.3 requests of 32k tokens, and this workload's "
            "requests are 32.6k: one at a time fits; the KV cache is too small for it."
        ),
        verdicts={"Q1": "kv-too-small"},
        answers={"Q1": "no"},
        not_recommended=("scale-out",),
        classes=("fit",),
    ),
]
