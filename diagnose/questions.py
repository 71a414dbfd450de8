"""The six questions (and the two extra nodes), each a pure function of evidence.

`ask_qN(evidence, thresholds) -> Answer`. "yes" and "no" mean what the question asks,
literally; which answer calls for a technique is decided in `diagnose.tree`. A question
without the evidence it needs answers "unknown" and lists what is missing and how to get it.
"""

from __future__ import annotations

from typing import Callable

from diagnose.diagnosis import Answer
from diagnose.evidence import Evidence
from diagnose.reading import Reading
from diagnose.thresholds import Thresholds
from probes import quantities as Q

__all__ = ["QUESTION_TITLES", "ASK", "ask_all"]

QUESTION_TITLES = {
    "Q1": "Does the model fit the hardware with room to spare?",
    "Q2": "Do requests share prompt prefixes?",
    "Q3": "Do requests of very different output lengths arrive concurrently?",
    "Q4": "Does KV-cache fragmentation cap the batch size?",
    "Q5": "Is per-token decode latency the main complaint?",
    "Q6": "Do prefill and decode contend on the same GPU?",
    "KV": "Is useful prefix cache evicted before it is reused?",
    "OB": "Does nobody wait for the responses (offline work)?",
}


def _answer(r: Reading, q: str, answer: str, confidence: float, rationale: str, verdict: str = "") -> Answer:
    # An answer lists as missing only what it did not manage to read: a key that some
    # other signal made unnecessary is still listed, since measuring it would add confidence.
    return Answer(
        question=q, title=QUESTION_TITLES[q], answer=answer,  # type: ignore[arg-type]
        confidence=round(max(0.0, min(1.0, confidence)), 3), rationale=rationale,
        comparisons=tuple(r.comparisons), evidence=tuple(r.used), missing=tuple(r.missing), verdict=verdict,
    )


