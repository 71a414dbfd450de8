"""How many of the requests a run sent the server failed, and how: one tally for every reader.

A failed request is one that ended in a server fault (`faults.SERVER_FAULTS`: an HTTP 5xx, a 429,
a stream cut off, stalled or making no progress, a timeout, a redirect off the target, ...); a
request the client itself stopped is not one. The tally counts what was *sent* (one record per
request, however many sends it took), so a change that makes the server reject half the
workload reads as half the requests failed, not as a shorter workload.

The run's summary (`active_run.run_summary`), the gate's and verify's per-request figures
(`llm_diagnose.diagnose.compare.request_measurements`) and the one-line account every output
starts with all read this one tally.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["FailureTally", "tally_failures"]


class _Ended(Protocol):
    """The slice of a `RequestRecord` the tally reads."""

    @property
    def server_fault(self) -> bool: ...

    @property
    def fault(self) -> object: ...


@dataclass(frozen=True)
class FailureTally:
    """`sent` requests, of which `failed` ended in a server fault; `by_kind` the faults' kinds,
    most frequent first; `outcomes` one 0/1 per request in send order (1: failed), the samples a
    comparison of two runs bootstraps."""

    sent: int
    failed: int
    by_kind: tuple[tuple[str, int], ...]
    outcomes: tuple[float, ...]

    @property
    def fraction(self) -> float:
        return self.failed / self.sent if self.sent else 0.0

    def kinds_text(self) -> str:
        """'12 server-error, 3 rate-limited', or 'none'."""
        return ", ".join(f"{n} {kind}" for kind, n in self.by_kind) or "none"

    def describe(self) -> str:
        """The one line every output shows: '20 of 40 requests failed (50%: 20 server-error)'."""
        if not self.failed:
            return f"none of {self.sent} requests failed"
        return f"{self.failed} of {self.sent} requests failed ({self.fraction:.0%}: {self.kinds_text()})"


def tally_failures(records: Iterable[_Ended]) -> FailureTally:
    outcomes: list[float] = []
    kinds: Counter[str] = Counter()
    for r in records:
        failed = bool(r.server_fault)
        outcomes.append(1.0 if failed else 0.0)
        if failed:
            kinds[str(getattr(r.fault, "value", r.fault))] += 1
    ranked = tuple(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    return FailureTally(len(outcomes), int(sum(outcomes)), ranked, tuple(outcomes))
