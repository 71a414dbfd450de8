"""The performance gate: compare a current run with a baseline and tell a regression from noise.

Metric rules (`llm_diagnose.diagnose.gate_rules`). Where both runs hold raw samples of a quantity, the
gate measures the change of the statistic the key names (the 99th percentile for `*_p99*`,
the mean for `*_mean`, the median otherwise) and its bootstrap confidence interval: each
run's samples are resampled with replacement `resamples` times from a seeded generator, the
change (relative, or absolute where the rule says `tolerance_abs`) is computed per resample,
and the central `confidence` share of those changes is the interval. Oriented so that
"worse" is positive, against the rule's tolerance:

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
same concept: where in either run the client's mean disagrees with the engine's over the same
requests, a regression or improvement the client saw stands only if the engine's figure moved
the same way; otherwise it is inconclusive (the change lies on the path between them: a starved
client on a busy host, the API server, the network).

The intervals cover the sampling noise within each run. Drift between runs (another tenant
on the machine, a different host) is not in them: the tolerance has to absorb it.

Diagnosis rules compare the two diagnoses: a newly detected pitfall, an answer that changed,
a technique newly recommended (or found not working), a technique that was in place and is
not any more (seen turned off, or no longer needed) are regressions by default. A technique in
place before that the current run could not verify (its switch not seen off: too little
traffic to tell, say) follows the unknown-answer rule, inconclusive by default, as does an
answer that changed between weak answers (confidence at most `min_confidence`).

`GateResult.exit_code()` follows `llm_diagnose.diagnose.errors.ExitCode`: 0 no regression, 1 regression,
5 inconclusive when asked to fail on it.

This module judges. Around it, one job each: the run folders are read by
`llm_diagnose.diagnose.runfolder.RunFolder` (the per-request records arrive here already loaded,
lines that could not be read counted there); the bootstrap is `llm_diagnose.probes.stats`; the
rules are `llm_diagnose.diagnose.gate_rules`; the value types (`RunData`, `Outcome`, `GateResult`)
are `llm_diagnose.diagnose.gate_result`; the text, JSON and JUnit outputs are
`llm_diagnose.diagnose.gate_render`, the Markdown one `llm_diagnose.diagnose.report.markdown.render_gate`.
The names callers import from here stay importable here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np

from llm_diagnose.diagnose.gate_render import render_json, render_junit, render_text
from llm_diagnose.diagnose.gate_result import VERDICTS, GateResult, Outcome, RunData, Verdict
from llm_diagnose.diagnose.gate_rules import (
    REQUEST_DECODE_TOKENS,
    REQUEST_E2E_P50,
    REQUEST_FAILED_FRACTION,
    REQUEST_TPOT_P50,
    REQUEST_TTFT_P50,
    REQUEST_TTFT_P99,
    GateRules,
    MetricRule,
    statistic_name,
)
from llm_diagnose.diagnose.host_load import host_load_change, host_timed
from llm_diagnose.diagnose.report.content import ACTIVE_STATUSES, UNSETTLED_STATUSES, format_value
from llm_diagnose.diagnose.tree.diagnosis import PITFALLS, QUESTIONS, TECHNIQUE_ON_NODES, TECHNIQUES, Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.client_server import SideBySide, others_counted
from llm_diagnose.probes.load.failures import tally_failures
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance
from llm_diagnose.probes.stats import ORDER_STATISTIC_ABOVE, bootstrap_comparison, comparison_of

if TYPE_CHECKING:  # records.py's package loads the HTTP client: types only here
    from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "Verdict",
    "VERDICTS",
    "RunData",
    "Outcome",
    "GateResult",
    "compare",
    "compare_metric",
    "compare_diagnoses",
    "failure_ceiling",
    "FAILURE_CEILING",
    "bootstrap_change",
    "Statistic",
    "statistic_of",
    "request_measurements",
    "render_text",
    "render_junit",
    "render_json",
]

TAIL_MIN = 3  # samples needed beyond a tail quantile for its bootstrap to mean anything
# Above this many samples a quantile's bootstrap takes its order-statistic form (read per call: tests lower it).
EXACT_BOOTSTRAP_MAX = ORDER_STATISTIC_ABOVE
NOTHING_COMPARED = "gate.nothing_compared"  # the outcome of two runs with no compared quantity between them


# --- per-request samples ------------------------------------------------------------------------
def request_measurements(records: Sequence[RequestRecord] | None, source: str) -> dict[str, Measurement]:
    """Client-side latencies of completed requests, one sample each (the records of a run folder's
    requests.jsonl, as `RunFolder.requests` loaded them; `source` names the file).

    `requests.ttft_p50_s` and `requests.ttft_p99_s` (time to first token as the client saw it),
    `requests.tpot_p50_s` (a request's mean time per output token after its first) and
    `requests.e2e_p50_s`; and `requests.failed_fraction`, the share of the requests sent that
    the server failed (one 0/1 sample per request: what was sent, not what was served). Nothing
    without records (a passive run has no requests.jsonl).
    """
    if not records:
        return {}
    prov = Provenance("client-per-request", source)
    tally = tally_failures(records)
    failures = Measurement(tally.fraction, "fraction", prov, samples=tally.outcomes, note=tally.describe())
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    decode_tokens = 0
    for r in records:
        if not r.completed or r.ttft_s is None:
            continue
        ttft.append(r.ttft_s)
        decode_tokens += max(r.tokens_out - 1, 0)
        if len(r.event_times) > 1:
            tpot.append((r.event_times[-1] - r.event_times[0]) / (len(r.event_times) - 1))
        if r.e2e_s is not None:
            e2e.append(r.e2e_s)
    series = {REQUEST_TTFT_P50: ttft, REQUEST_TTFT_P99: ttft, REQUEST_TPOT_P50: tpot, REQUEST_E2E_P50: e2e}
    # A record edited or damaged into a non-finite time is no sample (unreadable lines were skipped, and counted).
    series = {key: [v for v in values if math.isfinite(v)] for key, values in series.items()}
    out = {REQUEST_FAILED_FRACTION: failures}
    for key, values in series.items():
        if values:
            out[key] = Measurement(
                float(statistic_of(key)(values)),
                "s",
                prov,
                samples=tuple(values),
                note=f"{len(values)} completed requests, timed by the load driver",
            )
    if len(out) > 1:  # a latency besides the failures: some request completed
        out[REQUEST_DECODE_TOKENS] = Measurement(
            float(decode_tokens), "tokens", prov, note="output tokens after each completed request's first"
        )
    return out


# --- statistics ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Statistic:
    """What is compared: the mean, or a quantile `q` in percent (50: the median)."""

    name: str  # "median", "mean", "p99"
    q: float | None  # None for the mean

    def __call__(self, values, axis=None):
        return np.mean(values, axis=axis) if self.q is None else np.percentile(values, self.q, axis=axis)

    @property
    def tail(self) -> bool:
        return self.q is not None and self.q > 50


def statistic_of(key: str, override: str | None = None) -> Statistic:
    """The statistic a key names (p99 for `*_p99*`, mean for `*_mean`), else the median."""
    name = statistic_name(key, override)
    return Statistic(name, None if name == "mean" else 50.0 if name == "median" else float(name[1:]))


def _change(base: np.ndarray | float, cur: np.ndarray | float, relative: bool):
    return comparison_of(base, cur, "relative_change" if relative else "difference")


def bootstrap_change(
    base, cur, stat: Statistic, *, relative: bool, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(point, low, high): the change of `stat` from `base` to `cur`, with its bootstrap interval.

    llm_diagnose.probes.stats.bootstrap_comparison computes it: the interval takes order
    statistics of the resampled changes (no interpolation, so an infinite change from a zero
    resample stays infinite instead of becoming NaN).
    """
    interval = bootstrap_comparison(
        base,
        cur,
        "mean" if stat.q is None else stat.q,
        compare="relative_change" if relative else "difference",
        resamples=resamples,
        level=confidence,
        seed=seed,
        order_statistic_above=EXACT_BOOTSTRAP_MAX,
    )
    return interval.point, interval.low, interval.high


# --- metric rules -------------------------------------------------------------------------------
def _fmt_change(x: float, relative: bool) -> str:
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:+.1%}" if relative else f"{x:+.4g}"


