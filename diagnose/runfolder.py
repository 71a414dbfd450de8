"""The run folder: its file names, and writing files so a reader never sees half of one."""

from __future__ import annotations

from pathlib import Path

EVIDENCE = "evidence.json"
DIAGNOSIS = "diagnosis.json"
SUMMARY = "summary.txt"
METRICS = "metrics.jsonl"  # written by probes.metrics.scraper as scrapes arrive
REQUESTS = "requests.jsonl"  # written by the active load driver as requests complete
EVENTS = "events.jsonl"  # prefill injections and other experiment events


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
