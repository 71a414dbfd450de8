"""Recommendations and pitfalls from hand-built evidence, including engines that already run
the technique (in place) and techniques that are on but do not work (pitfalls)."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import PITFALLS, TECHNIQUES
from llm_diagnose.diagnose.tree.pitfalls import check_all
from llm_diagnose.diagnose.tree.questions.catalogue import ask_all
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from tests.evidence_builders import build

TH = Thresholds()

KV_BOUND = {"kv.usage_p95": 0.98, "kv.preemptions": 4}  # overloaded: the model fits, load fills the cache
KV_SMALL = {"memory.weights_fraction": 0.6, "kv.max_concurrency": 2.0, "kv.usage_p95": 0.98}  # too small a cache

# (evidence, technique, expected status)
REC_CASES = [
    # Q1
    ({"memory.weights_fraction": 1.5}, "parallelism", "recommended"),
    (KV_BOUND, "scale-out", "recommended"),
    (KV_BOUND, "quantization", "not-indicated"),  # never "quantize because it does not fit" when it fits
    ({**KV_BOUND, "config.weight_quantization": "fp8"}, "quantization", "in-place"),
    ({"memory.weights_fraction": 0.3, "kv.usage_p95": 0.4, "load.concurrency_mean": 6}, "scale-out", "not-indicated"),
    ({}, "scale-out", "unknown"),
    (KV_SMALL, "quantization", "recommended"),
    (KV_SMALL, "scale-out", "not-indicated"),
    ({**KV_SMALL, "config.weight_quantization": "fp8", "config.kv_cache_dtype": "fp8"}, "quantization", "in-place"),
    ({**KV_SMALL, "config.weight_quantization": "fp8", "config.kv_cache_dtype": "fp8"}, "parallelism", "recommended"),
    ({**KV_SMALL, "config.weight_quantization": "awq", "config.kv_cache_dtype": "auto"}, "quantization", "not-working"),
    ({**KV_SMALL, "config.weight_quantization": "awq", "config.kv_cache_dtype": "nvfp4"}, "quantization", "in-place"),
    ({"kv.usage_p95": 0.3, "kv.preemptions": 0, "config.weight_quantization": "none"}, "quantization", "not-indicated"),
    ({"kv.usage_p95": 0.3, "kv.preemptions": 0, "config.weight_quantization": "gptq"}, "quantization", "in-place"),
    ({}, "quantization", "unknown"),
    # Q2
    ({"prefix.potential_fraction": 0.6, "config.prefix_caching": False}, "prefix-caching", "recommended"),
    ({"prefix.potential_fraction": 0.6}, "prefix-caching", "recommended"),  # config not visible
    (
        {"prefix.potential_fraction": 0.6, "config.prefix_caching": True, "prefix.hit_rate": 0.3},
        "prefix-caching",
        "in-place",
    ),  # 0.3 >= 0.5 * 0.6
    (
        {"prefix.potential_fraction": 0.6, "config.prefix_caching": True, "prefix.hit_rate": 0.29},
        "prefix-caching",
        "not-working",
    ),
    (
        {"config.prefix_caching": True, "prefix.hit_rate": 0.7, "prefix.queried_tokens": 1000},
        "prefix-caching",
        "in-place",
    ),
    ({"prefix.potential_fraction": 0.02, "config.prefix_caching": True}, "prefix-caching", "in-place"),
    ({"prefix.potential_fraction": 0.02, "config.prefix_caching": False}, "prefix-caching", "not-indicated"),
    (
        {"prefix.potential_fraction": 0.02, "prompts.dynamic_prefix_fraction": 0.7, "config.prefix_caching": False},
        "prefix-caching",
        "recommended",
    ),
    (
        {"prefix.potential_fraction": 0.02, "prompts.dynamic_prefix_fraction": 0.7, "config.prefix_caching": True},
        "prefix-caching",
        "not-working",
    ),
    # Q3
    (
        {"outputs.length_cv": 1.5, "load.concurrency_mean": 6, "config.continuous_batching": True},
        "continuous-batching",
        "in-place",
    ),
    (
        {"outputs.length_cv": 1.5, "load.concurrency_mean": 6, "config.continuous_batching": False},
        "continuous-batching",
        "recommended",
    ),
    (
        {"batching.short_request_slowdown": 4.0, "config.continuous_batching": True},
        "continuous-batching",
        "not-working",
    ),
    (
        {"outputs.length_cv": 0.1, "load.concurrency_mean": 6, "config.continuous_batching": False},
        "continuous-batching",
        "not-indicated",
    ),
    # Q4
    ({"kv.waste_fraction": 0.6, "config.paged_kv": False}, "paged-attention", "recommended"),
    ({"config.paged_kv": True}, "paged-attention", "in-place"),
    ({"kv.waste_fraction": 0.6, "config.paged_kv": True}, "paged-attention", "not-working"),
    # Q5
    # Slow tokens: speculative decoding where the served gap is close to the hardware's step; without the
    # step it cannot tell the step from overhead above it (issue 25): unknown, with what would settle it.
    (
        {
            "decode.itl_p50_s": 0.09,
            "batch.running_mean": 1.0,
            "decode.roofline_floor_b1_s": 0.07,
            "config.spec_decode": False,
        },
        "speculative-decoding",
        "recommended",
    ),
    ({"decode.itl_p50_s": 0.09, "config.spec_decode": False}, "speculative-decoding", "unknown"),
    (
        {
            "decode.itl_p50_s": 0.09,
            "batch.running_mean": 1.0,
            "decode.roofline_floor_b1_s": 0.01,
            "config.spec_decode": False,
        },
        "speculative-decoding",
        "not-indicated",
    ),
    (
        {"decode.itl_p50_s": 0.09, "config.spec_decode": True, "spec.acceptance_rate": 0.8},
        "speculative-decoding",
        "in-place",
    ),
    (
        {"decode.itl_p50_s": 0.09, "config.spec_decode": True, "spec.acceptance_rate": 0.2},
        "speculative-decoding",
        "not-working",
    ),
    (
        {"decode.itl_p50_s": 0.01, "config.spec_decode": True, "spec.acceptance_rate": 0.2},
        "speculative-decoding",
        "not-working",
    ),
    ({"decode.itl_p50_s": 0.01, "config.spec_decode": False}, "speculative-decoding", "not-indicated"),
    # Q6
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": False}, "chunked-prefill", "recommended"),
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": False}, "pd-disaggregation", "not-indicated"),
    # contention that survives chunking: tune the chunk first; disaggregate only at scale
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": True}, "chunked-prefill", "not-working"),
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": True}, "pd-disaggregation", "not-indicated"),
    (
        {"interference.itl_inflation": 2.5, "config.chunked_prefill": True, "config.max_num_batched_tokens": 512},
        "chunked-prefill",
        "in-place",
    ),
    (
        {
            "interference.itl_inflation": 2.5,
            "config.chunked_prefill": True,
            "memory.device_count": 16,
            "inputs.length_p50": 8000,
            "outputs.length_p50": 200,
        },
        "pd-disaggregation",
        "recommended",
    ),
    (
        {
            "interference.itl_inflation": 2.5,
            "config.chunked_prefill": True,
            "memory.device_count": 2,
            "inputs.length_p50": 8000,
            "outputs.length_p50": 200,
        },
        "pd-disaggregation",
        "not-indicated",
    ),
    (
        {
            "interference.itl_inflation": 2.5,
            "config.chunked_prefill": True,
            "memory.device_count": 16,
            "inputs.length_p50": 800,
            "outputs.length_p50": 200,
        },
        "pd-disaggregation",
        "not-indicated",
    ),
    # a passive correlation at low load drives nothing
    (
        {"interference.prompt_itl_correlation": 0.9, "load.concurrency_mean": 0.3, "config.chunked_prefill": False},
        "chunked-prefill",
        "unknown",
    ),
    ({"interference.itl_inflation": 1.7, "config.chunked_prefill": True}, "pd-disaggregation", "not-indicated"),
    (
        {"interference.itl_inflation": 1.7, "config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.4},
        "pd-disaggregation",
        "not-working",
    ),
    (
        {"interference.itl_inflation": 1.1, "config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.1},
        "pd-disaggregation",
        "in-place",
    ),
    # KV offload
    (
        {"prefix.potential_fraction": 0.8, "prefix.lru_fraction_at_capacity": 0.3, "config.kv_offload": False},
        "kv-offload",
        "recommended",
    ),
    (
        {"prefix.potential_fraction": 0.8, "prefix.lru_fraction_at_capacity": 0.78, "config.kv_offload": True},
        "kv-offload",
        "in-place",
    ),
    (
        {
            "prefix.potential_fraction": 0.6,
            "prefix.lru_fraction_at_capacity": 0.3,
            "config.kv_offload": True,
            "prefix.hit_rate": 0.55,
        },
        "kv-offload",
        "in-place",
    ),  # live hits near the potential: it works
    (
        {
            "prefix.potential_fraction": 0.6,
            "prefix.lru_fraction_at_capacity": 0.3,
            "config.kv_offload": True,
            "prefix.hit_rate": 0.2,
        },
        "kv-offload",
        "on-unverified",
    ),  # the local counter misses the offload tier
    (
        {"prefix.potential_fraction": 0.6, "prefix.lru_fraction_at_capacity": 0.3, "config.kv_offload": True},
        "kv-offload",
        "on-unverified",
    ),
    # unknown stays unknown: on, but what would verify it was not measured
    ({"config.spec_decode": True}, "speculative-decoding", "on-unverified"),
    ({"config.pd_disaggregation": True}, "pd-disaggregation", "on-unverified"),
    (
        {"config.prefix_caching": True, "prefix.hit_rate": 0.0, "prefix.queried_tokens": 1000},
        "prefix-caching",
        "on-unverified",
    ),
    ({"engine.name": "vllm", "engine.version": "0.11.0"}, "chunked-prefill", "on-unverified"),  # V1 default
    (
        {"engine.name": "vllm", "engine.version": "0.11.0", "interference.itl_inflation": 1.1},
        "chunked-prefill",
        "in-place",
    ),
    ({"engine.name": "vllm", "engine.version": "0.6.3"}, "chunked-prefill", "unknown"),  # V0: no default
    # slow tokens: three causes, speculative decoding fixes one
    (
        {
            "decode.itl_p50_s": 0.09,
            "batch.running_mean": 4,
            "decode.roofline_floor_b4_s": 0.07,  # close to the step (issue 25)
            "config.spec_decode": False,
        },
        "speculative-decoding",
        "recommended",
    ),
    (
        {"decode.itl_p50_s": 0.09, "batch.running_mean": 256, "config.spec_decode": False},
        "speculative-decoding",
        "not-indicated",
    ),
    ({"decode.itl_p50_s": 0.09, "batch.running_mean": 256, "config.spec_decode": False}, "scale-out", "recommended"),
    (
        {
            "decode.itl_p50_s": 0.09,
            "batch.running_mean": 16,
            "decode.bound_b16": "compute",
            "config.spec_decode": False,
        },
        "speculative-decoding",
        "not-indicated",
    ),  # the measured roofline outranks the batch size
    (
        {
            "decode.itl_p50_s": 0.09,
            "batch.running_mean": 200,
            "decode.bound_b256": "memory",
            "decode.roofline_floor_b256_s": 0.07,
            "config.spec_decode": False,
        },
        "speculative-decoding",
        "recommended",
    ),
    (
        {
            "decode.itl_p50_s": 0.02,
            "decode.itl_p99_s": 0.5,
            "interference.itl_inflation": 3.0,
            "config.spec_decode": False,
        },
        "speculative-decoding",
        "not-indicated",
    ),  # the tail is prefill stalls: Q6
    (
        {
            "decode.itl_p50_s": 0.09,
            "config.spec_decode": True,
            "spec.acceptance_rate": 0.8,
            "batch.running_mean": 300,
            "config.num_speculative_tokens": 3,
            "decode.bound_b256": "compute",
        },
        "speculative-decoding",
        "not-working",
    ),  # compute-bound: verifying k+1 tokens per sequence costs k+1 steps
    (
        {
            "decode.itl_p50_s": 0.09,
            "config.spec_decode": True,
            "spec.acceptance_rate": 0.8,
            "batch.running_mean": 300,
            "config.num_speculative_tokens": 3,
        },
        "speculative-decoding",
        "on-unverified",
    ),  # compute-bound only by batch size: ITL with it off must settle it
    (
        {"decode.itl_p50_s": 0.09, "config.spec_decode": True, "spec.itl_speedup": 1.4, "spec.acceptance_rate": 0.2},
        "speculative-decoding",
        "in-place",
    ),  # measured on against off overrules the counters
    # offline batch
    ({"workload.interactive": False}, "offline-batch", "recommended"),
    ({"workload.interactive": True}, "offline-batch", "not-indicated"),
]


@pytest.mark.parametrize("items, technique, status", REC_CASES)
def test_recommendation_status(items, technique, status):
    d = diagnose(build(items), TH)
    rec = d.recommendation(technique)
    assert rec is not None
    assert rec.status == status, rec.reason
    assert rec.settings_for("vllm"), "every technique carries vLLM settings"


def test_every_technique_gets_exactly_one_status():
    d = diagnose(build(KV_BOUND), TH)
    assert sorted(r.technique for r in d.recommendations) == sorted(TECHNIQUES)


def test_recommendations_follow_the_tree_order():
    items = {
        "workload.interactive": False,  # OB
        "interference.itl_inflation": 3.0,
        "config.chunked_prefill": False,  # Q6
        "prefix.potential_fraction": 0.7,
        "config.prefix_caching": False,  # Q2
        **KV_BOUND,  # Q1
    }
    d = diagnose(build(items), TH)
    assert [r.technique for r in d.recommended] == ["scale-out", "prefix-caching", "chunked-prefill", "offline-batch"]
    assert (d.headline_kind, d.headline_subject) == ("capacity", "scale-out")
    assert d.bottleneck.startswith("Q1:") and "scale out" in d.bottleneck


def test_nothing_to_fix_says_so():
    d = diagnose(build({"kv.usage_p95": 0.2, "kv.preemptions": 0, "decode.itl_p50_s": 0.01}), TH)
    assert d.recommended == ()
    assert d.bottleneck.startswith("no bottleneck found")
    assert (d.headline_kind, d.headline_subject) == ("none-found", "")


def test_nothing_measured_is_said_as_such():
    for items in ({}, {"config.paged_kv": True, "workload.interactive": True}):
        d = diagnose(build(items), TH)
        assert (d.headline_kind, d.headline_subject) == ("nothing-measured", "")
        assert d.bottleneck.startswith("nothing was measured") and "no bottleneck" not in d.bottleneck


# (evidence, headline kind, subject): a pitfall > a technique not working > capacity > a recommendation
HEADLINE_CASES = [
    ({**KV_BOUND, "config.spec_decode": True, "spec.acceptance_rate": 0.1}, "pitfall", "spec-decode-low-acceptance"),
    ({**KV_BOUND, "prefix.potential_fraction": 0.7, "config.prefix_caching": False}, "capacity", "scale-out"),
    (
        {
            "kv.usage_p95": 0.3,
            "queue.waiting_mean": 4,
            "decode.itl_p50_s": 0.09,
            "batch.running_mean": 4,
            "config.spec_decode": False,
        },
        "pitfall",
        "batch-not-growing",
    ),
    (
        {
            "interference.itl_inflation": 2.5,
            "config.chunked_prefill": True,
            "prefix.potential_fraction": 0.7,
            "config.prefix_caching": False,
        },
        "fix",
        "chunked-prefill",
    ),
    (
        {"memory.weights_fraction": 1.5, "prefix.potential_fraction": 0.7, "config.prefix_caching": False},
        "use",
        "parallelism",
    ),
    (
        {"decode.itl_p50_s": 0.01, "config.spec_decode": True, "spec.acceptance_rate": 0.2},
        "pitfall",
        "spec-decode-low-acceptance",
    ),
]


@pytest.mark.parametrize("items, kind, subject", HEADLINE_CASES)
def test_headline_is_the_most_consequential_finding(items, kind, subject):
    d = diagnose(build(items), TH)
    assert (d.headline_kind, d.headline_subject) == (kind, subject), d.bottleneck
    if kind in ("fix", "use", "capacity"):
        rec = d.recommendation(subject)
        assert rec.status == {"fix": "not-working"}.get(kind, "recommended")
        assert rec.reason in d.bottleneck, "the headline quotes its own reason, so it cannot contradict it"
    if kind == "pitfall":
        assert next(p for p in d.pitfalls if p.pitfall == subject).detected is True


def test_a_pitfall_headline_never_says_within_target_then_fix():
    d = diagnose(build({"decode.itl_p50_s": 0.01, "config.spec_decode": True, "spec.acceptance_rate": 0.2}), TH)
    assert "within target" not in d.bottleneck and d.bottleneck.startswith("pitfall spec-decode-low-acceptance")


def test_path_visits_every_question_in_order_with_branches():
    d = diagnose(build({"prefix.potential_fraction": 0.6, "config.prefix_caching": True, "prefix.hit_rate": 0.01}), TH)
    roots = [s.node for s in d.path if "." not in s.node]
    assert roots == ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "KV", "OB"]
    nodes = [s.node for s in d.path]
    assert nodes.index("Q2.prefix-caching-on") < nodes.index("Q2.hit-rate-reaches-potential") < nodes.index("Q3")
    hit_step = next(s for s in d.path if s.node == "Q2.hit-rate-reaches-potential")
    assert hit_step.outcome == "no"


def test_settings_are_engine_specific():
    d = diagnose(build({"prefix.potential_fraction": 0.6, "config.prefix_caching": False, "engine.name": "sglang"}), TH)
    rec = d.recommendation("prefix-caching")
    assert d.engine == "sglang"
    assert any("radix" in s for s in rec.settings_for("sglang"))
    assert any("--enable-prefix-caching" in s for s in rec.settings_for("vllm"))
    assert rec.expect.startswith("prefix.hit_rate")


# (evidence, pitfall, expected detected)
PITFALL_CASES = [
    ({"prompts.dynamic_prefix_fraction": 0.20}, "dynamic-prefix", True),
    ({"prompts.dynamic_prefix_fraction": 0.1999}, "dynamic-prefix", False),
    # judged by its share of the cache's misses too: 15% of tokens, 71% of the misses
    ({"prompts.dynamic_prefix_fraction": 0.15, "prefix.potential_fraction": 0.79}, "dynamic-prefix", True),
    ({"prompts.dynamic_prefix_fraction": 0.04, "prefix.potential_fraction": 0.95}, "dynamic-prefix", False),
    ({"prompts.dynamic_prefix_fraction": 0.10, "prefix.potential_fraction": 0.5}, "dynamic-prefix", False),
    ({"config.prefix_caching": True, "prefix.hit_rate": 0.01}, "dynamic-prefix", None),
    ({"config.prefix_caching": True, "prefix.hit_rate": 0.5}, "dynamic-prefix", False),
    ({}, "dynamic-prefix", None),
    ({"prompts.unstable_serialization_fraction": 0.05}, "unstable-serialization", True),
    ({"prompts.unstable_serialization_fraction": 0.0499}, "unstable-serialization", False),
    ({}, "unstable-serialization", None),
    ({"kv.usage_p95": 0.4999, "queue.waiting_mean": 1.0}, "batch-not-growing", True),
    ({"kv.usage_p95": 0.50, "queue.waiting_mean": 3.0}, "batch-not-growing", False),
    ({"kv.usage_p95": 0.3, "queue.waiting_mean": 0.999}, "batch-not-growing", False),
    ({"kv.usage_p95": 0.3}, "batch-not-growing", None),
    ({"config.spec_decode": False}, "spec-decode-low-acceptance", False),
    ({"config.spec_decode": True, "spec.acceptance_rate": 0.4999}, "spec-decode-low-acceptance", True),
    ({"config.spec_decode": True, "spec.acceptance_rate": 0.50}, "spec-decode-low-acceptance", False),
    ({"config.spec_decode": True, "spec.mean_acceptance_length": 1.4999}, "spec-decode-low-acceptance", True),
    ({"config.spec_decode": True, "spec.mean_acceptance_length": 1.5}, "spec-decode-low-acceptance", False),
    # judged by tokens per verify step against the drafts' cost, not by the per-token rate alone
    (
        {
            "config.spec_decode": True,
            "config.spec_method": "ngram",
            "config.num_speculative_tokens": 8,
            "spec.acceptance_rate": 0.19,
            "spec.mean_acceptance_length": 2.5,
        },
        "spec-decode-low-acceptance",
        False,
    ),
    (
        {
            "config.spec_decode": True,
            "config.spec_method": "draft_model",
            "config.num_speculative_tokens": 5,
            "spec.mean_acceptance_length": 1.6,
        },
        "spec-decode-low-acceptance",
        True,
    ),
    (
        {
            "config.spec_decode": True,
            "config.spec_method": "eagle3",
            "config.num_speculative_tokens": 5,
            "spec.mean_acceptance_length": 1.6,
        },
        "spec-decode-low-acceptance",
        False,
    ),
    (
        {"config.spec_decode": True, "spec.acceptance_rate": 0.3, "spec.mean_acceptance_length": 2.2},
        "spec-decode-low-acceptance",
        False,
    ),  # k = 1.2 / 0.3 = 4 drafts derived from the two counters
    (
        {"config.spec_decode": True, "spec.itl_speedup": 0.9, "spec.acceptance_rate": 0.9},
        "spec-decode-low-acceptance",
        True,
    ),
    (
        {"config.spec_decode": True, "spec.itl_speedup": 1.3, "spec.acceptance_rate": 0.1},
        "spec-decode-low-acceptance",
        False,
    ),
    (
        {"config.spec_decode": True, "spec.acceptance_rate": "nan", "spec.mean_acceptance_length": 1.0},
        "spec-decode-low-acceptance",
        None,
    ),  # nothing was drafted
    ({"config.spec_decode": True}, "spec-decode-low-acceptance", None),
    ({"config.pd_disaggregation": False}, "disaggregation-overhead", False),
    ({"config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.30}, "disaggregation-overhead", True),
    ({"config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.2999}, "disaggregation-overhead", False),
    ({"config.pd_disaggregation": True}, "disaggregation-overhead", None),
    ({"config.weight_quantization": "none"}, "weight-only-quantization", False),
    ({"config.weight_quantization": "fp8", **KV_BOUND}, "weight-only-quantization", False),
    # A cache filled by load (Q1 overloaded) is a capacity finding, not the quantization's failure.
    (
        {"config.weight_quantization": "awq", "config.kv_cache_dtype": "auto", **KV_BOUND},
        "weight-only-quantization",
        None,
    ),
    (
        {"config.weight_quantization": "awq", "config.kv_cache_dtype": "auto", **KV_SMALL},
        "weight-only-quantization",
        True,
    ),
    (
        {"config.weight_quantization": "awq", "config.kv_cache_dtype": "fp8", **KV_BOUND, "batch.running_mean": 4},
        "weight-only-quantization",
        False,
    ),
    ({"config.weight_quantization": "gptq", "batch.running_mean": 32}, "weight-only-quantization", True),
    ({"config.weight_quantization": "gptq", "batch.running_mean": 31.9}, "weight-only-quantization", False),
    ({"config.weight_quantization": "gptq"}, "weight-only-quantization", None),
    # recognised by scheme, not by name
    (
        {"config.weight_quantization": "compressed-tensors W4A16", "batch.running_mean": 64},
        "weight-only-quantization",
        True,
    ),
    (
        {"config.weight_quantization": "compressed-tensors W8A8-FP8", "batch.running_mean": 64},
        "weight-only-quantization",
        False,
    ),
    ({"config.weight_quantization": "awq_marlin", "batch.running_mean": 64}, "weight-only-quantization", True),
    ({"config.weight_quantization": "bitsandbytes", "batch.running_mean": 64}, "weight-only-quantization", True),
    (
        {"config.weight_quantization": "compressed-tensors", "batch.running_mean": 64},
        "weight-only-quantization",
        None,
    ),  # the scheme was not observed
    (
        {"config.weight_quantization": "awq", "config.kv_cache_dtype": "nvfp4", **KV_BOUND, "batch.running_mean": 4},
        "weight-only-quantization",
        False,
    ),  # FP4 KV counts as quantized
    ({}, "weight-only-quantization", None),
    ({"prefix.hit_rate_first_requests": 0.10}, "warm-cache-benchmark", True),
    ({"prefix.hit_rate_first_requests": 0.0999}, "warm-cache-benchmark", False),
    ({"prefix.hit_rate": 0.8, "prefix.potential_fraction": 0.6}, "warm-cache-benchmark", True),
    ({"prefix.hit_rate": 0.65, "prefix.potential_fraction": 0.6}, "warm-cache-benchmark", False),
    # a cold start with a hit rate above the potential is a counting error (sanity), not a warm cache
    (
        {"prefix.hit_rate": 0.8, "prefix.potential_fraction": 0.0, "prefix.hit_rate_first_requests": 0.0},
        "warm-cache-benchmark",
        False,
    ),
    ({}, "warm-cache-benchmark", None),
]


@pytest.mark.parametrize("items, pitfall, detected", PITFALL_CASES)
def test_pitfall(items, pitfall, detected):
    ev = build(items)
    answers = {a.question: a for a in ask_all(ev, TH)}
    checks = {p.pitfall: p for p in check_all(ev, TH, answers)}
    assert sorted(checks) == sorted(PITFALLS)
    check = checks[pitfall]
    assert check.detected is detected, check.explanation
    if detected:
        assert check.fix, "a detected pitfall says how to fix it"
    if detected is None:
        assert check.missing, "an unchecked pitfall says what is missing"


def test_detected_pitfalls_reach_the_diagnosis():
    d = diagnose(
        build(
            {"prompts.unstable_serialization_fraction": 0.3, "config.spec_decode": True, "spec.acceptance_rate": 0.1}
        ),
        TH,
    )
    assert {p.pitfall for p in d.detected_pitfalls} == {"unstable-serialization", "spec-decode-low-acceptance"}


def test_a_near_idle_live_window_is_nothing_measured_even_with_one_requests_itl():
    # One request in a live window: its ITL (from the engine's histogram) says how one request
    # went, not how the server serves; an active experiment's ITL would count.
    from llm_diagnose.probes.results import Measurement, Provenance

    live = Provenance("prometheus-histogram-window", "vllm:inter_token_latency_seconds")
    gauge = Provenance("prometheus-gauge-samples", "vllm:num_requests_running")
    items = {
        "memory.weights_fraction": 0.2,
        "load.concurrency_mean": Measurement(0.2, "count", gauge),
        "queue.waiting_mean": Measurement(0.0, "count", gauge),
        "decode.itl_p50_s": Measurement(0.02, "s", live),
    }
    d = diagnose(build(items), TH)
    assert d.answer("Q1").verdict == "untested" and d.answer("Q5").answer == "no"
    assert d.headline_kind == "nothing-measured" and "near-idle" in d.bottleneck
    active = Provenance("active-probe/decode", "http://127.0.0.1:8000")
    # The decode experiment's figure beside the window's (issue 26, item 1): Q5 reads the experiment's.
    d = diagnose(build({**items, "decode.batch1_itl_p50_s": Measurement(0.02, "s", active)}), TH)
    assert d.headline_kind == "none-found"
