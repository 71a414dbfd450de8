"""A run folder's metrics.jsonl read back: the scrapes (`read_scrapes`), and the evidence an
interrupted run's scrapes give (`evidence_from_scrapes`, for `decide`, `report` and `gate` on a
folder with no evidence.json)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes.runfolder_names import EVIDENCE, METRICS

if TYPE_CHECKING:
    from llm_diagnose.probes.metrics.window import Window

__all__ = ["read_scrapes", "evidence_from_scrapes"]


def read_scrapes(run_dir: Path) -> Window:
    """The scrapes in a run folder's metrics.jsonl; UsageError (one line) where it cannot be read."""
    from llm_diagnose.probes.metrics.window import Window  # the Prometheus parser: loaded when a folder needs it

    path = Path(run_dir) / METRICS
    try:
        return Window.from_jsonl(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None


def evidence_from_scrapes(run_dir: Path, window: Window | None = None) -> Evidence:
    """Evidence rebuilt from a run folder's metrics.jsonl alone: what an interrupted run (Ctrl-C,
    a killed process) leaves behind. Passive evidence only; the window is marked incomplete.
    `window`: those scrapes, where the caller has read them already (`read_scrapes`)."""
    from llm_diagnose.probes.metrics.passive import passive_evidence

    path = Path(run_dir) / METRICS
    if window is None:
        window = read_scrapes(run_dir)
    if not window.ok_records:
        raise UsageError(f"{path} holds no readable scrape ({window.describe()}): nothing to diagnose")
    skipped = f" ({len(window.notes)} unreadable line(s) of it skipped)" if window.notes else ""
    window = dataclasses.replace(
        window, stopped_early=f"the run did not finish (no {EVIDENCE}): evidence rebuilt from {METRICS}{skipped}"
    )
    return Evidence(Target(url=window.source, label=Path(run_dir).name), passive_evidence(window))
