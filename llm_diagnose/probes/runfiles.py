"""Reading and writing a run folder without following links: the one place its files are opened.

A run folder may sit in a shared place (a CI workspace, /tmp), where someone else can plant a
symbolic link at the name a file is about to get. So, writing:

- files appended to as results arrive (`metrics.jsonl`, `requests.jsonl`, `events.jsonl`) are
  opened with O_NOFOLLOW and must be plain files with one name (no symlink, FIFO, device or
  hard link to a file elsewhere);
- whole files (evidence, diagnosis, reports) are written to a fresh temporary file created
  exclusively (O_EXCL, random name) beside the target, then renamed over it: a reader never
  sees half a file, and a link at the temporary name cannot redirect the write. A target
  that is itself a symbolic link is refused rather than replaced.

Reading (`open_plain`, `read_json_lines`, `read_document`): a run-folder file is read only as a
plain file, opened with O_NOFOLLOW: a link (to /dev/zero, say), a FIFO, a device or a socket is
refused before a byte is read, where it would otherwise hang the reader or fill its memory.
JSON-lines files are read with the trace readers' line cap (bounded_lines.MAX_LINE_BYTES: a
longer line is read past in pieces, never held whole); a line that cannot be read (over the cap,
bytes that are not UTF-8 anywhere in it, not JSON, nested too deeply, not a JSON object) comes
back as unreadable, with why, for the caller to skip and count. A whole document (evidence,
diagnosis) is read up to MAX_DOCUMENT_BYTES.

Counting (`read_objects`, `read_parsed`): the JSON objects of a file, with `LinesRead` saying how
many lines were kept and how many skipped as unreadable, so no reader drops a line silently;
`read_parsed` also turns each object into a record, and refuses the file (`LineSchemaError`, naming
the line) at an object of another schema. The run-folder module
(llm_diagnose.diagnose.runfolder) reads every file of a folder for the commands through these;
the probes read their own files (a replay source, a scrape file) through them too.

Refusals raise `UnsafePathError` (an OSError, so callers that already handle unreadable or
unwritable paths handle these too), whose message says what to do.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

from llm_diagnose.probes.bounded_lines import MAX_LINE_BYTES, bounded_lines, too_long

__all__ = [
    "UnsafePathError",
    "open_append",
    "write_atomic",
    "refuse_link",
    "open_plain",
    "read_json_lines",
    "read_document",
    "JsonLine",
    "LinesRead",
    "LineSchemaError",
    "ObjectLines",
    "read_objects",
    "read_parsed",
    "MAX_LINE_BYTES",
    "MAX_DOCUMENT_BYTES",
]

# The largest whole document read (evidence.json, diagnosis.json, a capacity plan). What the tool
# writes is far smaller (samples are capped at 2000 a measurement): a larger file is not one of its own.
MAX_DOCUMENT_BYTES = 64 << 20
_PIECE = 1 << 20

_FILE_MODE = 0o644  # what open() gives under the usual umask; mkstemp's 0600 would surprise readers


class UnsafePathError(OSError):
    """A path the tool will not read or write through (a link, a folder, a device), or a file past a bound."""

    def __init__(self, path: str | Path, what: str) -> None:
        super().__init__(errno.EPERM, what, str(path))
        self.what = what

    def __str__(self) -> str:
        return f"{self.filename}: {self.what}"


def refuse_link(path: str | Path) -> None:
    """Raise UnsafePathError when `path` is a symbolic link."""
    if os.path.islink(path):
        raise UnsafePathError(
            path, "is a symbolic link: refusing to write through it (remove the link, or give another path)"
        )


def open_append(path: str | Path) -> IO[str]:
    """Open a plain file for appending text, creating it if absent; never through a link."""
    path = Path(path)
    # O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader (it fails, ENXIO).
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | os.O_NONBLOCK
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, _FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            refuse_link(path)
        if exc.errno == errno.ENXIO:
            raise UnsafePathError(path, "is not a plain file: refusing to append to it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(path, "is not a plain file: refusing to append to it")
        if st.st_nlink > 1:
            raise UnsafePathError(
                path,
                f"has {st.st_nlink} names (a hard link to a file elsewhere): refusing to "
                "append to it (remove it, or give another folder)",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_atomic(path: str | Path, text: str | Iterable[bytes]) -> None:
    """Write `text` (UTF-8), or byte pieces in order, to `path` all at once: a fresh temporary file
    beside it, then a rename."""
    path = Path(path)
    refuse_link(path)
    if path.is_dir():
        raise UnsafePathError(path, "is a folder: give a file name")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.writelines((text.encode("utf-8"),) if isinstance(text, str) else text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --- reading --------------------------------------------------------------------------------------
_LINK = (
    "is a symbolic link, and a run folder's files are read only as plain files: replace the link with the file itself"
)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_plain(mode: int) -> str:
    kind = next((name for test, name in _KINDS if test(mode)), "a socket")  # (a folder is told apart before)
    return f"is {kind}, and a run folder's files are read only as plain files: put the run's own file there"


def open_plain(path: str | Path) -> BinaryIO:
    """Open a run-folder file for reading: a plain file, never through a link (see the module docstring)."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafePathError(path, _LINK) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UnsafePathError(path, "is a folder, not a file")
        if not stat.S_ISREG(mode):
            raise UnsafePathError(path, _not_plain(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_document(path: str | Path, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """A whole run-folder document as text (UnicodeDecodeError where it is not UTF-8)."""
    chunks: list[bytes] = []
    size = 0
    with open_plain(path) as f:
        # In pieces: read(max_bytes + 1) would allocate all of it up front, however small the file.
        while size <= max_bytes and (chunk := f.read(min(_PIECE, max_bytes + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    if size > max_bytes:
        raise UnsafePathError(
            path, f"is larger than {max_bytes >> 20} MiB (MAX_DOCUMENT_BYTES): not a file this tool wrote; not read"
        )
    return b"".join(chunks).decode("utf-8")


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSON-lines file: its object, or why it could not be read."""

    number: int  # from 1, blank lines included
    obj: dict[str, Any] | None  # None: unreadable (see `why`)
    why: str = ""
    too_long: bool = False  # over MAX_LINE_BYTES, skipped unread


_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def read_json_lines(path: str | Path, max_line_bytes: int | None = None) -> Iterator[JsonLine]:
    """Every non-blank line of a run-folder JSON-lines file (blank lines are not counted anywhere).

    The file is opened now (`open_plain`: UnsafePathError or OSError here), read as the iterator
    is. `max_line_bytes` defaults to this module's MAX_LINE_BYTES as it is when called. One rule
    for every line: a line that is not wholly UTF-8 (a stray byte in a key or in a value alike)
    is unreadable, never decoded with replacement characters, so it is skipped and counted like
    any other.
    """
    f = open_plain(path)
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    return _json_lines(f, limit)


def _json_lines(f: BinaryIO, limit: int) -> Iterator[JsonLine]:
    with f:
        for number, raw in bounded_lines(f, limit):
            if raw is None:
                yield JsonLine(number, None, too_long(limit), too_long=True)
                continue
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip():
                continue
            yield _parse_line(number, raw)


def _parse_line(number: int, raw: bytes) -> JsonLine:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return JsonLine(number, None, "not UTF-8 text")
    except RecursionError:
        return JsonLine(number, None, "JSON nested too deeply to read")
    except ValueError as exc:  # JSONDecodeError, or an integer of more digits than Python converts
        return JsonLine(number, None, f"not JSON ({getattr(exc, 'msg', exc)})")
    if not isinstance(obj, dict):
        return JsonLine(number, None, f"{_JSON_TYPES.get(type(obj), 'null')}, not a JSON object")
    return JsonLine(number, obj)


# --- counting -------------------------------------------------------------------------------------
_T = TypeVar("_T")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


@dataclass(frozen=True)
class LinesRead:
    """How one JSON-lines file was read: the lines kept, and the lines skipped as unreadable."""

    name: str  # the file's name in the run folder
    kept: int
    skipped: int  # cut short by a kill, too long, not UTF-8, nested too deeply, or not a JSON object
    too_long: int = 0  # of the skipped: longer than `max_line_bytes`, read past unread
    max_line_bytes: int = MAX_LINE_BYTES

    def describe(self) -> str:
        why = f"; {self.too_long} longer than the {_size(self.max_line_bytes)} line limit" if self.too_long else ""
        return f"{self.skipped} unreadable line(s) of {self.name} skipped ({self.kept} read{why})"


@dataclass(frozen=True)
class ObjectLines:
    """The JSON objects of a JSON-lines file with their line numbers, and the lines skipped."""

    objects: tuple[tuple[int, dict[str, Any]], ...]  # (line number, object)
    lines: LinesRead
    skipped_why: tuple[str, ...] = ()  # "line N: why", one per skipped line, in file order


def read_objects(path: str | Path, max_line_bytes: int | None = None) -> ObjectLines:
    """Every JSON object of a run-folder JSON-lines file (`read_json_lines`), each unreadable line
    skipped and counted with why. UnsafePathError or OSError where the file cannot be opened."""
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    objects: list[tuple[int, dict[str, Any]]] = []
    why: list[str] = []
    too_long_lines = 0
    for line in read_json_lines(path, limit):
        if line.obj is None:
            why.append(f"line {line.number}: {line.why}")
            too_long_lines += line.too_long
        else:
            objects.append((line.number, line.obj))
    read = LinesRead(Path(path).name, len(objects), len(why), too_long_lines, limit)
    return ObjectLines(tuple(objects), read, tuple(why))


class LineSchemaError(ValueError):
    """A line of a JSON-lines file that is a JSON object, but not a record of the schema read:
    the file is of another version or another tool, and skipping such lines would quietly empty it."""

    def __init__(self, path: str | Path, number: int, why: str) -> None:
        super().__init__(f"{path}: line {number}: {why}")
        self.path, self.number, self.why = Path(path), number, why


def read_parsed(
    path: str | Path, parse: Callable[[Mapping], _T], max_line_bytes: int | None = None
) -> tuple[tuple[_T, ...], LinesRead]:
    """Every readable line of `path` through `parse`; unreadable lines skipped and counted
    (`read_objects`). `parse` raises ValueError for an object of another schema: LineSchemaError."""
    read = read_objects(path, max_line_bytes)
    kept: list[_T] = []
    for number, obj in read.objects:
        try:
            kept.append(parse(obj))
        except ValueError as exc:
            raise LineSchemaError(path, number, str(exc)) from None
    return tuple(kept), read.lines
