"""The run folder: its file names, checking where output goes, and writing files so a reader
never sees half of one (and never through a link: see llm_diagnose.probes.runfiles)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llm_diagnose.diagnose.errors import UsageError

# write_atomic: a whole file at once (temporary file created exclusively, then renamed); links refused
from llm_diagnose.probes.runfiles import UnsafePathError, open_append, refuse_link, write_atomic

__all__ = [
    "EVIDENCE",
    "DIAGNOSIS",
    "SUMMARY",
    "METRICS",
    "REQUESTS",
    "EVENTS",
    "RUN_FILES",
    "write_atomic",
    "write_output",
    "open_append",
    "out_path",
    "prepare_out_dir",
    "check_out_file",
    "UnsafePathError",
]

EVIDENCE = "evidence.json"
DIAGNOSIS = "diagnosis.json"
SUMMARY = "summary.txt"
METRICS = "metrics.jsonl"  # written by llm_diagnose.probes.metrics.scraper as scrapes arrive
REQUESTS = "requests.jsonl"  # written by the active load driver as requests complete
EVENTS = "events.jsonl"  # prefill injections and other experiment events
RUN_FILES = (METRICS, REQUESTS, EVENTS, EVIDENCE, DIAGNOSIS, SUMMARY)


def out_path(text: str) -> Path:
    """argparse type of an output path: an empty one would silently mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder name (use '.' for this folder)")
    return Path(text)


def prepare_out_dir(path: Path, flag: str = "--out", files: tuple[str, ...] = RUN_FILES) -> Path:
    """Make sure the output folder exists and can be written, before any work (or traffic) starts.

    Raises UsageError (exit 2, one line) for an existing file, a folder that cannot be created or
    written, or a symbolic link at one of the names the command will write in it.
    """
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is an existing file: give a folder (new or existing) to write into")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder is not writable by this user")
    for name in files:
        try:
            refuse_link(path / name)
        except UnsafePathError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    return path


def check_out_file(path: Path, flag: str = "--out") -> Path:
    """An output file's checks, before the work that produces it: a folder that exists and is
    writable, and no folder or link at the name itself."""
    parent = path.parent
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder: give a file name")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder {parent} is not writable by this user")
    try:
        refuse_link(path)
    except UnsafePathError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    return path


def write_output(path: Path, text: str, flag: str = "--out") -> None:
    """`write_atomic` for a file the user named: every failure is one line naming the flag (exit 2)."""
    check_out_file(path, flag)
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
