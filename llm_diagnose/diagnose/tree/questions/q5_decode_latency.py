"""Q5: is per-token decode latency the main complaint, and what in each token's time is it?

The question (`ask_q5`) answers whether tokens arrive too slowly: against the SLO's ITL
objective where one is declared, else against the fixed q5.max_itl_* thresholds; a starved
client's gaps can say "fast enough" but never "slow".

The branch (`walk_q5`) decides speculative decoding by cause, from where the served time per
token goes (llm_diagnose.diagnose.tree.time_per_token: the hardware's step, dispatch, the
engine's overhead above the step, delivery):

- speculative decoding on: judged by whether its drafts pay (llm_diagnose.diagnose.tree.speculative);
- a slow tail from prefills stalling decode: that is Q6 (chunked prefill), not drafts;
- an overloaded server: capacity first (scale-out), drafts would take KV slots;
- growth with concurrency beyond what batching explains (q5.sharp_itl_growth): a pathology or
  contention to investigate, not a technique;
- decode compute-bound at a large batch: drafts compete for compute (scale-out);
- the served gap close to a memory-bound step (q5.step_close_ratio): speculative decoding, as
  far as the drafts are accepted;
- above it (q5.step_far_ratio: far above): the overhead, with its likely sources in order and
  what tells them apart; never speculative decoding or quantization, which shorten the step;
- the step not measured: inconclusive, with what would settle it (`llm-diagnose microbench`).

Findings no technique of the catalogue fixes (overhead, a pathology, an open cause) go to the
headline as `investigate` (Branches.findings).
"""

from __future__ import annotations

from dataclasses import replace

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.controlled import preferred
from llm_diagnose.diagnose.tree.declared import (
    UNDECLARED,
    objective_labels,
    slo_comparison,
    workload_interactive,
)
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import devices
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.speculative import decode_regime
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.diagnose.tree.time_per_token import Decomposition, decompose, ms, sharp_growth
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement

__all__ = ["TITLE", "ask_q5", "walk_q5", "MEASURE_THE_STEP", "QUESTION"]

TITLE = "Is per-token decode latency the main complaint?"
# What settles a cause the tree cannot tell without the hardware's step.
MEASURE_THE_STEP = (
    "measure the decode step on the serving host: `llm-diagnose microbench --config <model>/config.json --run RUN "
    "--out mb` (random weights of the model's shapes, at the run's batch and context; CUDA graphs on a GPU), "
    "then `llm-diagnose decide RUN mb`"
)


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q5", TITLE, answer, confidence, rationale, verdict)


# --- the question ------------------------------------------------------------------------------
# A median gap below this is tokens read in one bunch, not a step (the decode experiment's own
# "arrived whole" rule: every gap under 50 us).
BUNCHED_GAP_S = 50e-6


def _bunched_to_engine(ev: Evidence) -> Evidence:
    """The evidence with the decode experiment's batch-1 median replaced by the engine's own mean ITL
    over the same phase where the client read the tokens in bunches: a median gap of 0 is no time per
    token, and judged as one it meets any objective (CI, a busy host: client median 0 ms over 189 gaps,
    67% under 50 us; vLLM's mean ITL over the phase 6.8 ms)."""
    m, engine = ev.measurement(Q.DECODE_BATCH1_ITL_P50), ev.measurement(Q.DECODE_SERVER_ITL_MEAN)
    if m is None or engine is None or engine.value <= 0 or not m.provenance.method.startswith("active-probe/decode"):
        return ev
    if m.value > BUNCHED_GAP_S:
        return ev
    note = (
        f"the engine's own mean ITL over the decode experiment's batch-1 phase: the client's median gap was "
        f"{m.value * 1e6:.0f} us, tokens read in bunches"
    )
    return ev.with_items({Q.DECODE_BATCH1_ITL_P50: Measurement(engine.value, "s", engine.provenance, note=note)})


