"""Replay a request trace: the formats the trace analytics read, turned into RequestSpecs.

Reading is llm_diagnose.probes.traces.readers' (Mooncake, Azure, BurstGPT, OpenAI-style logs, prompt
JSONL; format detection, bad-line accounting, .gz): one reader for analysis and replay.
This module decides what to send for each request:

- the trace's token ids (completions) or prompt text (chat logs arrive rendered as text);
- for Mooncake hash ids, one block of `MOONCAKE_BLOCK_TOKENS` tokens per id, the same tokens
  for the same id, so requests share exactly the prefixes their ids say; the block key
  carries a per-run salt (drawn per call unless `run_salt` fixes it), so nothing is shared
  with an earlier run's cache;
- for lengths only, a random body of the stated length.

With `fresh_cache`, every prompt the trace gives (its token ids or text) starts with one salt
drawn for the workload (PromptMaker.nonce: NONCE_TOKENS ids, or about as many tokens of words),
and hash-id and length-only bodies are drawn from a fresh salt even where `run_salt` is given:
requests of the workload still share the prefixes the trace gives them, and nothing of an earlier
workload (an earlier trial of a goodput search, the same 32 prompts sent again) is in the prefix
cache.
Without it a server with prefix caching served 63% of a 200-token trace's prompt tokens from
the cache from the second trial on (vllm:prefix_cache_hits_total against _queries_total), so a
search measured a cheaper workload than the trace's.

Arrivals: the trace's own times (optionally sped up), or any Pacing (a rate, a concurrency).
"""

from __future__ import annotations

import random
from pathlib import Path

from llm_diagnose.probes.load.pacing import Pacing, TraceArrivals
from llm_diagnose.probes.load.prompts import NONCE_TOKENS, Prompt, PromptMaker
from llm_diagnose.probes.load.records import Endpoint, RequestSpec
from llm_diagnose.probes.load.workloads import Workload
from llm_diagnose.probes.traces.readers import HASH_ID_BLOCK_TOKENS as MOONCAKE_BLOCK_TOKENS  # 512 tokens per hash id
from llm_diagnose.probes.traces.readers import detect_format, read_trace
from llm_diagnose.probes.traces.records import LineLog, TraceRequest

__all__ = ["load_trace", "trace_workload", "MOONCAKE_BLOCK_TOKENS", "DEFAULT_OUTPUT_TOKENS"]

DEFAULT_OUTPUT_TOKENS = 128  # for a trace that gives no output length


def load_trace(
    path: str | Path, fmt: str | None = None, *, limit: int | None = None, strict: bool = False
) -> tuple[TraceRequest, ...]:
    """The first `limit` requests of a trace, in arrival order (file order where there are no times).

    Raises:
        llm_diagnose.probes.traces.TraceFormatError: unknown format or unreadable file (strict: a bad line).
    """
    name = str(path)
    fmt = fmt or detect_format(name)
    out = []
    for request in read_trace(name, fmt, LineLog(name, strict)):
        out.append(request)
        if limit is not None and len(out) >= limit:
            break
    if out and all(r.timestamp_s is not None for r in out):
        out.sort(key=lambda r: r.timestamp_s or 0.0)
    return tuple(out)


# --- replaying ---------------------------------------------------------------------------
def _mooncake_prompt(prompts: PromptMaker, request: TraceRequest, run_salt: str, endpoint: str) -> Prompt:
    ids = request.hash_ids or ()
    n_in = request.input_tokens or len(ids) * MOONCAKE_BLOCK_TOKENS
    parts = []
    for i, block_id in enumerate(ids):
        size = min(MOONCAKE_BLOCK_TOKENS, n_in - i * MOONCAKE_BLOCK_TOKENS)
        if size <= 0:
            break
        # The block's content depends on its id only (and the run), never on its neighbours:
        # chained ids already encode the prefix, so equal ids at equal positions mean equal prefixes.
        parts.append(prompts.block(f"{run_salt}:{block_id}", size, endpoint))
    return prompts.join(*parts) if parts else prompts.body(n_in, random.Random(f"{run_salt}:empty"), endpoint)


def _fresh_salts(trace: tuple[TraceRequest, ...], prompts: PromptMaker) -> tuple[str, tuple[int, ...]]:
    """One workload's salts: a text one, and token ids (the maker's where it knows the model's
    tokens, else drawn from the trace's own ids, which the model knows)."""
    nonce = prompts.nonce("completions")
    ids = nonce if isinstance(nonce, tuple) else ()
    if not ids:
        own = sorted({int(t) for r in trace if r.tokens is not None for t in r.tokens})
        ids = prompts.salt_from(own) if own else ()
    return str(prompts.nonce("chat")), ids


def trace_workload(
    trace: tuple[TraceRequest, ...],
    prompts: PromptMaker,
    *,
    pacing: Pacing | None = None,
    speedup: float = 1.0,
    endpoint: Endpoint = "completions",
    run_salt: str | None = None,
    max_model_len: int | None = None,
    name: str = "replay",
    experiment: str = "replay",
    fresh_cache: bool = False,
) -> Workload:
    """RequestSpecs for a trace. `pacing=None` replays at the trace's own times, `speedup` x faster.

    `trace` comes from `load_trace`. Lengths are clipped so
    prompt + output fits `max_model_len` (a clipped request is tagged "clipped"). `fresh_cache`:
    every prompt starts with this workload's salt (the module docstring).
    """
    salt = run_salt if run_salt is not None and not fresh_cache else f"{random.getrandbits(64):016x}"
    rng = random.Random(salt)
    text_salt, id_salt = _fresh_salts(trace, prompts) if fresh_cache else (None, None)
    specs = []
    for i, r in enumerate(trace):
        n_out = max(1, r.output_tokens or DEFAULT_OUTPUT_TOKENS)
        ep: Endpoint = endpoint
        text_salt_tokens = 0
        # The trace's own prompts carry the workload's salt (fresh_cache); hash-id and length-only
        # bodies are drawn from `salt`, fresh already.
        if r.tokens is not None and len(r.tokens):
            prompt: Prompt = (id_salt or ()) + tuple(int(t) for t in r.tokens)
            ep = "completions"  # token ids only go to the completions endpoint
        elif r.text is not None:
            prompt = prompts.join(text_salt, r.text) if text_salt else r.text
            text_salt_tokens = NONCE_TOKENS if text_salt else 0  # about: the server's usage says exactly
        elif r.hash_ids:
            prompt = _mooncake_prompt(prompts, r, salt, endpoint)
        else:
            prompt = prompts.body(max(1, r.input_tokens or 1), rng, endpoint)
        n_in = len(prompt) if isinstance(prompt, tuple) else r.input_tokens
        if n_in is not None and text_salt_tokens:
            n_in += text_salt_tokens
        tag = ""
        if max_model_len is not None and n_in is not None and n_in + n_out > max_model_len:
            tag = "clipped"
            n_out = max(1, max_model_len - n_in)
            if isinstance(prompt, tuple) and n_in >= max_model_len:
                prompt, n_in = prompt[: max_model_len - 1], max_model_len - 1
        specs.append(
            RequestSpec(f"{name}-{i}", prompt, n_out, ep, experiment, "replay", tag, planned_prompt_tokens=n_in)
        )
    if pacing is None:
        times = [r.timestamp_s for r in trace if r.timestamp_s is not None]
        if len(times) < len(trace):
            raise ValueError("the trace has no arrival times: give a rate or a concurrency to replay it")
        pacing = TraceArrivals(tuple(times), speedup)
    return Workload(name, tuple(specs), pacing, f"replay of {len(specs)} trace requests")
