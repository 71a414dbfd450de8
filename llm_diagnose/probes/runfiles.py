"""Writing into a run folder without following links: the one place files are opened for writing.

A run folder may sit in a shared place (a CI workspace, /tmp), where someone else can plant a
symbolic link at the name a file is about to get. So:

- files appended to as results arrive (`metrics.jsonl`, `requests.jsonl`, `events.jsonl`) are
  opened with O_NOFOLLOW and must be plain files with one name (no symlink, FIFO, device or
  hard link to a file elsewhere);
- whole files (evidence, diagnosis, reports) are written to a fresh temporary file created
  exclusively (O_EXCL, random name) beside the target, then renamed over it: a reader never
  sees half a file, and a link at the temporary name cannot redirect the write. A target
  that is itself a symbolic link is refused rather than replaced.

Refusals raise `UnsafePathError` (an OSError, so callers that already handle unreadable or
unwritable paths handle these too), whose message says what to do.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import IO

__all__ = ["UnsafePathError", "open_append", "write_atomic", "refuse_link"]

_FILE_MODE = 0o644  # what open() gives under the usual umask; mkstemp's 0600 would surprise readers


class UnsafePathError(OSError):
    """A path the tool will not write through (a link, a folder, a device)."""

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


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` all at once: a fresh temporary file beside it, then a rename."""
    path = Path(path)
    refuse_link(path)
    if path.is_dir():
        raise UnsafePathError(path, "is a folder: give a file name")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
