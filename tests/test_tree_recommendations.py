"""Recommendations and pitfalls from hand-built evidence, including engines that already run
the technique (in place) and techniques that are on but do not work (pitfalls)."""

from __future__ import annotations

import pytest

from diagnose.diagnosis import PITFALLS, TECHNIQUES
from diagnose.pitfalls import check_all
from diagnose.questions import ask_all
from diagnose.thresholds import Thresholds
from diagnose.tree import diagnose
from tests.evidence_builders import build

TH = Thresholds()

KV_BOUND = {"kv.usage_p95": 0.98, "kv.preemptions": 4}

# (evidence, technique, expected status)
REC_CASES = [
    # Q1
    ({"memory.weights_fraction": 1.5}, "parallelism", "recommended"),
    (KV_BOUND, "quantization", "recommended"),
    ({**KV_BOUND, "config.weight_quantization": "fp8", "config.kv_cache_dtype": "fp8"}, "quantization", "in-place"),
    ({**KV_BOUND, "config.weight_quantization": "fp8", "config.kv_cache_dtype": "fp8"}, "parallelism", "recommended"),
    ({**KV_BOUND, "config.weight_quantization": "awq", "config.kv_cache_dtype": "auto"}, "quantization", "not-working"),
    ({"kv.usage_p95": 0.3, "kv.preemptions": 0, "config.weight_quantization": "none"}, "quantization", "not-indicated"),
    ({"kv.usage_p95": 0.3, "kv.preemptions": 0, "config.weight_quantization": "gptq"}, "quantization", "in-place"),
    ({}, "quantization", "unknown"),
    # Q2
    ({"prefix.potential_fraction": 0.6, "config.prefix_caching": False}, "prefix-caching", "recommended"),
    ({"prefix.potential_fraction": 0.6}, "prefix-caching", "recommended"),  # config not visible
    ({"prefix.potential_fraction": 0.6, "config.prefix_caching": True, "prefix.hit_rate": 0.3},
     "prefix-caching", "in-place"),  # 0.3 >= 0.5 * 0.6
    ({"prefix.potential_fraction": 0.6, "config.prefix_caching": True, "prefix.hit_rate": 0.29},
     "prefix-caching", "not-working"),
    ({"config.prefix_caching": True, "prefix.hit_rate": 0.7, "prefix.queried_tokens": 1000},
     "prefix-caching", "in-place"),
    ({"prefix.potential_fraction": 0.02, "config.prefix_caching": True}, "prefix-caching", "in-place"),
    ({"prefix.potential_fraction": 0.02, "config.prefix_caching": False}, "prefix-caching", "not-indicated"),
    ({"prefix.potential_fraction": 0.02, "prompts.dynamic_prefix_fraction": 0.7, "config.prefix_caching": False},
     "prefix-caching", "recommended"),
    ({"prefix.potential_fraction": 0.02, "prompts.dynamic_prefix_fraction": 0.7, "config.prefix_caching": True},
     "prefix-caching", "not-working"),
    # Q3
    ({"outputs.length_cv": 1.5, "load.concurrency_mean": 6, "config.continuous_batching": True},
     "continuous-batching", "in-place"),
    ({"outputs.length_cv": 1.5, "load.concurrency_mean": 6, "config.continuous_batching": False},
     "continuous-batching", "recommended"),
    ({"batching.short_request_slowdown": 4.0, "config.continuous_batching": True}, "continuous-batching", "not-working"),
    ({"outputs.length_cv": 0.1, "load.concurrency_mean": 6, "config.continuous_batching": False},
     "continuous-batching", "not-indicated"),
    # Q4
    ({"kv.waste_fraction": 0.6, "config.paged_kv": False}, "paged-attention", "recommended"),
    ({"config.paged_kv": True}, "paged-attention", "in-place"),
    ({"kv.waste_fraction": 0.6, "config.paged_kv": True}, "paged-attention", "not-working"),
    # Q5
    ({"decode.itl_p50_s": 0.09, "config.spec_decode": False}, "speculative-decoding", "recommended"),
    ({"decode.itl_p50_s": 0.09, "config.spec_decode": True, "spec.acceptance_rate": 0.8}, "speculative-decoding", "in-place"),
    ({"decode.itl_p50_s": 0.09, "config.spec_decode": True, "spec.acceptance_rate": 0.2}, "speculative-decoding", "not-working"),
    ({"decode.itl_p50_s": 0.01, "config.spec_decode": True, "spec.acceptance_rate": 0.2}, "speculative-decoding", "not-working"),
    ({"decode.itl_p50_s": 0.01, "config.spec_decode": False}, "speculative-decoding", "not-indicated"),
    # Q6
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": False}, "chunked-prefill", "recommended"),
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": False}, "pd-disaggregation", "not-indicated"),
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": True}, "chunked-prefill", "in-place"),
    ({"interference.itl_inflation": 2.5, "config.chunked_prefill": True}, "pd-disaggregation", "recommended"),
    ({"interference.itl_inflation": 1.7, "config.chunked_prefill": True}, "pd-disaggregation", "not-indicated"),
    ({"interference.itl_inflation": 1.7, "config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.4},
     "pd-disaggregation", "not-working"),
    ({"interference.itl_inflation": 1.1, "config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.1},
     "pd-disaggregation", "in-place"),
    # KV offload
    ({"prefix.potential_fraction": 0.8, "prefix.lru_fraction_at_capacity": 0.3, "config.kv_offload": False},
     "kv-offload", "recommended"),
    ({"prefix.potential_fraction": 0.8, "prefix.lru_fraction_at_capacity": 0.78, "config.kv_offload": True},
     "kv-offload", "in-place"),
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
        "interference.itl_inflation": 3.0, "config.chunked_prefill": False,  # Q6
        "prefix.potential_fraction": 0.7, "config.prefix_caching": False,  # Q2
        **KV_BOUND,  # Q1
    }
    d = diagnose(build(items), TH)
    assert [r.technique for r in d.recommended] == ["quantization", "prefix-caching", "chunked-prefill", "offline-batch"]
    assert d.bottleneck.startswith("Q1:") and "quantization" in d.bottleneck


def test_nothing_to_fix_says_so():
    d = diagnose(build({"kv.usage_p95": 0.2, "kv.preemptions": 0, "decode.itl_p50_s": 0.01}), TH)
    assert d.recommended == ()
    assert d.bottleneck.startswith("no bottleneck found")


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
    ({"config.spec_decode": True}, "spec-decode-low-acceptance", None),
    ({"config.pd_disaggregation": False}, "disaggregation-overhead", False),
    ({"config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.30}, "disaggregation-overhead", True),
    ({"config.pd_disaggregation": True, "pd.kv_transfer_ttft_share": 0.2999}, "disaggregation-overhead", False),
    ({"config.pd_disaggregation": True}, "disaggregation-overhead", None),
    ({"config.weight_quantization": "none"}, "weight-only-quantization", False),
    ({"config.weight_quantization": "fp8", **KV_BOUND}, "weight-only-quantization", False),
    ({"config.weight_quantization": "awq", "config.kv_cache_dtype": "auto", **KV_BOUND}, "weight-only-quantization", True),
    ({"config.weight_quantization": "awq", "config.kv_cache_dtype": "fp8", **KV_BOUND, "batch.running_mean": 4},
     "weight-only-quantization", False),
    ({"config.weight_quantization": "gptq", "batch.running_mean": 32}, "weight-only-quantization", True),
    ({"config.weight_quantization": "gptq", "batch.running_mean": 31.9}, "weight-only-quantization", False),
    ({"config.weight_quantization": "gptq"}, "weight-only-quantization", None),
    ({}, "weight-only-quantization", None),
    ({"prefix.hit_rate_first_requests": 0.10}, "warm-cache-benchmark", True),
    ({"prefix.hit_rate_first_requests": 0.0999}, "warm-cache-benchmark", False),
    ({"prefix.hit_rate": 0.8, "prefix.potential_fraction": 0.6}, "warm-cache-benchmark", True),
    ({"prefix.hit_rate": 0.65, "prefix.potential_fraction": 0.6}, "warm-cache-benchmark", False),
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
    d = diagnose(build({"prompts.unstable_serialization_fraction": 0.3, "config.spec_decode": True,
                        "spec.acceptance_rate": 0.1}), TH)
    assert {p.pitfall for p in d.detected_pitfalls} == {"unstable-serialization", "spec-decode-low-acceptance"}
