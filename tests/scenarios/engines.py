"""Shared pieces of scenario evidence: what a serving engine reports about its own configuration.

Scenario modules spread these into their evidence (`{**VLLM_V1, "kv.usage_p95": 0.4}`) so each
scenario states only what is particular to its source. Discovery reports configuration values
as facts, so numeric settings go through `setting()` rather than becoming measurements.
"""

from __future__ import annotations

from llm_diagnose.probes.results import Fact
from tests.evidence_builders import PROV

__all__ = [
    "GIB",
    "A100_80GB",
    "H100_80GB",
    "H20_96GB",
    "B200_180GB",
    "L40_48GB",
    "RTX3090_24GB",
    "RTX4090_24GB",
    "VLLM_V1",
    "SGLANG",
    "setting",
    "speculation",
]

GIB = 1024**3
A100_80GB = 80 * GIB
H100_80GB = 80 * GIB
H20_96GB = 96 * GIB
B200_180GB = 180 * GIB
L40_48GB = 45 * GIB  # 46068 MiB as NVML reports it
RTX3090_24GB = 24 * GIB
RTX4090_24GB = 24 * GIB

# vLLM V1 batches continuously, pages its KV cache, and turns chunked prefill and prefix caching
# on by default; a scenario that says otherwise overrides the key.
VLLM_V1 = {
    "engine.name": "vllm",
    "config.continuous_batching": True,
    "config.paged_kv": True,
    "config.chunked_prefill": True,
    "config.prefix_caching": True,
}

# SGLang: continuous batching, paged KV (token-granular pages), radix (prefix) cache on by default.
SGLANG = {
    "engine.name": "sglang",
    "config.continuous_batching": True,
    "config.paged_kv": True,
    "config.chunked_prefill": True,
    "config.prefix_caching": True,
}


def setting(value: int | float) -> Fact:
    """A numeric configuration value (TP degree, num_speculative_tokens, chunk size...), as
    discovery reports it: a fact read from the server, not a measurement."""
    return Fact(value, PROV)


def speculation(method: str | None, drafts: int | None = None) -> dict:
    """Speculative decoding reported on, with its method and drafted tokens per verify step
    where the source names them (a method or count the source does not give stays unseen)."""
    facts: dict = {"config.spec_decode": True}
    if method is not None:
        facts["config.spec_method"] = method
    if drafts is not None:
        facts["config.num_speculative_tokens"] = setting(drafts)
    return facts
