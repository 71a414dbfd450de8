"""The decision tree: evidence in, a diagnosis out, with the path it took.

Every question is answered (real systems combine techniques); then each question's branch
decides the status of its techniques, looking at what the engine already runs:

- recommended: the tree says it would help and it is not on;
- in-place: it is on and the evidence says it works (or that nothing asks more of it);
- not-working: it is on but the evidence says it does not help (a pitfall says why);
- not-indicated: nothing calls for it; unknown: the question could not be answered.

Recommendations keep the tree's order: Q1, Q2, ..., Q6, then KV offload and offline batch.
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
from typing import Mapping

from diagnose.diagnosis import Answer, Diagnosis, PitfallCheck, Recommendation, Step
from diagnose.evidence import Evidence
from diagnose.pitfalls import QUANTIZED_KV_PREFIXES, check_all
from diagnose.questions import ask_all, slo_stalls_note
from diagnose.slo import SLO, ObjectiveCheck
from diagnose.techniques import CATALOGUE
from diagnose.thresholds import Thresholds
from probes import quantities as Q

__all__ = ["diagnose"]


class _Branches:
    """Collects recommendations and path steps while walking each question's branch."""

    def __init__(self, ev: Evidence, th: Thresholds, answers: Mapping[str, Answer],
                 pitfalls: Mapping[str, PitfallCheck], slo: SLO = SLO()):
        self.ev = ev
        self.th = th
        self.slo = slo
        self.answers = answers
        self.pitfalls = pitfalls
        self.recs: list[Recommendation] = []
        self.steps: list[Step] = []

    def step(self, node: str, outcome: bool | None, note: str = "") -> None:
        self.steps.append(Step(node, {True: "yes", False: "no", None: "unknown"}[outcome], note))

    def on(self, key: str) -> bool | None:
        value = self.ev.fact(key)
        return value if isinstance(value, bool) else None

    def detected(self, pitfall: str) -> bool:
        return bool(self.pitfalls[pitfall].detected)

    def add(self, technique: str, status: str, question: str, reason: str) -> None:
        t = CATALOGUE[technique]
        self.recs.append(Recommendation(
            technique=technique, status=status, question=question, reason=reason,  # type: ignore[arg-type]
            settings=t.settings, expect=t.expect, confidence=self.answers[question].confidence,
        ))

    def by_state(self, technique: str, question: str, enabled: bool | None, needed: bool | None,
                 working: bool | None = True, why: str = "", broken_why: str = "") -> None:
        """The common rule: status from (is it needed, is it on, does it work)."""
        a = self.answers[question]
        if needed is None:
            self.add(technique, "unknown", question, f"{a.title} could not be answered: {a.rationale}")
        elif needed:
            if enabled is False or enabled is None:
                suffix = "" if enabled is False else " (if it is not on already: the configuration was not visible)"
                self.add(technique, "recommended", question, (why or a.rationale) + suffix)
            elif working is False:
                self.add(technique, "not-working", question, broken_why or "it is on, but the evidence says it does not help")
            else:
                self.add(technique, "in-place", question, "already on and working")
        elif enabled:
            self.add(technique, "in-place", question, "on; nothing in the evidence asks more of it")
        else:
            self.add(technique, "not-indicated", question, a.rationale)


def _needed(answer: Answer, trigger: str) -> bool | None:
    return None if answer.answer == "unknown" else answer.answer == trigger