def _judge(worse_lo: float, worse_hi: float, tol: float) -> Verdict:
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


class _Compared(TypedDict):
    """The fields every outcome of one metric rule shares."""

    name: str
    kind: Literal["metric", "diagnosis"]
    baseline: str
    current: str
    tolerance: str


def _interval_outcome(
    common: _Compared, point: float, lo: float, hi: float, *, sign: float, tol: float, relative: bool, how: str
) -> Outcome:
    worse = sorted((sign * lo, sign * hi))
    verdict = _judge(worse[0], worse[1], tol)
    return Outcome(
        verdict=verdict,
        point=point,
        interval=(lo, hi),
        **common,
        change=f"{_fmt_change(point, relative)} [{_fmt_change(lo, relative)}, {_fmt_change(hi, relative)}]",
        detail=f"{how}: {_WHY[verdict]}",
    )


def _median_ci(m: Measurement) -> tuple[float, float, float] | None:
    """(median, CI low, CI high) of a summary-only measurement whose value is its median."""
    s = m.summary
    if s is None or s.n < 2 or not math.isclose(m.value, s.median, rel_tol=1e-9, abs_tol=1e-12):
        return None
    return s.median, s.ci_low, s.ci_high


def compare_metric(rule: MetricRule, base_ev: Evidence, cur_ev: Evidence, rules: GateRules) -> Outcome:
    """One metric rule: by bootstrap of raw samples, by the medians' intervals of summaries, or by value.

    A regression then becomes what the rule's severity says (a warning, say, on a shared runner).
    """
    outcome = _cross_checked(rule, _judge_metric(rule, base_ev, cur_ev, rules), base_ev, cur_ev, rules)
    outcome = _host_checked(rule, outcome, base_ev, cur_ev)
    severity = rule.severity or rules.settings.severity
    if outcome.verdict != "regression" or severity == "regression":
        return outcome
    note = " (ignored by the rules)" if severity == "ignore" else f" (a {severity} by the rules)"
    return replace(outcome, verdict=_AS_VERDICT[severity], detail=outcome.detail + note)


