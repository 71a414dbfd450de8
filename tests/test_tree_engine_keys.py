"""Evidence keys the tree reads that come from what engines already expose."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.questions.catalogue import ASK
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.metrics import passive_evidence
from tests.test_metrics_parse import page, window_of


def test_vllm_max_concurrency_comes_from_cache_config_info_and_feeds_q1():
    # A real vLLM 0.32 CPU server with a 2048-token KV cache: it reports kv_cache_max_concurrency="2.0".
    ev = passive_evidence(window_of(page("vllm-0.32.0-cpu-kv-pressure-real-b.txt")))
    assert ev["kv.max_concurrency"].value == 2.0 and ev["kv.max_concurrency"].unit == "requests"
    from llm_diagnose.diagnose.tree.evidence import Evidence, Target

    # The figure is at max_model_len (a lower bound): it decides because this cache is full (usage 1.0).
    answer = ASK["Q1"](
        Evidence(Target(), {"kv.max_concurrency": ev["kv.max_concurrency"], "kv.usage_p95": ev["kv.usage_p95"]}),
        Thresholds(),
    )
    assert answer.verdict == "kv-too-small"


def test_dp_engines_add_their_max_concurrency():
    ev = passive_evidence(window_of(page("vllm-0.32-dp2-multiproc.txt")))
    assert ev["kv.max_concurrency"].value == 25.0  # 12.5 per engine