def _q1(b: _Branches) -> None:
    a = b.answers["Q1"]
    quant = b.ev.fact(Q.WEIGHT_QUANTIZATION)
    kv_dtype = str(b.ev.fact(Q.KV_CACHE_DTYPE) or "")
    weights_quantized = None if quant is None else str(quant).lower() not in ("none", "")
    kv_quantized = kv_dtype.lower().startswith(QUANTIZED_KV_PREFIXES) if kv_dtype else None
    if a.verdict == "does-not-fit":
        b.step("Q1.fits-one-device", False, a.rationale)
        b.add("parallelism", "recommended", "Q1", "the weights do not fit one device: split them across devices")
        b.add("quantization", "in-place" if weights_quantized else "recommended", "Q1",
              "already quantized" if weights_quantized else "fewer bytes per weight may fit fewer devices")
        return
    b.step("Q1.fits-one-device", None if a.answer == "unknown" else True)
    fully = bool(weights_quantized) and bool(kv_quantized)
    if a.answer == "no":
        b.step("Q1.already-quantized", weights_quantized, f"weights: {quant}, KV cache: {kv_dtype or 'not observed'}")
        if b.detected("weight-only-quantization"):
            b.add("quantization", "not-working", "Q1", b.pitfalls["weight-only-quantization"].explanation)
        elif fully:
            b.add("quantization", "in-place", "Q1", "weights and KV cache are already quantized")
            b.add("parallelism", "recommended", "Q1", a.rationale + "; already quantized, so spread over more devices")
            return
        else:
            part = "the KV cache" if weights_quantized else "weights and KV cache"
            b.add("quantization", "recommended", "Q1", f"{a.rationale}: quantize {part} for room to spare")
        b.add("parallelism", "not-indicated", "Q1", "the weights fit one device: fewer bytes come before more devices")
    else:
        b.by_state("quantization", "Q1", weights_quantized, _needed(a, "no"))
        b.by_state("parallelism", "Q1", enabled=False, needed=None if a.answer == "unknown" else False)


def _q2(b: _Branches) -> None:
    a = b.answers["Q2"]
    caching = b.on(Q.PREFIX_CACHING)
    b.step("Q2.prefix-caching-on", caching)
    layout = [p for p in ("dynamic-prefix", "unstable-serialization") if b.detected(p)]
    if a.answer == "no" and layout:
        # The workload shares content the cache cannot see yet: fix the prompts, then cache.
        b.step("Q2.prompt-layout-defeats-cache", True, ", ".join(layout))
        status = "not-working" if caching else "recommended"
        b.add("prefix-caching", status, "Q2",
              f"prompts share content but not exact prefixes ({', '.join(layout)}): fix the prompt layout, "
              "then the prefix cache can serve it")
        return
    hit = b.ev.measurement(Q.PREFIX_HIT_RATE)
    potential = b.ev.measurement(Q.PREFIX_POTENTIAL)
    working: bool | None = None
    if caching and hit is not None:
        if potential is not None and potential.value > 0:
            working = hit.value >= potential.value * b.th["q2.working_ratio"]
        else:
            working = hit.value > 0
        b.step("Q2.hit-rate-reaches-potential", working,
               f"live {hit.value:.0%}" + (f" of a possible {potential.value:.0%}" if potential is not None else ""))
    broken = ", ".join(layout) if layout else "hits fall short of the workload's reuse (see KV offload)"
    b.by_state("prefix-caching", "Q2", caching, _needed(a, "yes"), working, broken_why=f"it is on, but {broken}")


def _q3(b: _Branches) -> None:
    a = b.answers["Q3"]
    cb = b.on(Q.CONTINUOUS_BATCHING)
    b.step("Q3.continuous-batching-on", cb)
    working = False if a.verdict == "short-waits-for-long" else True
    b.by_state("continuous-batching", "Q3", cb, _needed(a, "yes"), working,
               broken_why="it is reported on, yet short requests wait for long ones")


def _q4(b: _Branches) -> None:
    a = b.answers["Q4"]
    paged = b.on(Q.PAGED_KV)
    b.step("Q4.paged-kv-on", paged)
    b.by_state("paged-attention", "Q4", paged, _needed(a, "yes"), working=False if paged else True,
               broken_why="the KV cache is paged, yet much of it holds no token: check the block size")


def _q5(b: _Branches) -> None:
    a = b.answers["Q5"]
    spec = b.on(Q.SPEC_DECODE)
    b.step("Q5.spec-decode-on", spec)
    low = b.detected("spec-decode-low-acceptance")
    if spec:
        b.step("Q5.acceptance-high", not low, b.pitfalls["spec-decode-low-acceptance"].explanation)
    why = a.rationale + "; try speculative decoding and keep it only if acceptance is high (>= 50%)"
    # Spec decoding that is on with low acceptance is a pitfall whatever Q5 says: it slows decode.
    needed = True if (spec and low) else _needed(a, "yes")
    b.by_state("speculative-decoding", "Q5", spec, needed, working=not low, why=why,
               broken_why=b.pitfalls["spec-decode-low-acceptance"].explanation)


