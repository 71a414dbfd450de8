"""The decision tree: evidence in, a diagnosis out, with the path it took.

Every question is answered (real systems combine techniques); then each question's branch
decides the status of its techniques, looking at what the engine already runs:

- recommended: the tree says it would help and it is not on;
- in-place: it is on and the evidence says it works (or that nothing asks more of it);
- on-unverified: it is on (or on by the engine's default), but what would show it works was
  not measured; the reason says what would;
- not-working: it is on but the evidence says it does not help (a pitfall says why);
- not-indicated: nothing calls for it; unknown: the question could not be answered.

A setting that could not be seen is never read as off. Recommendations keep the tree's order:
Q1 (quantization, parallelism, scale-out), Q2, ..., Q6, then KV offload and offline batch.
Evidence is sanity-checked first (llm_diagnose.diagnose.tree.sanity); answers that read flagged evidence lose
confidence. The headline is the most consequential finding (llm_diagnose.diagnose.tree.headline).
`diagnose(evidence)` is a pure function: the same evidence, thresholds and SLO give the same
diagnosis, byte for byte.

The SLO (`diagnose(evidence, thresholds, slo=SLO(...))`, undeclared by default) is what the
latency answers are judged against: Q5 asks whether decode latency breaks the ITL objective,
Q6 notes whether its stalls break the ITL/TTFT objectives, and a workload declared offline
with no latency objective leads to offline batch. The diagnosis records the SLO and each
objective met or broken where the evidence shows it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from llm_diagnose.diagnose.tree import branches_late as late
from llm_diagnose.diagnose.tree.branch import Branches as _Branches
from llm_diagnose.diagnose.tree.branch import needed as _needed
from llm_diagnose.diagnose.tree.diagnosis import Answer, Diagnosis, Step
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.headline import headline
from llm_diagnose.diagnose.tree.pipeline import pipeline_for_latency
from llm_diagnose.diagnose.tree.pitfalls import check_all
from llm_diagnose.diagnose.tree.prefix_figures import judge_cache_apart
from llm_diagnose.diagnose.tree.q5_decode_latency import walk_q5
from llm_diagnose.diagnose.tree.questions import ask_all
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.sanity import check as sanity_check
from llm_diagnose.diagnose.tree.sanity import doubt_pitfalls, doubt_recommendations, lower_confidence
from llm_diagnose.diagnose.tree.schemes import kv_quantized, weight_scheme
from llm_diagnose.diagnose.tree.signals import devices, load_level, roofline_at
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.speculative import decode_regime
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["diagnose"]


def _q1(b: _Branches) -> None:
    a = b.answers["Q1"]
    quant = b.ev.fact(Q.WEIGHT_QUANTIZATION)
    kv_dtype = b.ev.fact(Q.KV_CACHE_DTYPE)
    weights_quantized = None if not isinstance(quant, str) else weight_scheme(quant) != "none"
    kv_q = kv_quantized(kv_dtype if isinstance(kv_dtype, str) else None)
    n_dev, _ = devices(b.reading())
    parallel = None if n_dev is None else n_dev > 1
    if a.verdict == "does-not-fit":
        b.step("Q1.fits-one-device", False, a.rationale)
        b.add(
            "quantization",
            "in-place" if weights_quantized else "recommended",
            "Q1",
            "already quantized" if weights_quantized else "fewer bytes per weight may fit fewer devices",
        )
        b.add("parallelism", "recommended", "Q1", f"{a.rationale}: split them across (more) devices")
        b.add("scale-out", "not-indicated", "Q1", "the model does not fit yet: replicas come after it does")
        return
    b.step("Q1.fits-one-device", None if a.answer == "unknown" else True)
    if a.answer == "no":  # tight or kv-too-small
        b.step(
            "Q1.already-quantized",
            weights_quantized,
            f"weights: {quant or 'not observed'}, KV cache: {kv_dtype or 'not observed'}",
        )
        fully = bool(weights_quantized) and bool(kv_q)
        if b.detected("weight-only-quantization"):
            b.add("quantization", "not-working", "Q1", b.pitfalls["weight-only-quantization"].explanation)
        elif fully:
            b.add("quantization", "in-place", "Q1", "weights and KV cache are already quantized")
        else:
            part = "the KV cache" if weights_quantized else "weights and KV cache"
            unseen = (
                " (the weights' quantization was not visible: they may be quantized already)"
                if weights_quantized is None
                else ""
            )
            b.add("quantization", "recommended", "Q1", f"{a.rationale}: quantize {part} for room to spare{unseen}")
        b.add(
            "parallelism",
            "recommended" if fully else "not-indicated",
            "Q1",
            a.rationale + "; already quantized, so spread over more devices"
            if fully
            else "fewer bytes come before more devices",
        )
        b.add("scale-out", "not-indicated", "Q1", "each instance lacks room: more replicas of it do not fix that")
        return
    if a.verdict == "overloaded":
        b.step("Q1.overloaded", True, a.rationale)
        b.add(
            "quantization",
            "in-place" if weights_quantized else "not-indicated",
            "Q1",
            "already quantized"
            if weights_quantized
            else "the model fits: load fills the KV cache, not the model's size (KV quantization is a capacity lever, "
            "see scale-out)",
        )
        b.add("parallelism", "in-place" if parallel else "not-indicated", "Q1", "the model fits its devices")
        if a.confidence > b.th["confidence.headline_min"]:
            b.add("scale-out", "recommended", "Q1", _scale_out_reason(b, a, kv_q))
        else:  # overload read from thin or doubtful evidence is no reason to buy replicas
            b.add(
                "scale-out",
                "unknown",
                "Q1",
                f"{a.rationale}, but on evidence too doubtful to act on "
                f"(confidence {a.confidence:.2f}): measure again over a steady loaded window",
            )
        return
    if weights_quantized and b.detected("weight-only-quantization"):
        b.add("quantization", "not-working", "Q1", b.pitfalls["weight-only-quantization"].explanation)
    else:
        b.by_state("quantization", "Q1", weights_quantized, _needed(a, "no"))
    _parallel_layout(b, parallel, None if a.answer == "unknown" else False)
    _scale_out_from_decode(b, a)


def _parallel_layout(b: _Branches, parallel: bool | None, needed: bool | None) -> None:
    """Parallelism on a model that fits: pipeline stages where tensor parallelism would serve the
    latency goal is the layout to fix (llm_diagnose.diagnose.tree.pipeline); otherwise the common rule."""
    pipeline, why, question = pipeline_for_latency(b.reading(), b.answers["Q5"], b.slo)
    if why:  # pipeline stages are on: the path says whether they are the layout to fix
        b.step("Q1.pipeline-where-tensor-fits", pipeline, why)
    if pipeline:
        conf = min(b.answers[question].confidence, b.th["confidence.config"])
        b.add("parallelism", "not-working", question, why, conf)
    else:
        b.by_state("parallelism", "Q1", parallel, needed)


def _scale_out_reason(b: _Branches, a: Answer, kv_q: bool | None) -> str:
    reason = f"{a.rationale}: add replicas (size them with llm-diagnose plan) or cap admission (--max-num-seqs)"
    if not kv_q:
        reason += "; KV-cache quantization (--kv-cache-dtype fp8) holds about twice the tokens as a capacity lever"
    r = b.reading()
    bound, at = roofline_at(r, r.num(Q.RUNNING_MEAN))
    if bound == "compute":
        reason += f"; decode is already compute-bound at batch {at}, so only more replicas add throughput"
    return reason


def _scale_out_from_decode(b: _Branches, q1: Answer) -> None:
    """Slow tokens at a compute-bound batch also call for fewer sequences per step or more devices."""
    q5 = b.answers["Q5"]
    regime, why = decode_regime(b.reading())
    # Where prefills stretch the decode steps (Q6), tune prefill scheduling before adding replicas.
    if q5.answer == "yes" and regime == "compute" and b.answers["Q6"].answer != "yes":
        b.add(
            "scale-out",
            "recommended",
            "Q5",
            f"{q5.rationale}; {why}: run fewer sequences per step "
            "(--max-num-seqs) or spread the load over more replicas or devices",
        )
    elif q1.answer == "unknown":
        b.add("scale-out", "unknown", "Q1", f"{q1.title} could not be answered: {q1.rationale}")
    else:
        b.add("scale-out", "not-indicated", "Q1", q1.rationale)


def _q2(b: _Branches) -> None:
    a = b.answers["Q2"]
    caching, how = b.on(Q.PREFIX_CACHING)
    b.step("Q2.prefix-caching-on", caching, "" if how == "seen" else how)
    layout = [p for p in ("dynamic-prefix", "unstable-serialization") if b.detected(p)]
    if a.answer == "no" and layout:
        # The workload shares content the cache cannot see yet: fix the prompts, then cache.
        b.step("Q2.prompt-layout-defeats-cache", True, ", ".join(layout))
        b.add(
            "prefix-caching",
            "not-working" if caching else "recommended",
            "Q2",
            f"prompts share content but not exact prefixes ({', '.join(layout)}): fix the prompt layout, "
            "then the prefix cache can serve it",
        )
        return
    if caching and judge_cache_apart(b):
        return
    hit = b.ev.measurement(Q.PREFIX_HIT_RATE)
    potential = b.ev.measurement(Q.PREFIX_POTENTIAL)
    working: bool | None = None
    unverified = "its live hit rate was not measured"
    if caching and hit is not None:
        # Exactly 0 with no lookups counted beside it: a gauge that reads 0, or no hits? It cannot say.
        gauge_zero = hit.value == 0.0 and b.ev.measurement(Q.PREFIX_QUERIED_TOKENS) is None
        if potential is not None and potential.value > 0 and not gauge_zero:
            working = hit.value >= potential.value * b.th["q2.working_ratio"]
        elif potential is None and hit.value <= b.th["q2.dead_hit_rate"]:
            unverified = (
                f"it hits {hit.value:.1%} of lookups and there is no trace to compare with: the workload may "
                "share nothing, or a varying head defeats the cache (give --trace FILE)"
            )
        elif gauge_zero:
            unverified = (
                f"its hit rate reads {hit.value:.1%} with no lookup counts beside it: an engine gauge of the "
                "last batch (SGLang cache_hit_rate) cannot show hits; hit and query counters, or the active "
                "prefix experiment (--active), would"
            )
        else:
            working = hit.value > 0
        b.step(
            "Q2.hit-rate-reaches-potential",
            working,
            f"live {hit.value:.0%}" + (f" of a possible {potential.value:.0%}" if potential is not None else ""),
        )
    if caching and working is None and hit is not None:
        b.add("prefix-caching", "on-unverified", "Q2", f"on, but {unverified}")
        return
    if caching and working is False and not layout:
        if b.answers["KV"].answer == "yes":
            b.add(
                "prefix-caching",
                "in-place",
                "Q2",
                "on; hits fall short of the workload's reuse only because the "
                "cache is too small to keep it until reuse (see kv-offload)",
            )
            return
        if b.ev.fact(Q.KV_OFFLOAD) is True:
            b.add(
                "prefix-caching",
                "on-unverified",
                "Q2",
                "on; the local hit rate falls short of the workload's "
                "reuse, but KV offload serves part of it outside that counter (see kv-offload)",
            )
            return
    broken = ", ".join(layout) if layout else "hits fall short of the workload's reuse (see KV offload)"
    b.by_state(
        "prefix-caching",
        "Q2",
        caching,
        _needed(a, "yes"),
        working,
        broken_why=f"it is on, but {broken}",
        unverified_why=unverified,
        default_why=how,
    )


def _q3(b: _Branches) -> None:
    a = b.answers["Q3"]
    cb, how = b.on(Q.CONTINUOUS_BATCHING)
    b.step("Q3.continuous-batching-on", cb)
    working = a.verdict != "short-waits-for-long"
    b.by_state(
        "continuous-batching",
        "Q3",
        cb,
        _needed(a, "yes"),
        working,
        broken_why="it is reported on, yet short requests wait for long ones",
        default_why=how,
    )


def _q4(b: _Branches) -> None:
    a = b.answers["Q4"]
    paged, how = b.on(Q.PAGED_KV)
    b.step("Q4.paged-kv-on", paged)
    b.by_state(
        "paged-attention",
        "Q4",
        paged,
        _needed(a, "yes"),
        working=not paged,
        broken_why="the KV cache is paged, yet much of it holds no token: check the block size",
        default_why=how,
    )


# Provenance methods of the live /metrics window (llm_diagnose.probes.metrics.passive), as opposed to an
# active experiment, a trace or a hand-built value.
_LIVE_METHODS = ("prometheus", "scrape-loop", "metric-")


def _idle_live_answers(ev: Evidence, th: Thresholds, answers: Mapping[str, Answer]) -> frozenset[str]:
    """On a near-idle server (signals.load_level, whatever Q1 could say), the questions answered
    only from the live window: a window without demand shows how one request went, not how the
    server serves."""
    if load_level(Reading(ev, th))[0] != "idle":
        return frozenset()

    def live(key: str) -> bool:
        r = ev.items.get(key)
        prov = getattr(r, "provenance", None)
        return prov is not None and prov.method.startswith(_LIVE_METHODS)

    return frozenset(q for q, a in answers.items() if a.evidence and all(live(k) for k in a.evidence))


def diagnose(evidence: Evidence, thresholds: Thresholds | None = None, *, slo: SLO | None = None) -> Diagnosis:
    th = thresholds or Thresholds()
    slo = slo or SLO()
    sanity = sanity_check(evidence, th)
    answers = {a.question: a for a in lower_confidence(ask_all(evidence, th, slo), sanity, th)}
    pitfalls = doubt_pitfalls(check_all(evidence, th, answers), sanity)
    b = _Branches(evidence, th, answers, {p.pitfall: p for p in pitfalls}, slo)
    path: list[Step] = []
    for q, walk in (
        ("Q1", _q1),
        ("Q2", _q2),
        ("Q3", _q3),
        ("Q4", _q4),
        ("Q5", walk_q5),
        ("Q6", late.q6),
        ("KV", late.kv),
        ("OB", late.ob),
    ):
        b.steps = []
        walk(b)
        path.append(Step(q, answers[q].answer, answers[q].rationale))
        path.extend(b.steps)
    b.recs = doubt_recommendations(b.recs, answers, sanity)
    engine = evidence.fact(Q.ENGINE_NAME)
    digest = hashlib.sha256(evidence.to_json().encode()).hexdigest()
    checks = slo.check_evidence(evidence)
    kind, subject, line = headline(
        b.recs,
        answers,
        pitfalls,
        checks,
        th["confidence.headline_min"],
        _idle_live_answers(evidence, th, answers),
        b.findings,
    )
    if kind == "none-found" and sanity:
        # "Nothing found" must not read as "all is well" when some evidence was set aside as impossible.
        line += f"; doubtful evidence set aside ({', '.join(sorted({f.key for f in sanity}))}): see sanity findings"
    return Diagnosis(
        engine=str(engine) if engine else "unknown",
        bottleneck=line,
        answers=tuple(answers.values()),
        path=tuple(path),
        recommendations=tuple(b.recs),
        pitfalls=pitfalls,
        thresholds=tuple(sorted(th.values.items())),
        evidence_digest=digest,
        target=evidence.target.url or evidence.target.label,
        slo=slo,
        slo_checks=checks,
        headline_kind=kind,
        headline_subject=subject,
        sanity=sanity,
    )
