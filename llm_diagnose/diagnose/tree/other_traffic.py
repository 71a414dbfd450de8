"""Answers read from experiments run beside other clients' traffic: said, and trusted less.

An active experiment whose scrapes found requests of other clients in flight on the server
(llm_diagnose.probes.experiments: the running and waiting gauges less this client's own) carries
Q.OTHER_TRAFFIC_WARNING on its figures. An answer that read such a figure is capped at
confidence.other_traffic, and its rationale says which figures and how many requests were
seen, so a verdict made beside other traffic says so wherever it is shown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from llm_diagnose.diagnose.tree.diagnosis import Answer
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.warning_codes import WarningCode

__all__ = ["shared_keys", "beside_other_traffic"]


def shared_keys(evidence: Evidence, keys: Iterable[str]) -> list[str]:
    """Those of `keys` whose measurement was taken beside other clients' traffic."""
    out = []
    for key in keys:
        m = evidence.measurement(key)
        if m is not None and WarningCode.OTHER_TRAFFIC in m.codes:
            out.append(key)
    return out


def beside_other_traffic(answers: Iterable[Answer], evidence: Evidence, th: Thresholds) -> list[Answer]:
    """Every answer that read a figure taken beside other traffic, capped and saying so."""
    ceiling = th["confidence.other_traffic"]
    out = []
    for a in answers:
        shared = shared_keys(evidence, a.evidence)
        if shared:
            a = replace(
                a,
                confidence=min(a.confidence, ceiling),
                rationale=f"{a.rationale} (measured beside other clients' traffic on the server: "
                f"{', '.join(shared)}; confidence at most {ceiling:g})",
            )
        out.append(a)
    return out