def ask_q5(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> Answer:
    """Q5, where a starved client's token gaps can say "fast enough" but never "slow": its
    lateness only stretches the gaps it saw (and bundles tokens), so "slow" may be its own. A median
    of bunched gaps (about 0) says nothing either: the engine's own mean ITL stands in for it."""
    ev = _bunched_to_engine(ev)
    answer = _ask_q5(ev, th, slo)
    if answer.answer != "yes":
        return answer
    r = Reading(ev, th)
    k50 = preferred(ev, Q.ITL_P50)
    untrusted = r.disbelieved(k50, preferred(ev, Q.ITL_P99))
    if untrusted is None:
        return answer
    # Unless the engine's own histogram over the same batch-1 phase says as much: then the slowness
    # is the server's, whatever the client's lateness (CI, a 100%-busy host: client median 7.4 ms,
    # vLLM's mean ITL over the phase 7.8 ms).
    p50, engine = r.num(k50), r.num(Q.DECODE_SERVER_ITL_MEAN)
    if p50 and engine is not None and r.compare(Q.DECODE_SERVER_ITL_MEAN, engine / p50, ">=", "q5.engine_confirms"):
        return replace(
            answer,
            rationale=f"{answer.rationale}; the client was starved, but the engine's own mean ITL over the same "
            f"phase ({engine * 1e3:.1f} ms) says as much",
        )
    return r.inconclusive("Q5", TITLE, f"whether tokens arrive slowly: {untrusted}")


def _ask_q5(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> Answer:
    r = Reading(ev, th)
    interactive, who = workload_interactive(ev, slo)
    if interactive is False:
        if slo.interactive is None:
            r.flag(Q.INTERACTIVE)  # the fact it was decided by, in the answer's evidence
        return _answer(
            r,
            "no",
            r.conf("direct"),
            f"nobody waits for single responses, {who}: per-token latency is no one's complaint, throughput is",
            "offline",
        )
    k50, k99 = preferred(ev, Q.ITL_P50), preferred(ev, Q.ITL_P99)  # the controlled figure where measured
    p50 = r.num(k50)
    p99 = r.num(k99)
    share = r.num(Q.DECODE_TIME_SHARE)
    if slo.for_metric("itl"):
        return _q5_against_slo(r, slo, share)
    if p50 is None and p99 is None:
        return _answer(r, "unknown", 0.0, "inter-token latency was not measured")
    slow_median = p50 is not None and r.compare(k50, p50, ">", "q5.max_itl_p50_s")
    slow_tail = p99 is not None and r.compare(k99, p99, ">", "q5.max_itl_p99_s")
    decode_dominates = None if share is None else r.compare(Q.DECODE_TIME_SHARE, share, ">=", "q5.min_decode_share")
    quality = r.quality(k50, k99)
    basis = " (against the fixed thresholds q5.max_itl_*: no ITL objective declared)"
    # In milliseconds for the text; each figure quoted below is one that was measured.
    p50_ms, p99_ms = (None if p50 is None else p50 * 1e3), (None if p99 is None else p99 * 1e3)
    if (slow_median or slow_tail) and decode_dominates is not False:
        what = f"median {p50_ms:.0f} ms" if slow_median else f"p99 {p99_ms:.0f} ms"
        conf = (r.conf("counters") if decode_dominates else r.conf("proxy")) * quality
        return _answer(r, "yes", conf, f"tokens arrive slowly ({what} between tokens){basis}")
    if slow_median or slow_tail:
        return _answer(
            r,
            "no",
            r.conf("proxy") * quality,
            f"decode is slow but only {share:.0%} of request time is decode: prefill or queueing dominate{basis}",
        )
    shown = f"{p50_ms:.1f} ms median" if p50_ms is not None else f"{p99_ms:.1f} ms p99"
    return _answer(r, "no", r.conf("counters") * quality, f"inter-token latency is within target ({shown}){basis}")


def _q5_against_slo(r: Reading, slo: SLO, share: float | None) -> Answer:
    """Q5 with a declared ITL objective: does decode latency break it? The decode share of
    request time does not overrule a broken ITL objective (the objective is about decode
    itself), it only says how much of the end-to-end latency a faster decode would win."""
    checks = slo.check_evidence(r.evidence, ("itl",))
    for c in checks:
        slo_comparison(r, c)
    broken = [c for c in checks if c.met is False]
    unjudged = [c for c in checks if c.met is None]
    keys = [c.evidence for c in checks if c.evidence]
    quality = r.quality(*keys) if keys else 0.0
    direct = all(not c.bound for c in checks if c.met is not None)
    if broken:
        conf = (r.conf("direct") if direct else r.conf("config")) * quality
        tail = ""
        if share is not None and share < r.thresholds["q5.min_decode_share"]:
            tail = f"; decode is only {share:.0%} of request time, so end-to-end latency gains less"
            conf *= r.conf("disagreement")
        return _answer(
            r,
            "yes",
            conf,
            f"decode latency breaks the SLO's ITL objective: {objective_labels(broken)}{tail}",
            "slo-broken",
        )
    if unjudged:
        return _answer(
            r,
            "unknown",
            0.0,
            "the SLO's ITL objective could not be judged from the evidence: "
            + "; ".join(f"{c.objective.label}: {c.how}" for c in unjudged)
            + " (measure every gap with --active; the fixed q5 thresholds are not used when an ITL "
            "objective is declared)",
            "slo-not-judged",
        )
    return _answer(
        r,
        "no",
        (r.conf("direct") if direct else r.conf("config")) * quality,
        f"inter-token latency meets the SLO's ITL objective: {objective_labels(checks)}",
        "slo-met",
    )


# --- the branch --------------------------------------------------------------------------------
def _prefill_stalls(b: Branches) -> bool:
    """The slow part is the tail, while Q6 (measured, not passive) finds prefills stalling decode."""
    q6 = b.answers["Q6"]
    p50 = b.num(preferred(b.ev, Q.ITL_P50))
    median_ok = p50 is not None and p50 <= b.th["q5.max_itl_p50_s"]
    return q6.answer == "yes" and q6.verdict not in ("passive",) and median_ok


def _record(b: Branches, d: Decomposition, spec: bool | None) -> None:
    """The decomposition on the path: the step it rests on, then each comparison it makes."""
    th = b.th
    if d.served_s is None:
        return
    over = d.over_step
    if spec and over is not None:
        b.step(
            "Q5.step-measured",
            None,
            f"{d.step_basis}; not compared: speculative decoding is on, so a served gap spans a verify step "
            "shared by several tokens, not one plain step",
        )
        over = None
    else:
        b.step(
            "Q5.step-measured",
            over is not None,
            d.step_basis if over is not None else (d.mismatch or "no decode step of this model was measured"),
        )
    if over is not None:
        close, far = th["q5.step_close_ratio"], th["q5.step_far_ratio"]
        b.step(
            "Q5.served-close-to-step",
            over <= close,
            f"served / {d.step_kind} = {over:.3g} (q5.step_close_ratio {close:g}, q5.step_far_ratio {far:g}); "
            + d.text(),
        )
    elif d.parts and not spec:
        b.step("Q5.time-per-token", None, d.text())
    if d.delivery_ratio is not None:
        b.step(
            "Q5.delivery-gap",
            d.delivery_ratio >= th["q5.min_delivery_ratio"],
            f"client mean gap / the engine's mean ITL = {d.delivery_ratio:.3g} "
            f"(q5.min_delivery_ratio {th['q5.min_delivery_ratio']:g})",
        )
    sharp, reading = sharp_growth(d, th)
    if sharp is not None:
        b.step("Q5.sharp-growth-with-concurrency", sharp, reading)
    if d.tail_ratio is not None and d.tail_ratio >= th["q5.stall_tail_ratio"]:
        b.step(
            "Q5.tail-above-median",
            True,
            f"p99 gap is {d.tail_ratio:.3g}x the median (q5.stall_tail_ratio {th['q5.stall_tail_ratio']:g}): "
            f"stalls; Q6 says: {b.answers['Q6'].rationale}",
        )


def _suspects(b: Branches, d: Decomposition) -> tuple[list[str], list[str]]:
    """The likely sources of the overhead above the step, in order, each with what tells it apart:
    first those a measurement points at, then in the order real reports found them (issue 25),
    then what a measurement rules out."""
    close = b.th["q5.step_close_ratio"]
    seen: list[str] = []
    likely: list[str] = []
    ruled_out: list[str] = []
    graphs = (
        "per-step dispatch: CUDA graphs off or not covering this batch, or on a CPU the step not compiled (vLLM "
        "replays graphs and compiles the step unless --enforce-eager is set; SGLang replays them unless "
        "--disable-cuda-graph, up to --cuda-graph-max-bs)"
    )
    dispatch = d.part("dispatch") or d.part("dispatch and kernels above the floor")
    if d.eager_s is not None and d.served_s is not None and d.served_s * close < d.eager_s:
        ruled_out.append(f"eager dispatch (the served gap is well below the eager step, {ms(d.eager_s)})")
    elif d.eager_s is not None and d.served_s is not None and d.served_s <= close * d.eager_s and dispatch:
        seen.append(
            f"{graphs}: the served gap ({ms(d.served_s)}) is near the eager step ({ms(d.eager_s)}), and the "
            f"{dispatch.name} is {dispatch.share:.0%} of it"
        )
    elif d.eager_s is not None:
        likely.append(f"{graphs} (tell: the served gap near the eager step, {ms(d.eager_s)})")
    else:
        likely.append(f"{graphs} (tell: the served gap near the eager step, far above the graph-replayed one)")
    likely.append(
        "structured output (response_format, guided_json, tool-call grammars): the grammar's token mask is "
        "computed on the CPU for every token (tell: the same requests without it)"
    )
    likely.append(
        "LoRA adapters (vLLM --enable-lora): extra kernels in every layer for requests naming an adapter "
        "(tell: the same requests against the base model)"
    )
    delivery = "the API server's CPU: detokenizing and streaming every stream (vLLM --api-server-count spreads it)"
    ratio = d.delivery_ratio
    if ratio is not None and ratio >= b.th["q5.min_delivery_ratio"]:
        seen.insert(0, f"{delivery}: the engine's own ITL histogram sees {1 / ratio:.0%} of the client's gap")
    elif ratio is not None:
        ruled_out.append(f"the API server (the engine's ITL agrees with the client's gap: ratio {ratio:.2f})")
    else:
        likely.append(f"{delivery} (tell: the engine's ITL histogram below the client's gap, --active)")
    tp = b.num(Q.TENSOR_PARALLEL)
    n_dev, _ = devices(b.reading())
    width = int(max(tp or 1.0, n_dev or 1.0))
    if width > 1:
        # The per-device step holds no all-reduce: with TP it is a suspect before the others.
        likely.insert(
            0,
            f"the tensor-parallel interconnect: each step all-reduces twice per layer across {width} devices, "
            "which the per-device step does not hold; over PCIe without P2P (nvidia-smi topo -m: PHB/SYS, "
            "NCCL_P2P_DISABLE) that is milliseconds (tell: the served gap at TP 1, or NCCL's share of a profile)",
        )
    elif tp is not None:
        ruled_out.append("the tensor-parallel interconnect (TP 1)")
    likely.append(
        "a Python-side sampler (repetition/frequency penalties, logits processors, logprobs) (tell: the same "
        "requests without those parameters)"
    )
    return seen + likely, ruled_out


def _in_order(b: Branches, d: Decomposition) -> str:
    """The suspects numbered, then what a measurement rules out."""
    ordered, ruled_out = _suspects(b, d)
    text = "; ".join(f"{i}) {s}" for i, s in enumerate(ordered, 1))
    return text + (f"; not it: {', '.join(ruled_out)}" if ruled_out else "")


def _first(b: Branches, d: Decomposition) -> str:
    return f"most likely {_suspects(b, d)[0][0]} (the others in order: see speculative-decoding)"


def _overhead(b: Branches, a: Answer, d: Decomposition, over: float, far: bool) -> None:
    hw = d.part("hardware step")
    share = f"{hw.share:.0%}" if hw is not None else "?"
    how = "far above" if far else "above"
    line = (
        f"{a.rationale}; the served gap is {over:.3g}x the {d.step_kind} ({how} it: the hardware's step is "
        f"{share} of each token's time, {d.text()})"
    )
    b.add(
        "speculative-decoding",
        "not-indicated",
        "Q5",
        f"{line}: speculative decoding and quantization shorten the step, which is not where the time goes; "
        f"find the overhead, likely sources in order: {_in_order(b, d)}",
    )
    b.findings.append(("Q5", f"{line} -> investigate the overhead above the step, {_first(b, d)}"))


def _unmeasured(b: Branches, a: Answer, d: Decomposition) -> None:
    """Tokens are slow and the hardware's step is not known: say what would settle it, or name
    the part that was measured without it (delivery)."""
    ratio = d.delivery_ratio
    if ratio is not None and ratio >= b.th["q5.min_delivery_ratio"] and d.served_s is not None:
        line = (
            f"{a.rationale}; {1 - 1 / ratio:.0%} of each token's gap is outside the engine (the client's mean gap is "
            f"{ratio:.3g}x the engine's own ITL)"
        )
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{line}: drafts shorten the engine's step, not the path to the client; likely sources in order: "
            f"{_in_order(b, d)}",
        )
        b.findings.append(("Q5", f"{line} -> investigate the delivery path, {_first(b, d)}"))
        return
    why = d.mismatch or "the hardware's decode step for this model was not measured"
    line = (
        f"{a.rationale}; inconclusive whether from the decode step (where speculative decoding helps) or from "
        f"overhead above it (where it cannot): {why}"
    )
    b.add("speculative-decoding", "unknown", "Q5", f"{line}; to settle it: {MEASURE_THE_STEP}")
    b.findings.append(("Q5", f"{line} -> {MEASURE_THE_STEP}"))


def _pathology(b: Branches, a: Answer, d: Decomposition, judged: bool = False) -> None:
    """Gaps grow with concurrency beyond what batching explains: a pathology or contention (`judged`:
    speculative decoding is on and its status was set by its drafts)."""
    line = f"{a.rationale}; tokens slow down with concurrency more than batching explains ({sharp_growth(d, b.th)[1]})"
    if not judged:
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{line}: a kernel or scheduling pathology, or contention, to investigate, not a technique",
        )
    b.findings.append(
        (
            "Q5",
            f"{line} -> a pathology or contention to investigate: profile the engine at two concurrent streams (a "
            "kernel off its fast path at batch > 1, a scheduler stall) and watch the API server's CPU and locks",
        )
    )


