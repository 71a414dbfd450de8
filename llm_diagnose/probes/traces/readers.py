"""Streaming readers for the request-trace formats users bring, with format detection.

Formats (see shared/notes/trace-formats.md):

- ``mooncake``: JSONL with ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (one chained id per 512-token block).
- ``azure``: Azure LLM inference CSV (2023 and 2024): ``TIMESTAMP``, ``ContextTokens``,
  ``GeneratedTokens``.
- ``burstgpt``: BurstGPT CSV: ``Timestamp`` (s), ``Request tokens``, ``Response tokens``, ...
- ``openai``: JSONL request logs: the body as sent (``messages`` or ``prompt``, ``tools``),
  at the top level or under ``request``/``body``, optionally with ``response``/``usage`` and
  timestamps (``timestamp``/``created``/``start_time``; ``end_time`` or ``latency``).
- ``prompts``: JSONL of ``prompt`` text or token ids (``prompt_token_ids``, ``token_ids``,
  ``input_ids``), optional ``output_length`` and ``timestamp`` (s; ``timestamp_ms`` in ms).

Every reader streams (a 10 GB file is read line by line), numbers lines from 1, and hands a
bad line to the LineLog: skipped and counted, or an error with its line number in strict mode.
Files ending in ``.gz`` are decompressed on the fly.

Limits: a line longer than MAX_LINE_BYTES is skipped and counted without being held in memory
whole; a UTF-8 byte-order mark before the first line is ignored; a ``.gz`` that ends early or is
corrupt is read up to the damage, and the rest counts as one skipped line. The analysis reads Mooncake traces through
`read_hash_id_batches`: column batches, the lines parsed by numpy a chunk at a time
(numeric_lines.py) and any line out of the file's layout by json, as `read_trace` does.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import json
import math
import re
import warnings
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np

from llm_diagnose.probes.traces.chat import chat_payloads, content_text, embedded_json, render_chat
from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceFormatError
from llm_diagnose.probes.traces.numeric_lines import LineLayout, ParsedLines, parse_lines
from llm_diagnose.probes.traces.records import BadRecord, LineLog, TraceRequest

__all__ = [
    "FORMATS",
    "HASH_ID_BLOCK_TOKENS",
    "MAX_LINE_BYTES",
    "HashIdBatch",
    "detect_format",
    "read_trace",
    "read_hash_id_batches",
    "hash_id_records_batch",
]

HASH_ID_BLOCK_TOKENS = 512  # Mooncake's hash_ids each stand for 512 prompt tokens

TOKEN_KEYS = ("prompt_token_ids", "token_ids", "input_ids", "prompt_ids", "tokens")
TEXT_KEYS = ("prompt", "text", "input")
OUTPUT_LEN_KEYS = ("output_length", "output_tokens", "output_len", "completion_tokens", "response_tokens")
INPUT_LEN_KEYS = ("input_length", "prompt_tokens", "prompt_len", "input_tokens")
START_KEYS = ("timestamp", "created", "start_time", "request_time", "arrival_time", "created_at", "time")
END_KEYS = ("end_time", "completed_at", "finished_at", "response_time")
LATENCY_KEYS = (("latency_s", 1.0), ("latency", 1.0), ("duration_s", 1.0), ("duration", 1.0), ("latency_ms", 1e-3))
_DETECT_LINES = 20

# The longest line read (bytes, newline included). A request line of a real trace is a few KB
# (a 128k-token prompt as ids: under 1 MB); a longer one is skipped and counted, read past in
# 1 MB pieces, so one bad line cannot take gigabytes of memory.
MAX_LINE_BYTES = 16 << 20
_TOO_LONG = f"longer than {MAX_LINE_BYTES >> 20} MiB (MAX_LINE_BYTES): skipped unread"


class _GzipStream(io.RawIOBase):
    """The decompressed bytes of a .gz, read up to any damage instead of failing on it.

    (gzip.GzipFile raises EOFError on a truncated file and loses the data of the read that hit
    it; this keeps everything before the damage, which `damage` then describes.) Members are
    read one after another, as gzip does; output comes in pieces of at most 1 MiB, so a
    decompression bomb costs time, not memory.
    """

    _IN, _OUT = 1 << 16, 1 << 20

    def __init__(self, compressed) -> None:
        self._f = compressed
        self._d = zlib.decompressobj(wbits=31)  # gzip header and trailer
        self._pending = b""  # compressed input not yet given to the decompressor
        self._out = memoryview(b"")
        self._started = False
        self.damage: str | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out:
            if self.damage or not self._fill():
                return 0
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _fill(self) -> bool:
        """Decompress a piece into self._out; False at the end (or at damage)."""
        if not self._pending:
            self._pending = self._f.read(self._IN)
            if not self._pending:
                if self._started and not self._d.eof:
                    self.damage = "the compressed file ends early (truncated .gz)"
                return False
        if self._d.eof:  # the next member of a multi-member file (or padding)
            if not self._pending.strip(b"\0"):
                self._pending = b""
                return True
            self._d = zlib.decompressobj(wbits=31)
        self._started = True
        try:
            out = self._d.decompress(self._pending, self._OUT)
        except zlib.error as exc:
            self.damage = f"the compressed data is corrupt ({exc})"
            return False
        self._pending = self._d.unconsumed_tail or self._d.unused_data
        self._out = memoryview(out)
        return True

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_binary(path: str):
    """The trace's bytes, a leading UTF-8 byte-order mark skipped; a .gz decompressed (damage: see _GzipStream)."""
    try:
        f = open(path, "rb")
        if path.endswith(".gz"):
            f = io.BufferedReader(_GzipStream(f), buffer_size=1 << 16)
    except FileNotFoundError:
        raise TraceFormatError("no such file", path=path) from None
    except IsADirectoryError:
        raise TraceFormatError("is a directory, not a trace file", path=path) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot open: {exc.strerror or exc}", path=path) from None
    try:
        if f.peek(len(codecs.BOM_UTF8))[: len(codecs.BOM_UTF8)] == codecs.BOM_UTF8:
            f.read(len(codecs.BOM_UTF8))
    except OSError as exc:
        f.close()
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", path=path) from None
    return f


