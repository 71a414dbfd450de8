"""Q1: does the model fit the hardware with room to spare, or is the server just overloaded?

Fit is judged per device (memory.weights_fraction is all weights over one device's memory;
TP x PP divide it) and by the KV capacity the engine reserved, counted in this workload's
typical requests. Overload (KV full, queueing, preemptions) while the model fits is a
capacity finding (verdict `overloaded`: replicas or admission limits), not a reason to
quantize. A near-idle server fits `untested`: demand was never tried.

Verdicts, in the order they are decided: does-not-fit, tight, kv-too-small (answer "no"),
overloaded, untested, fits (answer "yes"); "unknown" without evidence.

The branch (`walk_q1`) decides quantization, parallelism and scale-out: fewer bytes before more
devices, replicas only once the model fits; parallelism on a model that fits is judged by its
layout (llm_diagnose.diagnose.tree.pipeline); slow tokens at a compute-bound batch (Q5) also call
for scale-out.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.kv_room import ENGINE_FIGURE, batch_at_cap, kv_requests
from llm_diagnose.diagnose.tree.pipeline import pipeline_for_latency
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.schemes import kv_quantized, weight_scheme
from llm_diagnose.diagnose.tree.signals import devices, load_level, roofline_at
from llm_diagnose.diagnose.tree.speculative import decode_regime
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_q1", "walk_q1", "QUESTION"]

TITLE = "Does the model fit the hardware with room to spare?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q1", TITLE, answer, confidence, rationale, verdict)


def ask_q1(ev: Evidence, th: Thresholds) -> Answer:
    r = Reading(ev, th)
    weights = r.num(Q.WEIGHTS_FRACTION)
    n_dev, parallel_seen = devices(r)
    per_device = None if weights is None else weights / (n_dev or 1.0)
    split = f" over {n_dev:.0f} devices" if n_dev and n_dev > 1 else ""
    unseen = 1.0 if parallel_seen else r.conf("unseen_setting")
    if per_device is not None:
        key = Q.WEIGHTS_FRACTION + ("/devices" if split else "")
        if r.compare(key, per_device, ">", "q1.device_limit"):
            tail = "" if parallel_seen else " (TP/PP were not seen: if the weights are already split, measure them)"
            return _answer(
                r,
                "no",
                r.conf("physical") * unseen,
                f"the weights need {per_device:.3g}x one device's memory{split}{tail}",
                "does-not-fit",
            )
        util = r.num(Q.GPU_MEMORY_UTILIZATION)
        tight = r.compare(key, per_device, ">", "q1.max_weights_fraction")
        if not tight and util is not None:
            tight = r.compare("config.gpu_memory_utilization-weights", util - per_device, "<", "q1.min_kv_headroom")
        if tight:
            room = f" of the {util:.0%} the engine may use" if util is not None else ""
            return _answer(
                r,
                "no",
                r.conf("physical") * unseen * r.quality(Q.WEIGHTS_FRACTION),
                f"the weights take {per_device:.0%} of each device{split}{room}, leaving little for the KV cache",
                "tight",
            )
    engine_requests = r.num(Q.KV_MAX_CONCURRENCY)
    if engine_requests is not None and r.compare(Q.KV_MAX_CONCURRENCY, engine_requests, "<", "q1.min_engine_requests"):
        max_len = r.num(Q.MAX_MODEL_LEN)
        longest = f"one request of max_model_len ({max_len:.0f} tokens)" if max_len else "one request of max_model_len"
        return _answer(
            r,
            "no",
            r.conf("direct"),
            f"by the engine's own figure its KV cache holds {engine_requests:.2f} of {longest}: the deployment "
            "does not fit as configured, whatever the load; shorten max_model_len to what requests need, quantize "
            "the KV cache (fp8) or give it more devices; more replicas of it do not help",
            "kv-too-small",
        )
    fit_requests, how = kv_requests(r)
    at_max_len = how == ENGINE_FIGURE
    fills = not at_max_len or (
        (p95 := r.num(Q.KV_USAGE_P95)) is not None and r.compare(Q.KV_USAGE_P95, p95, ">=", "q1.kv_near_saturation")
    )
    if fit_requests is not None and fills and r.compare("kv.requests_at_once", fit_requests, "<", "q1.min_kv_requests"):
        util = r.num(Q.GPU_MEMORY_UTILIZATION)
        low_util = util is not None and r.compare(Q.GPU_MEMORY_UTILIZATION, util, "<", "q1.low_gpu_memory_utilization")
        hint = f"; the engine may use only {util:.0%} of device memory: raise it first" if low_util else ""
        return _answer(
            r,
            "no",
            r.conf("direct") * r.quality(Q.KV_CAPACITY_TOKENS, Q.INPUT_LEN_P50),
            f"the KV cache holds only {fit_requests:.1f} typical requests at once ({how}){hint}",
            "kv-too-small",
        )
    level, load_why = load_level(r)
    kv_p95 = r.num(Q.KV_USAGE_P95)
    preempted = r.num(Q.PREEMPTIONS)
    waiting = r.num(Q.WAITING_MEAN)
    kv_full = None if kv_p95 is None else r.compare(Q.KV_USAGE_P95, kv_p95, ">=", "q1.kv_saturation")
    queued = None if waiting is None else r.compare(Q.WAITING_MEAN, waiting, ">=", "q1.min_waiting")
    near_full = kv_p95 is not None and r.compare(Q.KV_USAGE_P95, kv_p95, ">=", "q1.kv_near_saturation")
    # Requests that wait while the cache is at least half used wait for load, not for a scheduler
    # cap (below q4.low_kv_usage that is the batch-not-growing pitfall's case).
    busy = kv_p95 is not None and r.compare(Q.KV_USAGE_P95, kv_p95, ">=", "q4.low_kv_usage")
    pressure = []
    if preempted is not None and preempted > 0 and (near_full or kv_p95 is None):
        pressure.append(f"{preempted:.0f} preemptions")
    if queued and (kv_full or busy):
        pressure.append(f"requests waited ({waiting:.1f} on average)")
    # With KV usage read, a batch at its cap and a cache mostly free is the batch-not-growing pitfall's
    # case (raise the cap), and a full one is pressure above; unread, the cap binding is a finding alone.
    at_cap = batch_at_cap(r) if queued and kv_p95 is None else None
    if at_cap is not None:
        pressure.append(at_cap)
    if pressure:
        usage = f"KV usage p95 {kv_p95:.0%}" if kv_p95 is not None else "KV usage not measured"
        # The quality caps are ceilings (their documented meaning), not factors: a window shorter
        # than evidence.min_window_s that shows a full cache, preemptions and a queue is still an
        # overload (the live test's 6 s window read 100% KV, 225 preemptions, 60 waiting); only
        # doubt (counter resets, disagreeing readings, impossible values) pulls it under the
        # headline's floor.
        basis = r.capped(r.conf("counters"), Q.KV_USAGE_P95, Q.PREEMPTIONS, Q.WAITING_MEAN)
        sure_fit = weights is not None or fit_requests is not None
        if not sure_fit:
            basis *= r.conf("unseen_setting")
        fits = (
            f"the model fits ({fit_requests:.0f} typical requests fit in the KV cache)"
            if fit_requests is not None
            else "the model fits"
            if weights is not None
            else "the server runs the model"
        )
        # A preemption is the cache running out: "capped by load, not memory" may not stand beside one.
        capped = "" if kv_full or (preempted or 0) > 0 or at_cap else "; the batch is capped by load, not by memory"
        return _answer(
            r, "yes", basis, f"{fits}, but load fills it: {usage}, {', '.join(pressure)}{capped}", "overloaded"
        )
    if kv_full and queued is None and not preempted and weights is None and fit_requests is None:
        return _answer(
            r, "unknown", 0.0, "the KV cache ran full, but whether requests were turned away was not measured"
        )
    if weights is None and kv_p95 is None and fit_requests is None:
        return _answer(r, "unknown", 0.0, "neither the weights' share of memory nor the KV cache was measured")
    parts = ["the model fits"]
    if per_device is not None:
        parts.append(f"weights take {per_device:.0%} of each device{split}")
    if fit_requests is not None:
        parts.append(f"the KV cache holds {fit_requests:.0f} typical requests at once")
    if kv_p95 is not None:
        parts.append(
            f"KV usage stayed at p95 {kv_p95:.0%}"
            + (
                " (full, but whether requests waited was not measured)"
                if kv_full and queued is None
                else " without preemption or queueing"
                if kv_full
                else ""
            )
        )
    rationale = "; ".join(parts)
    both = (per_device is not None or fit_requests is not None) and kv_p95 is not None
    conf = (r.conf("counters") if both else r.conf("proxy")) * unseen * r.quality(Q.KV_USAGE_P95, Q.WEIGHTS_FRACTION)
    if level == "idle":
        return _answer(
            r,
            "yes",
            min(conf, r.conf("idle")),
            f"{rationale}; but the server was near idle ({load_why}), so demand was not tested",
            "untested",
        )
    if level == "unknown":
        conf = min(conf, r.conf("load_unknown"))
        rationale += f" ({load_why})"
    return _answer(r, "yes", conf, rationale, "fits")


# --- the branch -------------------------------------------------------------------------------
def walk_q1(b: Branches) -> None:
    a = b.answers["Q1"]
    quant = b.ev.fact(Q.WEIGHT_QUANTIZATION)
    kv_dtype = b.ev.fact(Q.KV_CACHE_DTYPE)
    weights_quantized = None if not isinstance(quant, str) else weight_scheme(quant) != "none"
    kv_q = kv_quantized(kv_dtype if isinstance(kv_dtype, str) else None)
    n_dev, _ = devices(b.reading())
    parallel = None if n_dev is None else n_dev > 1
    if a.verdict == "does-not-fit":
        b.step("Q1.fits-one-device", False, a.rationale)
        b.add(
            "quantization",
            "in-place" if weights_quantized else "recommended",
            "Q1",
            "already quantized" if weights_quantized else "fewer bytes per weight may fit fewer devices",
        )
        b.add("parallelism", "recommended", "Q1", f"{a.rationale}: split them across (more) devices")
        b.add("scale-out", "not-indicated", "Q1", "the model does not fit yet: replicas come after it does")
        return
    b.step("Q1.fits-one-device", None if a.answer == "unknown" else True)
    if a.answer == "no":  # tight or kv-too-small
        b.step(
            "Q1.already-quantized",
            weights_quantized,
            f"weights: {quant or 'not observed'}, KV cache: {kv_dtype or 'not observed'}",
        )
        fully = bool(weights_quantized) and bool(kv_q)
        if b.detected("weight-only-quantization"):
            b.add("quantization", "not-working", "Q1", b.pitfalls["weight-only-quantization"].explanation)
        elif fully:
            b.add("quantization", "in-place", "Q1", "weights and KV cache are already quantized")
        else:
            part = "the KV cache" if weights_quantized else "weights and KV cache"
            unseen = (
                " (the weights' quantization was not visible: they may be quantized already)"
                if weights_quantized is None
                else ""
            )
            b.add("quantization", "recommended", "Q1", f"{a.rationale}: quantize {part} for room to spare{unseen}")
        b.add(
            "parallelism",
            "recommended" if fully else "not-indicated",
            "Q1",
            a.rationale + "; already quantized, so spread over more devices"
            if fully
            else "fewer bytes come before more devices",
        )
        b.add("scale-out", "not-indicated", "Q1", "each instance lacks room: more replicas of it do not fix that")
        return
    if a.verdict == "overloaded":
        b.step("Q1.overloaded", True, a.rationale)
        b.add(
            "quantization",
            "in-place" if weights_quantized else "not-indicated",
            "Q1",
            "already quantized"
            if weights_quantized
            else "the model fits: load fills the KV cache, not the model's size (KV quantization is a capacity lever, "
            "see scale-out)",
        )
        b.add("parallelism", "in-place" if parallel else "not-indicated", "Q1", "the model fits its devices")
        if a.confidence > b.th["confidence.headline_min"]:
            b.add("scale-out", "recommended", "Q1", _scale_out_reason(b, a, kv_q))
        else:  # overload read from thin or doubtful evidence is no reason to buy replicas
            b.add(
                "scale-out",
                "unknown",
                "Q1",
                f"{a.rationale}, but on evidence too doubtful to act on "
                f"(confidence {a.confidence:.2f}): measure again over a steady loaded window",
            )
        return
    if weights_quantized and b.detected("weight-only-quantization"):
        b.add("quantization", "not-working", "Q1", b.pitfalls["weight-only-quantization"].explanation)
    else:
        b.by_state("quantization", "Q1", weights_quantized, needed(a, "no"))
    _parallel_layout(b, parallel, None if a.answer == "unknown" else False)
    _scale_out_from_decode(b, a)


def _parallel_layout(b: Branches, parallel: bool | None, needed: bool | None) -> None:
    """Parallelism on a model that fits: pipeline stages where tensor parallelism would serve the
    latency goal is the layout to fix (llm_diagnose.diagnose.tree.pipeline); otherwise the common rule."""
    pipeline, why, question = pipeline_for_latency(b.reading(), b.answers["Q5"], b.slo)
    if why:  # pipeline stages are on: the path says whether they are the layout to fix
        b.step("Q1.pipeline-where-tensor-fits", pipeline, why)
    if pipeline:
        conf = min(b.answers[question].confidence, b.th["confidence.config"])
        b.add("parallelism", "not-working", question, why, conf)
    else:
        b.by_state("parallelism", "Q1", parallel, needed)


def _scale_out_reason(b: Branches, a: Answer, kv_q: bool | None) -> str:
    reason = f"{a.rationale}: add replicas (size them with llm-diagnose plan) or cap admission (--max-num-seqs)"
    if not kv_q:
        reason += "; KV-cache quantization (--kv-cache-dtype fp8) holds about twice the tokens as a capacity lever"
    r = b.reading()
    bound, at = roofline_at(r, r.num(Q.RUNNING_MEAN))
    if bound == "compute":
        reason += f"; decode is already compute-bound at batch {at}, so only more replicas add throughput"
    return reason


def _scale_out_from_decode(b: Branches, q1: Answer) -> None:
    """Slow tokens at a compute-bound batch also call for fewer sequences per step or more devices."""
    q5 = b.answers["Q5"]
    regime, why = decode_regime(b.reading())
    # Where prefills stretch the decode steps (Q6), tune prefill scheduling before adding replicas.
    if q5.answer == "yes" and regime == "compute" and b.answers["Q6"].answer != "yes":
        b.add(
            "scale-out",
            "recommended",
            "Q5",
            f"{q5.rationale}; {why}: run fewer sequences per step "
            "(--max-num-seqs) or spread the load over more replicas or devices",
        )
    elif q1.answer == "unknown":
        b.add("scale-out", "unknown", "Q1", f"{q1.title} could not be answered: {q1.rationale}")
    else:
        b.add("scale-out", "not-indicated", "Q1", q1.rationale)


QUESTION = Question("Q1", TITLE, ask_q1, walk_q1)
