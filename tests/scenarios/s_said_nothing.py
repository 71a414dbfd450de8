"""Saying little is not being right (issue 25, part 3): where the evidence holds a verdict, the
tree says it, with its reason and its confidence, instead of "nothing measured" or "none found".

- Disaggregation on at a size or shape where the KV transfer and the idle pools cost more than the
  interference they remove (one prefill and one decode instance): the disaggregation-overhead
  pitfall from the deployment's shape where the transfer time itself was not measured.
- Pipeline parallelism on one node where tensor parallelism over the same devices serves the
  latency goal: parallelism `not-working` (fix the layout).
- A prefix-cache hit rate that is the engine's own rolling figure: never read as this workload's
  hit or miss; the active prefix experiment's repeats say whether the cache works.

Each has healthy counterparts the new rules must leave alone: disaggregation at scale, pipeline
stages across nodes or for an offline batch, and a hit rate counted over the run's own window.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, Provenance
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import PROV
from tests.scenarios.engines import GIB, H100_80GB, SGLANG, VLLM_V1, setting
from tests.scenarios.model import Scenario

A100_40GB = 40 * GIB
L40S_48GB = 45 * GIB  # as NVML reports it

# What the live probe records from an engine's hit-rate gauge (llm_diagnose/probes/metrics/passive/prefix.py):
# the mean of its readings, with the warning that it is the engine's own figure.
_GAUGE = Provenance("prometheus-gauge-samples", "sglang:cache_hit_rate", "2026-12-02T00:00:00.000+00:00")
# SGLang before #26837: decode logging writes 0 and every prefill batch overwrites the gauge with its own
# ratio, so a 60 s scrape sees 0 almost always (sgl-project/sglang#26608); one reading of twelve caught a batch.
_SGLANG_GAUGE_MOSTLY_ZERO = Measurement(
    0.36 / 12,
    "fraction",
    _GAUGE,
    samples=(0.0,) * 11 + (0.36,),
    warnings=(coded(WarningCode.ENGINE_GAUGE, f"{Q.ENGINE_HIT_RATE_WARNING}: mean of its readings"),),
)
# The rate vLLM's stat logger prints ('Prefix cache hit rate: 21.3%'), copied into evidence as what it is:
# the engine's own figure over its last 1000 requests, not hits over lookups in a window.
_VLLM_LOGGED_RATE = Measurement(
    0.213,
    "fraction",
    Provenance("engine-log", "vLLM stat logger 'Prefix cache hit rate' (last 1000 requests)", PROV.taken_at),
    warnings=(
        coded(WarningCode.ENGINE_GAUGE, f"{Q.ENGINE_HIT_RATE_WARNING}: the rate vLLM logs over its last 1000 requests"),
    ),
)
# The same kind of rate counted by the live probe from vLLM's hit and query counters over the run.
_COUNTED = Provenance(
    "prometheus-counter-delta",
    "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total",
    PROV.taken_at,
)
# Ten request latencies whose 90th percentile is the reporter's 10.2 s (the spread below it is illustrative).
_PP2_TP2_E2E = Measurement(
    8.6,
    "s",
    PROV,
    samples=(7.4, 7.9, 8.2, 8.4, 8.6, 8.7, 9.0, 9.4, 10.2, 10.6),
)

SCENARIOS = [
    Scenario(
        id="said-nothing-1p1d-disaggregation-on-two-gpus",
        title="1P1D on 2x L40S for 1024-token prompts and 50-token answers: TTFT and ITL worse than chunked prefill",
        source="https://github.com/vllm-project/vllm/issues/11345",
        source_says=(
            "Reporter reproduced vLLM's 1P1D disaggregation benchmark against chunked prefill on 2x L40S, "
            "Qwen2.5-7B-Instruct, gpu-memory-utilization 0.6, kv_buffer_size 10e9, input 1024 / output 50: TTFT "
            "higher than expected (the transfer overhead benchmark shows only 20-30 ms) and ITL much higher than "
            "chunked prefill. The disaggregation author (KuntaiDu): 50-token output is too long for a 1P1D setup; "
            "for disaggregated prefill to perform like chunked prefill, prefill and decode work must be roughly 1:1 "
            "in runtime."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "Qwen/Qwen2.5-7B-Instruct",
            "config.pd_disaggregation": True,
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(2),
            "memory.device_total_bytes": 2 * L40S_48GB,
            "config.gpu_memory_utilization": setting(0.6),
            "inputs.length_p50": 1024,
            "outputs.length_p50": 50,
        },
        verdict=(
            "One prefill and one decode GPU cannot balance 50-token answers against 1k-token prompts: the "
            "transfer and the idle halves cost more than the interference removed; serve from one pool with "
            "chunked prefill."
        ),
        pitfalls={"disaggregation-overhead": True},
        statuses={"pd-disaggregation": "not-working"},
        headline=("pitfall", "disaggregation-overhead"),
        classes=("said-nothing", "q6-scale"),
    ),
    Scenario(
        id="said-nothing-1p1d-short-prompts-two-servers",
        title="SGLang 1P1D across two single-L40 servers, 128-token prompts and answers: slower than two plain servers",
        source="https://github.com/sgl-project/sglang/issues/7141",
        source_says=(
            "Reporter: two servers with one L40 each, one prefill and one decode instance, sglang.bench_serving "
            "random 128 input / 128 output at 50 req/s and concurrency 50 (100 prompts, 28.9 s): the PD-separated "
            "deployment is less efficient than the traditional deployment under stress, the prefill stage looking "
            "like the bottleneck. (No maintainer answered; the verdict rests on the deployment's shape.)"
        ),
        evidence={
            **SGLANG,
            "config.pd_disaggregation": True,
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(2),
            "inputs.length_p50": 128,
            "outputs.length_p50": 128,
        },
        verdict=(
            "Prompts no longer than the answers leave no prefill load to isolate, on two GPUs: disaggregation only "
            "adds the transfer; go back to colocated servers."
        ),
        pitfalls={"disaggregation-overhead": True},
        statuses={"pd-disaggregation": "not-working"},
        headline=("pitfall", "disaggregation-overhead"),
        classes=("said-nothing", "q6-scale"),
    ),
    Scenario(
        id="said-nothing-disaggregation-at-scale-is-not-condemned",
        title="Llama-70B disaggregated over 8x H100 (4 prefill + 4 decode), 2k-token prompts: transfer unmeasured",
        source="https://github.com/vllm-project/vllm/pull/6170",
        source_says=(
            "The disaggregation PR's author, back to back against chunked prefill (two TP 4 instances): 2048-token "
            "inputs, 150-token outputs, lower median TTFT and median ITL with disaggregation at QPS <= 6; with "
            "Llama 70B at TP 4 the KV transfer took about 31 ms on average."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Meta-Llama-3-70B-Instruct",
            "config.pd_disaggregation": True,
            "config.tensor_parallel_size": setting(4),
            "memory.device_count": setting(8),
            "memory.weights_fraction": 141e9 / H100_80GB,
            "inputs.length_p50": 2048,
            "outputs.length_p50": 150,
        },
        verdict=(
            "At eight GPUs and 14:1 prompt:output load the shape does not condemn disaggregation: it stays on, "
            "unverified until the connector's transfer time is read."
        ),
        pitfalls={"disaggregation-overhead": None},
        statuses={"pd-disaggregation": "on-unverified"},
        classes=("said-nothing", "healthy"),
    ),
    Scenario(
        id="said-nothing-pipeline-where-tensor-fits",
        title="LLaMA 13B on 4x A100 SXM as PP 2 x TP 2: p90 latency 10.2 s where TP 4 gives 6.4 s",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/1144",
        source_says=(
            "Reporter, TensorRT-LLM on 4x A100 40GB SXM at 3 requests/s: PP 2 x TP 2 gives 10.2 s p90 latency, "
            "PP 1 x TP 4 6.4 s, PP 4 cannot sustain the rate; pipeline engines show almost no speedup over one GPU. "
            "Maintainer (byshiue): PP cannot bring benefit on latency, it only increases throughput, and at small "
            "batch not even that, since it splits the batch into micro-batches."
        ),
        evidence={
            "engine.name": "trtllm",
            "engine.model": "meta-llama/Llama-2-13b-hf",
            "config.continuous_batching": True,
            "config.paged_kv": True,
            "config.tensor_parallel_size": setting(2),
            "config.pipeline_parallel_size": setting(2),
            "memory.device_total_bytes": 4 * A100_40GB,
            "memory.weights_fraction": 26e9 / A100_40GB,
            "latency.e2e_p50_s": _PP2_TP2_E2E,
        },
        # The goal is what the same four GPUs reach as TP 4, the reporter's own comparison.
        slo=SLO.from_flags(["e2e:p90:6.4s"]),
        verdict=(
            "Four GPUs in one node, a latency goal broken, and pipeline stages that add up per token: serve TP 4 "
            "and PP 1 on the same GPUs."
        ),
        statuses={"parallelism": "not-working"},
        headline=("fix", "parallelism"),
        path={"Q1.pipeline-where-tensor-fits": "yes"},
        classes=("said-nothing", "fit", "headline"),
    ),
    Scenario(
        id="said-nothing-pipeline-across-nodes-stays",
        title="Llama 3.1 405B over two 8x H100 nodes as TP 8 x PP 2",
        source="https://docs.vllm.ai/en/stable/serving/distributed_serving.html",
        source_says=(
            "vLLM's distributed-serving guide: a model too large for one node runs tensor parallel within a node "
            "and pipeline parallel across nodes, the tensor-parallel size being the GPUs per node and the "
            "pipeline-parallel size the number of nodes (16 GPUs in 2 nodes: TP 8, PP 2)."
        ),
        evidence={
            **VLLM_V1,
            "engine.model": "meta-llama/Llama-3.1-405B-Instruct",
            "config.tensor_parallel_size": setting(8),
            "config.pipeline_parallel_size": setting(2),
            "memory.device_total_bytes": 16 * H100_80GB,
            "memory.weights_fraction": 810e9 / H100_80GB,
        },
        verdict="Pipeline stages across nodes are the layout for a model two nodes hold: nothing to fix there.",
        statuses={"parallelism": "in-place"},
        path={"Q1.pipeline-where-tensor-fits": "no"},
        classes=("said-nothing", "healthy"),
    ),
    Scenario(
        id="said-nothing-pipeline-for-an-offline-batch-stays",
        title="The same 13B engine as PP 2 on two GPUs for an offline batch: nobody waits per token",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/1144",
        source_says=(
            "The maintainer's answer in the same thread: pipeline parallelism brings no benefit on latency but "
            "increases throughput (given enough micro-batches), which is what an offline batch asks for."
        ),
        evidence={
            "engine.name": "trtllm",
            "engine.model": "meta-llama/Llama-2-13b-hf",
            "workload.interactive": False,
            "config.continuous_batching": True,
            "config.paged_kv": True,
            "config.tensor_parallel_size": setting(1),
            "config.pipeline_parallel_size": setting(2),
            "memory.device_total_bytes": 2 * A100_40GB,
            "memory.weights_fraction": 26e9 / A100_40GB,
        },
        verdict="Nobody waits for single tokens: pipeline stages serve throughput, the layout is not the problem.",
        statuses={"parallelism": "in-place"},
        path={"Q1.pipeline-where-tensor-fits": "no"},
        classes=("said-nothing", "healthy"),
    ),
    Scenario(
        id="said-nothing-sglang-hit-gauge-zero-yet-the-cache-works",
        title="SGLang 0.5.12 radix cache on shared-prefix traffic: cache_hit_rate scrapes read ~0, cached_tokens 128",
        source="https://github.com/sgl-project/sglang/issues/26608",
        source_says=(
            "sglang:cache_hit_rate is a gauge overwritten by every prefill batch with that batch's ratio, and decode "
            "logging writes 0, so a 60 s scrape sees 0 almost permanently; health probes and fresh prompts reset it. "
            "The reporter verified that the API's cached_tokens works (128 on shared-prefix requests, v0.5.12 with "
            "EAGLE). The fix (PR #26837) exports a cumulative lifetime rate instead."
        ),
        evidence={
            **SGLANG,
            "engine.version": "0.5.12",
            "prefix.hit_rate": _SGLANG_GAUGE_MOSTLY_ZERO,
            "prefix.queried_tokens": None,
            "prefix.potential_fraction": 0.5,  # the trace: shared-prefix requests
            # What the active prefix experiment reads from cached_tokens: repeats of its own prefix hit,
            # its salted prompts do not.
            "prefix.active_repeated_hit_rate": 0.94,
            "prefix.active_salted_hit_rate": 0.0,
        },
        verdict=(
            "The gauge cannot describe this workload; repeats of a prefix the run cached hit 94%: the radix cache "
            "works, it is not 'not working'."
        ),
        statuses={"prefix-caching": "in-place"},
        path={"Q2.cache-keeps-a-repeated-prefix": "yes"},
        not_recommended=("prefix-caching",),
        classes=("said-nothing", "unknown"),
    ),
    Scenario(
        id="said-nothing-logged-rolling-hit-rate-is-not-a-miss",
        title="Same prompts sent in 3 rounds at concurrency 5, yet vLLM logs a 21.3% prefix cache hit rate",
        source="https://github.com/1CatAI/1Cat-vLLM/issues/90",
        source_says=(
            "Reporter: 5 concurrent requests of ~50k characters, the same prompts for 3 rounds, and the log shows "
            "'Prefix cache hit rate' 21.3%, far below what it should be. Maintainer: the logged rate is the "
            "token-weighted hit rate of at most the last 1000 scheduled requests, not the hit share of the three "
            "rounds; hits come only in full blocks; 21.3% alone cannot say the cache fails; read the "
            "prefix_cache_queries and prefix_cache_hits counter increases around each round."
        ),
        evidence={
            **VLLM_V1,
            "engine.version": "0.11.0",
            "prefix.hit_rate": _VLLM_LOGGED_RATE,
            "prefix.potential_fraction": 0.66,  # the trace: rounds 2 and 3 repeat round 1's prompts
        },
        verdict=(
            "A rolling figure over the engine's last 1000 requests is neither a hit nor a miss of these rounds: "
            "the cache is on and unverified until the counters over the run (or --active) are read."
        ),
        statuses={"prefix-caching": "on-unverified"},
        pitfalls={"warm-cache-benchmark": None},
        not_recommended=("prefix-caching",),
        classes=("said-nothing", "unknown"),
    ),
    Scenario(
        id="said-nothing-counted-hit-rate-over-the-run",
        title="vLLM prefix caching on shared-prefix traffic, counted over the run: 66.5% hit, 1.76x decode throughput",
        source="https://github.com/0xBakeer/qwen38-flash-next-spark/issues/9",
        source_says=(
            "Measured on 192 requests, 16 concurrent, grouped by shared prefix, caching off against on on the same "
            "box: aggregate decode 46.50 -> 81.79 tok/s (1.76x), TTFT p50 5.86 -> 2.55 s, p90 12.16 -> 5.28 s; hit "
            "rate over the run 66.5% (hits landing on block boundaries)."
        ),
        evidence={
            **VLLM_V1,
            "prefix.hit_rate": Measurement(0.665, "fraction", _COUNTED),
            "prefix.queried_tokens": Measurement(1_650_000, "tokens", _COUNTED),
        },
        verdict="Hits over lookups counted in the run's window describe the workload: the cache works.",
        statuses={"prefix-caching": "in-place"},
        answers={"Q2": "yes"},
        classes=("said-nothing", "healthy"),
    ),
]
