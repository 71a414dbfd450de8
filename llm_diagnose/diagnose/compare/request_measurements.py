"""A run's per-request records as measurements: the client-side samples two runs are compared by.

The records are the run folder's requests.jsonl (`RunFolder.requests`, lines that could not be
read already counted there); the keys below name what they become, and are the one source of
per-request samples, so a comparison can tell a latency change from noise. A passive run has
no records and gives nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.compare.statistic import statistic_of
from llm_diagnose.probes.load.failures import tally_failures
from llm_diagnose.probes.results import Measurement, Provenance

if TYPE_CHECKING:  # records.py's package loads the HTTP client: types only here
    from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "REQUEST_TTFT_P50",
    "REQUEST_TTFT_P99",
    "REQUEST_TPOT_P50",
    "REQUEST_E2E_P50",
    "REQUEST_FAILED_FRACTION",
    "REQUEST_DECODE_TOKENS",
    "request_measurements",
]

REQUEST_TTFT_P50 = "requests.ttft_p50_s"
REQUEST_TTFT_P99 = "requests.ttft_p99_s"
REQUEST_TPOT_P50 = "requests.tpot_p50_s"
REQUEST_E2E_P50 = "requests.e2e_p50_s"
# The share of the requests the run sent that the server failed (llm_diagnose.probes.load.failures):
# one 0/1 sample per request sent, so two runs compare by the bootstrap of the mean like any other.
REQUEST_FAILED_FRACTION = "requests.failed_fraction"
# Not a compared metric: how many inter-token intervals the engine's ITL histogram should hold for
# the client's requests (each one's output tokens after its first), for the client/engine cross-check.
REQUEST_DECODE_TOKENS = "requests.decode_tokens"


def request_measurements(records: Sequence[RequestRecord] | None, source: str) -> dict[str, Measurement]:
    """Client-side latencies of completed requests, one sample each (the records of a run folder's
    requests.jsonl, as `RunFolder.requests` loaded them; `source` names the file).

    `requests.ttft_p50_s` and `requests.ttft_p99_s` (time to first token as the client saw it),
    `requests.tpot_p50_s` (a request's mean time per output token after its first) and
    `requests.e2e_p50_s`; and `requests.failed_fraction`, the share of the requests sent that
    the server failed (one 0/1 sample per request: what was sent, not what was served). Nothing
    without records (a passive run has no requests.jsonl).
    """
    if not records:
        return {}
    prov = Provenance("client-per-request", source)
    tally = tally_failures(records)
    failures = Measurement(tally.fraction, "fraction", prov, samples=tally.outcomes, note=tally.describe())
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    decode_tokens = 0
    for r in records:
        if not r.completed or r.ttft_s is None:
            continue
        ttft.append(r.ttft_s)
        decode_tokens += max(r.tokens_out - 1, 0)
        if len(r.event_times) > 1:
            tpot.append((r.event_times[-1] - r.event_times[0]) / (len(r.event_times) - 1))
        if r.e2e_s is not None:
            e2e.append(r.e2e_s)
    series = {REQUEST_TTFT_P50: ttft, REQUEST_TTFT_P99: ttft, REQUEST_TPOT_P50: tpot, REQUEST_E2E_P50: e2e}
    # A record edited or damaged into a non-finite time is no sample (unreadable lines were skipped, and counted).
    series = {key: [v for v in values if math.isfinite(v)] for key, values in series.items()}
    out = {REQUEST_FAILED_FRACTION: failures}
    for key, values in series.items():
        if values:
            out[key] = Measurement(
                float(statistic_of(key)(values)),
                "s",
                prov,
                samples=tuple(values),
                note=f"{len(values)} completed requests, timed by the load driver",
            )
    if len(out) > 1:  # a latency besides the failures: some request completed
        out[REQUEST_DECODE_TOKENS] = Measurement(
            float(decode_tokens), "tokens", prov, note="output tokens after each completed request's first"
        )
    return out
