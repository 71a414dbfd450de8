"""One parser per JSONL format: a line's JSON object -> TraceRequest (BadRecord with the reason).

- ``mooncake``: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` (one
  chained id per HASH_ID_BLOCK_TOKENS-token block).
- ``openai``: the request body as sent (``messages`` or ``prompt``, ``tools``), at the top level
  or under ``request``/``body``, optionally with ``response``/``usage`` and timestamps.
- ``prompts``: ``prompt`` text or token ids (``prompt_token_ids``, ``token_ids``, ...), optional
  ``output_length`` and ``timestamp`` (s; ``timestamp_ms`` in ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llm_diagnose.probes.traces.chat import chat_payloads, content_text, embedded_json, render_chat
from llm_diagnose.probes.traces.fields import (
    END_KEYS,
    INPUT_LEN_KEYS,
    LATENCY_KEYS,
    OUTPUT_LEN_KEYS,
    START_KEYS,
    TEXT_KEYS,
    TOKEN_KEYS,
    _epoch_s,
    _first,
    _int,
    _new_request,
    _token_list,
)
from llm_diagnose.probes.traces.records import BadRecord, TraceRequest

__all__ = ["HASH_ID_BLOCK_TOKENS", "JSONL_PARSERS"]

HASH_ID_BLOCK_TOKENS = 512  # Mooncake's hash_ids each stand for 512 prompt tokens


def _parse_mooncake(obj: dict, line: int) -> TraceRequest:
    if "hash_ids" not in obj:
        raise BadRecord("missing field 'hash_ids'")
    ids = obj["hash_ids"]
    try:  # min() is C-fast and fails on strings and nested lists; a float would only truncate
        if not isinstance(ids, list) or (ids and (min(ids) < 0 or isinstance(ids[0], bool) or max(ids) >= 1 << 64)):
            raise TypeError
    except TypeError:
        raise BadRecord("field 'hash_ids' must be a list of non-negative integers below 2^64") from None
    ts, n_in, n_out = obj.get("timestamp"), obj.get("input_length"), obj.get("output_length")
    return _new_request(
        TraceRequest,
        (  # all fields, in order: see _new_request
            line,
            None if ts is None else _epoch_s(ts, "timestamp", unit_s=1e-3),
            None,
            None if n_in is None else _int(n_in, "input_length"),
            None if n_out is None else _int(n_out, "output_length"),
            None,
            ids,
            None,
            None,
            (),
        ),
    )


def _times(obj: dict, *more: dict) -> tuple[float | None, float | None]:
    start = end = None
    for src in (obj, *more):
        if start is None:
            k, v = _first(src, START_KEYS)
            if k is not None:
                start = _epoch_s(v, k)
        if end is None:
            k, v = _first(src, END_KEYS)
            if k is not None:
                end = _epoch_s(v, k)
    if end is None and start is not None:
        for src in (obj, *more):
            for key, scale in LATENCY_KEYS:
                if isinstance(src.get(key), (int, float)) and not isinstance(src.get(key), bool):
                    try:
                        latency = float(src[key]) * scale
                    except OverflowError:
                        raise BadRecord(f"field {key!r} is not a duration: a number beyond any time") from None
                    return start, start + latency
    return start, end


def _parse_prompts(obj: dict, line: int) -> TraceRequest:
    key, tokens = _first(obj, TOKEN_KEYS)
    text = None
    if key is not None:
        tokens = _token_list(tokens, key)
    else:
        key, text = _first(obj, TEXT_KEYS)
        if key is not None and isinstance(text, (list, np.ndarray)):  # "prompt": [ids]
            tokens, text = _token_list(text, key), None
        elif text is not None and not isinstance(text, str):
            raise BadRecord(f"field {key!r} must be text or a list of token ids")
    if tokens is None and text is None:
        raise BadRecord(f"no prompt: expected one of {', '.join(TOKEN_KEYS + TEXT_KEYS)}")
    start: float | None
    if "timestamp_ms" in obj:
        start, end = _epoch_s(obj["timestamp_ms"], "timestamp_ms", unit_s=1e-3), None
    else:
        start, end = _times(obj)
    ok, ov = _first(obj, OUTPUT_LEN_KEYS)
    ik, iv = _first(obj, INPUT_LEN_KEYS)
    return TraceRequest(
        line=line,
        timestamp_s=start,
        end_s=end,
        input_tokens=None if ik is None else _int(iv, ik),
        output_tokens=None if ok is None else _int(ov, ok),
        tokens=tokens,
        text=text,
        payloads=tuple(embedded_json(text, "prompt")) if text and "{" in text else (),
    )


def _object(default: dict, *candidates: Any) -> dict:
    """The first candidate that is a JSON object, else the default."""
    return next((c for c in candidates if isinstance(c, dict)), default)


def _request_body(obj: dict) -> dict:
    return _object(obj, obj.get("request"), obj.get("body"))  # a gateway log wraps the body


def _parse_openai(obj: dict, line: int) -> TraceRequest:
    body = _request_body(obj)
    response = _object({}, obj.get("response"))
    usage = _object({}, response.get("usage"), obj.get("usage"))
    messages, prompt = body.get("messages"), body.get("prompt")
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    tokens = text = None
    payloads: list[tuple[str, Any]] = []
    if isinstance(messages, list):
        text = render_chat(messages, tools)
        payloads = chat_payloads(messages, tools, body)
    elif isinstance(prompt, str):
        text = prompt
        payloads = embedded_json(prompt, "prompt") if "{" in prompt else []
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        text = prompt[0]
    elif isinstance(prompt, np.ndarray) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        tokens = _token_list(prompt, "prompt")
    elif isinstance(prompt, list):
        raise BadRecord(f"a batch of {len(prompt)} prompts in one request is not supported")
    else:
        raise BadRecord("no 'messages' or 'prompt' in the request body")
    start, end = _times(obj, body, response)
    output_text = None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c = choices[0]
        text_out = c.get("text")
        if not isinstance(text_out, str):
            text_out = content_text(_object({}, c.get("message")).get("content"))
        output_text = text_out or None
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return TraceRequest(
        line=line,
        timestamp_s=start,
        end_s=end,
        input_tokens=None if pt is None else _int(pt, "usage.prompt_tokens"),
        output_tokens=None if ct is None else _int(ct, "usage.completion_tokens"),
        tokens=tokens,
        text=text,
        output_text=output_text,
        payloads=tuple(payloads),
    )


JSONL_PARSERS = {"mooncake": _parse_mooncake, "openai": _parse_openai, "prompts": _parse_prompts}
