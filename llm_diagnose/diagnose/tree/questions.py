"""The six questions (and the two extra nodes), each a pure function of evidence.

`ask_qN(evidence, thresholds) -> Answer`. "yes" and "no" mean what the question asks,
literally; which answer calls for a technique is decided in `llm_diagnose.diagnose.tree`. A question
without the evidence it needs answers "unknown" and lists what is missing and how to get it.

Q5, Q6 and OB also take the declared service-level objectives (`slo=`, `llm_diagnose.diagnose.tree.slo.SLO`;
undeclared by default). Q5 (its own module, llm_diagnose.diagnose.tree.q5_decode_latency, question and
branch) asks whether decode latency breaks the ITL objective, and falls back to the fixed
q5.max_itl_* thresholds only when no ITL objective is declared; Q6 says in
its rationale whether the ITL or TTFT objective breaks; OB reads whether anyone waits from the
SLO first (it carries --interactive/--offline when given), then from the evidence's
`workload.interactive` fact.
"""

from __future__ import annotations

from collections.abc import Callable

from llm_diagnose.diagnose.tree.declared import UNDECLARED, objective_labels, workload_interactive
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.fit import TITLE as Q1_TITLE
from llm_diagnose.diagnose.tree.fit import ask_q1
from llm_diagnose.diagnose.tree.prefix_figures import engine_figure
from llm_diagnose.diagnose.tree.q5_decode_latency import TITLE as Q5_TITLE
from llm_diagnose.diagnose.tree.q5_decode_latency import ask_q5
from llm_diagnose.diagnose.tree.reading import SETTLE_LIVE, Reading
from llm_diagnose.diagnose.tree.signals import in_flight, load_level, setting
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["QUESTION_TITLES", "ASK", "SLO_QUESTIONS", "ask_all", "workload_interactive"]

QUESTION_TITLES = {
    "Q1": Q1_TITLE,
    "Q2": "Do requests share prompt prefixes?",
    "Q3": "Do requests of very different output lengths arrive concurrently?",
    "Q4": "Does KV-cache fragmentation cap the batch size?",
    "Q5": Q5_TITLE,
    "Q6": "Do prefill and decode contend on the same GPU?",
    "KV": "Is useful prefix cache evicted before it is reused?",
    "OB": "Does nobody wait for the responses (offline work)?",
}


def _answer(r: Reading, q: str, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer(q, QUESTION_TITLES[q], answer, confidence, rationale, verdict)


def inconclusive(r: Reading, q: str, why: str, settle: str = SETTLE_LIVE) -> Answer:
    """No verdict: the evidence leaves the answer open. Says why, and what would settle it."""
    return r.inconclusive(q, QUESTION_TITLES[q], why, settle)


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
            "Q2",
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
                "Q2",
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
            "Q2",
            "yes" if shares else "no",
            conf * r.quality(Q.PREFIX_HIT_RATE),
            f"the live prefix cache served {hit:.0%} of the prompt tokens it was asked for",
        )
    if caching is False:
        return _answer(
            r,
            "Q2",
            "unknown",
            0.0,
            "prefix caching is off, so the server's counters cannot show sharing; give a trace "
            "(--trace) or run the active prefix experiment (--active)",
        )
    return _answer(r, "Q2", "unknown", 0.0, "no measurement of prefix sharing (live or from a trace)")


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
            "Q3",
            "yes",
            r.capped(r.conf("direct"), Q.SHORT_WAIT_FOR_LONG),
            f"short requests beside long ones took {waits.shown}x as long as beside short ones",
            "short-waits-for-long",
        )
    if waits is not None and waits.holds is None:
        return inconclusive(r, "Q3", f"whether short requests wait for long ones: {waits.why}")
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
        return _answer(r, "Q3", "unknown", 0.0, f"{seen}: whether they overlap under real traffic was not seen")
    if varied is False or concurrent is False:
        why = (
            f"output lengths are similar (CV {cv:.2f})"
            if varied is False
            else f"requests rarely overlap (mean {conc:.1f} in flight)"
        )
        return _answer(
            r, "Q3", "no", r.conf("counters") * r.quality(Q.OUTPUT_LEN_CV, Q.CONCURRENCY_MEAN, Q.RUNNING_MEAN), why
        )
    if varied and concurrent:
        return _answer(
            r,
            "Q3",
            "yes",
            r.conf("counters") * r.quality(Q.OUTPUT_LEN_CV, Q.CONCURRENCY_MEAN, Q.RUNNING_MEAN),
            f"output lengths vary (CV {cv:.2f}) and {conc:.1f} requests are in flight on average",
        )
    return _answer(r, "Q3", "unknown", 0.0, "output-length spread or concurrency was not measured")