def _damage_skipped(f, log: LineLog, line: int) -> None:
    """Count the unreadable rest of a damaged .gz as one skipped line (strict mode: an error)."""
    damage = getattr(getattr(f, "raw", None), "damage", None)
    if damage:
        log.lines += 1
        log.skip(line, f"{damage}: the rest of the file is unreadable")


def _lines(f) -> Iterator[tuple[int, bytes | None]]:
    """(line number from 1, the line) for every line; None for a line over MAX_LINE_BYTES, which
    is read past a piece at a time (never held whole)."""
    readline, limit, n = f.readline, MAX_LINE_BYTES + 1, 0
    while True:
        raw = readline(limit)
        if not raw:
            return
        n += 1
        if len(raw) == limit and raw[-1] != 10:  # (10: the newline)
            while raw and raw[-1] != 10:
                raw = readline(1 << 20)
            yield n, None
        else:
            yield n, raw


# The NamedTuple constructor is a Python function (defaults, keywords): a few times the cost of
# the tuple itself. The per-line parsers of traces with millions of lines build the tuple
# directly, with every field given in TraceRequest's order.
_new_request = tuple.__new__


# --- small field parsers (raise BadRecord with the reason) -----------------------------------
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


def _epoch_s(value: Any, name: str, *, unit_s: float | None = None) -> float:
    """A timestamp as seconds: numbers in s (ms/µs guessed by size unless unit_s), or ISO text."""
    if type(value) is int and unit_s is not None and abs(value) < 1 << 62:
        return value * unit_s
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            f = float(value)
        except OverflowError:
            raise BadRecord(f"field {name!r} is not a timestamp: a number beyond any time") from None
        if not math.isfinite(f):
            raise BadRecord(f"field {name!r} is not finite")
        if unit_s is not None:
            return f * unit_s
        if f > 1e14:
            return f / 1e6  # microseconds since the epoch
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


_decoder = json.JSONDecoder()


def _loads(raw: bytes) -> Any:
    """json.loads for one line, about twice as quick (no encoding sniffing, no wrapper layers)."""
    text = raw.decode("utf-8").strip()
    obj, end = _decoder.raw_decode(text)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return obj


