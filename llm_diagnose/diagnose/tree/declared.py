"""What the user declared, read for the questions: whether anyone waits, and objectives judged
like thresholds.

Q5 and OB ask whether anyone waits (`workload_interactive`); Q5 and Q6 judge the SLO's
objectives from the evidence and record each as a comparison (`slo_comparison`) or a phrase
(`objective_labels`).
"""

from __future__ import annotations

from collections.abc import Iterable

from llm_diagnose.diagnose.tree.diagnosis import Comparison
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.slo import SLO, ObjectiveCheck
from llm_diagnose.probes import quantities as Q

__all__ = ["UNDECLARED", "workload_interactive", "slo_comparison", "objective_labels"]

UNDECLARED = SLO()


def slo_comparison(r: Reading, check: ObjectiveCheck) -> None:
    """Record an objective judged from evidence like a threshold comparison (`slo.<key>`)."""
    if check.met is None or check.observed_s is None:
        return
    r.num(check.evidence)  # the key read, in the answer's evidence
    r.comparisons.append(
        Comparison(
            f"slo.{check.objective.key}",
            check.evidence,
            float(check.observed_s),
            "<=",
            check.objective.limit_s,
            bool(check.met),
        )
    )


def objective_labels(checks: Iterable[ObjectiveCheck]) -> str:
    return "; ".join(c.text + (f" [{c.how}]" if c.bound else "") for c in checks)


def workload_interactive(ev: Evidence, slo: SLO = UNDECLARED) -> tuple[bool | None, str]:
    """Whether anyone waits, and who said so. The SLO comes first: it carries the
    --interactive/--offline flag of this invocation when one was given, and latency objectives
    mean someone waits; then the evidence's workload.interactive fact (declared when it was
    collected)."""
    if slo.latency_bound:
        return True, f"latency objectives are declared ({slo.source})"
    if slo.interactive is not None:
        return slo.interactive, f"declared {'interactive' if slo.interactive else 'offline'} ({slo.source})"
    fact = ev.fact(Q.INTERACTIVE)
    if isinstance(fact, bool):
        return fact, f"declared {'interactive' if fact else 'offline'} in the evidence"
    return None, "not declared"
