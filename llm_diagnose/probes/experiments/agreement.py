"""Client against server: the client's latencies beside the engine's own histograms, same window.

Every experiment is timed by the client; the engine (vLLM, SGLang) keeps its own time-to-first-
token, inter-token and end-to-end histograms. Over one experiment both see the same requests,
so their means must agree within a named tolerance (TOLERANCE of the server's mean plus a
per-concept SLACK_S for what the client's side adds on loopback: HTTP, the API server's
detokenizing, the socket). When they do not, the side to believe follows from how the client
fared:

- the client was starved (its event loop lagged or stalled): believe the server; the client's
  timestamps say when it got the CPU, so its verdicts are withheld (the starved warning);
- tokens arrived bundled (several per event, gaps of zero): believe the server for per-token
  figures; the client's gaps are the delivery's, not the engine's steps;
- the client kept up: the difference is the path between engine and client (API server, proxy,
  network); the client's figures are what users see, the engine's what it did. A ratio the
  experiment forms from client timings on both sides (short vs long, during vs without
  prefills) carries that path on both sides, so its verdict stands, with the disagreement noted.

Requests stopped by the client, and windows where the server counted far more requests than
this client sent (other traffic shares the histograms), are not compared.
"""

from __future__ import annotations

import statistics

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.client_server import SLACK_S, TOLERANCE, SideBySide, others_counted
from llm_diagnose.probes.experiments.common import ServerDelta
from llm_diagnose.probes.load.records import RequestRecord
from llm_diagnose.probes.results import Measurement, Provenance, Result
from llm_diagnose.probes.warning_codes import WarningCode, coded

__all__ = ["TOLERANCE", "SLACK_S", "SideBySide", "compare", "run_level", "CONCEPT_KEYS"]

CONCEPT_KEYS = {
    "ttft": Q.CLIENT_SERVER_TTFT_RATIO,
    "itl": Q.CLIENT_SERVER_ITL_RATIO,
    "e2e": Q.CLIENT_SERVER_E2E_RATIO,
}


def _client_samples(records: list[RequestRecord], concept: str) -> list[float]:
    done = [r for r in records if r.fault is None]
    if concept == "ttft":
        return [r.ttft_s for r in done if r.ttft_s is not None]
    if concept == "e2e":
        return [r.t_end for r in done if r.t_end is not None]
    return [g for r in done for g in r.gaps_s]


def compare(records: list[RequestRecord], server: ServerDelta) -> tuple[list[SideBySide], str]:
    """Each concept both sides measured over the window; and why any was left out ("" if none)."""
    if not server.available:
        return [], "no server metrics around it"
    done = sum(1 for r in records if r.fault is None)
    out, skipped = [], []
    for concept in ("ttft", "itl", "e2e"):
        client = _client_samples(records, concept)
        hist = server.histogram_mean(concept)
        if not client or hist is None or hist[0] <= 0:
            continue
        mean, count = hist
        ours = len(client) if concept == "itl" else done
        if others_counted(count, ours):
            skipped.append(f"{concept}: the server counted {count:.0f} against our {ours} (other traffic)")
            continue
        out.append(SideBySide(concept, statistics.fmean(client), len(client), mean, count))
    return out, "; ".join(skipped)


def disbelieved(pairs: list[SideBySide], starved: str | None, bundled: bool) -> str | None:
    """The starved-client warning when a disagreement makes the client's timings the side not
    to believe (see the module's rules), else None."""
    off = [p for p in pairs if not p.agree]
    if not off:
        return None
    what = "; ".join(p.describe() for p in off)
    if starved:
        return coded(
            WarningCode.CLIENT_STARVED, f"{starved}; the server's histograms disagree ({what}): believe the server"
        )
    if bundled and any(p.concept == "itl" for p in off):
        return coded(
            WarningCode.CLIENT_STARVED,
            f"{Q.CLIENT_STARVED_WARNING} tokens arrived bundled (gaps of zero), so the client's gaps are the "
            f"delivery's, not the engine's steps ({what}): believe the server",
        )
    return None


def run_level(pairs_by_experiment: dict[str, list[SideBySide]], source: str) -> dict[str, Result]:
    """client.server_*_ratio over the whole run: pooled means of the experiments both sides saw."""
    out: dict[str, Result] = {}
    for concept, key in CONCEPT_KEYS.items():
        pairs = [p for ps in pairs_by_experiment.values() for p in ps if p.concept == concept]
        if not pairs:
            continue
        n_c = sum(p.client_n for p in pairs)
        n_s = sum(p.server_n for p in pairs)
        client = sum(p.client_mean_s * p.client_n for p in pairs) / n_c
        server = sum(p.server_mean_s * p.server_n for p in pairs) / n_s
        pooled = SideBySide(concept, client, n_c, server, n_s)
        prov = Provenance(method="client-vs-server-histograms", source=source)
        out[key] = Measurement(
            pooled.ratio,
            "ratio",
            prov,
            warnings=() if pooled.agree else (f"client and server disagree: {pooled.describe()}",),
            note=f"{pooled.describe()}; by experiment: "
            + ", ".join(
                f"{name} {p.ratio:.2f}" for name, ps in pairs_by_experiment.items() for p in ps if p.concept == concept
            ),
        )
    return out
