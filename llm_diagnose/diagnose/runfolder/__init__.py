"""The run folder: the one package that reads, writes and checks what a run leaves behind.

- file names: defined once in llm_diagnose.probes.runfolder_names (the probes append to some of them);
- `folder`: reading (`RunFolder.open`/`load`: everything read once, unreadable lines counted,
  files of another schema refused with one line, exit 2);
- `scrapes`: metrics.jsonl read back, and the evidence an interrupted run's scrapes give;
- `loaded`: a run as the commands show it (`load_run`: the folder and the diagnosis to show);
- `output`: checking output paths before any work, writing whole files (`write_result`: the
  evidence, diagnosis and summary every run ends with);
- `frames`: the per-request records and the scrapes as pandas DataFrames (optional extra `analysis`),
  for notebooks and `llm-diagnose export`.

The probes never import this package (import-linter); they read and append their own files through
llm_diagnose.probes.runfiles, which every reader here goes through too. This module only re-exports.
"""

from llm_diagnose.diagnose.runfolder.folder import LinesRead, RunFolder, RunFolderError, read_requests
from llm_diagnose.diagnose.runfolder.frames import MissingExtra, requests_frame, scrapes_frame
from llm_diagnose.diagnose.runfolder.loaded import LoadedRun, load_run
from llm_diagnose.diagnose.runfolder.output import (
    RUN_FILES,
    check_out_file,
    out_path,
    prepare_out_dir,
    write_output,
    write_result,
)
from llm_diagnose.diagnose.runfolder.scrapes import evidence_from_scrapes, read_scrapes
from llm_diagnose.probes.runfiles import UnsafePathError, open_append, read_document, write_atomic
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

__all__ = [
    "EVIDENCE",
    "DIAGNOSIS",
    "SUMMARY",
    "METRICS",
    "REQUESTS",
    "EVENTS",
    "INPUTS",
    "CAPACITY_PLAN",
    "RUN_FILES",
    "RunFolder",
    "RunFolderError",
    "LinesRead",
    "read_requests",
    "read_scrapes",
    "evidence_from_scrapes",
    "LoadedRun",
    "load_run",
    "requests_frame",
    "scrapes_frame",
    "MissingExtra",
    "write_atomic",
    "write_output",
    "write_result",
    "open_append",
    "out_path",
    "prepare_out_dir",
    "check_out_file",
    "UnsafePathError",
    "read_document",
]
