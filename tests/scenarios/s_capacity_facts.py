"""Capacity facts the engine states itself (issue 25, part 2): its own KV figure below one
request of max_model_len, and a running batch held at the engine's cap while requests wait.

The engine's figure is vLLM's startup line 'Maximum concurrency for N tokens per request: Xx'
(`kv.max_concurrency`): below 1 the deployment cannot hold one request of its own max_model_len,
whatever the load, and more replicas of it do not help.
"""

from __future__ import annotations

from tests.scenarios.engines import GIB, setting
from tests.scenarios.model import Scenario

RTX3090_USABLE = 23.58 * GIB  # what vLLM logs as total_gpu_memory on an RTX 3090

SCENARIOS = [
    Scenario(
        id="q1-engine-figure-below-one-max-len-request",
        title="Llama 3.1 8B on an RTX 3090 at --max-model-len 29000: vLLM's own figure is 0.82x",
        source="https://github.com/vllm-project/vllm/issues/10517",
        source_says=(
            "Meta-Llama-3.1-8B-Instruct on an RTX 3090: at 20k tokens vLLM logs 'Maximum concurrency for 20000 "
            "tokens per request: 1.56x'; at 29k, 2.89 GiB of KV cache and 'Maximum concurrency for 29000 tokens "
            "per request: 0.82x', then 'The model's max seq len (29000) is larger than the maximum number of tokens "
            "that can be stored in KV cache (23648). Try increasing gpu_memory_utilization or decreasing "
            "max_model_len'."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "engine.max_model_len": setting(29000),
            "config.gpu_memory_utilization": setting(0.9),
            "memory.weights_bytes": 14.99 * GIB,
            "memory.device_total_bytes": RTX3090_USABLE,
            "memory.weights_fraction": 14.99 * GIB / RTX3090_USABLE,
            "kv.capacity_tokens": 23648,
            "kv.max_concurrency": 0.82,
        },
        verdict=(
            "By vLLM's own figure the cache holds 0.82 of a 29k-token request: the deployment does not fit as "
            "configured, whatever the load; shorten max_model_len or quantize the KV cache; replicas do not help."
        ),
        verdicts={"Q1": "kv-too-small"},
        answers={"Q1": "no"},
        statuses={"quantization": "recommended"},
        not_recommended=("scale-out",),
        classes=("fit",),
    ),
    Scenario(
        id="q1-engine-figure-above-one-request-is-no-finding",
        title="The same server at --max-model-len 20000: vLLM's figure 1.56x, nothing waits",
        source="https://github.com/vllm-project/vllm/issues/10517",
        source_says=(
            "The same reporter at 20k tokens: 3.81 GiB of KV cache, 1952 blocks of 16, 'Maximum concurrency for "
            "20000 tokens per request: 1.56x'; the server started and served."
        ),
        evidence={
            "engine.name": "vllm",
            "engine.model": "meta-llama/Llama-3.1-8B-Instruct",
            "engine.max_model_len": setting(20000),
            "config.gpu_memory_utilization": setting(0.9),
            "memory.weights_bytes": 14.99 * GIB,
            "memory.device_total_bytes": RTX3090_USABLE,
            "memory.weights_fraction": 14.99 * GIB / RTX3090_USABLE,
            "kv.max_concurrency": 1.56,
        },
        verdict="The engine's figure holds a full-length request: no capacity finding from it alone.",
        verdicts={"Q1": "fits"},
        not_recommended=("scale-out", "quantization"),
        classes=("fit",),
    ),
]
