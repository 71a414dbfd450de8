"""The fields of a trace record: the key names the readers look for, and one parser per kind of
value (a count, a timestamp, a list of token ids), each raising BadRecord with the reason."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np

from llm_diagnose.probes.traces.records import BadRecord

__all__ = ["TOKEN_KEYS", "TEXT_KEYS", "OUTPUT_LEN_KEYS", "INPUT_LEN_KEYS", "START_KEYS", "END_KEYS", "LATENCY_KEYS"]

TOKEN_KEYS = ("prompt_token_ids", "token_ids", "input_ids", "prompt_ids", "tokens")
TEXT_KEYS = ("prompt", "text", "input")
OUTPUT_LEN_KEYS = ("output_length", "output_tokens", "output_len", "completion_tokens", "response_tokens")
INPUT_LEN_KEYS = ("input_length", "prompt_tokens", "prompt_len", "input_tokens")
START_KEYS = ("timestamp", "created", "start_time", "request_time", "arrival_time", "created_at", "time")
END_KEYS = ("end_time", "completed_at", "finished_at", "response_time")
LATENCY_KEYS = (("latency_s", 1.0), ("latency", 1.0), ("duration_s", 1.0), ("duration", 1.0), ("latency_ms", 1e-3))


# The NamedTuple constructor is a Python function (defaults, keywords): a few times the cost of
# the tuple itself. The per-line parsers of traces with millions of lines build the tuple
# directly, with every field given in TraceRequest's order.
_new_request = tuple.__new__


_MAX_COUNT = 1 << 62  # a count a column of int64 can hold (any real one is far below)


def _int(value: Any, name: str) -> int:
    if type(value) is int and 0 <= value < _MAX_COUNT:
        return value
    if isinstance(value, bool):
        raise BadRecord(f"field {name!r} is a boolean, not a count")
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise BadRecord(f"field {name!r} is not a count: {str(value)[:20]!r}") from None
    if not math.isfinite(f) or f < 0 or f != int(f) or f >= _MAX_COUNT:
        raise BadRecord(f"field {name!r} must be a non-negative integer, got {str(value)[:20]!r}")
    return int(f)


_MAX_EPOCH_S = 1e11  # about the year 5100: beyond it a number is no time (a trace's spans and rates would overflow)


def _in_time(seconds: float, name: str) -> float:
    if abs(seconds) > _MAX_EPOCH_S:
        raise BadRecord(f"field {name!r} is not a timestamp: a number beyond any time")
    return seconds


def _epoch_s(value: Any, name: str, *, unit_s: float | None = None) -> float:
    """A timestamp as seconds: numbers in s (ms/µs guessed by size unless unit_s), or ISO text."""
    if type(value) is int and unit_s is not None and abs(value) < 1 << 62:
        return _in_time(value * unit_s, name)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            f = float(value)
        except OverflowError:
            raise BadRecord(f"field {name!r} is not a timestamp: a number beyond any time") from None
        if not math.isfinite(f):
            raise BadRecord(f"field {name!r} is not finite")
        if unit_s is not None:
            return _in_time(f * unit_s, name)
        if f > 1e14:
            return _in_time(f / 1e6, name)  # microseconds since the epoch
        if f > 1e11:
            return f / 1e3  # milliseconds since the epoch
        return f
    if isinstance(value, str):
        s = value.strip()
        try:
            return _epoch_s(float(s), name, unit_s=unit_s)
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise BadRecord(f"field {name!r} is not a timestamp: {s[:32]!r}") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)  # the public traces write UTC without an offset
        return dt.timestamp()
    raise BadRecord(f"field {name!r} is not a timestamp")


def _token_list(value: Any, name: str) -> np.ndarray:
    """Token (or block) ids as an unsigned array; BadRecord unless a flat list of non-negative integers."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, list):
        try:
            arr = np.array(value)
        except (ValueError, OverflowError):
            raise BadRecord(f"field {name!r} must be a list of non-negative integers") from None
    else:
        raise BadRecord(f"field {name!r} must be a list of non-negative integers")
    if arr.size == 0:
        return np.empty(0, dtype=np.uint32)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.min() < 0:
        raise BadRecord(f"field {name!r} must be a list of non-negative integers")
    return arr.astype(np.uint32 if arr.max() < 1 << 32 else np.uint64, copy=False)


def _first(obj: dict, keys) -> tuple[str | None, Any]:
    for k in keys:
        if k in obj and obj[k] is not None:
            return k, obj[k]
    return None, None
