"""Q3: do requests of very different output lengths arrive concurrently, so that short ones would
wait for long ones in a static batch? The branch judges continuous batching.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import in_flight
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_q3", "walk_q3", "QUESTION"]

TITLE = "Do requests of very different output lengths arrive concurrently?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q3", TITLE, answer, confidence, rationale, verdict)


def ask_q3(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    slowdown = r.num(Q.SHORT_WAIT_FOR_LONG)
    cv = r.num(Q.OUTPUT_LEN_CV)
    # In flight = running + waiting: a static server runs one request at a time while the
    # others wait, so its running batch alone would hide the concurrency.
    conc, conc_key = in_flight(r)
    varied = None if cv is None else r.compare(Q.OUTPUT_LEN_CV, cv, ">=", "q3.min_output_cv")
    concurrent = None if conc is None else r.compare(conc_key, conc, ">=", "q3.min_concurrency")
    waits = r.live(Q.SHORT_WAIT_FOR_LONG, ">=", "q3.max_short_slowdown") if slowdown is not None else None
    if waits is not None and waits.holds:
        return _answer(
            r,
            "yes",
            r.capped(r.conf("direct"), Q.SHORT_WAIT_FOR_LONG),
            f"short requests beside long ones took {waits.shown}x as long as beside short ones",
            "short-waits-for-long",
        )
    if waits is not None and waits.holds is None:
        return r.inconclusive("Q3", TITLE, f"whether short requests wait for long ones: {waits.why}")
    # Otherwise the interval is clear of the line (short requests do not wait): whether the
    # workload needs continuous batching is then the traffic's question, read below.
    tokens = r.num(Q.GEN_TOKENS_PER_S)
    idle = tokens is not None and tokens < th["load.min_tokens_per_s"]
    if concurrent is False and (conc == 0 or idle):
        seen = (
            "no requests ran in the window"
            if idle
            else "no request was in flight at any scrape"
            if tokens is None
            else f"every scrape read no request in flight while {tokens:.0f} tokens/s were generated (the "
            "requests fell between the scrapes)"
        )
        return _answer(r, "unknown", 0.0, f"{seen}: whether they overlap under real traffic was not seen")
    if varied is False or concurrent is False:
        why = (
            f"output lengths are similar (CV {cv:.2f})"
            if varied is False
            else f"requests rarely overlap (mean {conc:.1f} in flight)"
        )
        return _answer(
            r, "no", r.conf("counters") * r.quality(Q.OUTPUT_LEN_CV, Q.CONCURRENCY_MEAN, Q.RUNNING_MEAN), why
        )
    if varied and concurrent:
        return _answer(
            r,
            "yes",
            r.conf("counters") * r.quality(Q.OUTPUT_LEN_CV, Q.CONCURRENCY_MEAN, Q.RUNNING_MEAN),
            f"output lengths vary (CV {cv:.2f}) and {conc:.1f} requests are in flight on average",
        )
    return _answer(r, "unknown", 0.0, "output-length spread or concurrency was not measured")


# --- the branch -------------------------------------------------------------------------------
def walk_q3(b: Branches) -> None:
    a = b.answers["Q3"]
    cb, how = b.on(Q.CONTINUOUS_BATCHING)
    b.step("Q3.continuous-batching-on", cb)
    working = a.verdict != "short-waits-for-long"
    b.by_state(
        "continuous-batching",
        "Q3",
        cb,
        needed(a, "yes"),
        working,
        broken_why="it is reported on, yet short requests wait for long ones",
        default_why=how,
    )


QUESTION = Question("Q3", TITLE, ask_q3, walk_q3)
