"""Which figure a question reads where a run holds both: the controlled experiment's, or what the server served.

The engine's own figures over the window's traffic (the passive ITL quantiles, the acceptance
of speculative decoding) and the active experiments' figures over the requests they sent live
under their own names (issue 26, item 1). A question about the decode step or about drafts
reads the controlled figure where the experiment measured one: a stream alone says what a
token costs without the batch the traffic made. Where it measured none (not run, timed out,
failed), what the server served stands, so a failed experiment never erases the engine's figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement

if TYPE_CHECKING:  # read through .get() and .items only: slo.py imports this module
    from llm_diagnose.diagnose.tree.evidence import Evidence

__all__ = ["CONTROLLED", "preferred"]

# What the server served -> the controlled experiment's figure of the same quantity.
CONTROLLED: dict[str, str] = {
    Q.ITL_P50: Q.DECODE_BATCH1_ITL_P50,
    Q.ITL_P99: Q.DECODE_BATCH1_ITL_P99,
    Q.SPEC_ACCEPTANCE_RATE: Q.SPEC_ACTIVE_ACCEPTANCE_RATE,
    Q.SPEC_ACCEPTANCE_LENGTH: Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH,
}


def preferred(evidence: Evidence, served: str) -> str:
    """The key to read for `served`: the controlled figure where it was measured; else the served
    one where that was; else whichever of them says why it is missing (the controlled one first)."""
    controlled = CONTROLLED.get(served)
    if controlled is None:
        return served
    if isinstance(evidence.get(controlled), Measurement):
        return controlled
    if isinstance(evidence.get(served), Measurement) or controlled not in evidence.items:
        return served
    return controlled