def _tail_only(b: Branches, d: Decomposition) -> bool:
    """The median gap is within target and the tail is stalls: the complaint is the tail."""
    p50 = d.served_s
    return (
        p50 is not None
        and p50 <= b.th["q5.max_itl_p50_s"]
        and d.tail_ratio is not None
        and d.tail_ratio >= b.th["q5.stall_tail_ratio"]
    )


def _stalls(b: Branches, a: Answer, d: Decomposition) -> None:
    """Slow tail, fine median, and Q6 did not find prefills stalling decode (that case is `_prefill_stalls`)."""
    q6 = b.answers["Q6"]
    line = f"{a.rationale}; the median gap is fine and the p99 is {d.tail_ratio or 0:.3g}x it: stalls, not the step"
    if q6.answer == "no":
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{line}; not prefills ({q6.rationale}): preemption, a host hiccup or a long step to find; drafts do "
            "not shorten stalls",
        )
        b.findings.append(("Q5", f"{line}; not prefills (Q6) -> investigate preemptions and the host"))
        return
    settle = "the interference experiment (run --active) tells whether prefills cause them (then chunked prefill)"
    b.add("speculative-decoding", "unknown", "Q5", f"{line}; whether prefills cause them is not measured: {settle}")
    b.findings.append(("Q5", f"{line} -> {settle}"))


