"""Reading evidence for one node of the tree, and recording what was read.

A `Reading` wraps the evidence and the thresholds for one question or pitfall check. Every
value it hands out is recorded (the keys used), every hole is recorded (the missing keys,
with the probe's reason), and every comparison against a named threshold is recorded, so
an answer can never claim more than it looked at.
"""

from __future__ import annotations

import operator

from llm_diagnose.diagnose.tree.diagnosis import Answer, AnswerValue, Comparison, Missing
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured
from llm_diagnose.probes.warning_codes import WarningCode

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
# What settles a live verdict the evidence left open (said with every inconclusive answer).
SETTLE_LIVE = (
    "run the experiment again with more --budget-requests/--budget-seconds (more rounds narrow the interval), "
    "on a quieter host (the client's own CPU starvation widens it), or with the server's /metrics reachable"
)


def _starved_warning(m: Measurement) -> str | None:
    """The warning a measurement taken by a starved client carries (its code: WarningCode.CLIENT_STARVED)."""
    return next((w for w in m.warnings if getattr(w, "code", None) == WarningCode.CLIENT_STARVED), None)


class IntervalVerdict:
    """A live measurement judged by its interval, not its point: `holds` is True or False only
    when the whole interval lies on one side of the threshold, None (inconclusive) otherwise,
    with `why` saying what left it open."""

    __slots__ = ("holds", "why", "shown")

    def __init__(self, holds: bool | None, why: str, shown: str) -> None:
        self.holds, self.why, self.shown = holds, why, shown


