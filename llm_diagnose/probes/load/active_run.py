"""What every active run writes as it goes, whether it runs experiments or replays a recording.

Both `llm_diagnose.probes.experiments.run_active` and `llm_diagnose.probes.load.replay_inputs`
open the same three append files (requests, events, inputs), record every body as it leaves,
and summarise what was sent and what failed in the same two evidence figures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.failures import tally_failures
from llm_diagnose.probes.load.records import EVENTS_FILE, INPUTS_FILE, REQUESTS_FILE, JsonlWriter, RequestSpec
from llm_diagnose.probes.load.runner import Driver
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result

__all__ = ["run_writers", "input_recorder", "run_summary"]


def run_writers(run_dir: str | Path | None) -> tuple[JsonlWriter, JsonlWriter, JsonlWriter]:
    """The files an active run appends to as it goes (requests, events, inputs), in `run_dir`
    (created if missing); writers that discard everything when there is no folder."""
    run_path = None if run_dir is None else Path(run_dir)
    if run_path is not None:
        run_path.mkdir(parents=True, exist_ok=True)

    def writer(name: str) -> JsonlWriter:
        return JsonlWriter(None if run_path is None else run_path / name)

    return writer(REQUESTS_FILE), writer(EVENTS_FILE), writer(INPUTS_FILE)


def input_recorder(out: JsonlWriter, t0: float) -> Callable[[RequestSpec, str, bytes], None]:
    """Writes each request body as it leaves (resends included) to inputs.jsonl: with the path
    and the offset from the run's start, another client can send the same requests in the same
    pattern. The API key travels in a header and is never written."""
    sends: dict[str, int] = {}

    def record(spec: RequestSpec, url: str, body: bytes) -> None:
        sends[spec.request_id] = sends.get(spec.request_id, 0) + 1
        out.write(
            {
                "request_id": spec.request_id,
                "send": sends[spec.request_id],
                "experiment": spec.experiment,
                "phase": spec.phase,
                "t_offset_s": round(time.perf_counter() - t0, 6),
                "method": "POST",
                "path": urlsplit(url).path,
                "body": json.loads(body),
            }
        )

    return record


def run_summary(driver: Driver, source: str, window_s: float) -> dict[str, Result]:
    records = driver.records
    prov = Provenance(method="active-probe/run", source=source, window_s=window_s)
    if not records:
        why = driver.server_gone or "no request was sent"
        return {k: NotMeasured(why) for k in (Q.ACTIVE_REQUESTS_SENT, Q.ACTIVE_FAILED_FRACTION)}
    tally = tally_failures(records)
    return {
        Q.ACTIVE_REQUESTS_SENT: Measurement(
            float(tally.sent), "count", prov, note=f"{driver.not_sent} more were planned but not sent (budget)"
        ),
        Q.ACTIVE_FAILED_FRACTION: Measurement(
            tally.fraction,
            "fraction",
            prov,
            samples=tally.outcomes,
            note=f"faults: {tally.kinds_text()}" + (f"; {driver.server_gone}" if driver.server_gone else ""),
        ),
    }
