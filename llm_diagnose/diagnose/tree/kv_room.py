"""How much room the KV cache gives this workload: how many typical requests it holds at once,
and whether the running batch sits at the engine's cap on concurrent sequences (read by Q1)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.probes import quantities as Q

__all__ = ["ENGINE_FIGURE", "kv_requests", "batch_at_cap", "CAP_SETTING"]

ENGINE_FIGURE = "the engine's maximum-concurrency figure (at its max_model_len)"


def kv_requests(r: Reading) -> tuple[float | None, str]:
    """How many of this workload's typical requests the KV cache holds at once, and how that
    was worked out: capacity / (median prompt + median output), else the engine's own figure
    (vLLM's is at max_model_len: a lower bound, so `ask_q1` acts on it only when the cache fills)."""
    capacity = r.num(Q.KV_CAPACITY_TOKENS)
    prompt, output = r.num(Q.INPUT_LEN_P50), r.num(Q.OUTPUT_LEN_P50)
    engine = r.num(Q.KV_MAX_CONCURRENCY)
    if capacity is None and engine is not None and prompt is not None and output is not None:
        max_len = r.num(Q.MAX_MODEL_LEN)  # the engine's figure counts requests of max_model_len tokens
        capacity = None if max_len is None else engine * max_len
    if capacity is not None and prompt is not None and output is not None and prompt + output > 0:
        return capacity / (prompt + output), (
            f"{capacity:.0f} KV tokens / ({prompt:.0f} + {output:.0f}) tokens per typical request"
        )
    if engine is not None:
        return engine, ENGINE_FIGURE
    return None, ""


# The engine's own name for its cap on concurrent sequences (config.max_num_seqs), per engine.
CAP_SETTING = {
    "vllm": "--max-num-seqs",
    "sglang": "--max-running-requests",
    "trtllm": "max_batch_size",
}


def batch_at_cap(r: Reading) -> str | None:
    """Where the running batch sat at the engine's configured cap on concurrent sequences while
    requests waited (the caller checks the queue): the cap binds, whatever KV usage was or was not
    read. Names the setting and what would confirm the memory for more; None otherwise."""
    cap, running = r.num(Q.MAX_NUM_SEQS), r.num(Q.RUNNING_MEAN)
    if cap is None or running is None or cap <= 0:
        return None
    if not r.compare("batch.running_mean/config.max_num_seqs", running / cap, ">=", "q1.batch_at_cap"):
        return None
    engine = r.evidence.fact(Q.ENGINE_NAME)
    setting = CAP_SETTING.get(engine if isinstance(engine, str) else "", "the engine's cap on concurrent sequences")
    kv = r.num(Q.KV_USAGE_P95)
    memory = (
        f"KV usage p95 {kv:.0%} says whether memory holds more"
        if kv is not None
        else "KV usage was not read: its p95 at the cap (below ~90%) would confirm the memory for more"
    )
    return (
        f"the running batch sat at the engine's cap ({running:.1f} of {setting} {cap:.0f}) while requests waited: "
        f"the cap binds; raise {setting} where memory allows ({memory}), or add replicas"
    )
