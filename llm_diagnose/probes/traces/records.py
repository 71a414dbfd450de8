"""What a reader yields per request, and what it reports about the lines it read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from llm_diagnose.probes.traces.errors import TraceLineError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["TraceRequest", "ReadReport", "LineLog", "BadRecord"]


class TraceRequest(NamedTuple):
    """One request of a trace. Absent fields are None, never zero."""

    line: int  # line number in the file (1-based; for CSV, the row's last physical line)
    timestamp_s: float | None = None  # arrival, seconds (epoch or trace-relative)
    end_s: float | None = None  # completion, seconds, where the trace has it
    input_tokens: int | None = None  # prompt length as the trace states it
    output_tokens: int | None = None  # output length as the trace states it
    tokens: Sequence[int] | np.ndarray | None = None  # prompt token ids (a uint32 or uint64 array from the readers)
    hash_ids: Sequence[int] | None = None  # chained block ids (Mooncake)
    text: str | None = None  # prompt text (chat rendered), to be tokenised
    output_text: str | None = None  # response text, when only it gives the output length
    payloads: tuple[tuple[str, Any], ...] = ()  # (where, parsed JSON) for the key-order check


class BadRecord(Exception):
    """Raised by a record parser; the reader turns it into a skipped line (or a strict error)."""


@dataclass(frozen=True)
class ReadReport:
    lines: int  # non-blank lines (or CSV rows) read
    requests: int
    skipped: int
    first_errors: tuple[tuple[int, str], ...]  # (line, reason) of the first few skipped lines

    def to_dict(self) -> dict:
        return {
            "lines": self.lines,
            "requests": self.requests,
            "skipped": self.skipped,
            "first_errors": [{"line": n, "reason": r} for n, r in self.first_errors],
        }


class LineLog:
    """Counts lines and skipped lines while a reader streams; strict mode raises instead."""

    KEEP_ERRORS = 5

    def __init__(self, path: str, strict: bool) -> None:
        self.path = path
        self.strict = strict
        self.lines = 0
        self.requests = 0
        self.skipped = 0
        self.first_errors: list[tuple[int, str]] = []

    def skip(self, line: int, reason: str) -> None:
        if self.strict:
            raise TraceLineError(
                f"{reason} (without --strict such lines are skipped and counted)", path=self.path, line=line
            )
        self.skipped += 1
        if len(self.first_errors) < self.KEEP_ERRORS:
            self.first_errors.append((line, reason))

    def report(self) -> ReadReport:
        return ReadReport(self.lines, self.requests, self.skipped, tuple(self.first_errors))