def _q6(b: _Branches) -> None:
    a = b.answers["Q6"]
    chunked = b.on(Q.CHUNKED_PREFILL)
    pd = b.on(Q.PD_DISAGGREGATION)
    b.step("Q6.chunked-prefill-on", chunked)
    breaks, note = slo_stalls_note(b.ev, b.slo)
    if note and a.answer == "yes":
        b.step("Q6.stalls-break-slo", breaks, note)
    needed = _needed(a, "yes")
    b.by_state("chunked-prefill", "Q6", chunked, needed)
    inflation = b.ev.measurement(Q.ITL_INFLATION)
    if pd:
        overhead = b.detected("disaggregation-overhead")
        b.add("pd-disaggregation", "not-working" if overhead else "in-place", "Q6",
              b.pitfalls["disaggregation-overhead"].explanation if overhead else "on; no transfer overhead measured")
        return
    still = needed and chunked and inflation is not None and inflation.value >= b.th["q6.disagg_inflation"]
    b.step("Q6.contention-survives-chunking", bool(still) if (needed and chunked) else None)
    if still:
        b.add("pd-disaggregation", "recommended", "Q6",
              f"chunked prefill is on and streams still slow {inflation.value:.1f}x during prefills: at scale, "
              "separate prefill and decode instances")
    elif needed is None:
        b.add("pd-disaggregation", "unknown", "Q6", a.rationale)
    else:
        b.add("pd-disaggregation", "not-indicated", "Q6",
              "enable chunked prefill first" if needed else a.rationale)


def _kv(b: _Branches) -> None:
    a = b.answers["KV"]
    offload = b.on(Q.KV_OFFLOAD)
    b.step("KV.offload-on", offload)
    b.by_state("kv-offload", "KV", offload, _needed(a, "yes"), working=False if offload else True,
               broken_why="offload is on, yet reuse is still lost at capacity: enlarge the offload tier")


def _ob(b: _Branches) -> None:
    a = b.answers["OB"]
    b.by_state("offline-batch", "OB", None if a.answer == "yes" else False, _needed(a, "yes"),
               why="nobody waits: run it as an offline batch job at maximum throughput")


def _bottleneck(recs: list[Recommendation], answers: Mapping[str, Answer],
                checks: tuple[ObjectiveCheck, ...] = ()) -> str:
    first = next((r for r in recs if r.status in ("recommended", "not-working")), None)
    if first is None:
        unknown = [q for q, a in answers.items() if a.answer == "unknown"]
        tail = f"; {len(unknown)} question(s) could not be answered: {', '.join(unknown)}" if unknown else ""
        broken = [c.objective.label for c in checks if c.met is False]
        if broken:  # nothing the tree knows fixes it, but the reader must not take "none" for "all is well"
            tail += f"; yet the SLO breaks ({', '.join(broken)})"
        return "no bottleneck found among the questions answered" + tail
    a = answers[first.question]
    verb = "fix" if first.status == "not-working" else "use"
    return f"{first.question}: {a.rationale} -> {verb} {first.technique}"


def diagnose(evidence: Evidence, thresholds: Thresholds | None = None, *, slo: SLO | None = None) -> Diagnosis:
    th = thresholds or Thresholds()
    slo = slo or SLO()
    answers = {a.question: a for a in ask_all(evidence, th, slo)}
    pitfalls = check_all(evidence, th, answers)
    b = _Branches(evidence, th, answers, {p.pitfall: p for p in pitfalls}, slo)
    path: list[Step] = []
    for q, walk in (("Q1", _q1), ("Q2", _q2), ("Q3", _q3), ("Q4", _q4), ("Q5", _q5),
                    ("Q6", _q6), ("KV", _kv), ("OB", _ob)):
        b.steps = []
        walk(b)
        path.append(Step(q, answers[q].answer, answers[q].rationale))
        path.extend(b.steps)
    engine = evidence.fact(Q.ENGINE_NAME)
    digest = hashlib.sha256(evidence.to_json().encode()).hexdigest()
    checks = slo.check_evidence(evidence)
    return Diagnosis(
        engine=str(engine) if engine else "unknown",
        bottleneck=_bottleneck(b.recs, answers, checks),
        answers=tuple(answers.values()),
        path=tuple(path),
        recommendations=tuple(b.recs),
        pitfalls=pitfalls,
        thresholds=tuple(sorted(th.values.items())),
        evidence_digest=digest,
        target=evidence.target.url or evidence.target.label,
        slo=slo,
        slo_checks=checks,
    )
