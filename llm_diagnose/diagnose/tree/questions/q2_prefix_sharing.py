"""Q2: do requests share prompt prefixes, and does the prefix cache serve them?

The question reads the workload's own reuse (a trace) first, else the live cache's hit rate;
the branch judges prefix caching: a prompt layout that defeats it, its live hit rate against
the workload's reuse, and the active prefix experiment (llm_diagnose.diagnose.tree.prefix_figures).
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.prefix_figures import engine_figure, judge_cache_apart
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import setting
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_q2", "walk_q2", "QUESTION"]

TITLE = "Do requests share prompt prefixes?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q2", TITLE, answer, confidence, rationale, verdict)


def ask_q2(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    potential = r.num(Q.PREFIX_POTENTIAL)
    if potential is not None:
        shares = r.compare(Q.PREFIX_POTENTIAL, potential, ">=", "q2.min_reuse_fraction")
        conf = r.conf("direct")
        # The engine's own hit-rate figure covers other traffic: it neither agrees nor disagrees with this trace.
        own = r.evidence.fact(Q.PREFIX_CACHING) is True and engine_figure(r.evidence) is None
        hit = r.num(Q.PREFIX_HIT_RATE) if own else None
        if hit is not None and (hit >= r.thresholds["q2.min_reuse_fraction"]) != shares:
            conf *= r.conf("disagreement")  # the live cache says otherwise
        return _answer(
            r,
            "yes" if shares else "no",
            conf * r.quality(Q.PREFIX_POTENTIAL),
            f"an exact-prefix cache could serve {potential:.0%} of the prompt tokens of the workload",
        )
    caching, _ = setting(r, Q.PREFIX_CACHING)  # on by the engine's default counts: it is what ran
    hit = r.num(Q.PREFIX_HIT_RATE)
    queried = r.num(Q.PREFIX_QUERIED_TOKENS)
    if caching and hit is not None and (queried is None or queried > 0):
        if r.compare(Q.PREFIX_HIT_RATE, hit, "<=", "q2.dead_hit_rate"):
            return _answer(
                r,
                "unknown",
                0.0,
                f"the live prefix cache hit {hit:.1%} of lookups: that cannot tell 'nothing shared' from "
                "'shared content the cache cannot see' (a varying head, blocks larger than the shared "
                "part); give a trace (--trace) or run the active prefix experiment (--active)",
            )
        shares = r.compare(Q.PREFIX_HIT_RATE, hit, ">=", "q2.min_reuse_fraction")
        # A low live rate may hide sharing the cache lost to eviction: weaker than a high one.
        conf = r.conf("counters") if shares else r.conf("proxy")
        return _answer(
            r,
            "yes" if shares else "no",
            conf * r.quality(Q.PREFIX_HIT_RATE),
            f"the live prefix cache served {hit:.0%} of the prompt tokens it was asked for",
        )
    if caching is False:
        return _answer(
            r,
            "unknown",
            0.0,
            "prefix caching is off, so the server's counters cannot show sharing; give a trace "
            "(--trace) or run the active prefix experiment (--active)",
        )
    return _answer(r, "unknown", 0.0, "no measurement of prefix sharing (live or from a trace)")


# --- the branch -------------------------------------------------------------------------------
def walk_q2(b: Branches) -> None:
    a = b.answers["Q2"]
    caching, how = b.on(Q.PREFIX_CACHING)
    b.step("Q2.prefix-caching-on", caching, "" if how == "seen" else how)
    layout = [p for p in ("dynamic-prefix", "unstable-serialization") if b.detected(p)]
    if a.answer == "no" and layout:
        # The workload shares content the cache cannot see yet: fix the prompts, then cache.
        b.step("Q2.prompt-layout-defeats-cache", True, ", ".join(layout))
        b.add(
            "prefix-caching",
            "not-working" if caching else "recommended",
            "Q2",
            f"prompts share content but not exact prefixes ({', '.join(layout)}): fix the prompt layout, "
            "then the prefix cache can serve it",
        )
        return
    if caching and judge_cache_apart(b):
        return
    hit = b.ev.measurement(Q.PREFIX_HIT_RATE)
    potential = b.ev.measurement(Q.PREFIX_POTENTIAL)
    working: bool | None = None
    unverified = "its live hit rate was not measured"
    if caching and hit is not None:
        # Exactly 0 with no lookups counted beside it: a gauge that reads 0, or no hits? It cannot say.
        gauge_zero = hit.value == 0.0 and b.ev.measurement(Q.PREFIX_QUERIED_TOKENS) is None
        if potential is not None and potential.value > 0 and not gauge_zero:
            working = hit.value >= potential.value * b.th["q2.working_ratio"]
        elif potential is None and hit.value <= b.th["q2.dead_hit_rate"]:
            unverified = (
                f"it hits {hit.value:.1%} of lookups and there is no trace to compare with: the workload may "
                "share nothing, or a varying head defeats the cache (give --trace FILE)"
            )
        elif gauge_zero:
            unverified = (
                f"its hit rate reads {hit.value:.1%} with no lookup counts beside it: an engine gauge of the "
                "last batch (SGLang cache_hit_rate) cannot show hits; hit and query counters, or the active "
                "prefix experiment (--active), would"
            )
        else:
            working = hit.value > 0
        b.step(
            "Q2.hit-rate-reaches-potential",
            working,
            f"live {hit.value:.0%}" + (f" of a possible {potential.value:.0%}" if potential is not None else ""),
        )
    if caching and working is None and hit is not None:
        b.add("prefix-caching", "on-unverified", "Q2", f"on, but {unverified}")
        return
    if caching and working is False and not layout:
        if b.answers["KV"].answer == "yes":
            b.add(
                "prefix-caching",
                "in-place",
                "Q2",
                "on; hits fall short of the workload's reuse only because the "
                "cache is too small to keep it until reuse (see kv-offload)",
            )
            return
        if b.ev.fact(Q.KV_OFFLOAD) is True:
            b.add(
                "prefix-caching",
                "on-unverified",
                "Q2",
                "on; the local hit rate falls short of the workload's "
                "reuse, but KV offload serves part of it outside that counter (see kv-offload)",
            )
            return
    broken = ", ".join(layout) if layout else "hits fall short of the workload's reuse (see KV offload)"
    b.by_state(
        "prefix-caching",
        "Q2",
        caching,
        needed(a, "yes"),
        working,
        broken_why=f"it is on, but {broken}",
        unverified_why=unverified,
        default_why=how,
    )


QUESTION = Question("Q2", TITLE, ask_q2, walk_q2)
