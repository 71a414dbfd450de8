"""Detectors for the known pitfalls: techniques that are on but do not work, and bad benchmarks.

Each detector is a pure function of evidence (and, for two of them, of the answers already
given) returning a `PitfallCheck` with `detected` True, False, or None when it could not be
checked; None always lists what is missing.
"""

from __future__ import annotations

from typing import Mapping

from diagnose.diagnosis import Answer, PitfallCheck
from diagnose.evidence import Evidence
from diagnose.reading import Reading
from diagnose.thresholds import Thresholds
from probes import quantities as Q

__all__ = ["WEIGHT_ONLY_METHODS", "QUANTIZED_KV_PREFIXES", "check_all"]

# Weight-only quantization methods (activations stay 16-bit, weights are dequantized per GEMM).
# FP8 in vLLM (`--quantization fp8`) quantizes activations too and is not in this set.
WEIGHT_ONLY_METHODS = frozenset({
    "awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "bitsandbytes", "gguf", "hqq", "aqlm",
    "exl2", "w4a16", "w8a16", "int4_awq", "int8_wo", "int4_wo", "quark_w4a16",
})
QUANTIZED_KV_PREFIXES = ("fp8", "int8", "int4", "nvfp4")  # KV-cache dtypes that are quantized

TITLES = {
    "dynamic-prefix": "Dynamic content at the front of the prompt defeats the prefix cache",
    "unstable-serialization": "Serialised payloads change key order, so equal prompts hash differently",
    "batch-not-growing": "Memory is left over but the batch does not grow",
    "spec-decode-low-acceptance": "Speculative decoding accepts too few drafts to pay for itself",
    "disaggregation-overhead": "Prefill/decode disaggregation spends more on KV transfer than it saves",
    "weight-only-quantization": "Weight-only quantization without a throughput gain",
    "warm-cache-benchmark": "The benchmark ran against a warm prefix cache",
}


def _check(r: Reading, pitfall: str, detected: bool | None, explanation: str, fix: str = "") -> PitfallCheck:
    return PitfallCheck(
        pitfall=pitfall, detected=detected, title=TITLES[pitfall], explanation=explanation,
        fix=fix if detected else "", comparisons=tuple(r.comparisons), evidence=tuple(r.used),
        missing=tuple(r.missing) if detected is None else (),
    )


