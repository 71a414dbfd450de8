"""What every passive producer shares: the window's context and the wording of common warnings.

`PassiveContext` holds the window, the engine's name table (engines.ENGINE_METRICS) and its
version; it resolves a concept to the metric this engine exposes for it, builds provenance,
and words the "no such metric" NotMeasured the same way for every key. It is the one mutable
piece: gauge producers record readings below 0 in `negative_readings`, which
passive_window.bad_samples reports after every producer has run.

`reset_warning` and `too_few` give every counter and histogram figure one wording for counter
resets, left-out readings and windows too short to take an increase (the decision tree reads
the reset wording: diagnose/tree/reading.py). `quantile_result` turns a windowed histogram
into a quantile Measurement with its bucket-bound caveats; latency and request lengths both
use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_diagnose.probes.metrics.engines import CONCEPTS, Candidate, Sel
from llm_diagnose.probes.metrics.histogram import histogram_quantile, summary_from_buckets
from llm_diagnose.probes.metrics.window import CounterIncrease, HistogramIncrease, Window
from llm_diagnose.probes.quantities import BAD_SAMPLES
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result
from llm_diagnose.probes.warning_codes import WarningCode, coded

__all__ = ["NO_TRAFFIC_HINT", "PassiveContext", "quantile_result", "reset_warning", "too_few"]

NO_TRAFFIC_HINT = "run longer under traffic, or with --active to send a workload"


@dataclass
class PassiveContext:
    """What every producer needs: the window, the engine's name table, provenance, warnings."""

    window: Window
    engine: str | None
    version: tuple[int, ...] | None
    names: Mapping[str, tuple[Candidate, ...]]
    negative_readings: dict[str, int] = field(default_factory=dict)  # gauge selector -> readings below 0

    @property
    def duration(self) -> float:
        return self.window.duration_s

    def warnings(self, *extra: str) -> tuple[str, ...]:
        w = self.window
        base = (f"partial window: {w.incomplete}",) if w.incomplete else ()
        return base + tuple(x for x in extra if x)

    def prov(self, method: str, what: str) -> Provenance:
        return Provenance(
            method,
            f"{self.window.source} {what}".strip(),
            taken_at=self.window.ended_at,
            window_s=round(self.duration, 3),
        )

    def resolve(self, concept: str) -> Candidate | None:
        return self.window.resolve(self.names.get(concept, ()))

    def missing(self, concept: str, hint: str = "") -> NotMeasured:
        looked = ", ".join(c.describe() for c in self.names.get(concept, ())) or "no known name"
        what = CONCEPTS[concept].description
        return NotMeasured(
            f"{self.engine or 'the engine'} exposes no metric for {what} (looked for: {looked})",
            hint or "a newer engine version may expose it",
            self.prov("prometheus", ""),
        )

    def counter(self, concept: str) -> CounterIncrease | None:
        cand = self.resolve(concept)
        return self.window.counter(cand) if isinstance(cand, Sel) else None

    def histogram(self, concept: str) -> HistogramIncrease | None:
        cand = self.resolve(concept)
        return self.window.histogram(cand) if isinstance(cand, Sel) else None


def reset_warning(*incs: CounterIncrease | HistogramIncrease | None) -> str:
    """Counter resets and bad readings behind an increase (every counter/histogram figure calls this)."""
    n = sum(i.resets for i in incs if i is not None)
    text = (
        (
            f"{n} counter reset(s) in the window (server restarted?): increases counted from zero after each "
            "reset, as Prometheus rate() does"
        )
        if n
        else ""
    )
    excluded = _excluded_warning(sum(i.excluded for i in incs if i is not None))
    joined = "; ".join(
        t for t in (text, excluded, _untracked_warning(sum(i.untracked for i in incs if i is not None))) if t
    )
    return coded(WarningCode.COUNTER_RESET, joined) if n else joined


def _excluded_warning(n: int) -> str:
    return (
        f"{n} bad reading(s) left out (see {BAD_SAMPLES}); increases span them from the last good reading" if n else ""
    )


def _untracked_warning(n: int) -> str:
    return (
        f"{n} reading(s) of series past the window's cap on distinct series left out (MAX_TRACKED_SERIES): "
        "the increase misses what they added"
        if n
        else ""
    )


def too_few(ctx: PassiveContext, what: str) -> NotMeasured:
    """Why a counter or histogram figure is missing when the window has fewer than two good scrapes."""
    return NotMeasured(
        f"a counter increase needs two good scrapes; the window has {ctx.window.n_ok}",
        "scrape for longer",
        ctx.prov("prometheus-counter-delta", what),
    )


def quantile_result(ctx: PassiveContext, concept: str, q: float, unit: str, empty_reason: str) -> Result:
    """The q-quantile of `concept` over the window, or why there is none (`empty_reason`: nothing observed)."""
    cand = ctx.resolve(concept)
    if not isinstance(cand, Sel):
        return ctx.missing(concept)
    inc = ctx.window.histogram(cand)
    prov = ctx.prov("prometheus-histogram-window", cand.describe())
    if not inc.intervals:
        return too_few(ctx, cand.describe())
    if inc.count <= 0:
        return NotMeasured(empty_reason, NO_TRAFFIC_HINT, prov)
    est = histogram_quantile(q, inc.buckets)
    if est is None:
        return NotMeasured(f"{cand.describe()} has no +Inf bucket: its quantiles cannot be read", "", prov)
    warns = [reset_warning(inc)]
    if est.in_first_bucket:
        warns.append(f"p{q * 100:g} lies in the first bucket (<= {est.upper:g}): reported as that upper bound")
    if est.in_overflow_bucket:
        warns.append(f"p{q * 100:g} lies beyond the last finite bucket: reported as its lower bound {est.lower:g}")
    return Measurement(
        est.honest_value,
        unit,
        prov,
        summary=summary_from_buckets(inc.buckets, inc.sum),
        warnings=ctx.warnings(*warns),
        note=f"p{q * 100:g} over {inc.count:.0f} observations in the window: {est.bound_note}",
    )