# --- client against engine -------------------------------------------------------------------------
# A client-side latency and the engine's own histogram of the same concept (same requests).
ENGINE_COUNTERPARTS: dict[str, tuple[str, str]] = {
    REQUEST_TTFT_P50: (Q.TTFT_P50, "ttft"),
    REQUEST_TTFT_P99: (Q.TTFT_P99, "ttft"),
    REQUEST_E2E_P50: (Q.E2E_P50, "e2e"),
    # A request's mean gap against the engine's per-token one: equal weights per request instead of
    # per token, close enough for a 25% + 2 ms agreement, and bundled tokens (gaps of 0) stand out.
    REQUEST_TPOT_P50: (Q.ITL_P50, "itl"),
}


def client_engine_disagreement(key: str, ev: Evidence) -> SideBySide | None:
    """The client's mean of `key` beside the engine's histogram mean, when the two disagree
    (`llm_diagnose.probes.client_server.SideBySide.agree`); None when they agree or one is missing
    or the engine counted others' requests too (then the comparison says nothing)."""
    if key not in ENGINE_COUNTERPARTS:
        return None
    engine_key, concept = ENGINE_COUNTERPARTS[key]
    client, engine = ev.measurement(key), ev.measurement(engine_key)
    if client is None or not client.samples or engine is None or engine.summary is None:
        return None
    s, n = engine.summary, len(client.samples)
    # The engine's ITL histogram holds one observation per token after a request's first, not one per request.
    ours = n
    if concept == "itl":
        tokens = ev.measurement(REQUEST_DECODE_TOKENS)
        if tokens is None:
            return None
        ours = int(tokens.value)
    if s.n <= 0 or s.mean <= 0 or others_counted(s.n, ours):
        return None
    pair = SideBySide(concept, float(np.mean(client.samples)), n, s.mean, s.n)
    return None if pair.agree else pair


def _cross_checked(rule: MetricRule, outcome: Outcome, base: Evidence, cur: Evidence, rules: GateRules) -> Outcome:
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
    engine = _judge_metric(replace(rule, key=engine_key), base, cur, rules)
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