_FLAT_INT_LIST = re.compile(rb'(?<!\\)"(' + b"|".join(k.encode() for k in TOKEN_KEYS + ("prompt",)) + rb')"\s*:\s*\[')


def _loads_with_token_list(raw: bytes) -> dict:
    """json.loads, with a flat integer list under a token key parsed by numpy (3x quicker).

    Only a list with no quotes or brackets inside is taken this way; anything else, and any
    line where the numbers do not all parse, goes through json.loads unchanged.
    """
    m = _FLAT_INT_LIST.search(raw)
    if m is None:
        return _loads(raw)
    end = raw.find(b"]", m.end())
    body = raw[m.end() : end]
    if end < 0 or b'"' in body or b"[" in body:
        return _loads(raw)
    try:
        with warnings.catch_warnings():  # older numpy warns on text it cannot parse, newer raises
            warnings.simplefilter("ignore", DeprecationWarning)
            ids = np.fromstring(body, dtype=np.int64, sep=",") if body.strip() else np.empty(0, dtype=np.int64)
    except ValueError:
        return _loads(raw)
    if len(ids) != (body.count(b",") + 1 if body.strip() else 0):
        return _loads(raw)  # not all numbers: let json say what is wrong
    obj = _loads(raw[: m.end()] + raw[end:])
    key = m.group(1).decode()
    if not (isinstance(obj, dict) and obj.get(key) == []):
        return _loads(raw)  # the list was nested (a request body under "request"): parse it all
    obj[key] = ids
    return obj


class HashIdBatch(NamedTuple):
    """Consecutive requests of a hash-id (Mooncake) trace as columns, one entry per request."""

    timestamp_s: np.ndarray  # float64, NaN where absent
    input_tokens: np.ndarray  # int64, -1 where absent
    output_tokens: np.ndarray  # int64, -1 where absent
    hash_ids: np.ndarray  # the requests' block ids end to end (int64; uint64 from json)
    counts: np.ndarray  # ids per request (int64)

    @property
    def requests(self) -> int:
        return len(self.counts)


def _first(obj: dict, keys) -> tuple[str | None, Any]:
    for k in keys:
        if k in obj and obj[k] is not None:
            return k, obj[k]
    return None, None


# --- one parser per JSONL format: dict -> TraceRequest ----------------------------------------
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
    if tokens is None:
        key, text = _first(obj, TEXT_KEYS)
        if isinstance(text, (list, np.ndarray)):  # "prompt": [ids]
            tokens, text = _token_list(text, key), None
        elif text is not None and not isinstance(text, str):
            raise BadRecord(f"field {key!r} must be text or a list of token ids")
    else:
        tokens = _token_list(tokens, key)
    if tokens is None and text is None:
        raise BadRecord(f"no prompt: expected one of {', '.join(TOKEN_KEYS + TEXT_KEYS)}")
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


_CHUNK_LINES = 2048


def _objects(lines: list[tuple[int, bytes]], loads: Callable[[bytes], Any], log: LineLog, chunked: bool):
    """(line number, parsed value or the error) for a chunk of lines.

    Chunked: the lines are parsed as one JSON array, which saves json's per-call overhead (about
    half the cost of a short line); a chunk that fails is parsed line by line to find the bad ones.
    """
    if chunked:
        try:
            values = loads(b"[" + b",".join(raw for _, raw in lines) + b"]")
            if len(values) == len(lines):
                return zip((n for n, _ in lines), values)
        except (ValueError, RecursionError):
            pass
    out = []
    for number, raw in lines:
        try:
            out.append((number, loads(raw)))
        except UnicodeDecodeError:
            out.append((number, BadRecord("not UTF-8 text")))
        except RecursionError:
            out.append((number, BadRecord("JSON nested too deeply to read")))
        except ValueError as exc:
            out.append((number, BadRecord(f"not JSON ({getattr(exc, 'msg', exc)})")))
    return out


