"""Live verdicts on a busy host (issue 14): a starved client's figures, intervals that straddle
the line, and the static-batching server the interval does convict.

The evidence is shaped as the active experiments write it: live ratios with their bootstrap
interval (tests.evidence_builders.live), and the `client starved:` warning a measurement carries
when the client's event loop lagged a good share of the time the verdict rests on."""

from __future__ import annotations

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import live
from tests.scenarios.model import Scenario

_STARVED = coded(
    WarningCode.CLIENT_STARVED,
    f"{Q.CLIENT_STARVED_WARNING} event-loop lag p99 444.2 ms is 555% of the 80.0 ms it timed "
    "(0.01 client cores, host CPUs 100% busy)",
)

_VLLM_CPU = {
    "engine.name": "vllm",
    "engine.version": "0.32.0",
    "workload.interactive": True,
    "config.continuous_batching": True,
    "config.paged_kv": True,
    "config.prefix_caching": True,
    "load.concurrency_mean": 0.6,
    "throughput.generation_tokens_per_s": 40.0,
}

SCENARIOS = [
    Scenario(
        id="busy-host-starved-client-vllm-cpu",
        title="Default vLLM on a 2-core host shared with two busy processes: the client was starved",
        source="https://github.com/tenstorrent/tt-inference-server/issues/190",
        source_says=(
            "Measurement differences between vLLM and its benchmark client: the client script added ~40 ms "
            "(batch 32) to ~200 ms (batch 1) of TTFT that other measurements of the same server did not "
            "show. The measuring side, not the engine, made the latency. (Issue 14 saw the same on a busy "
            "2-core host: client event-loop lag 444 ms p99 while vLLM's TTFT histogram said 16-40 ms.)"
        ),
        evidence={
            **_VLLM_CPU,
            "batching.short_request_slowdown": live(2.3, 1.4, 3.9, warnings=(_STARVED,)),
            "interference.prompt_itl_correlation": 0.7,
        },
        verdict=(
            "Nothing can be concluded about batching from a starved client; vLLM batches continuously by "
            "default. Run again on a quieter host or with a larger budget."
        ),
        verdicts={"Q3": "inconclusive", "Q6": "passive-low-load"},
        not_recommended=("continuous-batching", "chunked-prefill", "pd-disaggregation"),
        classes=("live",),
    ),
    Scenario(
        id="busy-host-interval-straddles-the-line",
        title="A short-vs-long slowdown of 2.2 whose interval (1.3-3.4) straddles the 2.0 line",
        source="https://github.com/tenstorrent/tt-inference-server/issues/4179",
        source_says=(
            "An apparent server overhead in an AIPerf table (5.5 s mean TTFT at one input length) was a "
            "one-time cache miss on a never-warmed bucket, first request 9.9 s and the second 0.94 s: "
            "an artifact of N=2 rather than steady state."
        ),
        evidence={**_VLLM_CPU, "batching.short_request_slowdown": live(2.2, 1.3, 3.4)},
        verdict="Inconclusive: the interval includes both 'waits' and 'does not wait'; repeat with more rounds.",
        verdicts={"Q3": "inconclusive"},
        answers={"Q3": "unknown"},
        classes=("live",),
    ),
    Scenario(
        id="static-batching-convicted-by-its-interval",
        title="A plain PyTorch server that serves one request at a time: slowdown 12 (interval 9-15)",
        source="https://github.com/huggingface/transformers/pull/40758",
        source_says=(
            "transformers' serving docs: only 'with Continuous Batching' does `transformers serve` deliver "
            "solid throughput and latency; served with plain generate() it answers one request at a time, "
            "so a short request queued behind long ones waits for all of them."
        ),
        evidence={
            "engine.name": "transformers",
            "workload.interactive": True,
            "batching.short_request_slowdown": live(12.0, 9.0, 15.0),
            "load.concurrency_mean": 3.0,
        },
        verdict="Short requests wait for long ones: adopt continuous batching (or an engine that has it).",
        verdicts={"Q3": "short-waits-for-long"},
        answers={"Q3": "yes"},
        classes=("live",),
    ),
]
