"""Streaming readers for the request-trace formats users bring: the entry points.

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

One job per module: files.py opens a trace and reads its lines; fields.py parses a record's
values; jsonl.py reads JSONL into records with a format's parser from jsonl_formats.py;
hash_id_columns.py reads Mooncake as columns; csv_reader.py reads the CSV formats; detect.py
tells the format. This module chooses the reader and gives every reader the line limit, read
here at each call. Callers outside this package import from here; the underscored names the
reader modules share are the package's own.
"""

from __future__ import annotations

from collections.abc import Iterator

from llm_diagnose.probes.traces import detect, hash_id_columns
from llm_diagnose.probes.traces.csv_reader import CSV_ROWS, _read_csv
from llm_diagnose.probes.traces.detect import FORMATS
from llm_diagnose.probes.traces.errors import TraceFormatError
from llm_diagnose.probes.traces.files import MAX_LINE_BYTES
from llm_diagnose.probes.traces.hash_id_columns import (
    LAYOUT_CHUNK_BYTES,
    HashIdBatch,
    _learn_layout,
    hash_id_records_batch,
)
from llm_diagnose.probes.traces.jsonl import _loads_with_token_list, _read_jsonl
from llm_diagnose.probes.traces.jsonl_formats import (
    HASH_ID_BLOCK_TOKENS,
    JSONL_PARSERS,
    _parse_mooncake,  # noqa: F401  (its old home: tests import it here)
)
from llm_diagnose.probes.traces.records import LineLog, TraceRequest

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


def detect_format(path: str) -> str:
    """The format of a trace from its first readable lines; raises TraceFormatError if unsure."""
    return detect.detect_format(path, max_line_bytes=MAX_LINE_BYTES)


def read_trace(path: str, fmt: str, log: LineLog) -> Iterator[TraceRequest]:
    """Stream the requests of a trace in file order."""
    if fmt in JSONL_PARSERS:
        if fmt == "prompts":  # token ids are parsed by numpy, line by line
            # (np.fromstring per line: about twice as quick on long token lists as numeric_lines,
            # whose cost is per number, with a dozen numpy passes for each)
            return _read_jsonl(
                path, log, JSONL_PARSERS[fmt], _loads_with_token_list, chunked=False, max_line_bytes=MAX_LINE_BYTES
            )
        return _read_jsonl(path, log, JSONL_PARSERS[fmt], max_line_bytes=MAX_LINE_BYTES)
    if fmt in CSV_ROWS:
        return _read_csv(path, log, fmt, max_line_bytes=MAX_LINE_BYTES)
    raise TraceFormatError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)} or auto", path=path)


def read_hash_id_batches(path: str, log: LineLog, chunk_bytes: int = LAYOUT_CHUNK_BYTES) -> Iterator[HashIdBatch]:
    """A Mooncake trace as batches of columns, in file order: no object per request (hash_id_columns.py)."""
    return hash_id_columns.read_hash_id_batches(
        path, log, chunk_bytes, max_line_bytes=MAX_LINE_BYTES, learn_layout=_learn_layout
    )