def ask_q4(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    waste = r.num(Q.KV_WASTE_FRACTION)
    if waste is not None:
        capped = r.compare(Q.KV_WASTE_FRACTION, waste, ">=", "q4.max_kv_waste")
        return _answer(
            r,
            "Q4",
            "yes" if capped else "no",
            r.conf("direct") * r.quality(Q.KV_WASTE_FRACTION),
            f"{waste:.0%} of the allocated KV memory holds no token",
        )
    paged = r.flag(Q.PAGED_KV)
    if paged:
        return _answer(
            r,
            "Q4",
            "no",
            r.conf("config"),
            "the engine allocates the KV cache in blocks, wasting at most one block per sequence",
            "paged",
        )
    return _answer(r, "Q4", "unknown", 0.0, "KV allocation (paged or reserved per request) was not observed")


def slo_stalls_note(ev: Evidence, slo: SLO) -> tuple[bool | None, str]:
    """Whether the SLO's ITL or TTFT objective breaks (prefill stalls show in both: in the
    gaps of running streams and in the wait of the next prompt), and a phrase saying so.
    (None, "") when neither objective is declared."""
    checks = slo.check_evidence(ev, ("itl", "ttft"))
    if not checks:
        return None, ""
    broken = [c for c in checks if c.met is False]
    if broken:
        return True, f"the SLO breaks ({objective_labels(broken)})"
    if any(c.met is None for c in checks):
        return None, "whether the SLO's ITL/TTFT objectives hold could not be judged"
    return False, f"the SLO's ITL/TTFT objectives hold ({objective_labels(checks)})"


def ask_q6(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> Answer:
    r = Reading(ev, th)
    breaks, slo_note = slo_stalls_note(ev, slo)

    def said(answer: str, rationale: str) -> str:
        # Contention is a fact of the engine; the SLO says whether its stalls matter to anyone.
        if not slo_note:
            return rationale
        if answer == "yes":
            tail = {
                True: f"; the stalls matter: {slo_note}",
                False: f"; {slo_note}, so the stalls do not break it yet",
                None: f"; {slo_note}",
            }[breaks]
        else:
            tail = f"; {slo_note}" + (", but not from prefill/decode contention" if breaks else "")
        return rationale + tail

    inflation = r.num(Q.ITL_INFLATION)
    corr = r.num(Q.PROMPT_ITL_CORRELATION)
    corr_contend = None if corr is None else r.compare(Q.PROMPT_ITL_CORRELATION, corr, ">=", "q6.min_correlation")
    stalls = r.live(Q.ITL_INFLATION, ">=", "q6.min_itl_inflation") if inflation is not None else None
    if stalls is not None and stalls.holds is None:
        return inconclusive(r, "Q6", f"whether prefills stall decode: {stalls.why}")
    if stalls is not None:
        contend = bool(stalls.holds)
        conf = r.conf("direct")
        if corr_contend is not None and corr_contend != contend:
            conf *= r.conf("disagreement")
        answer: AnswerValue = "yes" if contend else "no"
        return _answer(
            r,
            "Q6",
            answer,
            r.capped(conf, Q.ITL_INFLATION),
            said(answer, f"inter-token latency during prefills was {stalls.shown}x the baseline"),
        )
    if corr is not None:
        # A rank correlation across scrapes is passive: at low load it says nothing, and
        # otherwise it stays a modest signal that asks for the active experiment.
        level, why = load_level(r)
        if level == "idle":
            return _answer(
                r,
                "Q6",
                "unknown",
                0.0,
                f"only a passive correlation (rank {corr:.2f}) from a near-idle server ({why}): run the "
                "interference experiment (--active)",
                "passive-low-load",
            )
        answer = "yes" if corr_contend else "no"
        return _answer(
            r,
            "Q6",
            answer,
            min(r.conf("passive"), r.conf("counters") * r.quality(Q.PROMPT_ITL_CORRELATION)),
            said(
                answer,
                f"across the window, ITL rose with prompt-token rate (rank correlation "
                f"{corr:.2f}); passive evidence: confirm with --active",
            ),
            "passive",
        )
    return _answer(r, "Q6", "unknown", 0.0, "prefill/decode interference was not measured")


def ask_kv(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    unlimited = r.num(Q.PREFIX_POTENTIAL)
    at_capacity = r.num(Q.PREFIX_AT_CAPACITY)
    if unlimited is not None and at_capacity is not None:
        gap = unlimited - at_capacity
        evicted = r.compare("prefix.potential_minus_at_capacity", gap, ">=", "kv_offload.min_gap")
        return _answer(
            r,
            "KV",
            "yes" if evicted else "no",
            r.conf("direct") * r.quality(Q.PREFIX_POTENTIAL),
            f"an unlimited cache would serve {unlimited:.0%} of prompt tokens, the server's capacity {at_capacity:.0%}",
        )
    return _answer(
        r,
        "KV",
        "unknown",
        0.0,
        "needs the workload's reuse with and without the capacity limit (a trace and --kv-capacity-tokens)",
    )


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
            "OB",
            "unknown",
            0.0,
            "whether anyone waits was not declared (--offline / --interactive, "
            "or [slo] interactive = false / latency objectives)",
        )
    if interactive:
        return _answer(r, "OB", "no", r.conf("declared"), f"someone waits: {who}{overruled}")
    return _answer(
        r,
        "OB",
        "yes",
        r.conf("declared"),
        f"the workload is {who} with no latency objective: nobody waits for single responses{overruled}",
    )


# Every question takes (evidence, thresholds); these also take `slo=`.
ASK: dict[str, Callable[..., Answer]] = {
    "Q1": ask_q1,
    "Q2": ask_q2,
    "Q3": ask_q3,
    "Q4": ask_q4,
    "Q5": ask_q5,
    "Q6": ask_q6,
    "KV": ask_kv,
    "OB": ask_ob,
}
SLO_QUESTIONS = frozenset({"Q5", "Q6", "OB"})


def ask_all(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> tuple[Answer, ...]:
    return tuple(ask(ev, th, slo=slo) if q in SLO_QUESTIONS else ask(ev, th) for q, ask in ASK.items())