def walk_q5(b: Branches) -> None:
    a = b.answers["Q5"]
    spec, how = b.on(Q.SPEC_DECODE)
    b.step("Q5.spec-decode-on", spec)
    low = b.detected("spec-decode-low-acceptance")
    pit = b.pitfalls["spec-decode-low-acceptance"]
    regime, regime_why = decode_regime(b.reading())
    b.step("Q5.decode-memory-bound", None if regime is None else regime == "memory", regime_why)
    d = decompose(b.reading())
    _record(b, d, spec)
    # Whatever the batch-1 gaps say, and whether drafts run or not: tokens crawl as soon as streams share the server.
    sharp = bool(sharp_growth(d, b.th)[0])
    if spec:
        _judge_drafts(b, low, pit.explanation, regime, regime_why)
        if sharp:
            _pathology(b, a, d, judged=True)
        return
    need = needed(a, "yes")
    if sharp:
        _pathology(b, a, d)
        return
    if need and _prefill_stalls(b):
        b.step("Q5.tail-from-prefills", True, b.answers["Q6"].rationale)
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{a.rationale}; the median is fine and the slow tail comes from prefills stalling decode (Q6): "
            "chunked prefill fixes that, speculative decoding does not",
        )
        return
    q1 = b.answers["Q1"]
    if need and q1.verdict == "overloaded":
        # Tokens are slow because the server is over capacity (KV full, queueing, preemptions);
        # drafts take KV slots and verify compute of their own, so they would add to the pressure
        # (vLLM's docs scope speculative decoding to medium-to-low QPS, memory-bound serving).
        b.step("Q5.slow-from-overload", True, q1.rationale)
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{a.rationale}; the server is overloaded ({q1.rationale}): drafts would take KV slots and compute "
            "from a full server; add capacity first (see scale-out)",
        )
        return
    if need and _tail_only(b, d):
        _stalls(b, a, d)
        return
    if need and regime == "compute":
        b.add(
            "speculative-decoding",
            "not-indicated",
            "Q5",
            f"{a.rationale}; {regime_why}: drafts would compete for compute and slow decode further: run fewer "
            "sequences per step or add devices (see scale-out)",
        )
        return
    if not need:
        b.by_state("speculative-decoding", "Q5", spec, need, default_why=how)
        return
    over = d.over_step
    if over is None:
        _unmeasured(b, a, d)
        return
    if over >= b.th["q5.step_far_ratio"] or over > b.th["q5.step_close_ratio"]:
        _overhead(b, a, d, over, far=over >= b.th["q5.step_far_ratio"])
        return
    hw = d.part("hardware step")
    caveat = "" if regime else " (the running batch was not measured: at a large batch it would hurt)"
    why = (
        f"{a.rationale}; the served gap is {over:.3g}x the {d.step_kind} (close to it: the hardware's step is "
        f"{hw.share if hw else 1:.0%} of each token's time) and {regime_why or 'decode is memory-bound'}: try "
        f"speculative decoding{caveat}, and keep it only if each verify step yields more tokens than the drafts cost"
    )
    b.by_state("speculative-decoding", "Q5", spec, need, why=why, default_why=how)


