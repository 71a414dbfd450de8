"""The branches of Q6 (prefill/decode contention), KV offload and offline batch (Q5's is in
llm_diagnose.diagnose.tree.q5_decode_latency).

Q6 knows the scale: when stalls survive chunked prefill, tune the chunk first, and separate
prefill and decode only past q6.disagg_min_devices and q6.disagg_min_prompt_ratio.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.diagnosis import Status
from llm_diagnose.diagnose.tree.disagg import disagg_scale
from llm_diagnose.diagnose.tree.questions import slo_stalls_note
from llm_diagnose.probes import quantities as Q

__all__ = ["q6", "kv", "ob"]


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
        # Judged from the deployment's shape (no transfer time): a configuration verdict, whatever Q6 says.
        shape = overhead is True and b.num(Q.KV_TRANSFER_TTFT_SHARE) is None
        b.add("pd-disaggregation", status[overhead], "Q6", reason, b.th["confidence.config"] if shape else None)
        return
    if survives:
        scale, why = disagg_scale(b.reading())
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