def dynamic_prefix(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    value = r.num(Q.DYNAMIC_PREFIX_FRACTION)
    if value is not None:
        dyn = r.compare(Q.DYNAMIC_PREFIX_FRACTION, value, ">=", "q2.dynamic_prefix_fraction")
        m = ev.measurement(Q.DYNAMIC_PREFIX_FRACTION)
        where = f" ({m.note})" if m is not None and m.note else ""
        return _check(r, "dynamic-prefix", dyn,
                      f"{value:.0%} of prompt tokens repeat other prompts' content behind a varying lead{where}",
                      "move the varying part (timestamps, user or request ids) to the end of the prompt, "
                      "after the static system prompt and context")
    caching = r.flag(Q.PREFIX_CACHING)
    hit = r.num(Q.PREFIX_HIT_RATE)
    if caching and hit is not None:
        if r.compare(Q.PREFIX_HIT_RATE, hit, ">=", "q2.min_reuse_fraction"):
            return _check(r, "dynamic-prefix", False, f"the prefix cache hits ({hit:.0%} of queried tokens)")
        if r.compare(Q.PREFIX_HIT_RATE, hit, "<=", "q2.dead_hit_rate"):
            return _check(r, "dynamic-prefix", None,
                          f"the hit rate is near zero ({hit:.1%}); whether similar prompts diverge early needs "
                          "the prompts: run with --trace FILE")
    return _check(r, "dynamic-prefix", None, "needs the prompts (--trace) to compare their content")


def unstable_serialization(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    hit = r.check(Q.UNSTABLE_SERIALIZATION_FRACTION, ">=", "q2.unstable_serialization_fraction")
    if hit is None:
        return _check(r, "unstable-serialization", None, "needs chat/tool payloads (--trace) to compare key order")
    frac = r.num(Q.UNSTABLE_SERIALIZATION_FRACTION)
    return _check(r, "unstable-serialization", hit,
                  f"{frac:.0%} of requests re-send an equal JSON payload with its keys in another order",
                  "serialise messages and tool schemas with a fixed key order (json.dumps(..., sort_keys=True))")


def batch_not_growing(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    low = r.check(Q.KV_USAGE_P95, "<", "q4.low_kv_usage")
    queued = r.check(Q.WAITING_MEAN, ">=", "q4.min_waiting")
    if low is None or queued is None:
        return _check(r, "batch-not-growing", None, "needs KV usage and the waiting queue over a loaded window")
    detected = low and queued
    cap = r.num(Q.MAX_NUM_SEQS)
    peak = r.num(Q.RUNNING_MAX)
    capped = ""
    if peak is not None:
        capped = f" The running batch peaked at {peak:.0f}" + (f" with max_num_seqs={cap:.0f}." if cap is not None else ".")
    return _check(r, "batch-not-growing", detected,
                  "requests wait while the KV cache has room: a scheduler limit, not memory, caps the batch." + capped
                  if detected else "the batch grows with demand until memory runs out",
                  "raise --max-num-seqs and --max-num-batched-tokens (SGLang: --max-running-requests); check "
                  "that the client keeps enough requests in flight")


def spec_low_acceptance(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    enabled = r.flag(Q.SPEC_DECODE)
    rate = r.num(Q.SPEC_ACCEPTANCE_RATE)
    length = r.num(Q.SPEC_ACCEPTANCE_LENGTH)
    if enabled is False:
        return _check(r, "spec-decode-low-acceptance", False, "speculative decoding is not enabled")
    if rate is None and length is None:
        return _check(r, "spec-decode-low-acceptance", None,
                      "speculative decoding " + ("is on but" if enabled else "may be on, and")
                      + " its acceptance counters were not measured")
    low = False
    if rate is not None:
        low = r.compare(Q.SPEC_ACCEPTANCE_RATE, rate, "<", "q5.min_acceptance_rate") or low
    if length is not None:
        low = r.compare(Q.SPEC_ACCEPTANCE_LENGTH, length, "<", "q5.min_acceptance_length") or low
    shown = f"{rate:.0%} of drafted tokens accepted" if rate is not None else f"{length:.2f} tokens per step"
    return _check(r, "spec-decode-low-acceptance", low,
                  f"{shown}: " + ("each verify step costs more than the drafts save" if low else "drafts pay off"),
                  "use a draft model closer to the target (or EAGLE heads trained for it), lower "
                  "num_speculative_tokens, or turn speculative decoding off for this workload")


def disaggregation_overhead(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    enabled = r.flag(Q.PD_DISAGGREGATION)
    if enabled is False:
        return _check(r, "disaggregation-overhead", False, "prefill and decode are not disaggregated")
    heavy = r.check(Q.KV_TRANSFER_TTFT_SHARE, ">=", "pd.max_kv_transfer_share")
    if heavy is None:
        return _check(r, "disaggregation-overhead", None,
                      "needs the KV transfer time against time to first token (NIXL/connector metrics)")
    share = r.num(Q.KV_TRANSFER_TTFT_SHARE)
    return _check(r, "disaggregation-overhead", heavy,
                  f"{share:.0%} of time to first token is spent moving KV from prefill to decode",
                  "go back to one pool with chunked prefill, or give the transfer a faster path (NIXL over RDMA, "
                  "same-node instances)")


def weight_only_quantization(ev: Evidence, th: Thresholds, answers: Mapping[str, Answer]) -> PitfallCheck:
    r = Reading(ev, th)
    method = r.text(Q.WEIGHT_QUANTIZATION)
    if method is None:
        return _check(r, "weight-only-quantization", None, "the weight quantization method was not observed")
    if method.lower() not in WEIGHT_ONLY_METHODS:
        return _check(r, "weight-only-quantization", False,
                      "weights are not quantized" if method.lower() in ("none", "") else f"{method} is not weight-only")
    kv_dtype = (r.text(Q.KV_CACHE_DTYPE) or "auto").lower()
    kv_bound = answers["Q1"].verdict == "kv-bound"
    running = r.num(Q.RUNNING_MEAN)
    big_batch = running is not None and r.compare(Q.RUNNING_MEAN, running, ">=", "q1.large_batch")
    kv_unquantized = not kv_dtype.startswith(QUANTIZED_KV_PREFIXES)
    reasons = []
    if kv_bound and kv_unquantized:
        reasons.append(f"the KV cache ({kv_dtype}) is still full: weight-only {method} freed too little of it")
    if big_batch:
        reasons.append(f"at a batch of {running:.0f} decode is compute-bound and dequantization costs time")
    if not reasons and running is None and not kv_bound:
        return _check(r, "weight-only-quantization", None, "needs the running batch size to judge")
    return _check(r, "weight-only-quantization", bool(reasons),
                  "; ".join(reasons) if reasons else f"{method} fits this small-batch, memory-bound decode",
                  "quantize activations too (FP8 W8A8: --quantization fp8) and the KV cache (--kv-cache-dtype fp8)")


def warm_cache_benchmark(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    first = r.check(Q.PREFIX_WARM_AT_START, ">=", "q2.warm_cache_hit_rate")
    if first:
        return _check(r, "warm-cache-benchmark", True,
                      "the benchmark's first requests already hit the prefix cache: it was warm from earlier runs",
                      "reset the cache before each run (vLLM: POST /reset_prefix_cache in dev mode, or restart), "
                      "or salt the prompts per run")
    hit = r.num(Q.PREFIX_HIT_RATE)
    potential = r.num(Q.PREFIX_POTENTIAL)
    if hit is not None and potential is not None:
        excess = hit - potential
        warm = r.compare("prefix.hit_rate_minus_potential", excess, ">", "q2.hit_above_potential")
        return _check(r, "warm-cache-benchmark", warm,
                      f"the live hit rate ({hit:.0%}) exceeds what the workload itself shares ({potential:.0%})"
                      if warm else "the live hit rate is within what the workload shares",
                      "reset the prefix cache between runs, or salt the prompts per run")
    if first is False:
        return _check(r, "warm-cache-benchmark", False, "the first requests missed the cache, as a cold start should")
    return _check(r, "warm-cache-benchmark", None,
                  "needs the hit rate of the first requests, or the workload's own reuse beside the live hit rate")


def check_all(ev: Evidence, th: Thresholds, answers: Mapping[str, Answer]) -> tuple[PitfallCheck, ...]:
    return (
        dynamic_prefix(ev, th),
        unstable_serialization(ev, th),
        batch_not_growing(ev, th),
        spec_low_acceptance(ev, th),
        disaggregation_overhead(ev, th),
        weight_only_quantization(ev, th, answers),
        warm_cache_benchmark(ev, th),
    )
