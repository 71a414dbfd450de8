"""One comparison's outcome: its verdict, the two values, the change and how it was judged.

A plain immutable value: `llm_diagnose.diagnose.compare.metric` produces one per metric, the gate
one per rule (metrics and the diagnosis), verify reads them into claims and side effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Verdict", "VERDICTS", "Outcome"]

Verdict = Literal["regression", "inconclusive", "warning", "improvement", "pass", "skipped"]
VERDICTS: tuple[Verdict, ...] = ("regression", "inconclusive", "warning", "improvement", "pass", "skipped")


@dataclass(frozen=True)
class Outcome:
    name: str  # an evidence key, or "pitfall:<id>", "answer:<id>", "technique:<id>"
    kind: Literal["metric", "diagnosis"]
    verdict: Verdict
    baseline: str = ""
    current: str = ""
    change: str = ""  # e.g. "+12.3% [+8.1%, +16.0%]"
    tolerance: str = ""
    detail: str = ""  # how it was judged, in words
    point: float | None = None  # the change (relative or absolute), for machines
    interval: tuple[float, float] | None = None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["interval"] = list(self.interval) if self.interval is not None else None
        return d
