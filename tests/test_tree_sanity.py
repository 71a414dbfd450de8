"""Sanity checks: impossible or contradictory evidence is reported and lowers confidence."""

from __future__ import annotations

import json

import pytest

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.schemes import kv_quantized, spec_method_class, weight_scheme
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.results import NotMeasured
from tests.evidence_builders import PROV, build

TH = Thresholds()

# (evidence, flagged key, words of the problem)
FLAGGED = [
    ({"kv.usage_p95": 1.7, "kv.preemptions": 3}, "kv.usage_p95", "outside [0, 1]"),
    ({"prefix.hit_rate": -0.04}, "prefix.hit_rate", "outside [0, 1]"),
    ({"kv.preemptions": -2}, "kv.preemptions", "negative"),
    ({"interference.prompt_itl_correlation": 1.4}, "interference.prompt_itl_correlation", "outside [-1, 1]"),
    ({"kv.usage_p95": "high"}, "kv.usage_p95", "where a number belongs"),
    ({"batch.running_mean": True}, "batch.running_mean", "a flag where a number belongs"),
    ({"config.prefix_caching": 1.0}, "config.prefix_caching", "where a flag"),
    ({"config.prefix_caching": False, "prefix.hit_rate": 0.3}, "prefix.hit_rate", "prefix caching is reported off"),
    ({"prefix.hit_rate": 0.9, "prefix.potential_fraction": 0.2}, "prefix.hit_rate", "above the workload's own reuse"),
    ({"decode.itl_p50_s": 0.05, "decode.itl_p99_s": 0.02}, "decode.itl_p99_s", "below decode.itl_p50_s"),
    ({"config.spec_decode": False, "spec.acceptance_rate": 0.5}, "spec.acceptance_rate", "reported off"),
    ({"spec.mean_acceptance_length": 0.6}, "spec.mean_acceptance_length", ">= 1"),
    (
        {"spec.mean_acceptance_length": 6.0, "config.num_speculative_tokens": 3},
        "spec.mean_acceptance_length",
        "at most 4",
    ),
    ({"kv.usage_p95": 0.99, "batch.running_mean": 0.0}, "kv.usage_p95", "no request ran"),
    (
        {"prompts.dynamic_prefix_fraction": 0.5, "prefix.potential_fraction": 0.7},
        "prompts.dynamic_prefix_fraction",
        "more than all the tokens",
    ),
]


@pytest.mark.parametrize("items, key, words", FLAGGED)
def test_impossible_evidence_is_flagged(items, key, words):
    d = diagnose(build(items), TH)
    problems = [f.problem for f in d.sanity if f.key == key]
    assert problems and any(words in p for p in problems), d.sanity


@pytest.mark.parametrize(
    "items",
    [
        {"memory.weights_fraction": 1.6},  # above 1 means "does not fit one device", which is possible
        {"kv.usage_p95": 1.0, "prefix.hit_rate": 0.0, "interference.prompt_itl_correlation": -0.3},
        {"prefix.hit_rate": 0.65, "prefix.potential_fraction": 0.6},  # within block rounding
        {"config.prefix_caching": False, "prefix.hit_rate": 0.0},
    ],
)
def test_possible_evidence_is_not_flagged(items):
    assert diagnose(build(items), TH).sanity == ()


def test_invalid_input_from_the_file_is_a_finding_and_lowers_the_answer_that_needed_it():
    items = {
        "kv.usage_p95": NotMeasured("invalid in the input: 'abc' is not a number", "fix the file", PROV),
        "kv.preemptions": 5,
        "memory.weights_fraction": 0.3,
    }
    d = diagnose(build(items), TH)
    assert [f.key for f in d.sanity] == ["kv.usage_p95"]
    assert d.sanity[0].problem.startswith("invalid in the input:")
    assert d.answer("Q1").confidence <= TH["confidence.sanity"]


def test_only_the_answers_reading_a_flagged_key_lose_confidence():
    items = {"kv.usage_p95": 1.7, "kv.preemptions": 3, "decode.itl_p50_s": 0.09, "batch.running_mean": 4}
    d = diagnose(build(items), TH)
    assert d.answer("Q1").confidence <= TH["confidence.sanity"] and "doubtful input" in d.answer("Q1").rationale
    clean = diagnose(build({k: v for k, v in items.items() if k != "kv.usage_p95"}), TH)
    assert d.answer("Q5").confidence == clean.answer("Q5").confidence > TH["confidence.sanity"]


def test_sanity_and_headline_round_trip_through_json():
    d = diagnose(build({"kv.usage_p95": 1.7, "kv.preemptions": 3}), TH)
    again = Diagnosis.from_dict(json.loads(d.to_json()))
    assert again == d and again.sanity and again.headline_kind == d.headline_kind


def test_an_older_diagnosis_without_headline_fields_still_reads():
    d = json.loads(diagnose(build({}), TH).to_json())
    for k in ("headline_kind", "headline_subject", "sanity"):
        d.pop(k)
    old = Diagnosis.from_dict(d)
    assert old.sanity == () and old.headline_subject == ""


@pytest.mark.parametrize(
    "method, scheme",
    [
        ("awq", "weight-only"),
        ("AWQ", "weight-only"),
        ("awq_marlin", "weight-only"),
        ("gptq_marlin", "weight-only"),
        ("bitsandbytes", "weight-only"),
        ("compressed-tensors W4A16", "weight-only"),
        ("w8a16", "weight-only"),
        ("fp8", "weight-activation"),
        ("compressed-tensors W8A8-FP8", "weight-activation"),
        ("modelopt_fp4", "weight-activation"),
        ("none", "none"),
        ("compressed-tensors", None),
        ("mxfp4", None),
    ],
)
def test_weight_quantization_is_judged_by_scheme(method, scheme):
    assert weight_scheme(method) == scheme


@pytest.mark.parametrize(
    "dtype, quantized",
    [
        ("auto", False),
        ("bfloat16", False),
        ("fp8", True),
        ("fp8_e5m2", True),
        ("nvfp4", True),
        ("fp4_e2m1", True),
        ("mxfp4", True),
        ("int8", True),
        (None, None),
    ],
)
def test_fp4_kv_dtypes_count_as_quantized(dtype, quantized):
    assert kv_quantized(dtype) is quantized


@pytest.mark.parametrize(
    "method, kind",
    [
        ("ngram", "ngram"),
        ("suffix", "ngram"),
        ("eagle", "head"),
        ("eagle3", "head"),
        ("EAGLE3", "head"),
        ("mtp", "head"),
        ("deepseek_mtp", "head"),
        ("medusa", "head"),
        ("draft_model", "model"),
        ("STANDALONE", "model"),
        ("", None),
    ],
)
def test_draft_methods_are_priced_by_class(method, kind):
    assert spec_method_class(method) == kind


@pytest.mark.parametrize(
    "engine, version, key, on",
    [
        ("vllm", "0.11.0", "config.chunked_prefill", True),
        ("vllm", "0.8.5", "config.prefix_caching", True),
        ("vllm", "0.6.3", "config.chunked_prefill", False),
        ("vllm", None, "config.chunked_prefill", False),
        ("sglang", "0.5.3", "config.chunked_prefill", True),
        ("trtllm", "1.0", "config.chunked_prefill", False),
        ("vllm", "0.11.0", "config.spec_decode", False),
    ],
)
def test_settings_on_by_the_engines_default(engine, version, key, on):
    from llm_diagnose.diagnose.tree.schemes import default_on

    assert bool(default_on(key, engine, version)) is on
