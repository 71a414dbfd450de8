"""One metric compared between two runs: a regression, an improvement, a pass, or too noisy to tell.

Where both runs hold raw samples of a quantity, the change of the statistic the key names (the
99th percentile for `*_p99*`, the mean for `*_mean`, the median otherwise) is measured with its
bootstrap confidence interval (`llm_diagnose.diagnose.compare.change`): each run's samples are
resampled with replacement `resamples` times from a seeded generator, the change (relative, or
absolute where the rule says `tolerance_abs`) is computed per resample, and the central
`confidence` share of those changes is the interval. Oriented so that "worse" is positive,
against the rule's tolerance:

- regression: the whole interval is worse than the tolerance;
- improvement: the whole interval is better than the tolerance;
- pass: the interval stays within the tolerance on the worse side;
- inconclusive: the interval straddles the tolerance (the runs are too noisy to say), or a
  run has fewer than `min_samples` samples, or too few beyond a tail quantile (a p99 needs
  300 for three samples past it).

Where a run holds only a summary of a median (a histogram's windowed estimate, with the
median's confidence interval), the change is bounded by the two medians' intervals instead.
A quantity with neither (a single reading, a ratio of counters, a histogram's tail quantile)
is compared by value against the tolerance, and its outcome says so: noise is not accounted
for there. A quantity measured in one run only is inconclusive; in neither, skipped.

Client-side latencies (`requests.*`) are cross-checked with the engine's own histogram of the
same concept (`llm_diagnose.diagnose.compare.client_engine`): where in either run the client's
mean disagrees with the engine's over the same requests, a regression or improvement the client
saw stands only if the engine's figure moved the same way; otherwise it is inconclusive. A
timed metric's decisive change is inconclusive too where the host's other load changed between
the runs (`llm_diagnose.diagnose.host_load`).

The intervals cover the sampling noise within each run. Drift between runs (another tenant
on the machine, a different host) is not in them: the tolerance has to absorb it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal, TypedDict

from llm_diagnose.diagnose.compare.change import bootstrap_change, change_of, format_change
from llm_diagnose.diagnose.compare.client_engine import ENGINE_COUNTERPARTS, client_engine_disagreement
from llm_diagnose.diagnose.compare.outcome import Outcome, Verdict
from llm_diagnose.diagnose.compare.rules import MetricRule
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.compare.statistic import statistic_of
from llm_diagnose.diagnose.host_load import host_load_change, host_timed
from llm_diagnose.diagnose.text.values import format_value
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes.results import Measurement, NotMeasured

__all__ = ["compare_metric", "judge_change", "Compared"]


def judge_change(worse_lo: float, worse_hi: float, tol: float) -> Verdict:
    """The verdict of a change whose worse-is-positive interval is [worse_lo, worse_hi]."""
    if worse_lo > tol:
        return "regression"
    if worse_hi < -tol:
        return "improvement"
    return "pass" if worse_hi <= tol else "inconclusive"


def _describe(r) -> str:
    if isinstance(r, Measurement):
        return format_value(r.value, r.unit) + (f" (n={len(r.samples)})" if len(r.samples) > 1 else "")
    if isinstance(r, NotMeasured):
        return "not measured"
    return "not a measurement" if r is not None else "absent"


_WHY = {
    "regression": "the whole interval is worse than the tolerance",
    "improvement": "the whole interval is better than the tolerance",
    "pass": "the interval stays within the tolerance",
    "inconclusive": "the interval straddles the tolerance: too noisy to tell",
}


class Compared(TypedDict):
    """The fields every outcome of one metric shares."""

    name: str
    kind: Literal["metric", "diagnosis"]
    baseline: str
    current: str
    tolerance: str


def _interval_outcome(
    common: Compared, point: float, lo: float, hi: float, *, sign: float, tol: float, relative: bool, how: str
) -> Outcome:
    worse = sorted((sign * lo, sign * hi))
    verdict = judge_change(worse[0], worse[1], tol)
    return Outcome(
        verdict=verdict,
        point=point,
        interval=(lo, hi),
        **common,
        change=f"{format_change(point, relative)} [{format_change(lo, relative)}, {format_change(hi, relative)}]",
        detail=f"{how}: {_WHY[verdict]}",
    )


def _median_ci(m: Measurement) -> tuple[float, float, float] | None:
    """(median, CI low, CI high) of a summary-only measurement whose value is its median."""
    s = m.summary
    if s is None or s.n < 2 or not math.isclose(m.value, s.median, rel_tol=1e-9, abs_tol=1e-12):
        return None
    return s.median, s.ci_low, s.ci_high


def compare_metric(rule: MetricRule, base_ev: Evidence, cur_ev: Evidence, settings: CompareSettings) -> Outcome:
    """One metric rule: by bootstrap of raw samples, by the medians' intervals of summaries, or by
    value; then cross-checked with the engine and with the host's load (see the module docstring)."""
    outcome = _cross_checked(rule, _judge_metric(rule, base_ev, cur_ev, settings), base_ev, cur_ev, settings)
    return _host_checked(rule, outcome, base_ev, cur_ev)