def _judge_metric(rule: MetricRule, base_ev: Evidence, cur_ev: Evidence, rules: GateRules) -> Outcome:
    s = rules.settings
    relative, tol = rule.relative, rule.tolerance_in(s)
    sign = 1.0 if rule.better == "lower" else -1.0  # worse = sign * change
    b_raw, c_raw = base_ev.items.get(rule.key), cur_ev.items.get(rule.key)
    b, c = base_ev.measurement(rule.key), cur_ev.measurement(rule.key)
    common: _Compared = {
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
    beyond_tail = math.ceil(TAIL_MIN / (1 - stat.q / 100)) if stat.q is not None and stat.tail else 0
    need = max(rule.min_samples or s.min_samples, beyond_tail)

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
        lo = float(_change(bm[2], cm[1], False)) / (abs(bm[0]) if relative else 1.0)
        hi = float(_change(bm[1], cm[2], False)) / (abs(bm[0]) if relative else 1.0)
        return _interval_outcome(
            common,
            float(_change(bm[0], cm[0], relative)),
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
    change = float(_change(b.value, c.value, relative))
    which = "either run" if not b.samples and not c.samples else "one run"
    return Outcome(
        verdict=_judge(sign * change, sign * change, tol),
        change=_fmt_change(change, relative),
        point=change,
        **common,
        detail=f"no raw samples in {which}: values compared with a plain tolerance (noise not accounted for)",
    )


# --- failed requests --------------------------------------------------------------------------------
FAILURE_CEILING = "requests.failed_fraction:ceiling"  # the outcome of the current run's own failures


def failure_ceiling(base_ev: Evidence, cur_ev: Evidence, rules: GateRules) -> Outcome | None:
    """The current run's share of failed requests against `[gate] max_failed_fraction`.

    A regression where it is above the ceiling, whatever the baseline did: a server that fails
    its requests fails the gate even where it failed them before (the comparison rule of the same
    key says whether it got worse). None where the current run sent no request (a passive run).
    """
    cur = cur_ev.measurement(REQUEST_FAILED_FRACTION)
    if cur is None:
        return None
    ceiling = rules.settings.max_failed_fraction
    base = base_ev.measurement(REQUEST_FAILED_FRACTION)
    common: _Compared = {
        "name": FAILURE_CEILING,
        "kind": "metric",
        "baseline": "not sent" if base is None else format_value(base.value, "fraction"),
        "current": format_value(cur.value, "fraction"),
        "tolerance": f"at most {ceiling:.0%} of the requests sent",
    }
    if cur.value <= ceiling:
        return Outcome(verdict="pass", detail=f"{cur.note}: within the ceiling", **common)
    before = "" if base is None else f" (the baseline: {base.note})"
    return Outcome(
        verdict="regression",
        detail=f"{cur.note}, above the ceiling of {ceiling:.0%}{before}: the server failed what it was sent, "
        "and the latencies above cover only the requests it answered; see the run's requests.jsonl (fault, "
        "fault_detail) and the server's log",
        **common,
    )


# --- diagnosis rules ------------------------------------------------------------------------------
_AS_VERDICT: dict[str, Verdict] = {
    "regression": "regression",
    "inconclusive": "inconclusive",
    "warning": "warning",
    "ignore": "pass",
}


def _severity(setting: str, detail: str, name: str, baseline: str, current: str) -> Outcome:
    suffix = " (ignored by the rules)" if setting == "ignore" else ""
    return Outcome(name, "diagnosis", _AS_VERDICT[setting], baseline, current, detail=detail + suffix)


def compare_diagnoses(base: Diagnosis, cur: Diagnosis, rules: GateRules) -> list[Outcome]:
    r = rules.diagnosis
    out: list[Outcome] = []
    b_pit, c_pit = {p.pitfall: p for p in base.pitfalls}, {p.pitfall: p for p in cur.pitfalls}
    shown = {True: "detected", False: "not detected", None: "not checkable"}
    for pid in PITFALLS:
        b_seen = b_pit[pid].detected if pid in b_pit else None
        c_seen = c_pit[pid].detected if pid in c_pit else None
        name, bs, cs = f"pitfall:{pid}", shown[b_seen], shown[c_seen]
        if c_seen is True and b_seen is not True:
            out.append(_severity(r.new_pitfall, f"newly detected: {c_pit[pid].explanation}", name, bs, cs))
        elif b_seen is True and c_seen is False:
            out.append(Outcome(name, "diagnosis", "improvement", bs, cs, detail="no longer detected"))
        elif b_seen is True and c_seen is None:
            out.append(_severity(r.unknown_answer, "detected before, not checkable now", name, bs, cs))
        else:
            out.append(
                Outcome(
                    name,
                    "diagnosis",
                    "pass",
                    bs,
                    cs,
                    detail="detected in both runs (not new)" if b_seen and c_seen else "unchanged",
                )
            )
    b_ans, c_ans = {a.question: a for a in base.answers}, {a.question: a for a in cur.answers}
    for q in QUESTIONS:
        b = b_ans[q].answer if q in b_ans else "unknown"
        c = c_ans[q].answer if q in c_ans else "unknown"
        name = f"answer:{q}"
        if b == c:
            out.append(Outcome(name, "diagnosis", "pass", b, c, detail="unchanged"))
        elif "unknown" in (b, c):
            why = c_ans[q].rationale if q in c_ans else "not answered"
            out.append(_severity(r.unknown_answer, f"answer {b} -> {c}: {why}", name, b, c))
        elif (sure := min(b_ans[q].confidence, c_ans[q].confidence)) <= r.min_confidence:
            # A flip between weak answers (a passive correlation, thin evidence) is noise until shown otherwise.
            out.append(
                _severity(
                    r.unknown_answer,
                    f"answer changed {b} -> {c} at low confidence ({sure:.2f} <= "
                    f"{r.min_confidence:g}): {c_ans[q].rationale}",
                    name,
                    b,
                    c,
                )
            )
        else:
            out.append(_severity(r.changed_answer, f"answer changed {b} -> {c}: {c_ans[q].rationale}", name, b, c))
    b_rec = {x.technique: x.status for x in base.recommendations}
    c_rec = {x.technique: x for x in cur.recommendations}
    for t in TECHNIQUES:
        was = b_rec.get(t, "unknown")
        now = c_rec[t].status if t in c_rec else "unknown"
        name = f"technique:{t}"
        if now in ACTIVE_STATUSES and was not in ACTIVE_STATUSES:
            out.append(_severity(r.new_recommendation, f"now {now}: {c_rec[t].reason}", name, was, now))
        elif (
            was == "in-place"
            and now in UNSETTLED_STATUSES
            and t in TECHNIQUE_ON_NODES
            and cur.technique_on(t) is not False
        ):
            # Knowing less is not a regression: a switch not seen off, in a run that could not tell
            # whether it still works (too little traffic in its window, say), is the unknown-answer
            # rule's case. Seen off, or a technique the tree records no switch for (quantization,
            # parallelism, disaggregation can read "unknown" while seen off), it is a lost technique.
            why = c_rec[t].reason if t in c_rec else "not in the current diagnosis"
            out.append(_severity(r.unknown_answer, f"in place before, now {now}: {why}", name, was, now))
        elif was == "in-place" and now != "in-place":
            why = c_rec[t].reason if t in c_rec else "not in the current diagnosis"
            out.append(_severity(r.lost_technique, f"in place before, now {now}: {why}", name, was, now))
        elif was in ACTIVE_STATUSES and now not in ACTIVE_STATUSES:
            out.append(Outcome(name, "diagnosis", "improvement", was, now, detail=f"no longer {was}"))
        else:
            out.append(
                Outcome(name, "diagnosis", "pass", was, now, detail="unchanged" if was == now else f"{was} -> {now}")
            )
    return out


def compare(
    baseline: RunData, current: RunData, rules: GateRules | None = None, notes: tuple[str, ...] = ()
) -> GateResult:
    rules = rules or GateRules()
    outcomes = [compare_metric(rule, baseline.evidence, current.evidence, rules) for rule in rules.metrics]
    if outcomes and all(o.verdict == "skipped" for o in outcomes):
        # Two runs that measured nothing the rules compare agree on nothing: not a pass.
        outcomes.append(
            Outcome(
                NOTHING_COMPARED,
                "metric",
                "inconclusive",
                detail=f"neither run measured any of the {len(rules.metrics)} quantities the rules compare, so no "
                "performance was compared: check that both runs scraped the server (their summary.txt) and "
                "rerun them (llm-diagnose run; --active adds per-request latencies)",
            )
        )
    ceiling = failure_ceiling(baseline.evidence, current.evidence, rules)
    if ceiling is not None:
        outcomes.append(ceiling)
    outcomes += compare_diagnoses(baseline.diagnosis, current.diagnosis, rules)
    skipped = tuple(
        f"{side}: {line}" for side, run in (("baseline", baseline), ("current", current)) for line in run.skipped_lines
    )
    return GateResult(tuple(outcomes), rules, baseline.label or "baseline", current.label or "current", notes, skipped)