def _json_records(
    lines: list[tuple[int, bytes]],
    log: LineLog,
    parse: Callable[[dict, int], TraceRequest],
    loads: Callable[[bytes], Any] = _loads,
    chunked: bool = True,
) -> Iterator[TraceRequest]:
    """The records of (line number, non-blank line) pairs; bad lines skipped and counted (strict: raised).

    A line given as None was over MAX_LINE_BYTES and is skipped unread."""
    log.lines += len(lines)
    if any(raw is None for _, raw in lines):
        for number, raw in lines:
            if raw is None:
                log.skip(number, _TOO_LONG)
        lines = [(n, raw) for n, raw in lines if raw is not None]
    for number, obj in _objects(lines, loads, log, chunked):
        if isinstance(obj, BadRecord):
            log.skip(number, str(obj))
            continue
        if not isinstance(obj, dict):
            log.skip(number, f"a JSON {type(obj).__name__}, not an object")
            continue
        try:
            record = parse(obj, number)
        except BadRecord as exc:
            log.skip(number, str(exc))
            continue
        except RecursionError:  # a value nested hundreds deep, rendered or walked by the parser
            log.skip(number, "JSON nested too deeply to read")
            continue
        log.requests += 1
        yield record


def _read_jsonl(
    path: str,
    log: LineLog,
    parse: Callable[[dict, int], TraceRequest],
    loads: Callable[[bytes], Any] = _loads,
    chunked: bool = True,
) -> Iterator[TraceRequest]:
    with _open_binary(path) as f:
        seen = [0]  # line number of the last line read, for the damage of a .gz

        def stripped() -> Iterator[tuple[int, bytes | None]]:
            for n, raw in _lines(f):
                seen[0] = n
                yield n, None if raw is None else raw.strip()

        numbered = stripped()
        while True:
            lines = [(n, raw) for n, raw in itertools.islice(numbered, _CHUNK_LINES) if raw != b""]
            if not lines:
                # islice may have consumed only blank lines: stop at the real end of the file
                peek = next(numbered, None)
                if peek is None:
                    break
                if peek[1] != b"":
                    lines = [peek]
                else:
                    continue
            yield from _json_records(lines, log, parse, loads, chunked)
        _damage_skipped(f, log, seen[0] + 1)


# --- JSONL of numbers, parsed a chunk at a time ---------------------------------------------------
LAYOUT_CHUNK_BYTES = 1 << 21  # about 17 k Mooncake lines: numpy's arrays stay in cache
_LAYOUT_LINES = 100
_MIXED_RANGES = 64  # more stretches of lines out of the layout in one chunk: the chunk goes to json


def _layout_pieces(
    path: str, list_keys: tuple[str, ...], chunk_bytes: int, log: LineLog
) -> Iterator[ParsedLines | list]:
    """A JSONL file in file order, as parsed chunks of lines in its layout and lists of other lines.

    The layout is learned from the first line among the first ones that json reads as numbers
    and one list of numbers under one of `list_keys` (numeric_lines). Lines in that layout
    (the same keys in the same order and spacing) come as ParsedLines; any other line comes in
    a list of (line number, stripped line) for json, blank lines left out. A line over
    MAX_LINE_BYTES, and the damaged rest of a .gz, are skipped into `log` here.
    """
    chunk_bytes = min(chunk_bytes, MAX_LINE_BYTES)  # so a line inside a chunk is within the cap
    with _open_binary(path) as f:
        layout: LineLayout | None = None
        before = 0  # lines before the chunk
        first = True
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                _damage_skipped(f, log, before + 1)
                return
            too_long = False  # the chunk's last line is over MAX_LINE_BYTES: cut off, read past
            if not chunk.endswith(b"\n"):
                start = chunk.rfind(b"\n") + 1  # where the chunk's last line starts
                rest = f.readline(max(1, MAX_LINE_BYTES + 1 - (len(chunk) - start)))
                chunk += rest
                if not chunk.endswith(b"\n") and len(chunk) - start > MAX_LINE_BYTES:
                    while rest and not rest.endswith(b"\n"):  # read past it, a piece at a time
                        rest = f.readline(1 << 20)
                    chunk, too_long = chunk[:start], True
                elif not chunk.endswith(b"\n"):
                    chunk += b"\n"  # the last line, without its newline
            if chunk:
                if first:
                    layout, first = _learn_layout(chunk, list_keys), False
                for piece in _chunk_pieces(chunk, layout, before):
                    yield piece
                before += chunk.count(b"\n")
            if too_long:
                before += 1
                log.lines += 1
                log.skip(before, _TOO_LONG)