def _cross_checked(
    rule: MetricRule, outcome: Outcome, base: Evidence, cur: Evidence, settings: CompareSettings
) -> Outcome:
    """A client latency's decisive change, kept only if the engine saw it too, where a run's client
    disagreed with its engine.

    Client latencies are what users see, and they also carry the path from the engine to the
    client: the API server, the network and, on a busy host, the client's own scheduling (a
    starved event loop reads answers late and in bunches). Where in either run the client's mean
    disagrees with the engine's own histogram over the same requests, a regression (or an
    improvement) the client saw stands only if the engine's figure moved the same way under the
    same rule; otherwise it is inconclusive: the time was added or lost on the path, and two runs
    cannot say whether users would see it. Where both runs' clients agree with their engines,
    the client's finer samples stand alone.
    """
    if rule.key not in ENGINE_COUNTERPARTS or outcome.verdict not in ("regression", "improvement"):
        return outcome
    off = [
        f"in {side}, {pair.describe()}"
        for side, ev in (("the baseline", base), ("the current run", cur))
        if (pair := client_engine_disagreement(rule.key, ev)) is not None
    ]
    if not off:
        return outcome
    engine_key = ENGINE_COUNTERPARTS[rule.key][0]
    engine = _judge_metric(replace(rule, key=engine_key), base, cur, settings)
    # In words, not verdict names: this outcome has one verdict, and a text search for it must find only that.
    moved = {"regression": "worse", "improvement": "better", "pass": "within the tolerance"}.get(
        engine.verdict, "too noisy or too few to tell"
    )
    seen = f"the engine's own {engine_key} read {engine.change or engine.current} ({moved})"
    if engine.verdict == outcome.verdict:
        return replace(outcome, detail=f"{outcome.detail}; {seen}, the same way")
    return replace(
        outcome,
        verdict="inconclusive",
        detail=f"{outcome.detail}, but {seen}, and the client disagreed with the engine ({'; '.join(off)}): "
        "the change lies between engine and client (a starved client on a busy host, the API server, the "
        "network), which two runs cannot attribute; rerun both on a quiet host",
    )


def _host_checked(rule: MetricRule, outcome: Outcome, base: Evidence, cur: Evidence) -> Outcome:
    """A timed metric's decisive change, withheld where the host's other load changed under the
    server between the runs (`llm_diagnose.diagnose.host_load`): client and engine slow down
    together then, so the cross-check above cannot see it."""
    if not host_timed(rule.key) or outcome.verdict not in ("regression", "improvement"):
        return outcome
    why = host_load_change(base, cur)
    if why is None:
        return outcome
    return replace(
        outcome,
        verdict="inconclusive",
        detail=f"{outcome.detail}, but {why}; rerun both on a quiet host (nothing else busy beside the server)",
    )


