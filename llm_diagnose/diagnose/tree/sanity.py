"""Sanity checks: evidence that cannot be true, or that contradicts other evidence.

A key no probe defines (misspelt?), a fraction outside [0, 1], weights beyond
sanity.max_weights_fraction devices, a parallel degree below 1, a negative count, a p99
below its p50, a hit rate while prefix caching is off, a live hit rate above what the
workload itself shares, a string or a flag where a number belongs, a value the evidence file
held in an unusable form (a NotMeasured whose reason starts "invalid in the input:"). Each
finding names the key; the tree lowers the confidence of every answer that read (or needed)
a flagged key, a pitfall judged from one is "not checked", and a technique recommended from
one is "unknown".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from llm_diagnose.diagnose.tree.diagnosis import Answer, Missing, PitfallCheck, Recommendation, SanityFinding
from llm_diagnose.diagnose.tree.evidence import INVALID_PREFIX, Evidence, catalogued
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured

__all__ = ["check", "lower_confidence", "doubt_pitfalls", "doubt_recommendations"]

_NON_NEGATIVE = frozenset({"count", "tokens", "s", "bytes", "1/s", "requests", "bytes/s", "flop/s", "cores", "ratio"})
_SIGNED = frozenset({Q.PROMPT_ITL_CORRELATION})  # a rank correlation lies in [-1, 1]
_UNBOUNDED_FRACTIONS = frozenset({Q.WEIGHTS_FRACTION})  # above 1 means "does not fit one device", not impossible
_AT_LEAST_ONE = frozenset({Q.TENSOR_PARALLEL, Q.PIPELINE_PARALLEL, Q.DEVICE_COUNT})  # 0 would divide by nothing


def _number(result) -> float | None:
    if isinstance(result, Measurement):
        return result.value
    if isinstance(result, Fact) and isinstance(result.value, (int, float)) and not isinstance(result.value, bool):
        return float(result.value)
    return None


def _kind(key: str, result, th: Thresholds) -> Iterable[str]:
    """Problems of one value on its own: its type against the catalogue, then its range."""
    q = Q.CATALOGUE.get(key)
    if not catalogued(key):
        yield "key not in the catalogue (llm_diagnose/probes/quantities.py); misspelt?"
    if isinstance(result, NotMeasured):
        if result.reason.startswith(INVALID_PREFIX):
            yield result.reason
        return
    if q is None:
        return
    value = result.value if isinstance(result, Fact) else None
    if q.unit == "bool":
        if not isinstance(value, bool):
            yield "a number where a flag (true/false) belongs" if _number(result) is not None else "not a flag"
        return
    if q.unit == "str":
        return
    if isinstance(value, bool):
        yield "a flag where a number belongs"
        return
    if isinstance(value, str):
        yield f"text ({value[:20]!r}) where a number belongs"
        return
    v = _number(result)
    if v is None:
        return
    if not math.isfinite(v):
        yield "not a finite number"
    elif key in _SIGNED:
        if not -1.0 <= v <= 1.0:
            yield f"a correlation of {v:.4g}, outside [-1, 1]"
    elif key == Q.WEIGHTS_FRACTION and v > th["sanity.max_weights_fraction"]:
        yield f"weights {v:.3g}x one device's memory, above sanity.max_weights_fraction: a unit or parsing error"
    elif key in _AT_LEAST_ONE and v < 1:
        yield f"{v:.3g} devices: a parallel degree is at least 1"
    elif q.unit == "fraction":
        if v < 0.0 or (v > 1.0 and key not in _UNBOUNDED_FRACTIONS):
            yield f"a fraction of {v:.4g}, outside [0, 1]"
    elif q.unit in _NON_NEGATIVE and v < 0:
        yield f"negative ({v:.4g}), which a {q.unit} cannot be"


def _cross(ev: Evidence, th: Thresholds) -> Iterable[tuple[str, str]]:
    """Values that contradict each other."""
    num = lambda k: _number(ev.items.get(k))  # noqa: E731
    hit, potential = num(Q.PREFIX_HIT_RATE), num(Q.PREFIX_POTENTIAL)
    if hit is not None and hit > 0 and ev.fact(Q.PREFIX_CACHING) is False:
        yield Q.PREFIX_HIT_RATE, f"a hit rate of {hit:.0%} while prefix caching is reported off"
    if hit is not None and potential is not None and hit - potential > th["q2.hit_above_potential"]:
        yield (
            Q.PREFIX_HIT_RATE,
            (
                f"a live hit rate of {hit:.0%} above the workload's own reuse ({potential:.0%}): "
                "a cache warm from other traffic, or a trace that is not this traffic"
            ),
        )
    # What the engine served and what the speculative-decoding experiment measured, each checked.
    for rate_key, length_key in (
        (Q.SPEC_ACCEPTANCE_RATE, Q.SPEC_ACCEPTANCE_LENGTH),
        (Q.SPEC_ACTIVE_ACCEPTANCE_RATE, Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH),
    ):
        if ev.fact(Q.SPEC_DECODE) is False:
            for key in (rate_key, length_key):
                if num(key) is not None:
                    yield key, "speculative-decoding counters while speculative decoding is reported off"
        length, k = num(length_key), num(Q.NUM_SPECULATIVE_TOKENS)
        if length is not None and length < 1.0:
            yield length_key, f"{length:.3g} tokens per verify step: the bonus token alone makes it >= 1"
        elif length is not None and k is not None and length > k + 1.0 + 1e-9:
            yield length_key, f"{length:.3g} tokens per verify step from {k:.0f} drafts: at most {k + 1:.0f}"
    if ev.fact(Q.PD_DISAGGREGATION) is False and num(Q.KV_TRANSFER_TTFT_SHARE) is not None:
        yield Q.KV_TRANSFER_TTFT_SHARE, "KV transfer time while prefill/decode disaggregation is reported off"
    for low, high in (
        (Q.ITL_P50, Q.ITL_P99),
        (Q.DECODE_BATCH1_ITL_P50, Q.DECODE_BATCH1_ITL_P99),
        (Q.TTFT_P50, Q.TTFT_P99),
        (Q.INPUT_LEN_P50, Q.INPUT_LEN_P99),
        (Q.OUTPUT_LEN_P50, Q.OUTPUT_LEN_P99),
        (Q.RUNNING_MEAN, Q.RUNNING_MAX),
    ):
        a, b = num(low), num(high)
        if a is not None and b is not None and b < a:
            yield high, f"{high} ({b:.4g}) below {low} ({a:.4g})"
    usage, running, conc = num(Q.KV_USAGE_P95), num(Q.RUNNING_MEAN), num(Q.CONCURRENCY_MEAN)
    idle = (running is not None and running == 0) or (conc is not None and conc == 0)
    if usage is not None and idle and usage > th["q4.low_kv_usage"]:
        # Cached-but-free prefix blocks count as free in vLLM: with nothing running usage is ~0.
        yield Q.KV_USAGE_P95, f"KV usage p95 {usage:.0%} while no request ran: a stale gauge"
    dyn = num(Q.DYNAMIC_PREFIX_FRACTION)
    if dyn is not None and potential is not None and dyn + potential > 1.0 + th["sanity.estimate_tolerance"]:
        yield (
            Q.DYNAMIC_PREFIX_FRACTION,
            (f"{dyn:.0%} of tokens lost to a varying head plus {potential:.0%} reusable is more than all the tokens"),
        )


def check(ev: Evidence, th: Thresholds) -> tuple[SanityFinding, ...]:
    found: list[SanityFinding] = []
    for key, result in ev.items.items():
        found.extend(SanityFinding(key, problem) for problem in _kind(key, result, th))
    found.extend(SanityFinding(k, p) for k, p in _cross(ev, th))
    unique = dict.fromkeys(found)
    return tuple(unique)


def lower_confidence(answers: Iterable[Answer], findings: tuple[SanityFinding, ...], th: Thresholds) -> list[Answer]:
    """Every answer that read or needed a flagged key, capped at confidence.sanity."""
    flagged = {f.key for f in findings}
    out = []
    for a in answers:
        touched = sorted(flagged & (set(a.evidence) | {m.evidence for m in a.missing}))
        if touched and a.confidence > th["confidence.sanity"]:
            a = replace(
                a,
                confidence=th["confidence.sanity"],
                rationale=f"{a.rationale} (doubtful input: {', '.join(touched)}; see sanity findings)",
            )
        out.append(a)
    return out


def doubt_pitfalls(pitfalls: Iterable[PitfallCheck], findings: tuple[SanityFinding, ...]) -> tuple[PitfallCheck, ...]:
    """A pitfall judged from a flagged key could not be checked: detected None, the keys missing."""
    flagged = {f.key for f in findings}
    out = []
    for p in pitfalls:
        touched = sorted(flagged & set(p.evidence))
        if touched and p.detected is not None:
            p = replace(
                p,
                detected=None,
                fix="",
                explanation=f"could not be checked: doubtful evidence ({', '.join(touched)}; see sanity findings)",
                missing=tuple(Missing(k, "doubtful: see sanity findings", "measure it again") for k in touched),
            )
        out.append(p)
    return tuple(out)


def doubt_recommendations(
    recs: Iterable[Recommendation], answers: Mapping[str, Answer], findings: tuple[SanityFinding, ...]
) -> list[Recommendation]:
    """A technique recommended by an answer that read a flagged key is not acted on: unknown."""
    flagged = {f.key for f in findings}
    out = []
    for r in recs:
        a = answers.get(r.question)
        touched = sorted(flagged & set(a.evidence)) if a is not None and r.status == "recommended" else []
        if touched:
            r = replace(
                r,
                status="unknown",
                reason=f"{r.reason}; but on doubtful evidence ({', '.join(touched)}; "
                "see sanity findings): measure it again before acting",
            )
        out.append(r)
    return out
