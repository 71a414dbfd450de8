"""Cases a reviewer built by hand against the issue-13 judgement, each tied to a public source
where the same situation was reported: a queue while the KV cache is half used, an overloaded
server with AWQ weights, speculative decoding judged at a large batch, a near-idle server Q1
could not judge, impossible or misspelt evidence, and slow tokens beside an unverified technique.
"""

from __future__ import annotations

from llm_diagnose.probes.results import Measurement, Provenance
from tests.scenarios.engines import setting, speculation
from tests.scenarios.model import Scenario

# The live /metrics window (llm_diagnose.probes.metrics.passive), as opposed to a hand-built value.
_LIVE = Provenance(
    method="prometheus",
    source="http://127.0.0.1:8000/metrics",
    taken_at="2026-12-02T00:00:00.000+00:00",
    window_s=120.0,
)


def _live(value: float, unit: str) -> Measurement:
    return Measurement(float(value), unit, _LIVE)


SCENARIOS = [
    Scenario(
        id="review-queue-with-kv-85pct-no-preemption-overloaded",
        title="Requests wait (5 on average) with the KV cache at 85% and nothing preempted",
        source="https://github.com/vllm-project/vllm/issues/3094",
        source_says=(
            "Under many concurrent users the vLLM log shows requests moving from Running to Pending with "
            "'Swapped: 0 reqs', 'Pending: 3 reqs' and 'GPU KV cache usage: 82.1%': requests queue while the "
            "cache is well used but not full, and nothing is swapped or preempted."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.32.0",
            "memory.weights_fraction": 0.3,
            "config.tensor_parallel_size": setting(1),
            "kv.usage_p95": 0.85,
            "queue.waiting_mean": 5.0,
            "kv.preemptions": 0.0,
            "batch.running_mean": 30.0,
            "throughput.generation_tokens_per_s": 1500.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.06,
        },
        verdict=(
            "Requests queue while most of the cache is in use: the server is at capacity for this load "
            "(more replicas or admission limits), not idle and not held back by a scheduler cap."
        ),
        verdicts={"Q1": "overloaded"},
        headline=("capacity", "scale-out"),
        statuses={"scale-out": "recommended"},
        pitfalls={"batch-not-growing": False},
        classes=("fit", "headline"),
    ),
    Scenario(
        id="review-queue-with-kv-60pct-overloaded-not-none-found",
        title="Requests wait (5 on average) with the KV cache at 60%: load, not 'no bottleneck'",
        source="https://docs.vllm.ai/en/v0.9.1/configuration/optimization.html",
        source_says=(
            "vLLM's optimization guide: when the KV cache cannot hold all requests, requests are queued or "
            "preempted; to handle more load, increase capacity (more KV space, tensor/pipeline parallelism) "
            "or run more instances."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.32.0",
            "memory.weights_fraction": 0.3,
            "config.tensor_parallel_size": setting(1),
            "kv.usage_p95": 0.6,
            "queue.waiting_mean": 5.0,
            "kv.preemptions": 0.0,
            "batch.running_mean": 30.0,
            "throughput.generation_tokens_per_s": 1500.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.06,
        },
        verdict=(
            "Five requests wait on average while the cache is more than half used: the batch is capped by "
            "load, a capacity finding; 'no bottleneck found' would be wrong."
        ),
        verdicts={"Q1": "overloaded"},
        headline=("capacity", "scale-out"),
        pitfalls={"batch-not-growing": False},
        classes=("fit", "headline"),
    ),
    Scenario(
        id="review-queue-with-kv-30pct-batch-not-growing",
        title="Requests wait (8 on average) with the KV cache at 30% and max_num_seqs 16: a scheduler cap",
        source="https://github.com/vllm-project/vllm/issues/13508",
        source_says=(
            "Qwen2.5-72B-AWQ on 4x4090 with --max-num-seqs 64: the deployment shows low GPU KV cache usage, "
            "few running requests and many pending ones, and the reporter asks which setting holds it back."
        ),
        evidence={
            "engine.name": "vllm",
            "memory.weights_fraction": 0.3,
            "kv.usage_p95": 0.3,
            "queue.waiting_mean": 8.0,
            "batch.running_mean": 16.0,
            "throughput.generation_tokens_per_s": 800.0,
            "config.max_num_seqs": setting(16),
        },
        verdict="Requests wait while most of the cache is free: a scheduler limit caps the batch; raise it.",
        headline=("pitfall", "batch-not-growing"),
        pitfalls={"batch-not-growing": True},
        not_recommended=("scale-out",),
        classes=("pitfall-scheme",),
    ),
    Scenario(
        id="review-awq-overloaded-not-told-to-quantize",
        title="AWQ 13B with the KV cache full, 30 preemptions and a queue: capacity, not quantization",
        source="https://github.com/vllm-project/vllm/issues/1206",
        source_says=(
            "Serving TheBloke/Wizard-Vicuna-13B-Uncensored-AWQ with --quantization awq, users report that once "
            "'GPU KV cache usage' reaches 100% under load the server stalls; maintainers ask for the command "
            "line and suggest cache and swap settings."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.32.0",
            "memory.weights_fraction": 0.1,
            "config.weight_quantization": "awq_marlin",
            "config.kv_cache_dtype": "auto",
            "config.tensor_parallel_size": setting(1),
            "kv.usage_p95": 0.97,
            "queue.waiting_mean": 6.0,
            "kv.preemptions": 30.0,
            "batch.running_mean": 24.0,
            "throughput.generation_tokens_per_s": 1500.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.06,
        },
        verdict=(
            "The weights take a tenth of the device and load fills the cache: add replicas or cap "
            "admission; the AWQ weights are in place and blaming them would contradict that."
        ),
        headline=("capacity", "scale-out"),
        statuses={"quantization": "in-place", "scale-out": "recommended"},
        pitfalls={"weight-only-quantization": False},
        classes=("fit", "pitfall-scheme", "headline"),
    ),
    Scenario(
        id="review-eagle3-at-batch-160-not-judged-by-batch-alone",
        title="EAGLE-3 with 3 drafts at 160 running sequences, 3.5 tokens per step: not judged without ITL off",
        source="https://github.com/SafeAILab/EAGLE/issues/269",
        source_says=(
            "EAGLE-3 under rising concurrency on ShareGPT: each step still yields extra tokens, but per-step "
            "latency grows up to 3x, so throughput falls below the baseline; the authors suggest not using "
            "the tree for batch sizes above 1. Only measuring with and without it showed the loss."
        ),
        evidence={
            "engine.name": "vllm",
            **speculation("eagle3", 3),
            "spec.mean_acceptance_length": 3.5,
            "batch.running_mean": 160.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.06,
            "throughput.generation_tokens_per_s": 5000.0,
        },
        verdict=(
            "Whether drafts pay at 160 sequences depends on how compute-bound the step is: measure ITL "
            "with it off before calling acceptance low (3.5 of 4 tokens per step is high)."
        ),
        pitfalls={"spec-decode-low-acceptance": None},
        statuses={"speculative-decoding": "on-unverified"},
        classes=("slow-tokens",),
    ),
    Scenario(
        id="review-mtp-at-batch-140-not-judged-by-batch-alone",
        title="MTP with one draft at 140 running sequences, 1.9 tokens per step: not judged without ITL off",
        source="https://docs.vllm.ai/en/latest/features/speculative_decoding/dynamic_speculative_decoding/",
        source_says=(
            "vLLM's dynamic speculative decoding: the best number of speculative tokens falls as the batch "
            "grows, because verification competes with the batch for compute; at large batches it lowers "
            "or disables speculation based on measured cost."
        ),
        evidence={
            "engine.name": "vllm",
            **speculation("mtp", 1),
            "spec.mean_acceptance_length": 1.9,
            "batch.running_mean": 140.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.06,
            "throughput.generation_tokens_per_s": 5000.0,
        },
        verdict=(
            "90% of one draft accepted at batch 140: whether it pays is a matter of step cost, measured "
            "with it off, not of acceptance."
        ),
        pitfalls={"spec-decode-low-acceptance": None},
        statuses={"speculative-decoding": "on-unverified"},
        not_recommended=("speculative-decoding",),
        classes=("slow-tokens",),
    ),
    Scenario(
        id="review-eagle3-small-batch-low-acceptance",
        title="EAGLE-3 with 3 drafts at batch 4 yields 1.2 tokens per step: the drafts do not pay",
        source="https://github.com/vllm-project/vllm/pull/16937",
        source_says=(
            "EAGLE-3 support in vLLM V1: at batch 1 on H100 the speedup depends on the acceptance length per "
            "K; drafting more tokens costs more, so a K whose acceptance length does not rise is slower."
        ),
        evidence={
            "engine.name": "vllm",
            **speculation("eagle3", 3),
            "spec.mean_acceptance_length": 1.2,
            "batch.running_mean": 4.0,
            "decode.itl_p50_s": 0.03,
            "decode.itl_p99_s": 0.06,
            "throughput.generation_tokens_per_s": 500.0,
        },
        verdict=(
            "At batch 4 the verify step is nearly free, yet 1.2 tokens per step from 3 drafts does not "
            "pay: fewer drafts or a draft trained on this traffic (it already runs EAGLE-3)."
        ),
        pitfalls={"spec-decode-low-acceptance": True},
        statuses={"speculative-decoding": "not-working"},
        headline=("pitfall", "spec-decode-low-acceptance"),
        classes=("slow-tokens",),
    ),
    Scenario(
        id="review-near-idle-live-window-q1-unknown",
        title="0.1 requests in flight, 3 tokens/s, nothing about memory: near idle, nothing measured",
        source="https://github.com/vllm-project/vllm/issues/5626",
        source_says=(
            "'Why is the GPU KV cache usage very low?' A maintainer answers that with only one request "
            "running the KV cache is unlikely to fill."
        ),
        evidence={
            "engine.name": "vllm",
            "batch.running_mean": _live(0.1, "requests"),
            "queue.waiting_mean": _live(0.0, "requests"),
            "throughput.generation_tokens_per_s": _live(3.0, "1/s"),
            "decode.itl_p50_s": _live(0.02, "s"),
            "decode.itl_p99_s": _live(0.03, "s"),
        },
        verdict="A near-idle window says how one request went, not how the server serves: nothing measured.",
        headline=("nothing-measured", ""),
        answers={"Q1": "unknown"},
        classes=("too-little", "headline"),
    ),
    Scenario(
        id="review-slow-tokens-spec-on-unverified-headline-verify",
        title="80 ms per token at batch 4 with speculative decoding on and no acceptance counters",
        source="https://github.com/vllm-project/vllm/issues/7301",
        source_says=(
            "Speculative decoding is enabled but its acceptance metrics do not show up in vLLM's Prometheus "
            "endpoint, so whether drafts are accepted cannot be seen from /metrics."
        ),
        evidence={
            "engine.name": "vllm",
            "config.spec_decode": True,
            "decode.itl_p50_s": 0.08,
            "decode.itl_p99_s": 0.1,
            "batch.running_mean": 4.0,
            "throughput.generation_tokens_per_s": 300.0,
        },
        verdict=(
            "Tokens are slow and speculative decoding is on but unverified: verify it (acceptance "
            "counters, or ITL with it off) before anything else; 'no bottleneck' contradicts Q5."
        ),
        answers={"Q5": "yes"},
        headline=("verify", "speculative-decoding"),
        statuses={"speculative-decoding": "on-unverified"},
        classes=("slow-tokens", "headline", "unknown"),
    ),
    Scenario(
        id="review-negative-kv-usage-sets-no-headline",
        title="KV usage p95 of -20% beside a queue: the batch-not-growing pitfall cannot stand on it",
        source="https://github.com/ModelEngine-Group/unified-cache-management/pull/941",
        source_says=(
            "A cache metric computed from counters read at different moments came out negative; the PR fixes "
            "how the ratio is computed."
        ),
        evidence={
            "engine.name": "vllm",
            "memory.weights_fraction": 0.3,
            "kv.usage_p95": -0.2,
            "queue.waiting_mean": 3.0,
            "batch.running_mean": 8.0,
            "throughput.generation_tokens_per_s": 500.0,
        },
        verdict="An impossible KV usage decides nothing: flag it, check no pitfall on it, headline nothing.",
        sanity_keys=("kv.usage_p95",),
        pitfalls={"batch-not-growing": None},
        headline=("nothing-measured", ""),
        max_confidence={"Q1": 0.4},
        classes=("sanity", "headline"),
    ),
    Scenario(
        id="review-weights-fraction-1e308",
        title="memory.weights_fraction of 1e308: a parsing error, flagged, not a model 1e308 devices large",
        source="https://prometheus.io/docs/instrumenting/exposition_formats/",
        source_says=(
            "The Prometheus text format carries sample values as Go ParseFloat floats, including +Inf and "
            "values up to 1.8e308: a mis-scaled or mis-parsed sample travels as a valid number."
        ),
        evidence={
            "engine.name": "vllm",
            "memory.weights_fraction": 1e308,
            "kv.usage_p95": 0.6,
            "batch.running_mean": 20.0,
            "queue.waiting_mean": 0.0,
            "throughput.generation_tokens_per_s": 1000.0,
        },
        verdict="Weights 1e308 times a device is a unit or parsing error: flag it and do not act on Q1.",
        sanity_keys=("memory.weights_fraction",),
        max_confidence={"Q1": 0.4},
        not_recommended=("parallelism", "quantization"),
        classes=("sanity",),
    ),
    Scenario(
        id="review-tensor-parallel-zero",
        title="config.tensor_parallel_size of 0: flagged, never read as one device",
        source="https://docs.vllm.ai/en/v0.8.3/serving/distributed_serving.html",
        source_says=(
            "vLLM's distributed serving guide: --tensor-parallel-size is the number of GPUs a model is split "
            "over, at least 1 (a single GPU when no parallelism is used)."
        ),
        evidence={
            "engine.name": "vllm",
            "memory.weights_fraction": 0.3,
            "config.tensor_parallel_size": setting(0),
            "kv.usage_p95": 0.6,
            "batch.running_mean": 20.0,
            "queue.waiting_mean": 0.0,
            "throughput.generation_tokens_per_s": 1000.0,
        },
        verdict="A parallel degree of 0 cannot be: flag it and doubt the fit answer that divides by it.",
        sanity_keys=("config.tensor_parallel_size",),
        max_confidence={"Q1": 0.4},
        classes=("sanity",),
    ),
    Scenario(
        id="review-misspelt-evidence-key-flagged",
        title="An evidence file names kv.usage_p59 (misspelt) beside a microbenchmark at batch 512",
        source="https://github.com/vllm-project/vllm/pull/27133",
        source_says=(
            "vLLM's Grafana dashboard queried the outdated metric name gpu_cache_usage_perc after it became "
            "kv_cache_usage_perc, so the cache panel silently showed nothing until the name was fixed."
        ),
        evidence={
            "engine.name": "vllm",
            "memory.weights_fraction": 0.3,
            "kv.usage_p59": 0.6,
            "decode.bound_b512": "compute",
            "batch.running_mean": 20.0,
            "queue.waiting_mean": 0.0,
            "throughput.generation_tokens_per_s": 1000.0,
        },
        verdict=(
            "A key no probe defines is most likely misspelt: say so instead of ignoring it; a per-batch "
            "key at a size outside the registered list is still a known key."
        ),
        sanity_keys=("kv.usage_p59",),
        not_flagged=("decode.bound_b512", "memory.weights_fraction"),
        classes=("sanity",),
    ),
]
