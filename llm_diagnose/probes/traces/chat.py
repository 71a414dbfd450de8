"""Chat requests as prompt text, and the JSON payloads in them (for the key-order check)."""

from __future__ import annotations

import json
from typing import Any

from llm_diagnose.probes.traces.records import BadRecord

__all__ = ["render_chat", "chat_payloads", "embedded_json", "content_text"]

_MAX_EMBEDDED = 4


def embedded_json(text: str, where: str) -> list[tuple[str, Any]]:
    """JSON objects written inside prompt text (tool schemas, documents), up to a few."""
    out: list[tuple[str, Any]] = []
    decoder = json.JSONDecoder()
    pos = text.find("{")
    attempts = 0
    while pos >= 0 and len(out) < _MAX_EMBEDDED and attempts < 2 * _MAX_EMBEDDED:
        attempts += 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict) and obj:
            out.append((where, obj))
        pos = text.find("{", end)
    return out


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: text parts kept, others stood in for
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(f"[{part.get('type', 'part') if isinstance(part, dict) else 'part'}]")
        return "".join(parts)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def render_chat(messages: list, tools: list | None = None) -> str:
    """Chat messages as one prompt text, ChatML-style (an approximation of the model's template).

    Tools and tool calls are written with json.dumps in the order given, as templates do, so an
    unstable key order changes the text exactly as it changes the real prompt.
    """
    parts = []
    if tools:
        parts.append("<|im_start|>system\n# Tools\n" + json.dumps(tools, ensure_ascii=False) + "<|im_end|>\n")
    for m in messages:
        if not isinstance(m, dict):
            raise BadRecord("a message is not an object")
        body = content_text(m.get("content"))
        if m.get("tool_calls"):
            body += json.dumps(m["tool_calls"], ensure_ascii=False)
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{body}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def chat_payloads(messages: list, tools: list | None, extra: dict) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("tools", t) for t in tools or () if isinstance(t, dict)]
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = content_text(m.get("content"))
        if "{" in content:
            out.extend(embedded_json(content, f"{m.get('role', 'user')} message"))
        for call in m.get("tool_calls") or ():
            args = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str) and args.startswith("{"):
                out.extend(embedded_json(args, "tool call arguments"))
    for key in ("response_format", "functions"):
        if isinstance(extra.get(key), dict):
            out.append((key, extra[key]))
    return out
