"""Q4: does KV-cache fragmentation (memory reserved per request and never filled) cap the batch
size? The branch judges the paged KV cache.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_q4", "walk_q4", "QUESTION"]

TITLE = "Does KV-cache fragmentation cap the batch size?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q4", TITLE, answer, confidence, rationale, verdict)


def ask_q4(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    waste = r.num(Q.KV_WASTE_FRACTION)
    if waste is not None:
        capped = r.compare(Q.KV_WASTE_FRACTION, waste, ">=", "q4.max_kv_waste")
        return _answer(
            r,
            "yes" if capped else "no",
            r.conf("direct") * r.quality(Q.KV_WASTE_FRACTION),
            f"{waste:.0%} of the allocated KV memory holds no token",
        )
    paged = r.flag(Q.PAGED_KV)
    if paged:
        return _answer(
            r,
            "no",
            r.conf("config"),
            "the engine allocates the KV cache in blocks, wasting at most one block per sequence",
            "paged",
        )
    return _answer(r, "unknown", 0.0, "KV allocation (paged or reserved per request) was not observed")


# --- the branch -------------------------------------------------------------------------------
def walk_q4(b: Branches) -> None:
    a = b.answers["Q4"]
    paged, how = b.on(Q.PAGED_KV)
    b.step("Q4.paged-kv-on", paged)
    b.by_state(
        "paged-attention",
        "Q4",
        paged,
        needed(a, "yes"),
        working=not paged,
        broken_why="the KV cache is paged, yet much of it holds no token: check the block size",
        default_why=how,
    )


QUESTION = Question("Q4", TITLE, ask_q4, walk_q4)
