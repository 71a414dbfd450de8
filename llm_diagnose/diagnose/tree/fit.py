"""Q1: does the model fit the hardware with room to spare, or is the server just overloaded?

Fit is judged per device (memory.weights_fraction is all weights over one device's memory;
TP x PP divide it) and by the KV capacity the engine reserved, counted in this workload's
typical requests. Overload (KV full, queueing, preemptions) while the model fits is a
capacity finding (verdict `overloaded`: replicas or admission limits), not a reason to
quantize. A near-idle server fits `untested`: demand was never tried.

Verdicts, in the order they are decided: does-not-fit, tight, kv-too-small (answer "no"),
overloaded, untested, fits (answer "yes"); "unknown" without evidence.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import devices, load_level
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["ask_q1", "kv_requests", "batch_at_cap", "CAP_SETTING"]

ENGINE_FIGURE = "the engine's maximum-concurrency figure (at its max_model_len)"

TITLE = "Does the model fit the hardware with room to spare?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q1", TITLE, answer, confidence, rationale, verdict)


def kv_requests(r: Reading) -> tuple[float | None, str]:
    """How many of this workload's typical requests the KV cache holds at once, and how that
    was worked out: capacity / (median prompt + median output), else the engine's own figure
    (vLLM's is at max_model_len: a lower bound, so `ask_q1` acts on it only when the cache fills)."""
    capacity = r.num(Q.KV_CAPACITY_TOKENS)
    prompt, output = r.num(Q.INPUT_LEN_P50), r.num(Q.OUTPUT_LEN_P50)
    engine = r.num(Q.KV_MAX_CONCURRENCY)
    if capacity is None and engine is not None and prompt is not None and output is not None:
        max_len = r.num(Q.MAX_MODEL_LEN)  # the engine's figure counts requests of max_model_len tokens
        capacity = None if max_len is None else engine * max_len
    if capacity is not None and prompt is not None and output is not None and prompt + output > 0:
        return capacity / (prompt + output), (
            f"{capacity:.0f} KV tokens / ({prompt:.0f} + {output:.0f}) tokens per typical request"
        )
    if engine is not None:
        return engine, ENGINE_FIGURE
    return None, ""


# The engine's own name for its cap on concurrent sequences (config.max_num_seqs), per engine.
CAP_SETTING = {
    "vllm": "--max-num-seqs",
    "sglang": "--max-running-requests",
    "trtllm": "max_batch_size",
}


def batch_at_cap(r: Reading) -> str | None:
    """Where the running batch sat at the engine's configured cap on concurrent sequences while
    requests waited (the caller checks the queue): the cap binds, whatever KV usage was or was not
    read. Names the setting and what would confirm the memory for more; None otherwise."""
    cap, running = r.num(Q.MAX_NUM_SEQS), r.num(Q.RUNNING_MEAN)
    if cap is None or running is None or cap <= 0:
        return None
    if not r.compare("batch.running_mean/config.max_num_seqs", running / cap, ">=", "q1.batch_at_cap"):
        return None
    engine = r.evidence.fact(Q.ENGINE_NAME)
    setting = CAP_SETTING.get(engine if isinstance(engine, str) else "", "the engine's cap on concurrent sequences")
    kv = r.num(Q.KV_USAGE_P95)
    memory = (
        f"KV usage p95 {kv:.0%} says whether memory holds more"
        if kv is not None
        else "KV usage was not read: its p95 at the cap (below ~90%) would confirm the memory for more"
    )
    return (
        f"the running batch sat at the engine's cap ({running:.1f} of {setting} {cap:.0f}) while requests waited: "
        f"the cap binds; raise {setting} where memory allows ({memory}), or add replicas"
    )


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