def _judge_metric(rule: MetricRule, base_ev: Evidence, cur_ev: Evidence, s: CompareSettings) -> Outcome:
    relative, tol = rule.relative, rule.tolerance_in(s)
    sign = 1.0 if rule.better == "lower" else -1.0  # worse = sign * change
    b_raw, c_raw = base_ev.items.get(rule.key), cur_ev.items.get(rule.key)
    b, c = base_ev.measurement(rule.key), cur_ev.measurement(rule.key)
    common: Compared = {
        "name": rule.key,
        "kind": "metric",
        "baseline": _describe(b_raw),
        "current": _describe(c_raw),
        "tolerance": rule.describe_tolerance(s),
    }
    if b is None and c is None:
        return Outcome(verdict="skipped", detail="not measured in either run", **common)
    if b is None or c is None:
        which, hole = ("baseline", b_raw) if b is None else ("current run", c_raw)
        why = f": {hole.reason}" if isinstance(hole, NotMeasured) else ""
        return Outcome(verdict="inconclusive", detail=f"not measured in the {which}{why}", **common)
    if b.unit != c.unit:
        return Outcome(verdict="inconclusive", detail=f"units differ ({b.unit} vs {c.unit})", **common)
    if relative and b.value == 0 and c.value != 0:
        return Outcome(
            verdict="inconclusive",
            **common,
            detail="the baseline is 0: a relative change is undefined (set tolerance_abs for this key)",
        )
    stat = statistic_of(rule.key, rule.statistic)
    name = stat.name
    need = max(rule.min_samples or s.min_samples, stat.beyond_tail)

    if len(b.samples) >= 2 and len(c.samples) >= 2:
        if min(len(b.samples), len(c.samples)) < need:
            return Outcome(
                verdict="inconclusive",
                **common,
                detail=f"too few samples for the {name} (baseline {len(b.samples)}, current "
                f"{len(c.samples)}; needs {need} in each)",
            )
        point, lo, hi = bootstrap_change(
            b.samples, c.samples, stat, relative=relative, resamples=s.resamples, confidence=s.confidence, seed=s.seed
        )
        return _interval_outcome(
            common,
            point,
            lo,
            hi,
            sign=sign,
            tol=tol,
            relative=relative,
            how=f"{name} of {len(b.samples)} vs {len(c.samples)} samples, {s.confidence:.0%} bootstrap interval",
        )

    bm, cm = _median_ci(b), _median_ci(c)
    # (_median_ci is None without a summary)
    if name == "median" and bm is not None and cm is not None and b.summary is not None and c.summary is not None:
        # Only summaries (a histogram's estimates): the change can be bounded by the two medians'
        # own confidence intervals, which is wider (safer) than an interval of the difference.
        nb, nc = b.summary.n, c.summary.n
        if min(nb, nc) < need:
            return Outcome(
                verdict="inconclusive",
                **common,
                detail=f"too few observations behind the medians (baseline {nb}, current {nc}; needs {need} in each)",
            )
        lo = float(change_of(bm[2], cm[1], False)) / (abs(bm[0]) if relative else 1.0)
        hi = float(change_of(bm[1], cm[2], False)) / (abs(bm[0]) if relative else 1.0)
        return _interval_outcome(
            common,
            float(change_of(bm[0], cm[0], relative)),
            lo,
            hi,
            sign=sign,
            tol=tol,
            relative=relative,
            how=f"medians of {nb} vs {nc} observations known only by their summaries, "
            "interval from the medians' confidence intervals",
        )

    if b.summary is not None and c.summary is not None and min(b.summary.n, c.summary.n) < need:
        # A histogram's quantile still says how many observations stand behind it.
        return Outcome(
            verdict="inconclusive",
            **common,
            detail=f"too few observations behind the {name} (baseline {b.summary.n}, current "
            f"{c.summary.n}; needs {need} in each)",
        )
    change = float(change_of(b.value, c.value, relative))
    which = "either run" if not b.samples and not c.samples else "one run"
    return Outcome(
        verdict=judge_change(sign * change, sign * change, tol),
        change=format_change(change, relative),
        point=change,
        **common,
        detail=f"no raw samples in {which}: values compared with a plain tolerance (noise not accounted for)",
    )