def _chunk_pieces(chunk: bytes, layout: LineLayout | None, before: int) -> Iterator[ParsedLines | list]:
    """One chunk of whole lines: parsed stretches in the layout, and lists of the other lines."""
    parsed, bad = (None, []) if layout is None else parse_lines(chunk, layout)
    if parsed is not None:  # (the usual case: every line in the layout)
        yield parsed
        return
    if not bad or len(bad) > _MIXED_RANGES:
        bad = [(0, len(chunk))]  # no layout, or lines of many layouts: json for the chunk
    pos = 0
    for lo, hi in bad + [(len(chunk), len(chunk))]:
        if lo > pos:  # lines in the layout between ones that are not
            parsed, _ = parse_lines(chunk[pos:lo], layout)
            yield parsed if parsed is not None else _numbered(chunk[pos:lo], before)
            before += chunk.count(b"\n", pos, lo)
        if hi > lo:
            yield _numbered(chunk[lo:hi], before)
            before += chunk.count(b"\n", lo, hi)
        pos = hi


def _learn_layout(chunk: bytes, list_keys: tuple[str, ...]) -> LineLayout | None:
    for raw in chunk.split(b"\n", _LAYOUT_LINES)[:_LAYOUT_LINES]:
        layout = LineLayout.learn(raw.strip())
        if layout is not None and layout.list_field is not None and layout.fields[layout.list_field] in list_keys:
            return layout
    return None


def _numbered(piece: bytes, before: int) -> list[tuple[int, bytes]]:
    return [(before + i, raw) for i, raw in enumerate((r.strip() for r in piece.split(b"\n")[:-1]), 1) if raw]


def read_hash_id_batches(path: str, log: LineLog, chunk_bytes: int = LAYOUT_CHUNK_BYTES) -> Iterator[HashIdBatch]:
    """A Mooncake trace as batches of columns, in file order: no object per request.

    Lines in the file's layout are parsed a chunk at a time by numpy; any other line goes
    through json.loads and the same checks as `read_trace`, with its line number.
    """
    for piece in _layout_pieces(path, ("hash_ids",), chunk_bytes, log):
        if isinstance(piece, ParsedLines):
            n = piece.lines
            log.lines += n
            log.requests += n
            cols = piece.columns
            absent = np.full(n, -1, dtype=np.int64)
            ts = cols["timestamp"] * 1e-3 if "timestamp" in cols else np.full(n, math.nan)  # ms, as _parse_mooncake
            yield HashIdBatch(
                ts, cols.get("input_length", absent), cols.get("output_length", absent), piece.items, piece.counts
            )
        else:
            records = list(_json_records(piece, log, _parse_mooncake))
            if records:
                yield hash_id_records_batch(records)


def hash_id_records_batch(records: list[TraceRequest]) -> HashIdBatch:
    """Mooncake records (from json) as a batch of columns."""
    cols = TraceRequest(*zip(*records))
    ts = np.array([math.nan if t is None else t for t in cols.timestamp_s], dtype=np.float64)
    inputs = np.array([-1 if x is None else x for x in cols.input_tokens], dtype=np.int64)
    outputs = np.array([-1 if x is None else x for x in cols.output_tokens], dtype=np.int64)
    counts = np.fromiter(map(len, cols.hash_ids), dtype=np.int64, count=len(records))
    ids = np.fromiter(itertools.chain.from_iterable(cols.hash_ids), dtype=np.uint64, count=int(counts.sum()))
    return HashIdBatch(ts, inputs, outputs, ids, counts)


# --- CSV formats -------------------------------------------------------------------------------
def _lengths_only(line: int, ts: float, n_in: int, n_out: int) -> TraceRequest:
    return _new_request(TraceRequest, (line, ts, None, n_in, n_out, None, None, None, None, ()))


def _azure_row(row: dict, line: int) -> TraceRequest:
    return _lengths_only(
        line,
        _epoch_s(row["TIMESTAMP"], "TIMESTAMP"),
        _int(row["ContextTokens"], "ContextTokens"),
        _int(row["GeneratedTokens"], "GeneratedTokens"),
    )


