"""Telling a trace's format from its first readable lines: a CSV header, or a JSON object's keys."""

from __future__ import annotations

import json

from llm_diagnose.probes.traces.csv_reader import CSV_COLUMNS
from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceFormatError
from llm_diagnose.probes.traces.fields import TEXT_KEYS, TOKEN_KEYS
from llm_diagnose.probes.traces.files import _lines, _open_binary
from llm_diagnose.probes.traces.jsonl_formats import _request_body

__all__ = ["FORMATS", "detect_format"]

FORMATS = ("mooncake", "azure", "burstgpt", "openai", "prompts")
_DETECT_LINES = 20
_OPENAI_HINTS = ("model", "max_tokens", "usage", "response", "request", "body", "messages", "stream")


def _jsonl_format(obj: dict) -> str | None:
    if "hash_ids" in obj:
        return "mooncake"
    body = _request_body(obj)
    if "messages" in body or ("prompt" in body and any(k in obj for k in _OPENAI_HINTS)):
        return "openai"
    if any(k in obj for k in TOKEN_KEYS + TEXT_KEYS):
        return "prompts"
    return None


def detect_format(path: str, *, max_line_bytes: int) -> str:
    """The format of a trace from its first readable lines; raises TraceFormatError if unsure."""
    with _open_binary(path) as f:
        seen_keys: list[str] = []
        for number, raw in _lines(f, max_line_bytes):
            if number > _DETECT_LINES:
                break
            if raw is None:
                continue  # over max_line_bytes: the reader skips and counts it
            line = raw.strip()
            if not line:
                continue
            if not line.startswith(b"{"):
                header = [h.strip().lstrip("\ufeff") for h in line.decode("utf-8", "replace").split(",")]
                for fmt, cols in CSV_COLUMNS.items():
                    if all(c in header for c in cols):
                        return fmt
                raise TraceFormatError(
                    "cannot tell the format: not JSONL, and the CSV header has neither the Azure columns "
                    f"({', '.join(CSV_COLUMNS['azure'])}) nor the BurstGPT ones "
                    f"({', '.join(CSV_COLUMNS['burstgpt'])}); "
                    f"pass --format ({', '.join(FORMATS)})",
                    path=path,
                    line=number,
                )
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a corrupt first line should not hide the format of the rest
            if isinstance(obj, dict):
                found = _jsonl_format(obj)
                if found:
                    return found
                seen_keys = sorted(obj)[:12]
        damage = getattr(getattr(f, "raw", None), "damage", None)
        if not seen_keys:
            raise EmptyTraceError(
                f"{damage} in its first lines"
                if damage
                else "empty file, or no readable JSON object in its first lines",
                path=path,
            )
        raise TraceFormatError(
            f"cannot tell the format from the keys {seen_keys}; pass --format ({', '.join(FORMATS)})", path=path
        )
