"""What the gate compares and what it concludes: one side of the comparison (`RunData`) and the
whole verdict (`GateResult`) over each rule's outcome
(`llm_diagnose.diagnose.compare.outcome.Outcome`), with its exit code.

Plain immutable values: `llm_diagnose.diagnose.gate.judge` produces them, `llm_diagnose.diagnose.gate.render`
and `llm_diagnose.diagnose.report.markdown.render_gate` lay them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llm_diagnose.diagnose.compare.outcome import VERDICTS, Outcome
from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.gate.rules import GateRules
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence

__all__ = ["RunData", "GateResult"]


@dataclass(frozen=True)
class RunData:
    """One side of the comparison: its evidence, its diagnosis, and what to call it.

    `skipped_lines` says which lines of its run folder could not be read (`RunFolder.skipped_notes()`):
    the per-request samples are the lines that could.
    """

    evidence: Evidence
    diagnosis: Diagnosis
    label: str = ""
    skipped_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class GateResult:
    outcomes: tuple[Outcome, ...]
    rules: GateRules
    baseline_label: str = "baseline"
    current_label: str = "current"
    notes: tuple[str, ...] = field(default=())  # how the inputs were read (e.g. a diagnosis recomputed)
    skipped_lines: tuple[str, ...] = ()  # "current: 1 unreadable line(s) of requests.jsonl skipped (40 read)"

    @property
    def verdict(self) -> Literal["regression", "inconclusive", "pass"]:
        verdicts = {o.verdict for o in self.outcomes}
        return "regression" if "regression" in verdicts else "inconclusive" if "inconclusive" in verdicts else "pass"

    def counts(self) -> dict[str, int]:
        return {v: sum(o.verdict == v for o in self.outcomes) for v in VERDICTS}

    def ordered(self) -> list[Outcome]:
        """Worst first; within a verdict, metrics before the diagnosis, in rule order."""
        rank = {v: i for i, v in enumerate(VERDICTS)}
        return sorted(self.outcomes, key=lambda o: (rank[o.verdict], o.kind != "metric"))

    def exit_code(self, *, fail_on_inconclusive: bool = False) -> int:
        if self.verdict == "regression":
            return ExitCode.REGRESSION
        if self.verdict == "inconclusive" and fail_on_inconclusive:
            return ExitCode.INCONCLUSIVE
        return ExitCode.OK

    def method_note(self) -> str:
        s = self.rules.settings
        return (
            f"Sampled quantities: bootstrap {s.confidence:.0%} confidence interval of the change "
            f"({s.resamples} resamples, seed {s.seed}, at least {s.min_samples} samples per run); "
            "medians known only by a summary: bounded by their confidence intervals; "
            f"others: plain tolerance on the value. Rules: {self.rules.source}."
        )

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "baseline": self.baseline_label,
            "current": self.current_label,
            "counts": self.counts(),
            "method": self.method_note(),
            "notes": list(self.notes),
            "skipped_lines": list(self.skipped_lines),
            "outcomes": [o.to_dict() for o in self.ordered()],
        }
