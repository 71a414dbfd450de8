"""Detectors for the known pitfalls: techniques that are on but do not work, and bad benchmarks.

Each detector is a pure function of evidence (and, for two of them, of the answers already
given) returning a `PitfallCheck` with `detected` True, False, or None when it could not be
checked; None always lists what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping

from llm_diagnose.diagnose.tree.diagnosis import Answer, Missing, PitfallCheck
from llm_diagnose.diagnose.tree.disagg import disagg_scale
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.prefix_figures import engine_figure
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.schemes import kv_quantized, spec_method_class, weight_scheme
from llm_diagnose.diagnose.tree.speculative import acceptance, decode_regime
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["check_all"]

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
        pitfall=pitfall,
        detected=detected,
        title=TITLES[pitfall],
        explanation=explanation,
        fix=fix if detected else "",
        comparisons=tuple(r.comparisons),
        evidence=tuple(r.used),
        missing=tuple(r.missing) if detected is None else (),
    )


def dynamic_prefix(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    value = r.num(Q.DYNAMIC_PREFIX_FRACTION)
    if value is not None:
        dyn = r.compare(Q.DYNAMIC_PREFIX_FRACTION, value, ">=", "q2.dynamic_prefix_fraction")
        m = ev.measurement(Q.DYNAMIC_PREFIX_FRACTION)
        where = f" ({m.note})" if m is not None and m.note else ""
        # Judged by the share of the cache's misses it causes too: when the rest is reused, a
        # small varying head can be most of what is still re-prefilled.
        potential = r.num(Q.PREFIX_POTENTIAL)
        misses = ""
        if not dyn and potential is not None and potential < 1.0:
            share = value / (1.0 - potential)
            dyn = r.compare("prompts.dynamic_share_of_misses", share, ">=", "q2.dynamic_miss_share") and r.compare(
                Q.DYNAMIC_PREFIX_FRACTION, value, ">=", "q2.dynamic_min_fraction"
            )
            misses = f", {min(share, 1.0):.0%} of the tokens the cache misses ({1.0 - potential:.0%} of all)"
        return _check(
            r,
            "dynamic-prefix",
            dyn,
            f"{value:.0%} of prompt tokens{misses} repeat other prompts' content behind a varying lead{where}",
            "move the varying part (timestamps, user or request ids) to the end of the prompt, "
            "after the static system prompt and context",
        )
    caching = r.flag(Q.PREFIX_CACHING)
    hit = r.num(Q.PREFIX_HIT_RATE)
    if caching and hit is not None:
        if r.compare(Q.PREFIX_HIT_RATE, hit, ">=", "q2.min_reuse_fraction"):
            return _check(r, "dynamic-prefix", False, f"the prefix cache hits ({hit:.0%} of queried tokens)")
        if r.compare(Q.PREFIX_HIT_RATE, hit, "<=", "q2.dead_hit_rate"):
            return _check(
                r,
                "dynamic-prefix",
                None,
                f"the hit rate is near zero ({hit:.1%}); whether similar prompts diverge early needs "
                "the prompts: run with --trace FILE",
            )
    return _check(r, "dynamic-prefix", None, "needs the prompts (--trace) to compare their content")


def unstable_serialization(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    hit = r.check(Q.UNSTABLE_SERIALIZATION_FRACTION, ">=", "q2.unstable_serialization_fraction")
    if hit is None:
        return _check(r, "unstable-serialization", None, "needs chat/tool payloads (--trace) to compare key order")
    frac = r.num(Q.UNSTABLE_SERIALIZATION_FRACTION)
    return _check(
        r,
        "unstable-serialization",
        hit,
        f"{frac:.0%} of requests re-send an equal JSON payload with its keys in another order",
        "serialise messages and tool schemas with a fixed key order (json.dumps(..., sort_keys=True))",
    )


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
        capped = f" The running batch peaked at {peak:.0f}" + (
            f" with max_num_seqs={cap:.0f}." if cap is not None else "."
        )
    kv_p95, waiting = r.num(Q.KV_USAGE_P95), r.num(Q.WAITING_MEAN)
    if detected:
        why = "requests wait while the KV cache has room: a scheduler limit, not memory, caps the batch." + capped
    elif not queued:
        why = f"requests hardly waited ({waiting:.1f} on average): nothing held the batch back"
    else:
        why = (
            f"requests waited ({waiting:.1f} on average) with the KV cache at p95 {kv_p95:.0%}: load, not a "
            "scheduler limit, fills it (see Q1)"
        )
    return _check(
        r,
        "batch-not-growing",
        detected,
        why,
        "raise --max-num-seqs and --max-num-batched-tokens (SGLang: --max-running-requests); check "
        "that the client keeps enough requests in flight",
    )


def spec_low_acceptance(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    enabled = r.flag(Q.SPEC_DECODE)
    if enabled is False:
        return _check(r, "spec-decode-low-acceptance", False, "speculative decoding is not enabled")
    low, why, _ = acceptance(r)
    if low is None:
        return _check(
            r,
            "spec-decode-low-acceptance",
            None,
            "speculative decoding " + ("is on but" if enabled else "may be on, and") + f" {why}",
        )
    return _check(r, "spec-decode-low-acceptance", low, why, _spec_fix(r) if low else "")


def _spec_fix(r: Reading) -> str:
    """The fix by where decode sits: compute-bound, no draft pays, so fewer sequences per step or
    more devices; memory-bound, a better draft (never the method the server already runs)."""
    regime, _ = decode_regime(r, "q5.compute_bound_batch")
    if regime == "compute":
        return (
            "decode is compute-bound at this batch, where every drafted token costs compute: run fewer "
            "sequences per step (--max-num-seqs) or spread the load over more devices or replicas, or turn "
            "speculative decoding off at this load"
        )
    trained = spec_method_class(r.text(Q.SPEC_METHOD)) == "head"
    better = "" if trained else "use a draft closer to the target (EAGLE-3 or MTP heads), "
    return (
        f"{better}lower num_speculative_tokens, train the draft on this workload's data, or turn speculative "
        "decoding off for this workload"
    )


_DISAGG_FIX = (
    "go back to one pool with chunked prefill, or give the transfer a faster path (NIXL over RDMA, same-node instances)"
)


def disaggregation_overhead(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    enabled = r.flag(Q.PD_DISAGGREGATION)
    if enabled is False:
        return _check(r, "disaggregation-overhead", False, "prefill and decode are not disaggregated")
    heavy = r.check(Q.KV_TRANSFER_TTFT_SHARE, ">=", "pd.max_kv_transfer_share")
    if heavy is None:
        # Unmeasured transfer: the deployment's shape still says whether separate pools can pay.
        scale, why = disagg_scale(r) if enabled else (None, "")
        if scale is False:
            return _check(
                r,
                "disaggregation-overhead",
                True,
                f"disaggregation is on with {why} (judged from the deployment's shape; the connector's transfer "
                "time against time to first token, NIXL nixl_xfer_time_seconds, would measure it)",
                _DISAGG_FIX,
            )
        return _check(
            r,
            "disaggregation-overhead",
            None,
            "needs the KV transfer time against time to first token (NIXL/connector metrics)",
        )
    share = r.num(Q.KV_TRANSFER_TTFT_SHARE)
    return _check(
        r,
        "disaggregation-overhead",
        heavy,
        f"{share:.0%} of time to first token is spent moving KV from prefill to decode",
        _DISAGG_FIX,
    )


def weight_only_quantization(ev: Evidence, th: Thresholds, answers: Mapping[str, Answer]) -> PitfallCheck:
    r = Reading(ev, th)
    method = r.text(Q.WEIGHT_QUANTIZATION)
    if method is None:
        return _check(r, "weight-only-quantization", None, "the weight quantization method was not observed")
    scheme = weight_scheme(method)
    if scheme is None:
        r.missing.append(
            Missing(
                Q.WEIGHT_QUANTIZATION,
                f"{method!r} names a format, not its scheme",
                "the checkpoint's quantization_config (config.json), or vLLM dev-mode /server_info",
            )
        )
        return _check(
            r,
            "weight-only-quantization",
            None,
            f"the scheme behind {method!r} was not observed (weight-only W4A16, or W8A8 with activations?)",
        )
    if scheme != "weight-only":
        return _check(
            r,
            "weight-only-quantization",
            False,
            "weights are not quantized" if scheme == "none" else f"{method} quantizes activations too",
        )
    kv_dtype = r.text(Q.KV_CACHE_DTYPE) or "auto"
    q1 = answers["Q1"].verdict
    kv_p95 = r.num(Q.KV_USAGE_P95)
    # A cache filled by load (Q1 overloaded) is a capacity finding: weight-only quantization is not
    # what failed there, and blaming it would contradict quantization: in-place.
    kv_full = q1 == "kv-too-small" or (
        q1 != "overloaded" and kv_p95 is not None and r.compare(Q.KV_USAGE_P95, kv_p95, ">=", "q1.kv_saturation")
    )
    regime, regime_why = decode_regime(r, "q1.large_batch")
    reasons = []
    if kv_full and not kv_quantized(kv_dtype):
        reasons.append(f"the KV cache ({kv_dtype}) is still full: weight-only {method} freed too little of it")
    if regime == "compute":
        reasons.append(f"{regime_why}, and dequantizing weights on every GEMM costs time there")
    if not reasons and regime is None and not kv_full:
        return _check(r, "weight-only-quantization", None, "needs the running batch size to judge")
    return _check(
        r,
        "weight-only-quantization",
        bool(reasons),
        "; ".join(reasons) if reasons else f"{method} fits this small-batch, memory-bound decode",
        "quantize activations too (FP8 W8A8: --quantization fp8) and the KV cache (--kv-cache-dtype fp8)",
    )


def warm_cache_benchmark(ev: Evidence, th: Thresholds) -> PitfallCheck:
    r = Reading(ev, th)
    first = r.check(Q.PREFIX_WARM_AT_START, ">=", "q2.warm_cache_hit_rate")
    if first:
        return _check(
            r,
            "warm-cache-benchmark",
            True,
            "the benchmark's first requests already hit the prefix cache: it was warm from earlier runs",
            "reset the cache before each run (vLLM: POST /reset_prefix_cache in dev mode, or restart), "
            "or salt the prompts per run",
        )
    if first is False:
        # A cold start: a live rate above the workload's reuse is then a counting error (sanity), not warmth.
        return _check(r, "warm-cache-benchmark", False, "the first requests missed the cache, as a cold start should")
    figure = engine_figure(ev)
    if figure is not None:
        return _check(
            r,
            "warm-cache-benchmark",
            None,
            f"the live hit rate is {figure}, over whatever traffic the engine last counted: beside this "
            "workload's reuse it says nothing of warmth; the hit rate of the first requests (--active) would",
        )
    hit = r.num(Q.PREFIX_HIT_RATE)
    potential = r.num(Q.PREFIX_POTENTIAL)
    if hit is not None and potential is not None:
        excess = hit - potential
        warm = r.compare("prefix.hit_rate_minus_potential", excess, ">", "q2.hit_above_potential")
        return _check(
            r,
            "warm-cache-benchmark",
            warm,
            f"the live hit rate ({hit:.0%}) exceeds what the workload itself shares ({potential:.0%})"
            if warm
            else "the live hit rate is within what the workload shares",
            "reset the prefix cache between runs, or salt the prompts per run",
        )
    return _check(
        r,
        "warm-cache-benchmark",
        None,
        "needs the hit rate of the first requests, or the workload's own reuse beside the live hit rate",
    )


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
