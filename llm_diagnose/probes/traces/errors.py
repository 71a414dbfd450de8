"""Errors of the trace readers: each names the file and, where there is one, the line."""

from __future__ import annotations

__all__ = ["TraceError", "TraceFormatError", "TraceLineError", "EmptyTraceError"]


class TraceError(ValueError):
    """A trace that cannot be analysed; `str()` reads `path:line: what is wrong`."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.reason = message
        where = path or ""
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)


class TraceFormatError(TraceError):
    """The format is unknown, cannot be detected, or lacks a required field or column."""


class TraceLineError(TraceError):
    """One line is unreadable (raised only in strict mode; otherwise the line is skipped)."""


class EmptyTraceError(TraceError):
    """No request could be read."""
