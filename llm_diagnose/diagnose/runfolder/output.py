"""Writing a run folder: checking where output goes before any work starts, and writing files so a
reader never sees half of one, and never through a link (llm_diagnose.probes.runfiles).

`write_result` writes what every run ends with (evidence.json, diagnosis.json, summary.txt); `run`,
`demo` and each replica of `fleet` write through it (llm_diagnose.diagnose.collect.write_run).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes.runfiles import UnsafePathError, refuse_link, write_atomic
from llm_diagnose.probes.runfolder_names import DIAGNOSIS, EVENTS, EVIDENCE, INPUTS, METRICS, REQUESTS, SUMMARY

__all__ = ["RUN_FILES", "out_path", "prepare_out_dir", "check_out_file", "write_output", "write_result"]

RUN_FILES = (METRICS, REQUESTS, EVENTS, INPUTS, EVIDENCE, DIAGNOSIS, SUMMARY)


def write_result(folder: Path, evidence: Evidence, diagnosis: Diagnosis, summary: str) -> None:
    """A run's result files, each written whole (`write_atomic`): evidence.json, diagnosis.json and
    summary.txt (`summary` as given: the caller escapes what may quote a server)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / EVIDENCE, evidence.to_json())
    write_atomic(folder / DIAGNOSIS, diagnosis.to_json())
    write_atomic(folder / SUMMARY, summary)


def out_path(text: str) -> Path:
    """argparse type of an output path: an empty one would silently mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder name (use '.' for this folder)")
    return Path(text)


def prepare_out_dir(path: Path, flag: str = "--out", files: tuple[str, ...] = RUN_FILES) -> Path:
    """Make sure the output folder exists and can be written, before any work (or traffic) starts.

    Raises UsageError (exit 2, one line) for an existing file, a symbolic link (to a folder or
    anything else: the files are never written through a link), a folder that cannot be created or
    written, or a symbolic link at one of the names the command will write in it.
    """
    if path.is_symlink():
        raise UsageError(
            f"{flag} {path} is a symbolic link: give the folder itself (a run's files are never written through a link)"
        )
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


def write_output(path: Path, text: str | bytes, flag: str = "--out") -> None:
    """`write_atomic` for a file the user named (text, or bytes as they are): every failure is one line
    naming the flag (exit 2)."""
    check_out_file(path, flag)
    try:
        write_atomic(path, text if isinstance(text, str) else (text,))
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