def _judge_drafts(b: Branches, low: bool | None, explanation: str, regime: str | None, regime_why: str) -> None:
    """Speculative decoding is on: do its drafts pay?"""
    b.step("Q5.drafts-pay", None if low is None else not low, explanation)
    side_by_side = b.num(Q.SPEC_ITL_SPEEDUP) is not None
    if low:
        b.add("speculative-decoding", "not-working", "Q5", explanation)
    elif low is None:
        counted = (
            b.num(preferred(b.ev, Q.SPEC_ACCEPTANCE_LENGTH)) is not None
            or b.num(preferred(b.ev, Q.SPEC_ACCEPTANCE_RATE)) is not None
        )
        b.add(
            "speculative-decoding",
            "on-unverified",
            "Q5",
            f"on, but whether its drafts pay is not settled: {explanation}"
            if counted
            else "on, but whether its drafts pay was not measured: scrape its acceptance counters over a loaded "
            "window (vLLM spec_decode_*, SGLang spec_accept_length) or measure ITL with it off",
        )
    elif regime == "compute" and not side_by_side:
        b.add(
            "speculative-decoding",
            "on-unverified",
            "Q5",
            f"drafts are accepted ({explanation}), but {regime_why}, where drafts compete for compute: "
            "measure ITL with it off (spec.itl_speedup)",
        )
    else:
        b.add("speculative-decoding", "in-place", "Q5", f"on and working: {explanation}")


QUESTION = Question("Q5", TITLE, ask_q5, walk_q5, reads_slo=True)
