"""What verify concludes: the configuration diff, the workload check, each claim's verdict, the
side effects, and the whole result with its exit code. Plain immutable values:
`llm_diagnose.diagnose.verify.judge` produces them, `llm_diagnose.diagnose.verify.render` lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.verify.claims import Claim

__all__ = [
    "ClaimVerdict",
    "CLAIM_VERDICTS",
    "ConfigChange",
    "ChangeKind",
    "AdoptedTechnique",
    "WorkloadCheck",
    "Comparability",
    "ClaimResult",
    "SideEffect",
    "SloChange",
    "VerifyResult",
]

ClaimVerdict = Literal["delivered", "no-measurable-effect", "made-it-worse", "cannot-tell"]
CLAIM_VERDICTS: tuple[ClaimVerdict, ...] = ("made-it-worse", "cannot-tell", "no-measurable-effect", "delivered")
ChangeKind = Literal["turned-on", "turned-off", "changed", "newly-known", "no-longer-known", "same"]
Overall = Literal[
    "not-comparable", "made-it-worse", "cannot-tell", "no-measurable-effect", "partly-delivered", "delivered"
]


@dataclass(frozen=True)
class ConfigChange:
    """One configuration fact as discovered in each run ("" where the run did not discover it)."""

    key: str
    before: str
    after: str
    technique: str  # the technique a change of this key belongs to ("" for none)
    change: ChangeKind

    @property
    def changed(self) -> bool:
        return self.change != "same"

    @property
    def set_differently(self) -> bool:
        """Switched or changed: a fact discovered in one run only (newly-known, no-longer-known) is not."""
        return self.change in ("turned-on", "turned-off", "changed")


@dataclass(frozen=True)
class AdoptedTechnique:
    technique: str
    why: str  # how it was identified: "config.prefix_caching off -> on", or "recommended by BEFORE's diagnosis"


@dataclass(frozen=True)
class WorkloadCheck:
    """One workload property of the two runs, and whether they agree within `tolerance`."""

    name: str  # "prompt tokens (median)", ...
    before: str
    after: str
    difference: str  # "+3.0%"
    tolerance: str  # "10%"
    comparable: bool
    deciding: bool = True  # False: shown only (it follows the server's speed in a closed-loop run)


@dataclass(frozen=True)
class Comparability:
    comparable: bool
    checks: tuple[WorkloadCheck, ...] = ()
    reasons: tuple[str, ...] = ()  # why not comparable, or what could not be checked


@dataclass(frozen=True)
class ClaimResult:
    technique: str
    claim: Claim
    verdict: ClaimVerdict
    before: str = ""
    after: str = ""
    change: str = ""  # "-32.0% [-35.1%, -28.7%]"
    basis: str = ""  # what was compared and how (samples, summaries, values), in words
    point: float | None = None
    interval: tuple[float, float] | None = None

    def to_dict(self) -> dict:
        return {
            "technique": self.technique,
            "claim": self.claim.describe(),
            "key": self.claim.key,
            "direction": self.claim.direction,
            "min_effect": self.claim.min_effect,
            "relative": self.claim.relative,
            "level": self.claim.level,
            "verdict": self.verdict,
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "basis": self.basis,
            "point": self.point,
            "interval": list(self.interval) if self.interval is not None else None,
        }


@dataclass(frozen=True)
class SideEffect:
    """A change beyond the claims: a metric that moved beyond the noise, or a new pitfall.

    `harmful`: worse, and the change's doing. A metric that got worse where the change cannot act
    is `attributed=False` and not harmful; its detail says why and what would tell.
    """

    name: str  # an evidence key, or "pitfall:<id>"
    kind: Literal["metric", "pitfall"]
    harmful: bool
    before: str = ""
    after: str = ""
    change: str = ""
    detail: str = ""
    attributed: bool = True


@dataclass(frozen=True)
class SloChange:
    objective: str
    before: str  # "met", "broken", "not judged", "not declared"
    after: str


@dataclass(frozen=True)
class VerifyResult:
    before_label: str
    after_label: str
    config: tuple[ConfigChange, ...]
    adopted: tuple[AdoptedTechnique, ...]
    comparability: Comparability
    claims: tuple[ClaimResult, ...] = ()  # empty when the runs are not comparable
    side_effects: tuple[SideEffect, ...] = ()
    slo: tuple[SloChange, ...] = ()
    change_note: str = ""  # what the user said was changed (--change): a note, never evidence
    notes: tuple[str, ...] = ()
    method: str = ""
    control_label: str = ""  # a second run of BEFORE's configuration, AFTER bracketed by both (verify.bracket)

    @property
    def config_changed(self) -> bool:
        return any(c.changed for c in self.config)

    @property
    def harmful_side_effects(self) -> tuple[SideEffect, ...]:
        return tuple(s for s in self.side_effects if s.harmful)

    @property
    def verdict(self) -> Overall:
        if not self.comparability.comparable:
            return "not-comparable"
        verdicts = {c.verdict for c in self.claims}
        if "made-it-worse" in verdicts or self.harmful_side_effects:
            return "made-it-worse"
        if "cannot-tell" in verdicts or not verdicts:
            return "cannot-tell"
        if verdicts == {"delivered"}:
            return "delivered"
        return "partly-delivered" if "delivered" in verdicts else "no-measurable-effect"

    def counts(self) -> dict[str, int]:
        return {v: sum(c.verdict == v for c in self.claims) for v in CLAIM_VERDICTS}

    def exit_code(self, *, fail_on_inconclusive: bool = False) -> int:
        """The gate's conventions: 1 harm, 5 not comparable (always) or cannot tell (when asked), else 0."""
        v = self.verdict
        if v == "not-comparable":
            return ExitCode.INCONCLUSIVE
        if v == "made-it-worse":
            return ExitCode.REGRESSION
        if v == "cannot-tell" and fail_on_inconclusive:
            return ExitCode.INCONCLUSIVE
        return ExitCode.OK

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "before": self.before_label,
            "after": self.after_label,
            "control": self.control_label or None,
            "change_note": self.change_note,
            "config": [c.__dict__.copy() for c in self.config if c.changed],
            "config_changed": self.config_changed,
            "adopted": [a.__dict__.copy() for a in self.adopted],
            "comparable": self.comparability.comparable,
            "workload": [w.__dict__.copy() for w in self.comparability.checks],
            "comparability_reasons": list(self.comparability.reasons),
            "counts": self.counts(),
            "claims": [c.to_dict() for c in self.claims],
            "side_effects": [s.__dict__.copy() for s in self.side_effects],
            "slo": [s.__dict__.copy() for s in self.slo],
            "notes": list(self.notes),
            "method": self.method,
        }
