"""What every branch of the tree shares: the evidence, the answers, the pitfalls, and the
rule that turns (needed, on, working) into a technique's status."""

from __future__ import annotations

from collections.abc import Mapping

from llm_diagnose.diagnose.tree.diagnosis import Answer, PitfallCheck, Recommendation, Status, Step
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import setting
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.techniques.catalogue import CATALOGUE
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["Branches", "needed"]


class Branches:
    """Collects recommendations and path steps while walking each question's branch."""

    def __init__(
        self,
        ev: Evidence,
        th: Thresholds,
        answers: Mapping[str, Answer],
        pitfalls: Mapping[str, PitfallCheck],
        slo: SLO = SLO(),
    ):
        self.ev = ev
        self.th = th
        self.slo = slo
        self.answers = answers
        self.pitfalls = pitfalls
        self.recs: list[Recommendation] = []
        self.steps: list[Step] = []
        # (question, line): a problem found that no technique of the catalogue fixes (the headline's `investigate`)
        self.findings: list[tuple[str, str]] = []

    def reading(self) -> Reading:
        return Reading(self.ev, self.th)

    def step(self, node: str, outcome: bool | None, note: str = "") -> None:
        self.steps.append(Step(node, {True: "yes", False: "no", None: "unknown"}[outcome], note))

    def on(self, key: str) -> tuple[bool | None, str]:
        """(on?, why): seen in the configuration, on by the engine's default, or None (not seen)."""
        return setting(self.reading(), key)

    def num(self, key: str) -> float | None:
        return self.reading().num(key)

    def detected(self, pitfall: str) -> bool | None:
        """True, False, or None when the pitfall could not be checked: unknown stays unknown."""
        return self.pitfalls[pitfall].detected

    def add(self, technique: str, status: Status, question: str, reason: str, confidence: float | None = None) -> None:
        """A technique's status. Its confidence is the deciding answer's, unless the finding rests on
        a basis of its own (`confidence`: a verdict from the configuration where the answer is open)."""
        t = CATALOGUE[technique]
        self.recs.append(
            Recommendation(
                technique=technique,
                status=status,
                question=question,
                reason=reason,
                settings=t.settings,
                expect=t.expect,
                confidence=self.answers[question].confidence if confidence is None else round(confidence, 3),
            )
        )

    def by_state(
        self,
        technique: str,
        question: str,
        enabled: bool | None,
        needed: bool | None,
        working: bool | None = True,
        why: str = "",
        broken_why: str = "",
        unverified_why: str = "",
        default_why: str = "",
    ) -> None:
        """The common rule: status from (is it needed, is it on, does it work)."""
        a = self.answers[question]
        by_default = f" ({default_why}, not seen in the configuration)" if default_why and default_why != "seen" else ""
        if needed is None:
            if enabled:
                self.add(
                    technique,
                    "on-unverified",
                    question,
                    f"on{by_default}; whether it is needed or works is not known: {a.rationale}",
                )
            else:
                self.add(technique, "unknown", question, f"{a.title} could not be answered: {a.rationale}")
        elif needed:
            if enabled is False or enabled is None:
                suffix = "" if enabled is False else " (if it is not on already: the configuration was not visible)"
                self.add(technique, "recommended", question, (why or a.rationale) + suffix)
            elif working is False:
                self.add(
                    technique, "not-working", question, broken_why or "it is on, but the evidence says it does not help"
                )
            elif working is None:
                self.add(
                    technique,
                    "on-unverified",
                    question,
                    f"on{by_default}, but {unverified_why or 'whether it works was not measured'}",
                )
            else:
                self.add(technique, "in-place", question, f"already on{by_default} and working")
        elif enabled:
            self.add(technique, "in-place", question, f"on{by_default}; nothing in the evidence asks more of it")
        else:
            self.add(technique, "not-indicated", question, a.rationale)


def needed(answer: Answer, trigger: str) -> bool | None:
    return None if answer.answer == "unknown" else answer.answer == trigger
