"""KV: is useful prefix cache evicted before it is reused? The question sets the workload's reuse
with an unlimited cache beside its reuse at the server's KV capacity; the branch judges KV-cache
offload, by the live hit rate where a tier is on (the capacity simulation does not know it).
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_kv", "walk_kv", "QUESTION"]

TITLE = "Is useful prefix cache evicted before it is reused?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("KV", TITLE, answer, confidence, rationale, verdict)


def ask_kv(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    unlimited = r.num(Q.PREFIX_POTENTIAL)
    at_capacity = r.num(Q.PREFIX_AT_CAPACITY)
    if unlimited is not None and at_capacity is not None:
        gap = unlimited - at_capacity
        evicted = r.compare("prefix.potential_minus_at_capacity", gap, ">=", "kv_offload.min_gap")
        return _answer(
            r,
            "yes" if evicted else "no",
            r.conf("direct") * r.quality(Q.PREFIX_POTENTIAL),
            f"an unlimited cache would serve {unlimited:.0%} of prompt tokens, the server's capacity {at_capacity:.0%}",
        )
    return _answer(
        r,
        "unknown",
        0.0,
        "needs the workload's reuse with and without the capacity limit (a trace and --kv-capacity-tokens)",
    )


# --- the branch -------------------------------------------------------------------------------
def walk_kv(b: Branches) -> None:
    a = b.answers["KV"]
    offload, how = b.on(Q.KV_OFFLOAD)
    b.step("KV.offload-on", offload)
    need = needed(a, "yes")
    if offload and need is not False:
        # The capacity simulation does not know the offload tier: judge by the live hit rate.
        hit, potential = b.num(Q.PREFIX_HIT_RATE), b.num(Q.PREFIX_POTENTIAL)
        if hit is None or potential is None:
            b.add(
                "kv-offload",
                "on-unverified",
                "KV",
                "on, but its effect needs the live hit rate beside the workload's own reuse (a trace: --trace FILE)",
            )
            return
        working = hit >= potential - b.th["kv_offload.min_gap"]
        b.step("KV.hit-rate-near-potential", working, f"live {hit:.0%} of a possible {potential:.0%}")
        # Below the potential is not proof of failure: the local counter misses what the tier serves.
        b.add(
            "kv-offload",
            "in-place" if working else "on-unverified",
            "KV",
            f"on, and the live hit rate ({hit:.0%}) is near the workload's reuse ({potential:.0%})"
            if working
            else f"on, but the local hit rate ({hit:.0%}) under the workload's reuse ({potential:.0%}) does not count "
            "what the offload tier serves: its own hit counters (vLLM external_prefix_cache_hits, LMCache "
            "lmcache:*) would verify it",
        )
        return
    b.by_state("kv-offload", "KV", offload, need, default_why=how)


QUESTION = Question("KV", TITLE, ask_kv, walk_kv)
