"""Signals several questions share: how loaded the server was, how many devices it uses, where
decode sits on the roofline, and whether a setting is on (seen, on by default, or unknown).

Each reads through a `Reading`, so the keys it used and compared land in the answer that
asked; each returns None (or "unknown") when the evidence does not say.
"""

from __future__ import annotations

import math

from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.schemes import default_on
from llm_diagnose.probes import quantities as Q

__all__ = ["load_level", "devices", "roofline_at", "setting", "in_flight"]


def in_flight(r: Reading) -> tuple[float | None, str]:
    """Mean requests in flight (running + waiting), and the key(s) it came from."""
    conc = r.num(Q.CONCURRENCY_MEAN)
    if conc is not None:
        return conc, Q.CONCURRENCY_MEAN
    running = r.num(Q.RUNNING_MEAN)
    if running is None:
        return None, ""
    waiting = r.num(Q.WAITING_MEAN)
    return running + (waiting or 0.0), Q.RUNNING_MEAN + (f"+{Q.WAITING_MEAN}" if waiting is not None else "")


def load_level(r: Reading) -> tuple[str, str]:
    """'idle' (near idle: demand was never tested), 'loaded', or 'unknown', with the reason."""
    tokens = r.num(Q.GEN_TOKENS_PER_S)
    if tokens is not None and r.compare(Q.GEN_TOKENS_PER_S, tokens, "<", "load.min_tokens_per_s"):
        return "idle", (
            "no tokens were generated in the window"
            if tokens == 0
            else f"{tokens:.1f} tokens/s were generated in the window"
        )
    conc, key = in_flight(r)
    waiting = r.num(Q.WAITING_MEAN)
    preempted = r.num(Q.PREEMPTIONS)
    if (waiting is not None and waiting >= r.thresholds["q1.min_waiting"]) or (preempted or 0) > 0:
        return "loaded", "requests waited or were preempted"
    if conc is not None:
        if r.compare(key, conc, "<", "load.min_concurrency"):
            return "idle", f"{conc:.1f} requests were in flight on average"
        return "loaded", f"{conc:.1f} requests were in flight on average"
    if tokens is not None:
        return "loaded", f"{tokens:.0f} tokens/s were generated"
    return "unknown", "the load the server saw was not measured"


def devices(r: Reading) -> tuple[float | None, bool]:
    """Devices one instance spans (TP x PP, else memory.device_count), and whether a parallel
    setting was seen (False: TP/PP were not seen, so the count may be low)."""
    tp = r.num(Q.TENSOR_PARALLEL)
    pp = r.num(Q.PIPELINE_PARALLEL)
    if tp is not None or pp is not None:
        return max(1.0, tp or 1.0) * max(1.0, pp or 1.0), True
    count = r.num(Q.DEVICE_COUNT)
    return (max(1.0, count), True) if count is not None else (None, False)


def roofline_at(r: Reading, batch: float | None) -> tuple[str | None, int | None]:
    """Which ceiling ('memory' or 'compute') bounds a decode step at the measured batch size
    nearest (in log scale) to `batch`; (None, None) where no roofline position was measured."""
    if batch is None or not math.isfinite(batch):
        return None, None
    measured = [n for n in Q.MICROBENCH_BATCHES if isinstance(r.evidence.fact(Q.decode_bound_key(n)), str)]
    if not measured:
        return None, None
    n = min(measured, key=lambda b: abs(math.log2(b) - math.log2(max(batch, 1.0))))
    bound = r.text(Q.decode_bound_key(n))
    return (bound.lower() if bound and bound.lower() in ("memory", "compute") else None), n


def setting(r: Reading, key: str) -> tuple[bool | None, str]:
    """Whether a boolean setting is on: (True/False, "seen") when the configuration shows it,
    (True, why) when the engine turns it on by default and it was not seen, (None, "") when
    it could not be seen. A setting not seen is never read as off."""
    seen = r.evidence.fact(key)
    if isinstance(seen, bool):
        r.flag(key)
        return seen, "seen"
    engine = r.evidence.fact(Q.ENGINE_NAME)
    version = r.evidence.fact(Q.ENGINE_VERSION)
    why = default_on(key, engine if isinstance(engine, str) else None, version if isinstance(version, str) else None)
    if why:
        return True, why
    return None, ""
