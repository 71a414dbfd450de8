"""The run folder: its file names (defined once), reading everything a run left behind once
(`RunFolder`), checking where output goes, and writing files so a reader never sees half of one
(and never through a link: see llm_diagnose.probes.runfiles).

Reading. `RunFolder.open(path)` takes a run folder, or its evidence.json or diagnosis.json, and
loads the evidence, the diagnosis as written, the request records (`requests.jsonl`), the
experiment events (`events.jsonl`) and the capacity plan (`capacity-plan.json`), each once.
Reports and the gate are functions of the loaded folder and open no file themselves.

- A line of a JSON-lines file that cannot be read (cut short by a kill mid-write, spoilt by bytes
  that are not UTF-8, nested too deeply, not a JSON object) is skipped and *counted*; the counts
  (`RunFolder.lines`) are shown by the reports and the gate, so a sample that quietly shrank says so.
- A file of another schema (an evidence or diagnosis file of another schema or version; a
  `requests.jsonl` or `events.jsonl` line that is JSON but not a record of this version) is
  refused: `RunFolderError`, a one-line UsageError (exit 2) naming the file and the line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.tree.diagnosis import DIAGNOSIS_SCHEMA, Diagnosis
from llm_diagnose.diagnose.tree.evidence import SCHEMA as EVIDENCE_SCHEMA
from llm_diagnose.diagnose.tree.evidence import Evidence, EvidenceError, parse_json_document

# write_atomic: a whole file at once (temporary file created exclusively, then renamed); links refused
from llm_diagnose.probes.runfiles import UnsafePathError, open_append, refuse_link, write_atomic

# The file names are defined once, where the probes that append to some of them can import them too.
from llm_diagnose.probes.runfolder_names import (
    CAPACITY_PLAN,
    DIAGNOSIS,
    EVENTS,
    EVIDENCE,
    INPUTS,
    METRICS,
    REQUESTS,
    SUMMARY,
)

if TYPE_CHECKING:  # the record type is imported when a requests.jsonl is read (its package loads the HTTP client)
    from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "EVIDENCE",
    "DIAGNOSIS",
    "SUMMARY",
    "METRICS",
    "REQUESTS",
    "EVENTS",
    "CAPACITY_PLAN",
    "RUN_FILES",
    "RunFolder",
    "RunFolderError",
    "LinesRead",
    "write_atomic",
    "write_output",
    "open_append",
    "out_path",
    "prepare_out_dir",
    "check_out_file",
    "UnsafePathError",
]

RUN_FILES = (METRICS, REQUESTS, EVENTS, INPUTS, EVIDENCE, DIAGNOSIS, SUMMARY)

_T = TypeVar("_T")


class RunFolderError(UsageError):
    """A run-folder file this version cannot read: another schema or version, or unreadable (exit 2)."""


@dataclass(frozen=True)
class LinesRead:
    """How one JSON-lines file was read: the lines kept, and the lines skipped as unreadable."""

    name: str  # the file's name in the run folder
    kept: int
    skipped: int  # cut short by a kill, not UTF-8, nested too deeply, or not a JSON object

    def describe(self) -> str:
        return f"{self.skipped} unreadable line(s) of {self.name} skipped ({self.kept} read)"


def _read_json_lines(path: Path, parse: Callable[[str], _T | None], what: str) -> tuple[tuple[_T, ...], LinesRead]:
    """Every line of `path` through `parse` (None: unreadable, skipped and counted).

    `parse` raises ValueError (RecordSchemaError, say) for a line that is JSON but of another schema:
    the whole file is refused, naming the line.
    """
    kept: list[_T] = []
    skipped = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:  # a stray byte spoils its line, not the file
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    item = parse(line)
                except ValueError as exc:
                    raise RunFolderError(
                        f"{path}: line {number} is not {what} this version reads ({exc}): written by another "
                        "version of llm-diagnose or another tool? Rerun with this version, or move the file aside"
                    ) from None
                if item is None:
                    skipped += 1
                else:
                    kept.append(item)
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return tuple(kept), LinesRead(path.name, len(kept), skipped)


def _parse_event(line: str) -> Mapping[str, object] | None:
    """An events.jsonl line: {"event": NAME, "t": perf_counter seconds, ...} (JsonlWriter.event)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if not isinstance(obj.get("event"), str):
        raise ValueError(f"field 'event' is {obj.get('event')!r}, expected the event's name")
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ValueError(f"field 't' is {t!r}, expected a time in seconds")
    return MappingProxyType(obj)


def _read_document(path: Path) -> dict:
    try:
        data = parse_json_document(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path}: cannot read it ({exc})") from None
    except EvidenceError as exc:
        raise RunFolderError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object")
    return data


def _read_evidence(path: Path) -> Evidence:
    try:
        return Evidence.from_dict(_read_document(path))
    except EvidenceError as exc:
        raise RunFolderError(f"{path}: {exc}") from None


def _read_diagnosis(path: Path) -> Diagnosis:
    try:
        return Diagnosis.from_dict(_read_document(path))
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:  # a file edited by hand
        raise RunFolderError(
            f"{path}: not a diagnosis this tool can read ({type(exc).__name__}: {exc}); "
            f"remove it to diagnose {EVIDENCE} afresh"
        ) from None