class Reading:
    def __init__(self, evidence: Evidence, thresholds: Thresholds) -> None:
        self.evidence = evidence
        self.thresholds = thresholds
        self.used: list[str] = []
        self.missing: list[Missing] = []
        self.comparisons: list[Comparison] = []

    # --- values ------------------------------------------------------------------------
    def _note_missing(self, key: str) -> None:
        result = self.evidence.get(key)
        reason = result.reason if isinstance(result, NotMeasured) else "present but not of the expected kind"
        hint = result.hint if isinstance(result, NotMeasured) else ""
        if all(m.evidence != key for m in self.missing):
            self.missing.append(Missing(key, reason, hint))

    def _use(self, key: str) -> None:
        if key not in self.used:
            self.used.append(key)

    def num(self, key: str) -> float | None:
        """A numeric value (a Measurement, or a numeric Fact), or None (recorded as missing)."""
        r = self.evidence.get(key)
        if isinstance(r, Measurement):
            self._use(key)
            return r.value
        if isinstance(r, Fact) and isinstance(r.value, (int, float)) and not isinstance(r.value, bool):
            self._use(key)
            return float(r.value)
        self._note_missing(key)
        return None

    def flag(self, key: str) -> bool | None:
        r = self.evidence.get(key)
        if isinstance(r, Fact) and isinstance(r.value, bool):
            self._use(key)
            return r.value
        self._note_missing(key)
        return None

    def text(self, key: str) -> str | None:
        r = self.evidence.get(key)
        if isinstance(r, Fact) and isinstance(r.value, str):
            self._use(key)
            return r.value
        self._note_missing(key)
        return None

    def measurement(self, key: str) -> Measurement | None:
        return self.evidence.measurement(key)

    # --- comparisons -------------------------------------------------------------------
    def compare(self, key: str, value: float, op: str, threshold: str) -> bool:
        limit = self.thresholds[threshold]
        holds = bool(_OPS[op](value, limit))
        self.comparisons.append(Comparison(threshold, key, float(value), op, float(limit), holds))
        return holds

    def disbelieved(self, *keys: str) -> str | None:
        """The first of `keys` whose client timings are not to be believed (a starved client,
        bundled delivery the engine's histograms contradict): its warning, else None."""
        for key in keys:
            m = self.evidence.measurement(key)
            if m is not None:
                found = _starved_warning(m)
                if found is not None:
                    self._use(key)
                    return f"{key}: {found}"
        return None

    def live(self, key: str, op: str, threshold: str) -> IntervalVerdict | None:
        """Judge a live (client-timed) measurement by its interval; None when it is missing.

        Rules: a measurement the client took while starved of CPU (its warning names it,
        `Q.CLIENT_STARVED_WARNING`) is no verdict; an active experiment's figure without an
        interval (a single probe, or too few samples for one) is no verdict; otherwise the verdict
        holds only where the interval clears the threshold. A figure from another probe (its
        provenance is not `active-probe/...`) is judged on its value.
        """
        m = self.evidence.measurement(key)
        if m is None:
            self._note_missing(key)
            return None
        self._use(key)
        limit = self.thresholds[threshold]
        holds = bool(_OPS[op](m.value, limit))
        self.comparisons.append(Comparison(threshold, key, float(m.value), op, float(limit), holds))
        starved = _starved_warning(m)
        if starved is not None:
            return IntervalVerdict(None, starved, f"{m.value:.3g}")
        # Only the active experiments' client-timed figures need their own interval; a figure
        # another probe derived (the in-process PyTorch probe's latency over step-time ratio)
        # is judged as before, on its value.
        if not m.provenance.method.startswith("active-probe"):
            return IntervalVerdict(holds, "", f"{m.value:.3g}")
        if m.summary is None or m.n < self.thresholds["evidence.min_live_samples"]:
            return IntervalVerdict(
                None,
                f"{key} = {m.value:.3g} rests on {m.n} sample(s): too few for an interval "
                f"(at least {self.thresholds['evidence.min_live_samples']:.0f})",
                f"{m.value:.3g}",
            )
        low, high = m.summary.ci_low, m.summary.ci_high
        shown = f"{m.value:.3g} ({m.summary.ci_level:.0%} interval {low:.3g}-{high:.3g})"
        upward = op in (">=", ">")
        if _OPS[op](low if upward else high, limit):
            return IntervalVerdict(True, "", shown)
        if not _OPS[op](high if upward else low, limit):
            return IntervalVerdict(False, "", shown)
        return IntervalVerdict(None, f"{key} = {shown} straddles the threshold {threshold} = {limit:g}", shown)

    def check(self, key: str, op: str, threshold: str) -> bool | None:
        """Read `key` and compare it with `threshold`; None when the key is missing."""
        value = self.num(key)
        return None if value is None else self.compare(key, value, op, threshold)

    # --- confidence ----------------------------------------------------------------------
    def conf(self, rule: str) -> float:
        """A named confidence rule's value (llm_diagnose.diagnose.tree.thresholds, `confidence.*`)."""
        return self.thresholds[f"confidence.{rule}"]

    def quality(self, *keys: str) -> float:
        """1.0 for well-sampled clean measurements over a long enough window; capped by the
        named rules confidence.thin_samples / warnings / short_window otherwise."""
        q = 1.0
        th = self.thresholds
        for key in keys:
            m = self.evidence.measurement(key)
            if m is None:
                continue
            if m.summary is not None and m.n < th["evidence.min_samples"]:
                q = min(q, th["confidence.thin_samples"])
            if m.warnings:
                q = min(q, th["confidence.warnings"])
            if WarningCode.COUNTER_RESET in m.codes:  # probes.metrics.passive.context.reset_warning
                q = min(q, th["confidence.counter_reset"])
            spread = m.summary.iqr_like_spread if m.summary is not None and m.n >= th["evidence.min_samples"] else None
            if spread is not None and spread > th["evidence.max_median_spread"]:
                q = min(q, th["confidence.spread"])
            window = m.provenance.window_s
            if window is not None and window < th["evidence.min_window_s"]:
                q = min(q, th["confidence.short_window"])
        if self.evidence.fact("live.window_complete") is False and any(self.evidence.measurement(k) for k in keys):
            q = min(q, th["confidence.short_window"])
        return q

    def capped(self, base: float, *keys: str) -> float:
        """`base` under the quality caps of `keys`, taken as ceilings (their documented meaning).

        Only Q1's overload uses it so far; the other answers still multiply base by quality,
        which turns a ceiling of 0.6 into 0.48 under a 0.8 base (see the closing note of stop 12).
        """
        return min(base, self.quality(*keys))

    def answer(
        self, question: str, title: str, answer: AnswerValue, confidence: float, rationale: str, verdict: str = ""
    ) -> Answer:
        """The answer with everything this reading recorded. It lists as missing only what it
        did not manage to read: a key another signal made unnecessary is still listed, since
        measuring it would add confidence."""
        return Answer(
            question=question,
            title=title,
            answer=answer,
            confidence=round(max(0.0, min(1.0, confidence)), 3),
            rationale=rationale,
            comparisons=tuple(self.comparisons),
            evidence=tuple(self.used),
            missing=tuple(self.missing),
            verdict=verdict,
        )

    def inconclusive(self, question: str, title: str, why: str, settle: str = SETTLE_LIVE) -> Answer:
        """No verdict: the evidence leaves the answer open. Says why, and what would settle it."""
        self.missing.append(Missing(f"{question}.verdict", f"inconclusive: {why}", settle))
        rationale = f"inconclusive: {why}; to settle it: {settle}"
        return self.answer(question, title, "unknown", 0.0, rationale, "inconclusive")
