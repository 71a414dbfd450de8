"""Impossible or contradictory evidence: the diagnosis names the key (`Diagnosis.sanity`) and
lowers the confidence of every answer that reads it, instead of reasoning from it as if true.

Evidence objects cannot hold NaN or infinity (`llm_diagnose.probes.results` refuses them), so a non-finite
value arrives the way a third-party exporter writes it: as the string "nan" in a Fact.
"""

from __future__ import annotations

from llm_diagnose.probes.results import Measurement
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import PROV, sampled
from tests.scenarios.engines import H100_80GB as H100
from tests.scenarios.engines import setting
from tests.scenarios.model import Scenario

# Two replicas answer one scrape address in turn: every counter drops at every other scrape,
# and the live probe counts each drop as a reset (as Prometheus rate() does).
_FLIP_FLOP = (
    coded(
        WarningCode.COUNTER_RESET,
        "11 counter reset(s) in the window (server restarted?): increases counted from zero after each "
        "reset, as Prometheus rate() does",
    ),
)

SCENARIOS = [
    Scenario(
        id="sanity-hit-rate-above-potential-preemption-recompute",
        title="Random prompts, yet a 32% prefix hit rate: preempted requests' re-prefills counted as hits",
        source="https://github.com/vllm-project/vllm/issues/25780",
        source_says=(
            "A vLLM maintainer (zhuohan123) got a 30% prefix cache hit rate from `vllm bench throughput "
            "--dataset-name random` on Hermes-3-Llama-3.1-8B ('Running: 259 reqs, Waiting: 535 reqs, GPU KV "
            "cache usage: 82.3%, Prefix cache hit rate: 32.2%'): requests preempted and recomputed counted as "
            "prefix matches. The fix (PR #25787) dropped the rate to 0.2%."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "NousResearch/Hermes-3-Llama-3.1-8B",
            "config.prefix_caching": True,
            "prefix.hit_rate": 0.322,
            "prefix.queried_tokens": 9_800_000,
            "prefix.potential_fraction": 0.0,  # the trace of random prompts shares no full block
            "prefix.hit_rate_first_requests": 0.0,  # a fresh offline engine: the first requests missed
            "trace.requests": 1000,
            "memory.weights_fraction": 16.1e9 / H100,
            "kv.usage_p95": 1.0,
            "kv.preemptions": 420,
            "queue.waiting_mean": 535,
            "batch.running_mean": 259,
        },
        verdict=(
            "A live hit rate of 32% on prompts that share nothing, from a cache that started cold, is "
            "impossible as reuse: flag it (here preemption re-prefills counted as hits); it is not a "
            "warm-cache benchmark, and the server is simply overloaded."
        ),
        sanity_keys=("prefix.hit_rate",),
        pitfalls={"warm-cache-benchmark": False},
        verdicts={"Q1": "overloaded"},
        classes=("sanity", "fit"),
    ),
    Scenario(
        id="sanity-negative-prefix-hit-rate",
        title="A negative prefix-cache hit count from a preemption race: hit rate -4%",
        source="https://github.com/ModelEngine-Group/unified-cache-management/pull/941",
        source_says=(
            "In vLLM 0.18.0 with async scheduling, a preemption can reset a request between scheduling and "
            "output processing, so local_cache_hit comes out negative (vllm-project/vllm#36755) and the "
            "Prometheus counter raises 'Counters can only be incremented by non-negative amounts'; the patch "
            "clamps it with max(0, ...)."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.18.0",
            "config.prefix_caching": True,
            "prefix.hit_rate": -0.04,
            "prefix.queried_tokens": 1_200_000,
            "kv.preemptions": 85,
            "kv.usage_p95": 0.97,
        },
        verdict=(
            "A hit rate below zero is impossible: flag it, and answer the prefix question at low "
            "confidence or not at all."
        ),
        sanity_keys=("prefix.hit_rate",),
        max_confidence={"Q2": 0.5},
        classes=("sanity", "confidence"),
    ),
    Scenario(
        id="sanity-stale-kv-usage-after-all-requests-aborted",
        title="KV usage stuck at 99% with nothing running after a benchmark aborted all its requests",
        source="https://github.com/vllm-project/vllm/issues/29928",
        source_says=(
            "A vLLM maintainer (robertgshaw2-redhat) reports that when all requests are cancelled at once "
            "vLLM does not refresh its Prometheus stats until another engine step runs, so pods can stay "
            "'stuck' reporting 99% KV utilization and routers stop sending them work."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "memory.weights_bytes": 16.1e9,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 16.1e9 / H100,
            "kv.capacity_tokens": 445_000,
            "kv.usage_p95": 0.99,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 0.0,
            "load.concurrency_mean": 0.0,
            "throughput.generation_tokens_per_s": 0.0,
            "throughput.prompt_tokens_per_s": 0.0,
        },
        verdict=(
            "A full KV cache with nothing running and nothing generated is a stale gauge, not overload: "
            "flag it and make no capacity finding from it."
        ),
        sanity_keys=("kv.usage_p95",),
        max_confidence={"Q1": 0.5},
        not_recommended=("scale-out", "quantization", "parallelism"),
        classes=("sanity", "confidence"),
    ),
    Scenario(
        id="sanity-kv-usage-summed-over-data-parallel-engines",
        title="KV usage 146%: a usage gauge summed over two data-parallel engines",
        source="https://github.com/vllm-project/vllm/pull/22227",
        source_says=(
            "With `vllm serve ... --data-parallel-size 2 --api-server-count 2`, /metrics carries every vLLM "
            'series once per engine (engine="0", engine="1"); the PR disables the stats logger with more '
            "than one API server to avoid incomplete stats. Summing a per-engine usage gauge over engines "
            "gives a 'fraction' above 1."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/Qwen3-8B",
            "memory.weights_bytes": 16.4e9,
            "memory.device_total_bytes": 2.0 * H100,
            "memory.weights_fraction": 16.4e9 / H100,
            "memory.device_count": setting(2),
            "kv.usage_p95": 1.46,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.2,
            "batch.running_mean": 40,
            "load.concurrency_mean": 40,
        },
        verdict="A KV usage above 100% cannot be: flag it and do not call the cache full (or empty) from it.",
        sanity_keys=("kv.usage_p95",),
        max_confidence={"Q1": 0.5},
        not_recommended=("quantization",),
        classes=("sanity", "confidence"),
    ),
    Scenario(
        id="sanity-gpu-memory-utilization-as-string",
        title="gpu_memory_utilization read from vllm:cache_config_info arrives as the string '0.9'",
        source="https://docs.vllm.ai/en/v0.4.0.post1/serving/metrics.html",
        source_says=(
            "vLLM's production metrics publish the cache configuration as a Prometheus Info metric "
            "(`Info(name='vllm:cache_config', documentation='information of cache_config')`), whose values "
            "are label strings, not numbers."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.4.0.post1",
            "config.gpu_memory_utilization": "0.9",
            "memory.weights_fraction": 13.5e9 / H100,
            "kv.usage_p95": 0.35,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 12,
            "load.concurrency_mean": 12,
        },
        verdict=(
            "A string where a fraction belongs is flagged (and parsed or ignored), never compared as if "
            "it were a number."
        ),
        sanity_keys=("config.gpu_memory_utilization",),
        max_confidence={"Q1": 0.4},  # Q1 reads the utilisation: doubtful input caps it (confidence.sanity)
        classes=("sanity",),
    ),
    Scenario(
        id="sanity-acceptance-rate-nan-with-no-drafts",
        title="Speculative decoding on, zero drafts in the window: acceptance rate 0/0 = 'nan', length 1.0",
        source="https://github.com/vllm-project/vllm/pull/24322",
        source_says=(
            "Review of vLLM's draft-model speculative decoding PR: compute_acceptance_rate divides accepted by "
            "drafted tokens without checking for zero drafts (before any drafts are generated), while "
            "compute_acceptance_len returns 1 when there were no drafts."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/Qwen3-32B",
            "config.spec_decode": True,
            "config.spec_method": "draft_model",
            "config.num_speculative_tokens": setting(4),
            "spec.acceptance_rate": "nan",
            "spec.mean_acceptance_length": 1.0,
            "decode.itl_p50_s": 0.028,
            "decode.itl_p99_s": 0.06,
            "batch.running_mean": 2,
            "load.concurrency_mean": 2,
        },
        verdict=(
            "With no drafts in the window the acceptance rate is undefined (a 'nan' string) and a length "
            "of 1.0 means nothing was drafted, not that all was rejected: flag it and leave acceptance unjudged."
        ),
        sanity_keys=("spec.acceptance_rate",),
        pitfalls={"spec-decode-low-acceptance": None},
        classes=("sanity",),
    ),
    Scenario(
        id="sanity-counters-flip-flop-scraped-through-load-balancer",
        title="Counters go up and down on alternate scrapes: /metrics read through a load balancer over two replicas",
        source="https://github.com/prometheus/prometheus/issues/3860",
        source_says=(
            "A counter flip-flopped, increasing and decreasing continuously; a Prometheus maintainer "
            "(brian-brazil) asked whether it was scraped through a load balancer: this is usually due to "
            "scraping multiple instances as one target, which does not work."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "memory.weights_bytes": 16.1e9,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 16.1e9 / H100,
            "kv.capacity_tokens": 445_000,
            "inputs.length_p50": 800,
            "outputs.length_p50": 300,
            "config.prefix_caching": True,
            "kv.preemptions": Measurement(5400.0, "count", PROV, warnings=_FLIP_FLOP),
            "prefix.hit_rate": Measurement(0.97, "fraction", PROV, warnings=_FLIP_FLOP),
            "prefix.queried_tokens": Measurement(4.1e6, "tokens", PROV, warnings=_FLIP_FLOP),
            # Gauges alternate between the two replicas' values.
            "kv.usage_p95": sampled(
                [0.31, 0.92, 0.33, 0.91, 0.30, 0.93, 0.32, 0.92, 0.31, 0.94, 0.30, 0.93], "fraction"
            ),
            "queue.waiting_mean": sampled([0, 4, 0, 5, 0, 4, 0, 6, 0, 5, 0, 4], "requests"),
            "batch.running_mean": sampled([12, 60, 11, 58, 12, 61, 12, 59, 11, 60, 12, 58], "requests"),
        },
        verdict=(
            "Counters that reset at every other scrape are two servers read as one: no capacity or cache "
            "finding can stand on them; scrape each replica (llm-diagnose fleet) before judging."
        ),
        max_confidence={"Q1": 0.5, "Q2": 0.5},
        headline=("nothing-measured", ""),  # not "no bottleneck found": nothing usable was measured
        not_recommended=("scale-out", "quantization", "kv-offload"),
        classes=("sanity", "confidence"),
    ),
]
