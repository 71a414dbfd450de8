"""Too little measured to say anything: the headline is "nothing measured", never "no bottleneck
found"; a server that saw no load cannot confirm its capacity."""

from __future__ import annotations

from tests.evidence_builders import sampled
from tests.scenarios.engines import A100_80GB as A100_80
from tests.scenarios.engines import H100_80GB as H100
from tests.scenarios.engines import RTX4090_24GB as RTX4090
from tests.scenarios.engines import setting
from tests.scenarios.model import Scenario

SCENARIOS = [
    Scenario(
        id="too-little-metrics-endpoint-empty",
        title="/metrics answers 200 OK with an empty body: only the engine's identity is known",
        source="https://github.com/vllm-project/vllm/issues/8612",
        source_says=(
            "A vLLM server's Prometheus /metrics endpoint answered 'HTTP/1.1 200 OK' with no metrics at all, "
            "even after requests to the completions endpoint had been served."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.6.1",
            "engine.model": "mistralai/Mixtral-8x7B-Instruct-v0.1",
            "kv.usage_p95": None,
            "kv.preemptions": None,
            "queue.waiting_mean": None,
            "batch.running_mean": None,
            "prefix.hit_rate": None,
            "decode.itl_p50_s": None,
            "memory.weights_fraction": None,
        },
        verdict="Nothing about the server's behaviour was measured: say so, and say how to get metrics; no verdict.",
        headline=("nothing-measured", ""),
        answers={"Q1": "unknown", "Q2": "unknown", "Q5": "unknown", "Q6": "unknown"},
        not_recommended=("quantization", "parallelism", "scale-out", "speculative-decoding"),
        classes=("too-little",),
    ),
    Scenario(
        id="too-little-log-stats-disabled",
        title="Server started with --disable-log-stats: the endpoint exists, the engine metrics do not",
        source="https://github.com/vllm-project/vllm/issues/11987",
        source_says=(
            "Asked whether /metrics can be disabled, a maintainer (hmellor) answered that with "
            "--disable-log-stats the endpoint stays but receives no data, and stats are not logged to the "
            "terminal either."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.version": "0.6.6",
            "engine.model": "Qwen/Qwen2.5-7B-Instruct",
            "config.tensor_parallel_size": setting(1),
            "kv.usage_p95": None,
            "kv.preemptions": None,
            "queue.waiting_mean": None,
            "batch.running_mean": None,
            "throughput.generation_tokens_per_s": None,
            "decode.itl_p50_s": None,
            "prefix.hit_rate": None,
        },
        verdict=(
            "With engine metrics off nothing was measured; the diagnosis must say that (restart without "
            "--disable-log-stats)."
        ),
        headline=("nothing-measured", ""),
        answers={"Q1": "unknown", "Q5": "unknown"},
        not_recommended=("quantization", "parallelism", "scale-out"),
        classes=("too-little",),
    ),
    Scenario(
        id="too-little-idle-window",
        title="Every 10 s the log reads 0 tokens/s, 0 running, 0 pending, KV 0.0%: the window saw no traffic",
        source="https://github.com/vllm-project/vllm/issues/3048",
        source_says=(
            "A Qwen-14B-Chat server on one GPU prints 'Avg prompt throughput: 0.0 tokens/s, Avg generation "
            "throughput: 0.0 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: "
            "0.0%' every 10 seconds while idle; the reporter asks how to silence it."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "Qwen/Qwen-14B-Chat",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_bytes": 28.3e9,
            "memory.device_total_bytes": float(A100_80),
            "memory.weights_fraction": 28.3e9 / A100_80,
            "kv.usage_p95": 0.0,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 0.0,
            "load.concurrency_mean": 0.0,
            "throughput.generation_tokens_per_s": 0.0,
            "throughput.prompt_tokens_per_s": 0.0,
        },
        verdict=(
            "The weights fit, but nothing ran in the window: capacity was not tested and no finding can "
            "be made; the headline says nothing was measured under load."
        ),
        headline=("nothing-measured", ""),
        verdicts={"Q1": "untested"},
        max_confidence={"Q1": 0.5},
        not_recommended=("scale-out", "quantization", "parallelism"),
        classes=("too-little", "confidence"),
    ),
    Scenario(
        id="too-little-one-request-at-a-time-benchmark",
        title="A 7B model on an RTX 4090 benchmarked one request at a time: no faster than a single-user runtime",
        source="https://github.com/vllm-project/vllm/issues/2308",
        source_says=(
            "The reporter sent single requests to vLLM on a 4090 and saw the same speed as ollama; a reply "
            "explained that vLLM's gains (PagedAttention, batching many requests) apply to a server handling "
            "many concurrent requests, so the code must send requests concurrently to see them."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "mistralai/Mistral-7B-Instruct-v0.2",
            "config.tensor_parallel_size": setting(1),
            "memory.device_count": setting(1),
            "memory.weights_bytes": 14.5e9,
            "memory.device_total_bytes": float(RTX4090),
            "memory.weights_fraction": 14.5e9 / RTX4090,
            "kv.capacity_tokens": 40_000,
            "inputs.length_p50": 200,
            "outputs.length_p50": 300,
            "kv.usage_p95": 0.013,
            "kv.preemptions": 0,
            "queue.waiting_mean": 0.0,
            "batch.running_mean": 1.0,
            "load.concurrency_mean": 1.0,
            "throughput.generation_tokens_per_s": 52.0,
            "decode.itl_p50_s": 0.019,
            "decode.itl_p99_s": 0.024,
        },
        verdict=(
            "One request at a time says nothing about capacity: Q1 is 'fits, untested' at low confidence, "
            "and nothing about batching or scale can be recommended from it."
        ),
        verdicts={"Q1": "untested"},
        max_confidence={"Q1": 0.5},
        not_recommended=("scale-out", "quantization", "parallelism"),
        classes=("too-little", "confidence"),
    ),
    Scenario(
        id="too-little-two-scrapes-in-the-window",
        title="An 8-second window at a 5 s scrape interval: two scrapes, one counter delta",
        source="https://robustperception.io/what-range-should-i-use-with-rate",
        source_says=(
            "Robust Perception (Prometheus): rate needs at least two samples, and its range should be at "
            "least four times the scrape interval to survive races and a failed scrape."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "live.window_s": 8.0,
            "live.window_complete": True,
            "memory.weights_bytes": 16.1e9,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 16.1e9 / H100,
            "kv.usage_p95": sampled([0.62, 0.66], "fraction"),
            "queue.waiting_mean": sampled([0.0, 0.0], "requests"),
            "batch.running_mean": sampled([21.0, 23.0], "requests"),
            "kv.preemptions": 0,
            "decode.itl_p50_s": sampled([0.012, 0.013], "s"),
            "decode.itl_p99_s": sampled([0.03, 0.05], "s"),
        },
        verdict=(
            "Two scrapes are one delta: whatever the numbers say, every answer built on them is low "
            "confidence until the window covers several scrape intervals."
        ),
        max_confidence={"Q1": 0.5, "Q5": 0.5},
        not_recommended=("scale-out", "quantization"),
        classes=("too-little", "confidence"),
    ),
    Scenario(
        id="too-little-window-cut-short-metrics-stopped-answering",
        title="SGLang under load: /metrics stopped answering 14 s into a planned 60 s window",
        source="https://github.com/sgl-project/sglang/pull/28163",
        source_says=(
            "SGLang mounts /metrics as the raw Prometheus ASGI app, so a slow or wedged registry read runs "
            "inline and can starve the health endpoints behind the same event loop; the PR bounds the scrape "
            "with a timeout and answers 503 instead of hanging."
        ),
        evidence={
            "engine.name": "sglang",
            "engine.model": "Qwen/Qwen2.5-14B-Instruct",
            "live.window_s": 14.0,
            "live.window_complete": False,
            "memory.weights_bytes": 29.5e9,
            "memory.device_total_bytes": float(H100),
            "memory.weights_fraction": 29.5e9 / H100,
            "kv.usage_p95": sampled([0.88, 0.93, 0.96], "fraction"),
            "queue.waiting_mean": sampled([2.0, 6.0, 11.0], "requests"),
            "batch.running_mean": sampled([40.0, 44.0, 45.0], "requests"),
            "kv.preemptions": 0,
        },
        verdict=(
            "The window broke off after three scrapes while pressure was rising: report what was seen, "
            "at low confidence, and ask for a complete window before sizing anything."
        ),
        max_confidence={"Q1": 0.5},
        headline=("nothing-measured", ""),
        not_recommended=("scale-out",),  # no sizing from three scrapes of a broken-off window
        classes=("too-little", "confidence"),
    ),
]
