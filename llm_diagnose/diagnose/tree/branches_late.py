"""The branches of Q5 (slow tokens), Q6 (prefill/decode contention), KV offload and offline batch.

Slow tokens have three causes and speculative decoding fixes one: decode memory-bound at a
small batch (it helps), compute-bound at a large batch (it hurts: fewer sequences per step or
more devices, see scale-out), and a slow tail from prefills stalling decode (that is Q6).
Q6 knows the scale: when stalls survive chunked prefill, tune the chunk first, and separate
prefill and decode only past q6.disagg_min_devices and q6.disagg_min_prompt_ratio.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Status
from llm_diagnose.diagnose.tree.questions import slo_stalls_note
from llm_diagnose.diagnose.tree.signals import devices
from llm_diagnose.diagnose.tree.speculative import decode_regime
from llm_diagnose.probes import quantities as Q

__all__ = ["q5", "q6", "kv", "ob"]


def _prefill_stalls(b: Branches) -> bool:
    """The slow part is the tail, while Q6 (measured, not passive) finds prefills stalling decode."""
    q6 = b.answers["Q6"]
    p50 = b.num(Q.ITL_P50)
    median_ok = p50 is not None and p50 <= b.th["q5.max_itl_p50_s"]
    return q6.answer == "yes" and q6.verdict not in ("passive",) and median_ok


def q5(b: Branches) -> None:
    a = b.answers["Q5"]
    spec, how = b.on(Q.SPEC_DECODE)
    b.step("Q5.spec-decode-on", spec)
    low = b.detected("spec-decode-low-acceptance")
    pit = b.pitfalls["spec-decode-low-acceptance"]
    regime, regime_why = decode_regime(b.reading())
    b.step("Q5.decode-memory-bound", None if regime is None else regime == "memory", regime_why)
    if spec:
        b.step("Q5.drafts-pay", None if low is None else not low, pit.explanation)
        side_by_side = b.num(Q.SPEC_ITL_SPEEDUP) is not None
        if low:
            b.add("speculative-decoding", "not-working", "Q5", pit.explanation)
        elif low is None:
            counted = b.num(Q.SPEC_ACCEPTANCE_LENGTH) is not None or b.num(Q.SPEC_ACCEPTANCE_RATE) is not None
            b.add(
                "speculative-decoding",
                "on-unverified",
                "Q5",
                f"on, but whether its drafts pay is not settled: {pit.explanation}"
                if counted
                else "on, but whether its drafts pay was not measured: scrape its acceptance counters over a loaded "
                "window (vLLM spec_decode_*, SGLang spec_accept_length) or measure ITL with it off",
            )
        elif regime == "compute" and not side_by_side:
            b.add(
                "speculative-decoding",
                "on-unverified",
                "Q5",
                f"drafts are accepted ({pit.explanation}), but {regime_why}, where drafts compete for compute: "
                "measure ITL with it off (spec.itl_speedup)",
            )
        else:
            b.add("speculative-decoding", "in-place", "Q5", f"on and working: {pit.explanation}")
        return
    need = needed(a, "yes")
    if need and _prefill_stalls(b):
        b.step("Q5.tail-from-prefills", True, b.answers["Q6"].rationale)
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{a.rationale}; the median is fine and the slow tail comes from prefills stalling decode (Q6): "
            "chunked prefill fixes that, speculative decoding does not",
        )
        return
    q1 = b.answers["Q1"]
    if need and q1.verdict == "overloaded":
        # Tokens are slow because the server is over capacity (KV full, queueing, preemptions);
        # drafts take KV slots and verify compute of their own, so they would add to the pressure
        # (vLLM's docs scope speculative decoding to medium-to-low QPS, memory-bound serving).
        b.step("Q5.slow-from-overload", True, q1.rationale)
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{a.rationale}; the server is overloaded ({q1.rationale}): drafts would take KV slots and compute "
            "from a full server; add capacity first (see scale-out)",
        )
        return
    if need and regime == "compute":
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{a.rationale}; {regime_why}: drafts would compete for compute and slow decode further: run fewer "
            "sequences per step or add devices (see scale-out)",
        )
        return
    caveat = "" if regime else " (the running batch was not measured: at a large batch it would hurt)"
    why = (
        f"{a.rationale}; {regime_why}: try speculative decoding{caveat}, and keep it only if each verify step "
        "yields more tokens than the drafts cost"
    )
    b.by_state("speculative-decoding", "Q5", spec, need, why=why, default_why=how)


def _disagg_scale(b: Branches) -> tuple[bool | None, str]:
    """Whether the deployment is large enough, with enough prefill, for separate pools."""
    r = b.reading()
    n_dev, _ = devices(r)
    count = r.num(Q.DEVICE_COUNT)
    n = max(v for v in (n_dev, count, 0.0) if v is not None)
    prompt_rate, gen_rate = r.num(Q.PROMPT_TOKENS_PER_S), r.num(Q.GEN_TOKENS_PER_S)
    ratio: float | None
    if prompt_rate is not None and gen_rate:
        ratio, what = prompt_rate / gen_rate, "prompt:output tokens per second"
    else:
        isl, osl = r.num(Q.INPUT_LEN_P50), r.num(Q.OUTPUT_LEN_P50)
        ratio, what = (isl / osl, "median prompt:output length") if isl is not None and osl else (None, "")
    min_dev, min_ratio = b.th["q6.disagg_min_devices"], b.th["q6.disagg_min_prompt_ratio"]
    seen = []
    if n:
        seen.append(f"{n:.0f} devices")
    if ratio is not None:
        seen.append(f"{what} {ratio:.1f}:1")
    below = (
        f"below {min_dev:.0f} devices and a {min_ratio:.0f}:1 prompt:output load, separate prefill and decode "
        f"pools cost more in KV transfer and routing than they save"
    )
    if (n and n < min_dev) or (ratio is not None and ratio < min_ratio):
        return False, f"{below} (seen: {', '.join(seen)})"
    if not n or ratio is None:
        return None, f"{below}; the deployment's size or prefill load was not measured" + (
            f" (seen: {', '.join(seen)})" if seen else ""
        )
    return True, f"{', '.join(seen)}: large enough, and prefill-heavy enough, for separate pools"


def q6(b: Branches) -> None:
    a = b.answers["Q6"]
    chunked, how = b.on(Q.CHUNKED_PREFILL)
    pd, _ = b.on(Q.PD_DISAGGREGATION)
    b.step("Q6.chunked-prefill-on", chunked, "" if how == "seen" else how)
    breaks, note = slo_stalls_note(b.ev, b.slo)
    if note and a.answer == "yes":
        b.step("Q6.stalls-break-slo", breaks, note)
    need = needed(a, "yes")
    inflation = b.ev.measurement(Q.ITL_INFLATION)
    slowdown = inflation.value if need and chunked and inflation is not None else None  # a float where survives
    survives = slowdown is not None and slowdown >= b.th["q6.disagg_inflation"]
    b.step("Q6.contention-survives-chunking", survives if (need and chunked) else None)
    chunk = b.num(Q.MAX_NUM_BATCHED_TOKENS)
    tuned = chunk is not None and chunk <= b.th["q6.min_chunk_tokens"]
    if survives and not tuned:
        size = f" (now {chunk:.0f} tokens)" if chunk is not None else ""
        b.add(
            "chunked-prefill",
            "not-working",
            "Q6",
            f"chunked prefill is on, yet streams still slow {slowdown:.1f}x during prefills: tune the chunk "
            f"first{size}: a smaller --max-num-batched-tokens and --long-prefill-token-threshold (vLLM), "
            "--chunked-prefill-size (SGLang)",
        )
    elif survives:
        b.add("chunked-prefill", "in-place", "Q6", f"on with a small chunk ({chunk:.0f} tokens): tuning it is done")
    elif need and chunked and a.verdict == "passive":
        b.add(
            "chunked-prefill",
            "on-unverified",
            "Q6",
            f"on, but {a.rationale}: whether prefills still stall decode despite the chunking needs the "
            "interference experiment (--active); then tune the chunk",
        )
    else:
        b.by_state(
            "chunked-prefill",
            "Q6",
            chunked,
            need,
            default_why=how,
            unverified_why="whether prefills stall decode was not measured (--active)",
        )
    if pd:
        overhead = b.detected("disaggregation-overhead")
        pit = b.pitfalls["disaggregation-overhead"]
        status: dict[bool | None, Status] = {True: "not-working", False: "in-place", None: "on-unverified"}
        reason = {
            True: pit.explanation,
            False: f"on; {pit.explanation}",
            None: "on, but the KV transfer time was not measured: read the connector's metrics (NIXL: "
            "nixl_xfer_time_seconds) against time to first token",
        }[overhead]
        b.add("pd-disaggregation", status[overhead], "Q6", reason)
        return
    if survives:
        scale, why = _disagg_scale(b)
        b.step("Q6.scale-for-disaggregation", scale, why)
        if scale:
            b.add(
                "pd-disaggregation",
                "recommended",
                "Q6",
                f"chunked prefill is on and streams still slow {slowdown:.1f}x during prefills; {why}: "
                "separate prefill and decode instances",
            )
        else:
            b.add("pd-disaggregation", "not-indicated", "Q6", why + ": tune the chunk")
    elif need is None:
        b.add("pd-disaggregation", "unknown", "Q6", a.rationale)
    else:
        b.add(
            "pd-disaggregation",
            "not-indicated",
            "Q6",
            ("enable chunked prefill first" if not chunked else "chunked prefill bounds the stalls")
            if need
            else a.rationale,
        )


def kv(b: Branches) -> None:
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


def ob(b: Branches) -> None:
    a = b.answers["OB"]
    b.by_state(
        "offline-batch",
        "OB",
        None if a.answer == "yes" else False,
        needed(a, "yes"),
        why="nobody waits: run it as an offline batch job at maximum throughput",
    )
