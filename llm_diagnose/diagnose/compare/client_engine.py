"""A client-side latency beside the engine's own histogram of the same concept, in one run.

Where the client's mean disagrees with the engine's over the same requests, the time was added
or lost on the path between them (a starved client on a busy host, the API server, the network):
`llm_diagnose.diagnose.compare.metric` then lets a change the client saw stand only if the engine
saw it too. The agreement band is `llm_diagnose.probes.client_server.SideBySide.agree`'s.
"""

from __future__ import annotations

import numpy as np

from llm_diagnose.diagnose.compare.request_measurements import (
    REQUEST_DECODE_TOKENS,
    REQUEST_E2E_P50,
    REQUEST_TPOT_P50,
    REQUEST_TTFT_P50,
    REQUEST_TTFT_P99,
)
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.client_server import SideBySide, others_counted

__all__ = ["ENGINE_COUNTERPARTS", "client_engine_disagreement"]

# A client-side latency and the engine's own histogram of the same concept (same requests).
ENGINE_COUNTERPARTS: dict[str, tuple[str, str]] = {
    REQUEST_TTFT_P50: (Q.TTFT_P50, "ttft"),
    REQUEST_TTFT_P99: (Q.TTFT_P99, "ttft"),
    REQUEST_E2E_P50: (Q.E2E_P50, "e2e"),
    # A request's mean gap against the engine's per-token one: equal weights per request instead of
    # per token, close enough for a 25% + 2 ms agreement, and bundled tokens (gaps of 0) stand out.
    REQUEST_TPOT_P50: (Q.ITL_P50, "itl"),
}


def client_engine_disagreement(key: str, ev: Evidence) -> SideBySide | None:
    """The client's mean of `key` beside the engine's histogram mean, when the two disagree
    (`llm_diagnose.probes.client_server.SideBySide.agree`); None when they agree or one is missing
    or the engine counted others' requests too (then the comparison says nothing)."""
    if key not in ENGINE_COUNTERPARTS:
        return None
    engine_key, concept = ENGINE_COUNTERPARTS[key]
    client, engine = ev.measurement(key), ev.measurement(engine_key)
    if client is None or not client.samples or engine is None or engine.summary is None:
        return None
    s, n = engine.summary, len(client.samples)
    # The engine's ITL histogram holds one observation per token after a request's first, not one per request.
    ours = n
    if concept == "itl":
        tokens = ev.measurement(REQUEST_DECODE_TOKENS)
        if tokens is None:
            return None
        ours = int(tokens.value)
    if s.n <= 0 or s.mean <= 0 or others_counted(s.n, ours):
        return None
    pair = SideBySide(concept, float(np.mean(client.samples)), n, s.mean, s.n)
    return None if pair.agree else pair
