"""A run as the commands show it: its folder read once (`RunFolder.open`) and the diagnosis to show
(`load_run`): the one written in diagnosis.json, or computed now from the evidence. `report`, `gate`
and `verify` load their runs through it; the renderers take the loaded run, never a command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_diagnose.diagnose.runfolder.folder import RunFolder
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.runfolder_names import DIAGNOSIS

__all__ = ["LoadedRun", "load_run"]


@dataclass(frozen=True)
class LoadedRun:
    diagnosis: Diagnosis  # as written in diagnosis.json, or computed now (`note` says so)
    folder: RunFolder  # everything read from the run folder, once
    note: str = ""  # how the diagnosis was obtained, when that is worth saying

    @property
    def evidence(self) -> Evidence | None:  # None: a diagnosis.json with no evidence.json beside it
        return self.folder.evidence

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def label(self) -> str:
        return self.folder.label


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def load_run(path: str | Path, thresholds: Thresholds | None = None, slo: SLO | None = None) -> LoadedRun:
    """A run folder, an evidence.json or a diagnosis.json -> the diagnosis and its evidence.

    The diagnosis is read from diagnosis.json when there is one (it is what the run decided,
    with the thresholds and SLO it ran with); otherwise it is computed from the evidence, with
    `thresholds` and `slo` where given. Unreadable files, and files of another schema, raise
    RunFolderError (exit 2, one line).
    """
    folder = RunFolder.open(path)
    evidence, written = folder.evidence, folder.diagnosis
    if written is None:
        assert evidence is not None  # RunFolder.open refuses a folder with neither
        diagnosis = diagnose(evidence, thresholds, slo=slo)
        if folder.from_scrapes:
            return LoadedRun(diagnosis, folder, folder.note)
        note = (
            f"no {DIAGNOSIS} beside {folder.evidence_path}: diagnosed now"
            + (f" with thresholds from {thresholds.source}" if thresholds is not None else " with default thresholds")
            + (f" and the SLO from {slo.source}" if slo is not None and slo.declared else "")
        )
        return LoadedRun(diagnosis, folder, note)
    dg_path, ev_path = folder.diagnosis_path, folder.evidence_path
    note = ""
    # The tree is cheap and pure: re-running it is the one way to get the digest it records.
    if evidence is not None and written.evidence_digest != diagnose(evidence, thresholds).evidence_digest:
        note = f"{dg_path} was computed from other evidence than {ev_path}: it is used as written"
    if slo is not None and slo.declared and not slo.equivalent(written.slo):
        note = _notes(
            note,
            f"{dg_path} was judged against {'its recorded SLO' if written.slo.declared else 'no SLO'}, used as "
            f"written: the SLO given applies only without a {DIAGNOSIS} (re-judge: llm-diagnose decide "
            f"{ev_path} --slo ...)",
        )
    return LoadedRun(written, folder, note)
