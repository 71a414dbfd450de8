"""A hash-id (Mooncake) trace as batches of columns: no object per request.

The lines are parsed by numpy a chunk at a time (numeric_lines.py) in the layout learned from
the first lines; any line out of that layout goes through json and the same checks as
`read_trace` (jsonl.py, jsonl_formats.py), with its line number.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from llm_diagnose.probes.traces.files import _TOO_LONG, _damage_skipped, _open_binary
from llm_diagnose.probes.traces.jsonl import _json_records
from llm_diagnose.probes.traces.jsonl_formats import _parse_mooncake
from llm_diagnose.probes.traces.numeric_lines import LineLayout, ParsedLines, parse_lines
from llm_diagnose.probes.traces.records import LineLog, TraceRequest

__all__ = ["HashIdBatch", "LAYOUT_CHUNK_BYTES", "read_hash_id_batches", "hash_id_records_batch"]

# The file's layout from its first chunk and the list keys it must hold (None: no layout).
LearnLayout = Callable[[bytes, tuple[str, ...]], LineLayout | None]

LAYOUT_CHUNK_BYTES = 1 << 21  # about 17 k Mooncake lines: numpy's arrays stay in cache
_LAYOUT_LINES = 100
_MIXED_RANGES = 64  # more stretches of lines out of the layout in one chunk: the chunk goes to json


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


def _layout_pieces(
    path: str,
    list_keys: tuple[str, ...],
    chunk_bytes: int,
    log: LineLog,
    max_line_bytes: int,
    learn_layout: LearnLayout,
) -> Iterator[ParsedLines | list]:
    """A JSONL file in file order, as parsed chunks of lines in its layout and lists of other lines.

    The layout is learned from the first line among the first ones that json reads as numbers
    and one list of numbers under one of `list_keys` (numeric_lines). Lines in that layout
    (the same keys in the same order and spacing) come as ParsedLines; any other line comes in
    a list of (line number, stripped line) for json, blank lines left out. A line over
    max_line_bytes, and the damaged rest of a .gz, are skipped into `log` here.
    """
    chunk_bytes = min(chunk_bytes, max_line_bytes)  # so a line inside a chunk is within the cap
    with _open_binary(path) as f:
        layout: LineLayout | None = None
        before = 0  # lines before the chunk
        first = True
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                _damage_skipped(f, log, before + 1)
                return
            too_long = False  # the chunk's last line is over max_line_bytes: cut off, read past
            if not chunk.endswith(b"\n"):
                start = chunk.rfind(b"\n") + 1  # where the chunk's last line starts
                rest = f.readline(max(1, max_line_bytes + 1 - (len(chunk) - start)))
                chunk += rest
                if not chunk.endswith(b"\n") and len(chunk) - start > max_line_bytes:
                    while rest and not rest.endswith(b"\n"):  # read past it, a piece at a time
                        rest = f.readline(1 << 20)
                    chunk, too_long = chunk[:start], True
                elif not chunk.endswith(b"\n"):
                    chunk += b"\n"  # the last line, without its newline
            if chunk:
                if first:
                    layout, first = learn_layout(chunk, list_keys), False
                yield from _chunk_pieces(chunk, layout, before)
                before += chunk.count(b"\n")
            if too_long:
                before += 1
                log.lines += 1
                log.skip(before, _TOO_LONG)


def _chunk_pieces(chunk: bytes, layout: LineLayout | None, before: int) -> Iterator[ParsedLines | list]:
    """One chunk of whole lines: parsed stretches in the layout, and lists of the other lines."""
    if layout is None:  # json for the chunk
        if chunk:
            yield _numbered(chunk, before)
        return
    parsed, bad = parse_lines(chunk, layout)
    if parsed is not None:  # (the usual case: every line in the layout)
        yield parsed
        return
    if not bad or len(bad) > _MIXED_RANGES:
        bad = [(0, len(chunk))]  # lines of many layouts: json for the chunk
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


def read_hash_id_batches(
    path: str,
    log: LineLog,
    chunk_bytes: int = LAYOUT_CHUNK_BYTES,
    *,
    max_line_bytes: int,
    learn_layout: LearnLayout = _learn_layout,
) -> Iterator[HashIdBatch]:
    """A Mooncake trace as batches of columns, in file order: no object per request.

    Lines in the file's layout are parsed a chunk at a time by numpy; any other line goes
    through json.loads and the same checks as `read_trace`, with its line number.
    `learn_layout` finds the layout (one that finds none sends every line through json, as the
    parity tests do).
    """
    for piece in _layout_pieces(path, ("hash_ids",), chunk_bytes, log, max_line_bytes, learn_layout):
        if isinstance(piece, ParsedLines):
            if piece.items is None or piece.counts is None:  # a layout learned here holds the hash_ids list
                raise RuntimeError("a hash-id layout without its list field")
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
    id_lists = [r.hash_ids for r in records if r.hash_ids is not None]
    if len(id_lists) < len(records):
        raise ValueError("a Mooncake record without its hash_ids")
    ts = np.array([math.nan if r.timestamp_s is None else r.timestamp_s for r in records], dtype=np.float64)
    inputs = np.array([-1 if r.input_tokens is None else r.input_tokens for r in records], dtype=np.int64)
    outputs = np.array([-1 if r.output_tokens is None else r.output_tokens for r in records], dtype=np.int64)
    counts = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(records))
    ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.uint64, count=int(counts.sum()))
    return HashIdBatch(ts, inputs, outputs, ids, counts)
