"""OB: does nobody wait for the responses (offline work)? Read from the SLO first (it carries
--interactive/--offline when given), then from the evidence's `workload.interactive` fact.
The branch recommends offline batch inference where nobody waits.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.declared import UNDECLARED, workload_interactive
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_ob", "walk_ob", "QUESTION"]

TITLE = "Does nobody wait for the responses (offline work)?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("OB", TITLE, answer, confidence, rationale, verdict)


def ask_ob(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> Answer:
    r = Reading(ev, th)
    # Read (and list as missing) the evidence's fact only where the SLO does not decide.
    decided_by_slo = slo.latency_bound or slo.interactive is not None
    fact = ev.fact(Q.INTERACTIVE) if decided_by_slo else r.flag(Q.INTERACTIVE)
    fact = fact if isinstance(fact, bool) else None
    interactive, who = workload_interactive(ev, slo)
    # The SLO (this invocation's declaration) outranks a fact recorded with older evidence.
    overruled = (
        ""
        if fact is None or fact == interactive or interactive is None
        else (f"; the evidence's {Q.INTERACTIVE} = {str(fact).lower()} is overruled by the SLO")
    )
    if interactive is None:
        return _answer(
            r,
            "unknown",
            0.0,
            "whether anyone waits was not declared (--offline / --interactive, "
            "or [slo] interactive = false / latency objectives)",
        )
    if interactive:
        return _answer(r, "no", r.conf("declared"), f"someone waits: {who}{overruled}")
    return _answer(
        r,
        "yes",
        r.conf("declared"),
        f"the workload is {who} with no latency objective: nobody waits for single responses{overruled}",
    )


# --- the branch -------------------------------------------------------------------------------
def walk_ob(b: Branches) -> None:
    a = b.answers["OB"]
    b.by_state(
        "offline-batch",
        "OB",
        None if a.answer == "yes" else False,
        needed(a, "yes"),
        why="nobody waits: run it as an offline batch job at maximum throughput",
    )


QUESTION = Question("OB", TITLE, ask_ob, walk_ob, reads_slo=True)