def _burstgpt_row(row: dict, line: int) -> TraceRequest:
    return _lengths_only(
        line,
        _epoch_s(row["Timestamp"], "Timestamp", unit_s=1.0),
        _int(row["Request tokens"], "Request tokens"),
        _int(row["Response tokens"], "Response tokens"),
    )


CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
_CSV_ROWS = {"azure": _azure_row, "burstgpt": _burstgpt_row}


def _read_csv(path: str, log: LineLog, fmt: str) -> Iterator[TraceRequest]:
    required = CSV_COLUMNS[fmt]
    with _open_binary(path) as raw:
        seen = [0]

        def text_lines() -> Iterator[str]:
            # Decoded line by line (csv counts what it is given, so line numbers stay the file's):
            # a line over MAX_LINE_BYTES becomes an empty line, skipped and counted here.
            for n, line in _lines(raw):
                seen[0] = n
                if line is None:
                    log.lines += 1
                    log.skip(n, _TOO_LONG)
                    yield "\n"
                else:
                    text = line.decode("utf-8", "replace")
                    if "\r" in text.rstrip("\r\n"):  # old Mac line ends (what newline="" reading split on)
                        yield from text.splitlines(keepends=True)
                    else:
                        yield text

        reader = csv.reader(text_lines())
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise TraceFormatError(f"the CSV header cannot be read ({exc})", path=path, line=1) from None
        if header is None:
            raise EmptyTraceError("empty file", path=path)
        header = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(
                f"{fmt} CSV lacks the column(s) {', '.join(map(repr, missing))} (header: {', '.join(header)[:200]})",
                path=path,
                line=1,
            )
        index = {c: header.index(c) for c in required}
        parse = _CSV_ROWS[fmt]
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                log.lines += 1
                log.skip(reader.line_num, f"bad CSV ({exc})")
                continue
            if not row or all(not c.strip() for c in row):
                continue
            log.lines += 1
            if len(row) < len(header):
                log.skip(reader.line_num, f"{len(row)} columns where the header has {len(header)}")
                continue
            try:
                record = parse({c: row[i] for c, i in index.items()}, reader.line_num)
            except BadRecord as exc:
                log.skip(reader.line_num, str(exc))
                continue
            log.requests += 1
            yield record
        _damage_skipped(raw, log, seen[0] + 1)


# --- detection and the entry point -------------------------------------------------------------
FORMATS = ("mooncake", "azure", "burstgpt", "openai", "prompts")

_JSONL = {"mooncake": _parse_mooncake, "openai": _parse_openai, "prompts": _parse_prompts}
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


def detect_format(path: str) -> str:
    """The format of a trace from its first readable lines; raises TraceFormatError if unsure."""
    with _open_binary(path) as f:
        seen_keys: list[str] = []
        for number, raw in _lines(f):
            if number > _DETECT_LINES:
                break
            if raw is None:
                continue  # over MAX_LINE_BYTES: the reader skips and counts it
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
                    f"({', '.join(CSV_COLUMNS['azure'])}) nor the BurstGPT ones ({', '.join(CSV_COLUMNS['burstgpt'])}); "
                    f"pass --format ({', '.join(FORMATS)})",
                    path=path,
                    line=number,
                )
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a corrupt first line should not hide the format of the rest
            if isinstance(obj, dict):
                fmt = _jsonl_format(obj)
                if fmt:
                    return fmt
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


def read_trace(path: str, fmt: str, log: LineLog) -> Iterator[TraceRequest]:
    """Stream the requests of a trace in file order."""
    if fmt in _JSONL:
        if fmt == "prompts":  # token ids are parsed by numpy, line by line
            # (np.fromstring per line: about twice as quick on long token lists as numeric_lines,
            # whose cost is per number, with a dozen numpy passes for each)
            return _read_jsonl(path, log, _JSONL[fmt], _loads_with_token_list, chunked=False)
        return _read_jsonl(path, log, _JSONL[fmt])
    if fmt in _CSV_ROWS:
        return _read_csv(path, log, fmt)
    raise TraceFormatError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)} or auto", path=path)
