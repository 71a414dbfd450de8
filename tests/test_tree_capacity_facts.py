"""Q1 reads capacity facts the engine states itself: a running batch held at the engine's own cap
while requests wait binds even where KV usage was not read, and "capped by load, not by memory"
never stands beside a preemption (a preemption is the cache running out)."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.tree import diagnose
from tests.evidence_builders import build
from tests.scenarios.engines import setting


def _q1(**items):
    d = diagnose(build({"engine.name": "vllm", "memory.weights_fraction": 0.3, **items}))
    return d, d.answer("Q1")


@pytest.mark.parametrize(("engine", "setting_name"), [("vllm", "--max-num-seqs"), ("sglang", "--max-running-requests")])
def test_a_batch_held_at_the_engines_cap_while_requests_wait_names_the_cap(engine, setting_name):
    d, q1 = _q1(
        **{
            "engine.name": engine,
            "config.max_num_seqs": setting(64),
            "batch.running_mean": 63.6,
            "queue.waiting_mean": 40.0,
        }
    )
    assert q1.verdict == "overloaded", q1.rationale
    assert f"of {setting_name} 64" in q1.rationale and "the cap binds" in q1.rationale, q1.rationale
    assert "KV usage was not read" in q1.rationale and "capped by load" not in q1.rationale, q1.rationale
    assert any(c.threshold == "q1.batch_at_cap" and c.holds for c in q1.comparisons)


def test_a_batch_below_its_cap_is_no_cap_finding():
    _, q1 = _q1(**{"config.max_num_seqs": setting(64), "batch.running_mean": 20.0, "queue.waiting_mean": 40.0})
    assert "the cap binds" not in q1.rationale
    assert q1.verdict != "overloaded", q1.rationale


def test_with_kv_usage_read_a_free_cache_at_the_cap_stays_the_pitfalls_case():
    # KV 30% used, batch at its cap of 16, 8 waiting: batch-not-growing (raise the cap), not overload.
    d, q1 = _q1(
        **{
            "config.max_num_seqs": setting(16),
            "batch.running_mean": 16.0,
            "queue.waiting_mean": 8.0,
            "kv.usage_p95": 0.3,
        }
    )
    assert q1.verdict != "overloaded" and "the cap binds" not in q1.rationale, q1.rationale
    assert d.recommendation("scale-out").status != "recommended"


def test_capped_by_load_never_stands_beside_preemptions():
    _, q1 = _q1(**{"kv.usage_p95": 0.85, "kv.preemptions": 12.0, "queue.waiting_mean": 3.0})
    assert q1.verdict == "overloaded" and "12 preemptions" in q1.rationale, q1.rationale
    assert "capped by load" not in q1.rationale, q1.rationale
    # Without a preemption and with the cache below full, the wording stands.
    _, q1 = _q1(**{"kv.usage_p95": 0.85, "kv.preemptions": 0.0, "queue.waiting_mean": 3.0})
    assert "capped by load, not by memory" in q1.rationale, q1.rationale


def test_the_engines_figure_below_one_request_does_not_fit_whatever_the_load():
    d, q1 = _q1(**{"kv.max_concurrency": 0.82, "engine.max_model_len": setting(29000)})
    assert (q1.answer, q1.verdict) == ("no", "kv-too-small"), q1.rationale
    assert "0.82 of one request of max_model_len (29000 tokens)" in q1.rationale
    assert "replicas of it do not help" in q1.rationale
    assert d.recommendation("scale-out").status == "not-indicated"
