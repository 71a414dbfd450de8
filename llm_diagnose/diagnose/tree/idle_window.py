"""Which answers rest only on the live window of a near-idle server: the headline does not count
them as measured (a window without demand shows how one request went, not how the server serves)."""

from __future__ import annotations

from collections.abc import Mapping

from llm_diagnose.diagnose.tree.diagnosis import Answer
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import load_level
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["idle_live_answers"]

# Provenance methods of the live /metrics window (llm_diagnose.probes.metrics.passive), as opposed to an
# active experiment, a trace or a hand-built value.
_LIVE_METHODS = ("prometheus", "scrape-loop", "metric-")


def idle_live_answers(ev: Evidence, th: Thresholds, answers: Mapping[str, Answer]) -> frozenset[str]:
    """On a near-idle server (signals.load_level, whatever Q1 could say), the questions answered
    only from the live window: a window without demand shows how one request went, not how the
    server serves."""
    if load_level(Reading(ev, th))[0] != "idle":
        return frozenset()

    def live(key: str) -> bool:
        r = ev.items.get(key)
        prov = getattr(r, "provenance", None)
        return prov is not None and prov.method.startswith(_LIVE_METHODS)

    return frozenset(q for q, a in answers.items() if a.evidence and all(live(k) for k in a.evidence))
