"""The questions in the order the tree asks them and walks their branches: an explicit tuple,
and the views read from it. Recommendations keep this order: Q1 (quantization, parallelism,
scale-out), Q2, ..., Q6, then KV offload and offline batch.

Every question reads (evidence, thresholds); Q5, Q6 and OB also the declared service-level
objectives (`slo=`, llm_diagnose.diagnose.tree.slo.SLO; undeclared by default).
"""

from __future__ import annotations

from collections.abc import Callable

from llm_diagnose.diagnose.tree.declared import UNDECLARED
from llm_diagnose.diagnose.tree.diagnosis import Answer
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions import (
    kv_eviction,
    offline_work,
    q1_fit,
    q2_prefix_sharing,
    q3_mixed_lengths,
    q4_kv_fragmentation,
    q5_decode_latency,
    q6_contention,
)
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["QUESTIONS", "ASK", "QUESTION_TITLES", "SLO_QUESTIONS", "ask_all"]

QUESTIONS: tuple[Question, ...] = (
    q1_fit.QUESTION,
    q2_prefix_sharing.QUESTION,
    q3_mixed_lengths.QUESTION,
    q4_kv_fragmentation.QUESTION,
    q5_decode_latency.QUESTION,
    q6_contention.QUESTION,
    kv_eviction.QUESTION,
    offline_work.QUESTION,
)

# Every question takes (evidence, thresholds); those in SLO_QUESTIONS also take `slo=`.
ASK: dict[str, Callable[..., Answer]] = {q.id: q.ask for q in QUESTIONS}
QUESTION_TITLES: dict[str, str] = {q.id: q.title for q in QUESTIONS}
SLO_QUESTIONS = frozenset(q.id for q in QUESTIONS if q.reads_slo)


def ask_all(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> tuple[Answer, ...]:
    return tuple(q.answer(ev, th, slo) for q in QUESTIONS)
