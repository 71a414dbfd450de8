"""What would measure something, said where the headline finds that nothing was measured.

The advice depends on what the run already did: a run that sent its experiments must not be told
to run them (issue 26, item 10: a plain server attached with --active read "run the experiments
(--active)"), and a target without engine metrics needs the in-process probe, not more traffic.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact

__all__ = ["DEFAULT_REMEDY", "nothing_measured_remedy"]

DEFAULT_REMEDY = "attach to a loaded server, give a trace (--trace) or run the experiments (--active)"


def nothing_measured_remedy(ev: Evidence) -> str:
    """The advice that ends a 'nothing was measured' headline, from what this run did."""
    kind = ev.items.get(Q.TARGET_KIND)
    if isinstance(kind, Fact) and kind.value:
        what = f"{kind.note}; " if kind.note else ""
        return (
            f"the target is a {kind.value} (no engine metrics), so only the client's experiments ran: {what}"
            "or give a trace (--trace)"
        )
    sent = ev.measurement(Q.ACTIVE_REQUESTS_SENT)
    if sent is not None and sent.value > 0:
        return (
            "the experiments (--active) ran and answered nothing firmly: attach while the server carries its "
            "traffic, or give a trace (--trace)"
        )
    return DEFAULT_REMEDY