def ask_q1(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    weights = r.num(Q.WEIGHTS_FRACTION)
    tight = False
    if weights is not None:
        if r.compare(Q.WEIGHTS_FRACTION, weights, ">", "q1.device_limit"):
            return _answer(r, "Q1", "no", 0.95, "the weights alone exceed one device's memory", "does-not-fit")
        tight = r.compare(Q.WEIGHTS_FRACTION, weights, ">", "q1.max_weights_fraction")
    kv_p95 = r.num(Q.KV_USAGE_P95)
    preempted = r.num(Q.PREEMPTIONS)
    waiting = r.num(Q.WAITING_MEAN)
    kv_full = None if kv_p95 is None else r.compare(Q.KV_USAGE_P95, kv_p95, ">=", "q1.kv_saturation")
    turned_away = None
    if preempted is not None and preempted > 0:
        turned_away = True
    if waiting is not None:
        queued = r.compare(Q.WAITING_MEAN, waiting, ">=", "q1.min_waiting")
        turned_away = bool(turned_away) or queued
    elif turned_away is None and preempted is not None:
        turned_away = False

    if tight:
        return _answer(r, "Q1", "no", 0.85 * r.quality(Q.WEIGHTS_FRACTION),
                       f"the weights take {weights:.0%} of a device, leaving little for the KV cache", "tight")
    if kv_full and turned_away:
        why = "requests were preempted" if preempted else "requests waited for capacity"
        return _answer(r, "Q1", "no", 0.85 * r.quality(Q.KV_USAGE_P95),
                       f"the KV cache ran full (p95 usage {kv_p95:.0%}) and {why}", "kv-bound")
    if kv_p95 is None and weights is None:
        return _answer(r, "Q1", "unknown", 0.0, "neither the weights' share of memory nor KV usage was measured")
    gen = r.num(Q.GEN_TOKENS_PER_S)
    idle = gen is not None and gen == 0
    conf = 0.8 if (kv_p95 is not None and weights is not None) else 0.6
    if kv_full and turned_away is None:
        return _answer(r, "Q1", "unknown", 0.0,
                       "the KV cache ran full, but whether requests were turned away was not measured")
    rationale = "the model fits"
    if kv_p95 is not None:
        rationale += f"; KV usage stayed at p95 {kv_p95:.0%}" + (" without preemption or queueing" if kv_full else "")
    if idle:
        rationale += " (no tokens were generated in the window, so demand was not tested)"
        conf = 0.3
    return _answer(r, "Q1", "yes", conf * r.quality(Q.KV_USAGE_P95), rationale, "fits")


def ask_q2(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    potential = r.num(Q.PREFIX_POTENTIAL)
    if potential is not None:
        shares = r.compare(Q.PREFIX_POTENTIAL, potential, ">=", "q2.min_reuse_fraction")
        return _answer(r, "Q2", "yes" if shares else "no", 0.9 * r.quality(Q.PREFIX_POTENTIAL),
                       f"an exact-prefix cache could serve {potential:.0%} of the prompt tokens of the workload")
    caching = r.flag(Q.PREFIX_CACHING)
    hit = r.num(Q.PREFIX_HIT_RATE)
    queried = r.num(Q.PREFIX_QUERIED_TOKENS)
    if caching and hit is not None and (queried is None or queried > 0):
        shares = r.compare(Q.PREFIX_HIT_RATE, hit, ">=", "q2.min_reuse_fraction")
        conf = 0.75 if shares else 0.55  # a low live rate may hide sharing the cache lost to eviction
        return _answer(r, "Q2", "yes" if shares else "no", conf * r.quality(Q.PREFIX_HIT_RATE),
                       f"the live prefix cache served {hit:.0%} of the prompt tokens it was asked for")
    if caching is False:
        return _answer(r, "Q2", "unknown", 0.0,
                       "prefix caching is off, so the server's counters cannot show sharing; give a trace "
                       "(--trace) or run the active prefix experiment (--active)")
    return _answer(r, "Q2", "unknown", 0.0, "no measurement of prefix sharing (live or from a trace)")


def ask_q3(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    slowdown = r.num(Q.SHORT_WAIT_FOR_LONG)
    cv = r.num(Q.OUTPUT_LEN_CV)
    conc = r.num(Q.CONCURRENCY_MEAN)
    conc_key = Q.CONCURRENCY_MEAN
    if conc is None:
        # In flight = running + waiting: a static server runs one request at a time while
        # the others wait, so its running batch alone would hide the concurrency.
        running = r.num(Q.RUNNING_MEAN)
        waiting = r.num(Q.WAITING_MEAN)
        if running is not None:
            conc = running + (waiting or 0.0)
            conc_key = f"{Q.RUNNING_MEAN}+{Q.WAITING_MEAN}" if waiting is not None else Q.RUNNING_MEAN
    varied = None if cv is None else r.compare(Q.OUTPUT_LEN_CV, cv, ">=", "q3.min_output_cv")
    concurrent = None if conc is None else r.compare(conc_key, conc, ">=", "q3.min_concurrency")
    if slowdown is not None and r.compare(Q.SHORT_WAIT_FOR_LONG, slowdown, ">=", "q3.max_short_slowdown"):
        return _answer(r, "Q3", "yes", 0.9 * r.quality(Q.SHORT_WAIT_FOR_LONG),
                       f"short requests beside long ones took {slowdown:.1f}x as long as alone", "short-waits-for-long")
    if varied is False or concurrent is False:
        why = (f"output lengths are similar (CV {cv:.2f})" if varied is False
               else f"requests rarely overlap (mean {conc:.1f} in flight)")
        return _answer(r, "Q3", "no", 0.8 * r.quality(Q.OUTPUT_LEN_CV, Q.CONCURRENCY_MEAN, Q.RUNNING_MEAN), why)
    if varied and concurrent:
        return _answer(r, "Q3", "yes", 0.8 * r.quality(Q.OUTPUT_LEN_CV, Q.CONCURRENCY_MEAN, Q.RUNNING_MEAN),
                       f"output lengths vary (CV {cv:.2f}) and {conc:.1f} requests are in flight on average")
    return _answer(r, "Q3", "unknown", 0.0, "output-length spread or concurrency was not measured")


def ask_q4(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    waste = r.num(Q.KV_WASTE_FRACTION)
    if waste is not None:
        capped = r.compare(Q.KV_WASTE_FRACTION, waste, ">=", "q4.max_kv_waste")
        return _answer(r, "Q4", "yes" if capped else "no", 0.85 * r.quality(Q.KV_WASTE_FRACTION),
                       f"{waste:.0%} of the allocated KV memory holds no token")
    paged = r.flag(Q.PAGED_KV)
    if paged:
        return _answer(r, "Q4", "no", 0.7,
                       "the engine allocates the KV cache in blocks, wasting at most one block per sequence",
                       "paged")
    return _answer(r, "Q4", "unknown", 0.0, "KV allocation (paged or reserved per request) was not observed")


def ask_q5(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    p50 = r.num(Q.ITL_P50)
    p99 = r.num(Q.ITL_P99)
    share = r.num(Q.DECODE_TIME_SHARE)
    if p50 is None and p99 is None:
        return _answer(r, "Q5", "unknown", 0.0, "inter-token latency was not measured")
    slow_median = p50 is not None and r.compare(Q.ITL_P50, p50, ">", "q5.max_itl_p50_s")
    slow_tail = p99 is not None and r.compare(Q.ITL_P99, p99, ">", "q5.max_itl_p99_s")
    decode_dominates = None if share is None else r.compare(Q.DECODE_TIME_SHARE, share, ">=", "q5.min_decode_share")
    quality = r.quality(Q.ITL_P50, Q.ITL_P99)
    if (slow_median or slow_tail) and decode_dominates is not False:
        what = f"median {p50 * 1e3:.0f} ms" if slow_median else f"p99 {p99 * 1e3:.0f} ms"
        conf = (0.8 if decode_dominates else 0.6) * quality
        return _answer(r, "Q5", "yes", conf, f"tokens arrive slowly ({what} between tokens)")
    if slow_median or slow_tail:
        return _answer(r, "Q5", "no", 0.6 * quality,
                       f"decode is slow but only {share:.0%} of request time is decode: prefill or queueing dominate")
    shown = f"{p50 * 1e3:.1f} ms median" if p50 is not None else f"{p99 * 1e3:.1f} ms p99"
    return _answer(r, "Q5", "no", 0.8 * quality, f"inter-token latency is within target ({shown})")


def ask_q6(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    inflation = r.num(Q.ITL_INFLATION)
    if inflation is not None:
        m = r.measurement(Q.ITL_INFLATION)
        contend = r.compare(Q.ITL_INFLATION, inflation, ">=", "q6.min_itl_inflation")
        conf = 0.9
        if m is not None and m.summary is not None and m.summary.ci_low <= 1.0 < m.summary.ci_high:
            conf = 0.5  # the interval includes "no inflation"
        return _answer(r, "Q6", "yes" if contend else "no", conf * r.quality(Q.ITL_INFLATION),
                       f"inter-token latency during prefills was {inflation:.2f}x the baseline")
    corr = r.num(Q.PROMPT_ITL_CORRELATION)
    if corr is not None:
        contend = r.compare(Q.PROMPT_ITL_CORRELATION, corr, ">=", "q6.min_correlation")
        return _answer(r, "Q6", "yes" if contend else "no", 0.5 * r.quality(Q.PROMPT_ITL_CORRELATION),
                       f"across the window, ITL rose with prompt-token rate (rank correlation {corr:.2f}); "
                       "passive evidence: confirm with --active")
    return _answer(r, "Q6", "unknown", 0.0, "prefill/decode interference was not measured")


def ask_kv(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    unlimited = r.num(Q.PREFIX_POTENTIAL)
    at_capacity = r.num(Q.PREFIX_AT_CAPACITY)
    if unlimited is not None and at_capacity is not None:
        gap = unlimited - at_capacity
        evicted = r.compare("prefix.potential_minus_at_capacity", gap, ">=", "kv_offload.min_gap")
        return _answer(r, "KV", "yes" if evicted else "no", 0.85,
                       f"an unlimited cache would serve {unlimited:.0%} of prompt tokens, the server's capacity "
                       f"{at_capacity:.0%}")
    return _answer(r, "KV", "unknown", 0.0,
                   "needs the workload's reuse with and without the capacity limit (a trace and --kv-capacity-tokens)")


def ask_ob(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    interactive = r.flag(Q.INTERACTIVE)
    if interactive is None:
        return _answer(r, "OB", "unknown", 0.0, "whether anyone waits was not declared (--offline / --interactive)")
    if interactive:
        return _answer(r, "OB", "no", 1.0, "the workload is declared interactive")
    return _answer(r, "OB", "yes", 1.0, "the workload is declared offline: nobody waits for single responses")


ASK: dict[str, Callable[[Evidence, Thresholds], Answer]] = {
    "Q1": ask_q1, "Q2": ask_q2, "Q3": ask_q3, "Q4": ask_q4, "Q5": ask_q5, "Q6": ask_q6, "KV": ask_kv, "OB": ask_ob,
}


def ask_all(ev: Evidence, th: Thresholds) -> tuple[Answer, ...]:
    return tuple(ask(ev, th) for ask in ASK.values())
