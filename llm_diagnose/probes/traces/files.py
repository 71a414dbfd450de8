"""Opening a trace file and reading its lines: .gz on the fly, a byte-order mark skipped, a line cap.

A line longer than the cap (MAX_LINE_BYTES; `readers.py`, the entry point, hands it to every
reader) is read past in 1 MiB pieces and never held whole; a ``.gz`` that ends early or is
corrupt is read up to the damage, and the rest counts as one skipped line.
"""

from __future__ import annotations

import codecs
import io
import zlib

# The line cap and the splitter are the run-folder reader's too (one piece of code: bounded_lines.py).
from llm_diagnose.probes.bounded_lines import MAX_LINE_BYTES, too_long
from llm_diagnose.probes.bounded_lines import bounded_lines as _lines  # noqa: F401  (the trace readers' name)
from llm_diagnose.probes.traces.errors import TraceFormatError
from llm_diagnose.probes.traces.records import LineLog

__all__ = ["MAX_LINE_BYTES"]
_TOO_LONG = too_long(MAX_LINE_BYTES)


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
        f = open(path, "rb")  # noqa: SIM115  (returned open: the caller's `with` closes it)
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
