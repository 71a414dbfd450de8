"""Lines of a file with a bound on each: the one line splitter of the trace readers and the run-folder reader.

A line longer than the cap is read past in READ_PAST_BYTES pieces and never held whole, so one
bad line (a file of zeros with no newline, a line cut from one JSON document of gigabytes) costs
the cap in memory, not its own length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

__all__ = ["MAX_LINE_BYTES", "READ_PAST_BYTES", "bounded_lines", "too_long"]

# The longest line read (bytes, not counting its newline). A request line of a real trace is a few KB
# (a 128k-token prompt as ids: under 1 MB); a run folder's longest is a metrics.jsonl line, one
# /metrics page of at most MAX_PAGE_BYTES (8 MiB) as a JSON string. A longer one is skipped and
# counted, read past in READ_PAST_BYTES pieces, so one bad line cannot take gigabytes of memory.
MAX_LINE_BYTES = 16 << 20
READ_PAST_BYTES = 1 << 20
_NEWLINE = 10


class _ReadsLines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


def too_long(max_line_bytes: int = MAX_LINE_BYTES) -> str:
    """Why a line over the cap was skipped (the same words wherever a reader skips one)."""
    size = f"{max_line_bytes >> 20} MiB" if max_line_bytes >= 1 << 20 else f"{max_line_bytes} bytes"
    return f"longer than {size} (MAX_LINE_BYTES): skipped unread"


def bounded_lines(f: _ReadsLines, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """(line number from 1, the line) for every line of a binary file; None for a line over
    `max_line_bytes`, which is read past a piece at a time (never held whole)."""
    readline, limit, n = f.readline, max_line_bytes + 1, 0
    while True:
        raw = readline(limit)
        if not raw:
            return
        n += 1
        if len(raw) == limit and raw[-1] != _NEWLINE:
            while raw and raw[-1] != _NEWLINE:
                raw = readline(READ_PAST_BYTES)
            yield n, None
        else:
            yield n, raw
