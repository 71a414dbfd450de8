"""Q6: do prefill and decode contend on the same GPU?

The question reads the interference experiment's ITL inflation, else a passive correlation of
ITL with the prompt-token rate, and says whether the SLO's ITL/TTFT objectives break. The
branch knows the scale: when stalls survive chunked prefill, tune the chunk first, and
separate prefill and decode only past q6.disagg_min_devices and q6.disagg_min_prompt_ratio.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.declared import UNDECLARED, objective_labels
from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue, Status
from llm_diagnose.diagnose.tree.disagg import disagg_scale
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.question import Question
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import load_level
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q

__all__ = ["TITLE", "ask_q6", "walk_q6", "QUESTION", "slo_stalls_note"]

TITLE = "Do prefill and decode contend on the same GPU?"


def _answer(r: Reading, answer: AnswerValue, confidence: float, rationale: str, verdict: str = "") -> Answer:
    return r.answer("Q6", TITLE, answer, confidence, rationale, verdict)


def slo_stalls_note(ev: Evidence, slo: SLO) -> tuple[bool | None, str]:
    """Whether the SLO's ITL or TTFT objective breaks (prefill stalls show in both: in the
    gaps of running streams and in the wait of the next prompt), and a phrase saying so.
    (None, "") when neither objective is declared."""
    checks = slo.check_evidence(ev, ("itl", "ttft"))
    if not checks:
        return None, ""
    broken = [c for c in checks if c.met is False]
    if broken:
        return True, f"the SLO breaks ({objective_labels(broken)})"
    if any(c.met is None for c in checks):
        return None, "whether the SLO's ITL/TTFT objectives hold could not be judged"
    return False, f"the SLO's ITL/TTFT objectives hold ({objective_labels(checks)})"


def ask_q6(ev: Evidence, th: Thresholds, slo: SLO = UNDECLARED) -> Answer:
    r = Reading(ev, th)
    breaks, slo_note = slo_stalls_note(ev, slo)

    def said(answer: str, rationale: str) -> str:
        # Contention is a fact of the engine; the SLO says whether its stalls matter to anyone.
        if not slo_note:
            return rationale
        if answer == "yes":
            tail = {
                True: f"; the stalls matter: {slo_note}",
                False: f"; {slo_note}, so the stalls do not break it yet",
                None: f"; {slo_note}",
            }[breaks]
        else:
            tail = f"; {slo_note}" + (", but not from prefill/decode contention" if breaks else "")
        return rationale + tail

    inflation = r.num(Q.ITL_INFLATION)
    corr = r.num(Q.PROMPT_ITL_CORRELATION)
    corr_contend = None if corr is None else r.compare(Q.PROMPT_ITL_CORRELATION, corr, ">=", "q6.min_correlation")
    stalls = r.live(Q.ITL_INFLATION, ">=", "q6.min_itl_inflation") if inflation is not None else None
    if stalls is not None and stalls.holds is None:
        return r.inconclusive("Q6", TITLE, f"whether prefills stall decode: {stalls.why}")
    if stalls is not None:
        contend = bool(stalls.holds)
        conf = r.conf("direct")
        if corr_contend is not None and corr_contend != contend:
            conf *= r.conf("disagreement")
        answer: AnswerValue = "yes" if contend else "no"
        return _answer(
            r,
            answer,
            r.capped(conf, Q.ITL_INFLATION),
            said(answer, f"inter-token latency during prefills was {stalls.shown}x the baseline"),
        )
    if corr is not None:
        # A rank correlation across scrapes is passive: at low load it says nothing, and
        # otherwise it stays a modest signal that asks for the active experiment.
        level, why = load_level(r)
        if level == "idle":
            return _answer(
                r,
                "unknown",
                0.0,
                f"only a passive correlation (rank {corr:.2f}) from a near-idle server ({why}): run the "
                "interference experiment (--active)",
                "passive-low-load",
            )
        answer = "yes" if corr_contend else "no"
        return _answer(
            r,
            answer,
            min(r.conf("passive"), r.conf("counters") * r.quality(Q.PROMPT_ITL_CORRELATION)),
            said(
                answer,
                f"across the window, ITL rose with prompt-token rate (rank correlation "
                f"{corr:.2f}); passive evidence: confirm with --active",
            ),
            "passive",
        )
    return _answer(r, "unknown", 0.0, "prefill/decode interference was not measured")


# --- the branch -------------------------------------------------------------------------------
def walk_q6(b: Branches) -> None:
    a = b.answers["Q6"]
    chunked, how = b.on(Q.CHUNKED_PREFILL)
    pd, _ = b.on(Q.PD_DISAGGREGATION)
    b.step("Q6.chunked-prefill-on", chunked, "" if how == "seen" else how)
    breaks, note = slo_stalls_note(b.ev, b.slo)
    if note and a.answer == "yes":
        b.step("Q6.stalls-break-slo", breaks, note)
    need = needed(a, "yes")
    inflation = b.ev.measurement(Q.ITL_INFLATION)
    slowdown = inflation.value if need and chunked and inflation is not None else None  # a float where survives
    survives = slowdown is not None and slowdown >= b.th["q6.disagg_inflation"]
    b.step("Q6.contention-survives-chunking", survives if (need and chunked) else None)
    chunk = b.num(Q.MAX_NUM_BATCHED_TOKENS)
    tuned = chunk is not None and chunk <= b.th["q6.min_chunk_tokens"]
    if survives and not tuned:
        size = f" (now {chunk:.0f} tokens)" if chunk is not None else ""
        b.add(
            "chunked-prefill",
            "not-working",
            "Q6",
            f"chunked prefill is on, yet streams still slow {slowdown:.1f}x during prefills: tune the chunk "
            f"first{size}: a smaller --max-num-batched-tokens and --long-prefill-token-threshold (vLLM), "
            "--chunked-prefill-size (SGLang)",
        )
    elif survives:
        b.add("chunked-prefill", "in-place", "Q6", f"on with a small chunk ({chunk:.0f} tokens): tuning it is done")
    elif need and chunked and a.verdict == "passive":
        b.add(
            "chunked-prefill",
            "on-unverified",
            "Q6",
            f"on, but {a.rationale}: whether prefills still stall decode despite the chunking needs the "
            "interference experiment (--active); then tune the chunk",
        )
    else:
        b.by_state(
            "chunked-prefill",
            "Q6",
            chunked,
            need,
            default_why=how,
            unverified_why="whether prefills stall decode was not measured (--active)",
        )
    if pd:
        overhead = b.detected("disaggregation-overhead")
        pit = b.pitfalls["disaggregation-overhead"]
        status: dict[bool | None, Status] = {True: "not-working", False: "in-place", None: "on-unverified"}
        reason = {
            True: pit.explanation,
            False: f"on; {pit.explanation}",
            None: "on, but the KV transfer time was not measured: read the connector's metrics (NIXL: "
            "nixl_xfer_time_seconds) against time to first token",
        }[overhead]
        # Judged from the deployment's shape (no transfer time): a configuration verdict, whatever Q6 says.
        shape = overhead is True and b.num(Q.KV_TRANSFER_TTFT_SHARE) is None
        b.add("pd-disaggregation", status[overhead], "Q6", reason, b.th["confidence.config"] if shape else None)
        return
    if survives:
        scale, why = disagg_scale(b.reading())
        b.step("Q6.scale-for-disaggregation", scale, why)
        if scale:
            b.add(
                "pd-disaggregation",
                "recommended",
                "Q6",
                f"chunked prefill is on and streams still slow {slowdown:.1f}x during prefills; {why}: "
                "separate prefill and decode instances",
            )
        else:
            b.add("pd-disaggregation", "not-indicated", "Q6", why + ": tune the chunk")
    elif need is None:
        b.add("pd-disaggregation", "unknown", "Q6", a.rationale)
    else:
        b.add(
            "pd-disaggregation",
            "not-indicated",
            "Q6",
            ("enable chunked prefill first" if not chunked else "chunked prefill bounds the stalls")
            if need
            else a.rationale,
        )


QUESTION = Question("Q6", TITLE, ask_q6, walk_q6, reads_slo=True)
