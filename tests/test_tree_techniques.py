"""The technique records (llm_diagnose.diagnose.tree.techniques): one record per technique, and
every table the tool reads about techniques derived from them."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.tree.diagnosis import QUESTIONS, TECHNIQUE_ON_NODES, TECHNIQUES
from llm_diagnose.diagnose.tree.techniques.catalogue import CATALOGUE, TECHNIQUE_RANK
from llm_diagnose.diagnose.tree.techniques.catalogue import TECHNIQUES as RECORDS
from llm_diagnose.diagnose.tree.techniques.claim import Claim, down, up
from llm_diagnose.diagnose.tree.techniques.expect import expect_text
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.diagnose.verify.claims import ADOPTION, CAN_WORSEN, MECHANISMS, SWITCHES, can_worsen, claims_for

# The expect text each recommendation showed when it was written by hand, before it was generated
# from the claims: a diagnosis reads the same.
WRITTEN = {
    "quantization": "kv.capacity_tokens up, kv.preemptions and queue.waiting_mean down",
    "parallelism": "memory.weights_fraction below 1 per device",
    "scale-out": "queue.waiting_mean and kv.preemptions down per replica, kv.usage_p95 below saturation",
    "prefix-caching": "prefix.hit_rate up, latency.ttft_p50_s down",
    "continuous-batching": "batching.short_request_slowdown down, throughput.generation_tokens_per_s up",
    "paged-attention": "kv.waste_fraction down, batch.running_mean up",
    "speculative-decoding": "decode.itl_p50_s down while spec.acceptance_rate stays >= 0.5",
    "chunked-prefill": "interference.itl_inflation and decode.itl_p99_s down",
    "pd-disaggregation": "decode.itl_p99_s down at equal latency.ttft_p50_s",
    "kv-offload": "prefix.hit_rate up towards prefix.potential_fraction",
    "offline-batch": "throughput.generation_tokens_per_s up",
}


@pytest.mark.parametrize("technique", sorted(WRITTEN))
def test_the_generated_expect_text_reads_as_the_written_one(technique):
    assert CATALOGUE[technique].expect == WRITTEN[technique]


def test_the_expect_text_groups_alike_claims_and_puts_conditions_last():
    claims = (up("a.x"), down("b.y"), down("c.z"), Claim("d.w", "at-least", 0.0, relative=False, level=0.7))
    assert expect_text(claims) == "a.x up, b.y and c.z down while d.w stays >= 0.7"
    assert expect_text((down("a.x", said="below 1"), Claim("b.y", "not-up", 0.1))) == "a.x below 1 at equal b.y"


def test_the_registry_names_each_technique_once_with_its_own_rank():
    assert TECHNIQUES == tuple(t.id for t in RECORDS) == tuple(CATALOGUE) == tuple(WRITTEN)
    assert len({t.rank for t in RECORDS}) == len(RECORDS), "two techniques share a headline rank"
    assert sorted(TECHNIQUE_RANK) == sorted(TECHNIQUES)
    # Most consequential first: weights that do not fit before capacity (scale-out is last).
    assert TECHNIQUE_RANK[0] == "parallelism" and TECHNIQUE_RANK[-1] == "scale-out"


def test_each_on_node_belongs_to_a_question_and_each_switch_to_one_technique():
    for technique, node in TECHNIQUE_ON_NODES.items():
        assert node.split(".")[0] in QUESTIONS, (technique, node)
    switches = [t.switch for t in RECORDS if t.switch]
    assert len(set(switches)) == len(switches)
    tuned = [k for t in RECORDS for k in t.tuned_by]
    assert len(set(tuned)) == len(tuned) and not set(tuned) & set(switches)


def test_verify_reads_its_tables_from_the_records():
    assert SWITCHES["config.prefix_caching"] == "prefix-caching"
    assert ADOPTION["config.max_num_batched_tokens"] == "chunked-prefill" and ADOPTION["engine.version"] == ""
    assert MECHANISMS == {"prefix-caching": "prefix.hit_rate", "paged-attention": "kv.waste_fraction"}
    assert set(CAN_WORSEN) == {"prefix-caching"} and "decode" not in can_worsen("prefix-caching")
    assert can_worsen("quantization") == can_worsen("no-such-technique") and "decode" in can_worsen("quantization")
    assert claims_for("offline-batch") == CATALOGUE["offline-batch"].claims and claims_for("no-such") == ()


def test_settings_are_kept_in_engine_order_and_unknown_engines_refused():
    options = per_engine(trtllm=[Setting("--x")], vllm=[Setting("--y", "why")])
    assert [e for e, _ in options] == ["vllm", "trtllm"]
    with pytest.raises(ValueError, match="unknown engines"):
        per_engine(vlm=[Setting("--y")])
