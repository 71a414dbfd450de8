"""Reading a run folder: everything a run left behind, read once (`RunFolder`).

`RunFolder.open(path)` takes a run folder, or its evidence.json or diagnosis.json, and loads the
evidence, the diagnosis as written, the request records (`requests.jsonl`), the experiment events
(`events.jsonl`) and the capacity plan (`capacity-plan.json`), each once. Reports, the gate,
verify and export are functions of the loaded folder and open no file themselves.

- Every file is read as a plain file, never through a link (llm_diagnose.probes.runfiles): a
  link (to /dev/zero, say), a FIFO or a device at one of its names is refused, RunFolderError.
- A line of a JSON-lines file that cannot be read (cut short by a kill mid-write, longer than
  MAX_LINE_BYTES, holding a byte that is not UTF-8 in a key or a value alike, nested too deeply,
  not a JSON object) is skipped and *counted*; the counts (`RunFolder.lines`) are shown by the
  reports, the gate and export, so a sample that quietly shrank says so.
- A file of another schema (an evidence or diagnosis file of another schema or version; a
  `requests.jsonl` or `events.jsonl` line that is JSON but not a record of this version) is
  refused: `RunFolderError`, a one-line UsageError (exit 2) naming the file and the line.
"""

from __future__ import annotations

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
from llm_diagnose.probes.runfiles import LineSchemaError, LinesRead, UnsafePathError, read_document, read_parsed
from llm_diagnose.probes.runfolder_names import CAPACITY_PLAN, DIAGNOSIS, EVENTS, EVIDENCE, METRICS, REQUESTS

if TYPE_CHECKING:  # the record type is imported when a requests.jsonl is read (its package loads the HTTP client)
    from llm_diagnose.probes.load.records import RequestRecord

__all__ = ["RunFolder", "RunFolderError", "LinesRead", "read_requests", "unreadable"]

_T = TypeVar("_T")

_OTHER_VERSION = (
    "written by another version of llm-diagnose or another tool? Rerun with this version, or move the file aside"
)


class RunFolderError(UsageError):
    """A run-folder file this version cannot read: another schema or version, or unreadable (exit 2)."""


def unreadable(path: Path, exc: OSError) -> RunFolderError:
    """A file of the folder that cannot be opened or read: a link or special file refused, a read error."""
    if isinstance(exc, UnsafePathError):
        return RunFolderError(str(exc))
    return RunFolderError(f"{path}: cannot read it ({exc.strerror or exc})")


def _read_json_lines(path: Path, parse: Callable[[Mapping], _T], what: str) -> tuple[tuple[_T, ...], LinesRead]:
    """Every line of `path` through `parse` (runfiles.read_parsed: unreadable lines skipped and counted);
    a JSON object of another schema refuses the whole file, naming the line."""
    try:
        return read_parsed(path, parse)
    except LineSchemaError as exc:
        raise RunFolderError(
            f"{path}: line {exc.number} is not {what} this version reads ({exc.why}): {_OTHER_VERSION}"
        ) from None
    except OSError as exc:
        raise unreadable(path, exc) from None


def read_requests(folder: str | Path) -> tuple[tuple[RequestRecord, ...], LinesRead] | None:
    """The request records of a run folder's requests.jsonl and how its lines were read; None where
    there is no requests.jsonl. RunFolderError (exit 2, one line) for a file that cannot be read or
    of another schema. (The probes' `records.read_records` reads the same way: `read_parsed` with
    `record_from_object`.)"""
    from llm_diagnose.probes.load.records import record_from_object  # see TYPE_CHECKING above

    path = Path(folder) / REQUESTS
    if not _present(path):
        return None
    return _read_json_lines(path, record_from_object, "a request record")


def _parse_event(obj: Mapping) -> Mapping[str, object]:
    """An events.jsonl line: {"event": NAME, "t": perf_counter seconds, ...} (JsonlWriter.event)."""
    if not isinstance(obj.get("event"), str):
        raise ValueError(f"field 'event' is {obj.get('event')!r}, expected the event's name")
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ValueError(f"field 't' is {t!r}, expected a time in seconds")
    return MappingProxyType(obj)


def _read_document(path: Path) -> dict:
    try:
        data = parse_json_document(read_document(path))
    except OSError as exc:
        raise unreadable(path, exc) from None
    except UnicodeDecodeError as exc:
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
    """The capacity plan, or None (unreadable, a link or not a plain file: a report still renders without it)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(read_document(path))
    except (OSError, ValueError, RecursionError):  # ValueError covers UnicodeDecodeError
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
        requests, lines = None, []
        if _present(ev_path):
            evidence = _read_evidence(ev_path)
        elif not _present(dg_path):
            if not _present(folder / METRICS):
                raise RunFolderError(f"{folder} holds neither {EVIDENCE} nor {DIAGNOSIS}: is it a run folder?")
            from llm_diagnose.diagnose.runfolder.scrapes import evidence_from_scrapes, read_scrapes

            scrapes = read_scrapes(folder)
            evidence, from_scrapes = evidence_from_scrapes(folder, scrapes), True
            lines.append(LinesRead(METRICS, len(scrapes.records), len(scrapes.notes)))
            note = f"no {EVIDENCE} in {folder} (an interrupted run?): diagnosed from the scrapes in {folder / METRICS}"
        diagnosis = _read_diagnosis(dg_path) if _present(dg_path) else None
        events: tuple[Mapping[str, object], ...] = ()
        if (read_req := read_requests(folder)) is not None:
            requests, read = read_req
            lines.append(read)
        if _present(folder / EVENTS):
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


def _present(path: Path) -> bool:
    """Something is at the name, a dangling link included (refused when read, not taken for absent)."""
    return os.path.lexists(path)


def _finite(v: object) -> float | None:
    """A number as a finite float, or None (infinite, NaN, or an integer beyond a float)."""
    if not isinstance(v, (int, float, str)):  # the JSON values float() takes
        return None
    try:
        f = float(v)
    except (ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None
