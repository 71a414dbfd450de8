"""Wording and bounds of pitfall fixes that the scenario corpus cannot check (it compares statuses,
not text): the speculative-decoding fix by draft method and regime, the batch-not-growing text,
huge weights printed short."""

from __future__ import annotations

from llm_diagnose.diagnose.tree import diagnose
from tests.evidence_builders import build


def _pitfall(d, pitfall):
    return next(p for p in d.pitfalls if p.pitfall == pitfall)


def test_low_acceptance_on_eagle3_does_not_advise_eagle3():
    d = diagnose(
        build(
            {
                "config.spec_decode": True,
                "config.spec_method": "eagle3",
                "config.num_speculative_tokens": 3,
                "spec.mean_acceptance_length": 1.2,
                "batch.running_mean": 4.0,
            }
        )
    )
    p = _pitfall(d, "spec-decode-low-acceptance")
    assert p.detected is True
    assert "EAGLE-3" not in p.fix and "num_speculative_tokens" in p.fix


def test_low_acceptance_on_draft_model_suggests_trained_heads():
    d = diagnose(
        build(
            {
                "config.spec_decode": True,
                "config.spec_method": "draft_model",
                "config.num_speculative_tokens": 3,
                "spec.mean_acceptance_length": 1.1,
                "batch.running_mean": 4.0,
            }
        )
    )
    assert "EAGLE-3" in _pitfall(d, "spec-decode-low-acceptance").fix


def test_measured_compute_bound_spec_fix_is_by_regime():
    d = diagnose(
        build(
            {
                "config.spec_decode": True,
                "config.spec_method": "eagle3",
                "config.num_speculative_tokens": 3,
                "spec.mean_acceptance_length": 3.5,
                "batch.running_mean": 256.0,
                "decode.bound_b256": "compute",
            }
        )
    )
    p = _pitfall(d, "spec-decode-low-acceptance")
    assert p.detected is True
    assert "--max-num-seqs" in p.fix and "EAGLE-3" not in p.fix


def test_batch_growth_not_claimed_when_requests_wait():
    d = diagnose(
        build(
            {
                "memory.weights_fraction": 0.3,
                "kv.usage_p95": 0.6,
                "queue.waiting_mean": 5.0,
                "kv.preemptions": 0.0,
                "batch.running_mean": 30.0,
            }
        )
    )
    p = _pitfall(d, "batch-not-growing")
    assert p.detected is False and "grows" not in p.explanation
    assert "capped by load" in d.answer("Q1").rationale


def test_huge_weights_fraction_printed_short():
    d = diagnose(build({"memory.weights_fraction": 1e308, "kv.usage_p95": 0.6}))
    assert len(d.answer("Q1").rationale) < 300
    assert any(f.key == "memory.weights_fraction" for f in d.sanity)