def _read_plan(path: Path) -> Mapping | None:
    """The capacity plan, or None (unreadable: a report still renders without it)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("scenarios"), list) else None


@dataclass(frozen=True)
class RunFolder:
    """What a run left behind, read once: immutable, and the only reader of a run folder's files.

    `requests` is None where the folder has no requests.jsonl (a passive run); `lines` counts,
    per JSON-lines file, the lines read and the lines skipped as unreadable.
    """

    path: Path  # the folder the per-request files are read from
    label: str  # what the user named (a folder or a file), for messages
    evidence: Evidence | None = None  # None: no evidence file (a diagnosis.json alone)
    evidence_path: Path | None = None
    diagnosis: Diagnosis | None = None  # as written in diagnosis.json; None when there is none
    diagnosis_path: Path | None = None
    requests: tuple[RequestRecord, ...] | None = None
    events: tuple[Mapping[str, object], ...] = ()
    capacity_plan: Mapping | None = None
    lines: tuple[LinesRead, ...] = ()
    note: str = ""  # how the evidence was obtained, when that is worth saying
    from_scrapes: bool = False  # evidence rebuilt from metrics.jsonl (an interrupted run)

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> RunFolder:
        """A run folder, an evidence.json or a diagnosis.json (any name: the file's schema says which).

        Raises RunFolderError (exit 2, one line) for a path that does not exist, a folder holding
        neither file, a file of another schema, or any file of the folder that cannot be read.
        """
        p = Path(path)
        if not p.exists():
            raise RunFolderError(f"{p} does not exist: give a run folder, an {EVIDENCE} or a {DIAGNOSIS}")
        if p.is_dir():
            return cls.load(p, label=str(p))
        schema = _read_document(p).get("schema")
        if schema == DIAGNOSIS_SCHEMA:
            return cls.load(p.parent, diagnosis_path=p, label=str(p))
        if schema == EVIDENCE_SCHEMA:
            return cls.load(p.parent, evidence_path=p, label=str(p))
        raise RunFolderError(f"{p}: field 'schema' is {schema!r}; expected {EVIDENCE_SCHEMA!r} or {DIAGNOSIS_SCHEMA!r}")

    @classmethod
    def load(
        cls,
        folder: str | Path,
        *,
        evidence_path: Path | None = None,
        diagnosis_path: Path | None = None,
        label: str = "",
    ) -> RunFolder:
        """Everything in `folder`; `evidence_path`/`diagnosis_path` name those files where they are not
        the folder's own. A folder with neither, but with the scrapes of an interrupted run, gives the
        evidence rebuilt from them."""
        folder = Path(folder)
        ev_path = evidence_path or folder / EVIDENCE
        dg_path = diagnosis_path or folder / DIAGNOSIS
        evidence, note, from_scrapes = None, "", False
        if ev_path.exists():
            evidence = _read_evidence(ev_path)
        elif not dg_path.exists():
            if not (folder / METRICS).exists():
                raise RunFolderError(f"{folder} holds neither {EVIDENCE} nor {DIAGNOSIS}: is it a run folder?")
            from llm_diagnose.diagnose.collect import evidence_from_scrapes  # collect imports this module

            evidence, from_scrapes = evidence_from_scrapes(folder), True
            note = f"no {EVIDENCE} in {folder} (an interrupted run?): diagnosed from the scrapes in {folder / METRICS}"
        diagnosis = _read_diagnosis(dg_path) if dg_path.exists() else None
        events: tuple[Mapping[str, object], ...] = ()
        requests, lines = None, []
        if (folder / REQUESTS).exists():
            from llm_diagnose.probes.load.records import parse_record_line  # see TYPE_CHECKING above

            requests, read = _read_json_lines(folder / REQUESTS, parse_record_line, "a request record")
            lines.append(read)
        if (folder / EVENTS).exists():
            events, read = _read_json_lines(folder / EVENTS, _parse_event, "an experiment event")
            lines.append(read)
        return cls(
            path=folder,
            label=label or str(folder),
            evidence=evidence,
            evidence_path=ev_path if evidence is not None and not from_scrapes else None,
            diagnosis=diagnosis,
            diagnosis_path=dg_path if diagnosis is not None else None,
            requests=requests,
            events=events,
            capacity_plan=_read_plan(folder / CAPACITY_PLAN),
            lines=tuple(lines),
            note=note,
            from_scrapes=from_scrapes,
        )

    # --- what was read --------------------------------------------------------------------------
    @property
    def skipped(self) -> tuple[LinesRead, ...]:
        """The JSON-lines files with lines skipped as unreadable."""
        return tuple(r for r in self.lines if r.skipped)

    def skipped_in(self, name: str) -> int:
        return sum(r.skipped for r in self.lines if r.name == name)

    def skipped_notes(self) -> tuple[str, ...]:
        """One line per file with skipped lines, e.g. "1 unreadable line(s) of requests.jsonl skipped (40 read)"."""
        return tuple(r.describe() for r in self.skipped)

    def prefill_times(self) -> list[float]:
        """perf_counter times of the prefill events (the driver's clock, as `RequestRecord.t_send`)."""
        return [t for e in self.events if "prefill" in str(e["event"]) and (t := _finite(e["t"])) is not None]


def _finite(v: object) -> float | None:
    """A number as a finite float, or None (infinite, NaN, or an integer beyond a float)."""
    if not isinstance(v, (int, float, str)):  # the JSON values float() takes
        return None
    try:
        f = float(v)
    except (ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


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
