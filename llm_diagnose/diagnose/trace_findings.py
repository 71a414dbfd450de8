"""The findings `llm-diagnose trace` prints, judged by the decision tree's own checks.

A trace analysis (`llm_diagnose.probes.traces`) measures; this module judges. Whether a
finding is raised comes from the functions and named thresholds `decide` applies to the same
trace's evidence (`tree.pitfalls.dynamic_prefix` and `unstable_serialization`, `tree.questions.kv_eviction.ask_kv`,
with the sanity checks that set doubtful evidence aside), so `trace FILE` and `decide` on the
evidence of `trace FILE --evidence-out` agree, and `--thresholds` moves both. What is added
here is the phrasing, from what only the analysis holds: where similar prompts diverge and what
varies there, where the reordered payloads sit, the cache sizes compared.

Finding ids are stable: users' CI matches on them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_diagnose.diagnose.tree.diagnosis import Answer, Comparison, PitfallCheck
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.diagnose.tree.pitfalls import dynamic_prefix, unstable_serialization
from llm_diagnose.diagnose.tree.questions.kv_eviction import ask_kv
from llm_diagnose.diagnose.tree.sanity import check as sanity_check
from llm_diagnose.diagnose.tree.sanity import doubt_pitfalls
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.traces.evidence import trace_evidence as trace_items
from llm_diagnose.probes.traces.pitfalls import TOKEN_SPAN

if TYPE_CHECKING:
    from llm_diagnose.probes.traces.analysis import TraceAnalysis
    from llm_diagnose.probes.traces.pitfalls import SerializationStats
    from llm_diagnose.probes.traces.prefix import PrefixReuse
    from llm_diagnose.probes.traces.similarity import SimilarityStats

__all__ = [
    "Finding",
    "trace_evidence",
    "trace_findings",
    "DYNAMIC_PREFIX",
    "UNSTABLE_SERIALIZATION",
    "KV_OFFLOAD",
]

DYNAMIC_PREFIX = "dynamic-prefix"
UNSTABLE_SERIALIZATION = "unstable-serialization"
KV_OFFLOAD = "kv-offload"  # a technique the trace calls for, not a pitfall: the tree's KV answer
_CRITICAL = "q2.dynamic_prefix_critical"  # severity of the dynamic-prefix finding only


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # "warning" or "critical"
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""
    comparisons: tuple[Comparison, ...] = ()  # against the named thresholds: why it was raised, and how severe

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "evidence": dict(self.evidence),
            "fix": self.fix,
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


def trace_evidence(analysis: TraceAnalysis) -> Evidence:
    """The analysis's measurements as the evidence `--evidence-out` writes and `decide` reads."""
    return Evidence(Target(url=analysis.path, label="trace"), trace_items(analysis))


def trace_findings(analysis: TraceAnalysis, th: Thresholds) -> tuple[Finding, ...]:
    """The findings of a trace: the tree's checks on its evidence, phrased with the analysis's detail."""
    ev = trace_evidence(analysis)
    dyn, ser = doubt_pitfalls((dynamic_prefix(ev, th), unstable_serialization(ev, th)), sanity_check(ev, th))
    kv = ask_kv(ev, th)
    found: list[Finding] = []
    if dyn.detected and analysis.similarity is not None:
        found.append(_dynamic_prefix(analysis, analysis.similarity, dyn, th))
    if ser.detected and analysis.serialization is not None:
        found.append(_unstable_serialization(analysis.serialization, ser))
    reuse = analysis.prefix_reuse
    if kv.answer == "yes" and reuse is not None and reuse.lru_token_fraction is not None:
        found.append(_kv_offload(reuse, reuse.lru_token_fraction, kv))
    return tuple(found)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _dynamic_prefix(a: TraceAnalysis, sim: SimilarityStats, check: PitfallCheck, th: Thresholds) -> Finding:
    examples = a.divergence_examples
    dynamic_fraction = sim.dynamic_fraction
    whats = Counter(e.what_varies for e in examples)
    what = whats.most_common(1)[0][0] if whats else None
    at = sorted(e.token_offset for e in examples)[len(examples) // 2] if examples else sim.divergence_tokens_p50
    where = f" at about token {at}" if at is not None else ""
    # Raised by its share of the cache's misses when its share of all tokens is under the line.
    by_misses = next((c for c in check.comparisons if c.evidence == "prompts.dynamic_share_of_misses"), None)
    misses = (
        f" ({_pct(min(by_misses.value, 1.0))} of the tokens the prefix cache misses)"
        if by_misses is not None and by_misses.holds
        else ""
    )
    message = (
        f"{_pct(dynamic_fraction)} of prompt content{misses} repeats earlier prompts but comes after a point where "
        f"prompts differ, so an exact-prefix cache cannot reuse it; prompts first diverge{where}"
        + (f" ({what})" if what else "")
    )
    if what and what.startswith(TOKEN_SPAN):
        thing = "the tokens that vary per request"
    elif what and what != "text":
        thing = f"the {what}"
    else:
        thing = "the part that varies per request"
    evidence = {
        "dynamic_token_fraction": dynamic_fraction,
        "similar_token_fraction": sim.seen_fraction,
        "cache_servable_similar_fraction": sim.cached_fraction,
        "divergence_token": at,
        "examples": [e.to_dict() for e in examples],
    }
    limit = th[_CRITICAL]
    critical = dynamic_fraction >= limit
    severity = Comparison(_CRITICAL, Q.DYNAMIC_PREFIX_FRACTION, float(dynamic_fraction), ">=", float(limit), critical)
    return Finding(
        DYNAMIC_PREFIX,
        "critical" if critical else "warning",
        message,
        evidence,
        f"move {thing}{where} to the end of the prompt, after the shared content",
        check.comparisons + (severity,),
    )


def _unstable_serialization(stats: SerializationStats, check: PitfallCheck) -> Finding:
    places = ", ".join(stats.locations)
    message = (
        f"{stats.unstable_requests} requests ({_pct(stats.unstable_fraction)}) send JSON ({places}) equal to an "
        "earlier request's but with its keys in another order: same meaning, different bytes, so prefix "
        "matching stops there"
    )
    fix = (
        "serialise JSON with a fixed key order (e.g. json.dumps(obj, sort_keys=True)) before it goes into the "
        "prompt; where it cannot be made stable, move it to the end of the prompt"
    )
    return Finding(UNSTABLE_SERIALIZATION, "warning", message, stats.to_dict(), fix, check.comparisons)


def _kv_offload(prefix: PrefixReuse, at_capacity: float, answer: Answer) -> Finding:
    """`at_capacity`: the share an LRU cache of the KV capacity serves (prefix.lru_token_fraction)."""
    unlimited = prefix.token_fraction
    message = (
        f"an unlimited prefix cache would serve {_pct(unlimited)} of prompt tokens, an LRU cache of "
        f"{prefix.capacity_tokens} tokens only {_pct(at_capacity)}: evicted prefixes are recomputed"
    )
    fix = (
        "offload KV blocks to CPU memory or disk (e.g. LMCache or the engine's CPU offload) or give the KV cache "
        "more memory, so evicted prefixes are reloaded instead of recomputed"
    )
    evidence = {
        "unlimited_token_fraction": unlimited,
        "at_capacity_token_fraction": at_capacity,
        "capacity_tokens": prefix.capacity_tokens,
        "gap": unlimited - at_capacity,
    }
    return Finding(KV_OFFLOAD, "warning", message, evidence, fix, answer.comparisons)
