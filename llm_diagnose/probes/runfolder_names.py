"""The names of the files in a run folder, defined once.

The probes append to some of them as results arrive (`metrics.jsonl`, `requests.jsonl`,
`events.jsonl`); the diagnoser writes the rest and reads them all back
(`llm_diagnose.diagnose.runfolder.RunFolder`). Plain constants, importing nothing, so any layer can
name a file without importing an HTTP client or a metrics parser.
"""

from __future__ import annotations

__all__ = ["METRICS", "REQUESTS", "EVENTS", "INPUTS", "EVIDENCE", "DIAGNOSIS", "SUMMARY", "CAPACITY_PLAN"]

METRICS = "metrics.jsonl"  # every raw scrape, appended as it is taken (llm_diagnose.probes.metrics.scraper)
REQUESTS = "requests.jsonl"  # one record per request, appended as it ends (the active load driver)
EVENTS = "events.jsonl"  # experiment events: prefill injections, phases (JsonlWriter.event)
# Every request body as it left the client (resends included), for replaying the run with
# another client: the role of AIPerf's inputs.json, one JSON line per send.
INPUTS = "inputs.jsonl"
EVIDENCE = "evidence.json"
DIAGNOSIS = "diagnosis.json"
SUMMARY = "summary.txt"
CAPACITY_PLAN = "capacity-plan.json"  # written by `llm-diagnose plan --out`; shown by the reports
