"""`Question`: one node of the tree's first level, its id and title, how it reads the evidence
(`ask`) and its branch (`walk`: the techniques it decides, from its answer and the others')."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llm_diagnose.diagnose.tree.branch import Branches
from llm_diagnose.diagnose.tree.diagnosis import Answer
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["Question"]


@dataclass(frozen=True)
class Question:
    id: str  # the stable identifier a diagnosis names it by ("Q1", "KV")
    title: str
    # (evidence, thresholds) -> Answer; a question that `reads_slo` also takes `slo=`.
    ask: Callable[..., Answer]
    walk: Callable[[Branches], None]
    reads_slo: bool = False

    def answer(self, ev: Evidence, th: Thresholds, slo: SLO) -> Answer:
        return self.ask(ev, th, slo=slo) if self.reads_slo else self.ask(ev, th)
