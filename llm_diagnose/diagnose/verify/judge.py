"""Verify a change: did the technique adopted between two runs deliver what it promised?

Pure functions over two loaded runs (`RunSide`: a `RunFolder` and its diagnosis):

1. `config_diff`: the configuration each run discovered (`config.*` facts and a few engine
   facts), and `identify_adopted`: the techniques whose switch went from off or absent to on, or
   whose setting changed. With no change discovered, the techniques BEFORE's diagnosis
   recommended are judged instead (the change may be outside what the probes discover).
2. `compare_workloads`: the two runs must have put the same load on the server (prompt and
   output lengths, requests per experiment, prefix reuse, the model): otherwise no verdict.
3. `judge_claim`: each claim of each adopted technique (llm_diagnose.diagnose.verify.claims),
   judged by the comparison core the gate uses too (`llm_diagnose.diagnose.compare.metric.compare_metric`:
   the bootstrap interval of the change from raw samples, medians' intervals from summaries, or
   values where there is nothing else), against the claim's minimum effect.
4. `side_effects`: the default metrics (`llm_diagnose.diagnose.compare.rules.DEFAULT_METRICS`) that
   moved beyond their tolerance with the whole interval, pitfalls new in AFTER, and the SLO checks
   of both diagnoses.

The tolerances (the workload's, the failure ceiling's, the metrics') are the registry's
(`llm_diagnose.diagnose.tolerances`), in force through `CompareSettings.tolerances`.

`verify` puts them together into a `VerifyResult` (llm_diagnose.diagnose.verify.result).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from llm_diagnose.diagnose.compare.metric import compare_metric
from llm_diagnose.diagnose.compare.outcome import Outcome
from llm_diagnose.diagnose.compare.request_measurements import (
    REQUEST_E2E_P50,
    REQUEST_FAILED_FRACTION,
    REQUEST_TPOT_P50,
    REQUEST_TTFT_P50,
    REQUEST_TTFT_P99,
    request_measurements,
)
from llm_diagnose.diagnose.compare.rules import DEFAULT_METRICS, MetricRule
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.host_load import OTHER_LOAD_CHANGE_CORES, host_load_change
from llm_diagnose.diagnose.runfolder import REQUESTS, RunFolder, RunFolderError
from llm_diagnose.diagnose.text.values import ACTIVE_STATUSES, format_value
from llm_diagnose.diagnose.tolerances import (
    OUTPUT_TOKENS,
    PREFIX_REUSE,
    PROMPT_TOKENS,
    REQUESTS_SENT,
    SEND_RATE,
    Tolerances,
)
from llm_diagnose.diagnose.tree.diagnosis import PITFALLS, Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.verify.claims import (
    ADOPTION,
    ALL_PARTS,
    CAN_WORSEN,
    MECHANISMS,
    SWITCHES,
    Claim,
    Part,
    can_worsen,
    claims_for,
)
from llm_diagnose.diagnose.verify.result import (
    AdoptedTechnique,
    ChangeKind,
    ClaimResult,
    ClaimVerdict,
    Comparability,
    ConfigChange,
    SideEffect,
    SloChange,
    VerifyResult,
    WorkloadCheck,
)
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, Provenance

if TYPE_CHECKING:
    from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "RunSide",
    "verify",
    "config_diff",
    "identify_adopted",
    "compare_workloads",
    "judge_claim",
    "judge_interval",
    "side_effects",
    "slo_changes",
]

# Where a claim's key has a per-request counterpart from requests.jsonl, in order of preference
# (TTFT and end-to-end latency are the same quantity timed per request; ITL's is a proxy: a
# request's mean time per output token).
_SOURCES: dict[str, tuple[str, ...]] = {
    Q.TTFT_P50: (REQUEST_TTFT_P50, Q.TTFT_P50),
    Q.TTFT_P99: (REQUEST_TTFT_P99, Q.TTFT_P99),
    Q.E2E_P50: (REQUEST_E2E_P50, Q.E2E_P50),
    # The decode experiment's batch-1 gap where both runs measured it (a controlled figure: the same
    # streams alone), else what the server served, else the per-request proxy.
    Q.ITL_P50: (Q.DECODE_BATCH1_ITL_P50, Q.ITL_P50, REQUEST_TPOT_P50),
    Q.SPEC_ACCEPTANCE_RATE: (Q.SPEC_ACTIVE_ACCEPTANCE_RATE, Q.SPEC_ACCEPTANCE_RATE),
}


@dataclass(frozen=True)
class RunSide:
    """One run as verify reads it: its folder (evidence, request records) and its diagnosis.

    `evidence` holds the folder's evidence with the per-request samples of requests.jsonl joined
    in (`requests.ttft_p50_s`, ...), as the gate compares them.
    """

    folder: RunFolder
    diagnosis: Diagnosis
    evidence: Evidence
    note: str = ""  # how the diagnosis was obtained, when that is worth saying (LoadedRun.note)

    @classmethod
    def of(cls, folder: RunFolder, diagnosis: Diagnosis, note: str = "") -> RunSide:
        if folder.evidence is None:
            raise RunFolderError(f"{folder.label}: verify needs the run's evidence.json (its measurements)")
        joined = folder.evidence.with_items(request_measurements(folder.requests, str(folder.path / REQUESTS)))
        return cls(folder, diagnosis, joined, note or folder.note)

    @property
    def label(self) -> str:
        return self.folder.label


# --- 1. what changed ------------------------------------------------------------------------------
def _shown(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _config_value(evidence: Evidence, key: str) -> object:
    r = evidence.items.get(key)
    if isinstance(r, Fact):
        return r.value
    if isinstance(r, Measurement):
        return r.value
    return None


def config_diff(before: Evidence, after: Evidence) -> tuple[ConfigChange, ...]:
    """Every configuration fact either run discovered: the known ones (`ADOPTION`), then any other
    `config.*` key, each with how it changed."""
    keys = list(ADOPTION) + sorted(
        {k for ev in (before, after) for k in ev.items if k.startswith("config.") and k not in ADOPTION}
    )
    out = []
    for key in keys:
        b, a = _config_value(before, key), _config_value(after, key)
        if b is None and a is None:
            continue
        change: ChangeKind
        if key in SWITCHES:
            if a is True and b is not True:
                change = "turned-on"
            elif b is True and a is False:
                change = "turned-off"
            else:
                change = "same" if b == a else "newly-known" if b is None else "no-longer-known"
        elif b is None:
            change = "newly-known"
        elif a is None:
            change = "no-longer-known"
        else:
            change = "same" if b == a else "changed"
        out.append(ConfigChange(key, _shown(b), _shown(a), ADOPTION.get(key, ""), change))
    return tuple(out)


# What else than the server's settings can differ between two runs: the engine, where it runs, and
# when. Each is a row of "What changed" (with no technique: it can be behind anything).
ENGINE_KEYS = (Q.ENGINE_NAME, Q.ENGINE_VERSION)
# The server's host (not its port: two servers of one host on two ports are the usual A/B).
TARGET_KEY = "target.host"
DIAGNOSER_HOST_KEY = "diagnoser.host"  # the machine llm-diagnose ran on (the client's, and the host rule's)


def _host(url: str | None) -> str | None:
    try:
        return urlsplit(url).hostname if url else None
    except ValueError:
        return None


def target_diff(before: Evidence, after: Evidence) -> tuple[ConfigChange, ...]:
    """The engine (name, version), the target's host and the diagnoser's host of each run, where
    either run knows them: a change of any of them is a change too, and no technique's."""
    pairs = [(k, before.fact(k), after.fact(k)) for k in ENGINE_KEYS]
    pairs.append((TARGET_KEY, _host(before.target.url), _host(after.target.url)))
    pairs.append((DIAGNOSER_HOST_KEY, before.host or None, after.host or None))
    out = []
    for key, b, a in pairs:
        if b is None and a is None:
            continue
        change: ChangeKind = (
            "newly-known" if b is None else "no-longer-known" if a is None else "same" if b == a else "changed"
        )
        out.append(ConfigChange(key, _shown(b), _shown(a), "", change))
    return tuple(out)


def _created(ev: Evidence) -> datetime | None:
    try:
        return datetime.fromisoformat(ev.created_at)
    except (TypeError, ValueError):
        return None


def not_the_same_target(before: Evidence, after: Evidence, target: Sequence[ConfigChange]) -> str | None:
    """Why BEFORE and AFTER are not two runs of one server in order, or None where they are: another
    engine version, another target or diagnoser host, or AFTER taken before BEFORE. A gain (or a
    loss) between them may be that difference's, so no claim is credited with it. (Another engine
    altogether is not comparable at all: `compare_workloads`.)"""
    why = [f"{c.key} {c.before} -> {c.after}" for c in target if c.change == "changed"]
    b_t, a_t = _created(before), _created(after)
    if b_t is not None and a_t is not None and a_t.tzinfo == b_t.tzinfo and a_t < b_t:
        why.append(f"AFTER ({after.created_at}) was taken before BEFORE ({before.created_at}): were they swapped?")
    return "; ".join(why) or None


def identify_adopted(config: Sequence[ConfigChange], before: Diagnosis) -> tuple[AdoptedTechnique, ...]:
    """The techniques the configuration diff shows adopted; with none, those BEFORE recommended."""
    why: dict[str, list[str]] = {}
    for c in config:
        if c.technique and c.change in ("turned-on", "changed"):
            why.setdefault(c.technique, []).append(f"{c.key} {c.before or 'absent'} -> {c.after}")
    if why:
        return tuple(AdoptedTechnique(t, "; ".join(w)) for t, w in why.items())
    return tuple(
        AdoptedTechnique(r.technique, f"{r.status} by BEFORE's diagnosis (no discovered change adopts a technique)")
        for r in before.recommendations
        if r.status in ACTIVE_STATUSES
    )


# --- 2. the same workload? -------------------------------------------------------------------------
def _relative(b: float, a: float) -> float:
    if b == a:
        return 0.0
    return (a - b) / abs(b) if b else math.copysign(math.inf, a - b)


def _pct(x: float) -> str:
    return ("+inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:+.1%}"


def _check(name: str, b: float, a: float, tol: float, *, relative: bool = True, deciding: bool = True) -> WorkloadCheck:
    diff = _relative(b, a) if relative else a - b
    return WorkloadCheck(
        name,
        f"{b:.4g}",
        f"{a:.4g}",
        _pct(diff) if relative else f"{diff:+.3g}",
        f"{tol:.0%}" if relative else f"{tol:g}",
        abs(diff) <= tol,
        deciding,
    )


@dataclass(frozen=True)
class _Workload:
    requests: int
    per_experiment: Mapping[str, int]
    prompt_median: float | None
    output_median: float | None
    send_rate: float | None
    in_flight: float | None


def _prompt_tokens(r: RequestRecord) -> int | None:
    return r.prompt_tokens or r.planned_prompt_tokens


def _workload(records: Sequence[RequestRecord], other: Sequence[RequestRecord]) -> _Workload:
    """The load one run put on the server, judged on what it *sent*: a request the server failed
    keeps its prompt (its own length where known, else the same request's in the other run: a
    replay sends the same bodies under the same ids), and output lengths are compared over the
    requests both runs completed where they share ids. A change that makes the server reject the
    long half of a workload is then half the requests failed, not a shorter workload."""
    theirs = {r.request_id: r for r in other}
    prompts = [
        p
        for r in records
        if (p := _prompt_tokens(r) or (_prompt_tokens(theirs[r.request_id]) if r.request_id in theirs else None))
    ]
    done = [r for r in records if r.completed]
    both = [r for r in done if r.request_id in theirs and theirs[r.request_id].completed]
    outputs = [r.tokens_out for r in (both or done)]
    sends = sorted(r.t_send for r in records)
    span = sends[-1] - sends[0] if len(sends) > 1 else 0.0
    ends = [r.t_send + r.t_end for r in records if r.t_end is not None]
    busy = (max(ends) - sends[0]) if ends else 0.0
    return _Workload(
        len(records),
        Counter(f"{r.experiment}/{r.phase}" for r in records),
        statistics.median(prompts) if prompts else None,
        statistics.median(outputs) if outputs else None,
        (len(sends) - 1) / span if span > 0 else None,
        sum(r.t_end for r in records if r.t_end is not None) / busy if busy > 0 else None,
    )


def compare_workloads(before: RunSide, after: RunSide, tolerances: Tolerances | None = None) -> Comparability:
    """Whether the two runs put the same load on the same model: the registry's `workload.*`
    tolerances (`tolerances`, else their defaults), checks shown."""
    tol = tolerances or Tolerances()
    checks: list[WorkloadCheck] = []
    reasons: list[str] = []
    b_model, a_model = before.evidence.fact(Q.ENGINE_MODEL), after.evidence.fact(Q.ENGINE_MODEL)
    if b_model and a_model and b_model != a_model:
        reasons.append(f"different models: {b_model} before, {a_model} after")
    b_engine, a_engine = before.evidence.fact(Q.ENGINE_NAME), after.evidence.fact(Q.ENGINE_NAME)
    if b_engine and a_engine and b_engine != a_engine:
        reasons.append(f"different engines: {b_engine} before, {a_engine} after (another server, not a change of one)")
    b_req, a_req = before.folder.requests, after.folder.requests
    if (b_req is None) != (a_req is None):
        which = "BEFORE" if b_req is None else "AFTER"
        reasons.append(f"{which} has no {REQUESTS} (a passive run) and the other has: different kinds of run")
    elif b_req is not None and a_req is not None:
        bw, aw = _workload(b_req, a_req), _workload(a_req, b_req)
        for name in sorted(set(bw.per_experiment) | set(aw.per_experiment)):
            checks.append(
                _check(
                    f"requests sent ({name})",
                    bw.per_experiment.get(name, 0),
                    aw.per_experiment.get(name, 0),
                    tol[REQUESTS_SENT],
                )
            )
        for label, b, a, limit in (
            ("prompt tokens (median)", bw.prompt_median, aw.prompt_median, tol[PROMPT_TOKENS]),
            ("output tokens (median)", bw.output_median, aw.output_median, tol[OUTPUT_TOKENS]),
        ):
            if b is not None and a is not None:
                checks.append(_check(label, b, a, limit))
        for label, b, a in (
            ("send rate (requests/s)", bw.send_rate, aw.send_rate),
            ("requests in flight (mean)", bw.in_flight, aw.in_flight),
        ):
            if b is not None and a is not None:
                checks.append(_check(label, b, a, tol[SEND_RATE], deciding=False))
    else:
        for label, key, limit in (
            ("prompt tokens (median)", Q.INPUT_LEN_P50, tol[PROMPT_TOKENS]),
            ("output tokens (median)", Q.OUTPUT_LEN_P50, tol[OUTPUT_TOKENS]),
        ):
            bm, am = before.evidence.measurement(key), after.evidence.measurement(key)
            if bm is not None and am is not None:
                checks.append(_check(label, bm.value, am.value, limit))
            elif (bm is None) != (am is None):  # traffic in one run only: an idle server against a loaded one
                which = "BEFORE" if bm is None else "AFTER"
                reasons.append(f"{which} measured no {label} ({key}) and the other did: was it idle?")
    b_pot, a_pot = before.evidence.measurement(Q.PREFIX_POTENTIAL), after.evidence.measurement(Q.PREFIX_POTENTIAL)
    if b_pot is not None and a_pot is not None:
        checks.append(_check("prefix reuse (potential)", b_pot.value, a_pot.value, tol[PREFIX_REUSE], relative=False))
    b_host, a_host = (
        before.evidence.measurement(Q.CLIENT_HOST_OTHER_CORES),
        after.evidence.measurement(Q.CLIENT_HOST_OTHER_CORES),
    )
    if b_host is not None and a_host is not None:  # shown: the host rule (host_load) acts on the timings instead
        row = _check(
            "other processes' CPU (cores)", b_host.value, a_host.value, OTHER_LOAD_CHANGE_CORES, relative=False
        )
        # "same?" is the host rule's answer (it also asks whether the host was busy), shown only.
        same = host_load_change(before.evidence, after.evidence) is None
        checks.append(replace(row, comparable=same, deciding=False))
    reasons += [
        f"{c.name} differs by {c.difference} (tolerance {c.tolerance})"
        for c in checks
        if c.deciding and not c.comparable
    ]
    if not reasons and not any(c.deciding for c in checks):
        return Comparability(
            True,
            tuple(checks),
            (
                "workload not checked: neither run recorded requests or prompt/output lengths; verdicts assume it is "
                "the same",
            ),
        )
    return Comparability(not reasons, tuple(checks), tuple(reasons))


# --- 3. the claims ----------------------------------------------------------------------------------
def judge_interval(claim: Claim, low: float, high: float) -> ClaimVerdict:
    """A claim's verdict from the interval of the change (relative or absolute, as the claim is)."""
    m = claim.min_effect
    if claim.direction == "not-up":
        return "delivered" if high <= m else "made-it-worse" if low > m else "cannot-tell"
    sign = 1.0 if claim.direction == "up" else -1.0
    good_lo, good_hi = sorted((sign * low, sign * high))
    if good_lo > m:
        return "delivered"
    if good_hi < -m:
        return "made-it-worse"
    if -m <= good_lo and good_hi <= m:
        return "no-measurable-effect"
    return "cannot-tell"


def _source(key: str, before: Evidence, after: Evidence) -> str:
    """The key a claim is compared on: the first candidate both runs sampled, else measured, else its own."""
    candidates = _SOURCES.get(key, (key,))
    for enough in (lambda m: len(m.samples) >= 2, lambda m: True):
        for k in candidates:
            b, a = before.measurement(k), after.measurement(k)
            if b is not None and a is not None and enough(b) and enough(a):
                return k
    return key


def _reword(detail: str) -> str:
    """The gate's words for the two runs, as verify names them."""
    for old, new in (
        ("the current run", "AFTER"),
        ("the baseline", "BEFORE"),
        ("baseline", "before"),
        ("current", "after"),
    ):
        detail = detail.replace(old, new)
    return detail


def _at_least(technique: str, claim: Claim, after: Evidence, settings: CompareSettings) -> ClaimResult:
    level = claim.level if claim.level is not None else 0.0
    m = after.measurement(claim.key)
    if m is None:
        return ClaimResult(technique, claim, "cannot-tell", basis="not measured in AFTER")
    shown = format_value(m.value, m.unit)
    s = m.summary
    if s is not None and s.n >= settings.min_samples:
        low, high, basis = s.ci_low, s.ci_high, f"median of {s.n} samples in AFTER with its confidence interval"
    else:
        low = high = m.value
        basis = "one value in AFTER (noise not accounted for)"
    verdict: ClaimVerdict = "delivered" if low >= level else "made-it-worse" if high < level else "cannot-tell"
    return ClaimResult(
        technique, claim, verdict, "", shown, f"[{low:.3g}, {high:.3g}] vs {level:g}", basis, m.value, (low, high)
    )


def _cache_off_is_zero_hits(claim: Claim, before: Evidence) -> tuple[Evidence, str]:
    """A run whose server had prefix caching off served no prompt token from a cache: its hit
    rate is 0 by construction, not unknown (the engine looked nothing up, so it reports none)."""
    if claim.key != Q.PREFIX_HIT_RATE or before.measurement(Q.PREFIX_HIT_RATE) is not None:
        return before, ""
    if before.fact(Q.PREFIX_CACHING) is not False:
        return before, ""
    zero = Measurement(0.0, "fraction", Provenance("verify", "config.prefix_caching = false"),
                       note="prefix caching off: no prompt token can be served from a cache")  # fmt: skip
    return before.with_items({Q.PREFIX_HIT_RATE: zero}), "BEFORE had prefix caching off, so 0 hits; "


def judge_claim(
    technique: str, claim: Claim, before: Evidence, after: Evidence, settings: CompareSettings
) -> ClaimResult:
    """One claim, judged by the comparison of the two runs the gate makes too (`compare.metric.compare_metric`)."""
    if claim.direction == "at-least":
        return _at_least(technique, claim, after, settings)
    before, zero_note = _cache_off_is_zero_hits(claim, before)
    key = _source(claim.key, before, after)
    rule = MetricRule(
        key,
        "higher" if claim.direction == "up" else "lower",
        tolerance=claim.min_effect if claim.relative else None,
        tolerance_abs=None if claim.relative else claim.min_effect,
    )
    o = compare_metric(rule, before, after, settings)
    via = zero_note + (f"{key}: " if key != claim.key else "")

    def result(verdict: ClaimVerdict, basis: str, interval: tuple[float, float] | None = None) -> ClaimResult:
        return ClaimResult(technique, claim, verdict, o.baseline, o.current, o.change, via + basis, o.point, interval)

    if o.interval is not None:
        verdict = judge_interval(claim, *o.interval)
        if o.verdict == "inconclusive" and verdict in ("delivered", "made-it-worse"):
            # The comparison withheld the interval's verdict: the client saw a change its engine did not
            # (`compare.metric._cross_checked`), which says where the time went and why it is not the change's.
            return result("cannot-tell", _reword(o.detail), o.interval)
        how = o.detail.split(": the ", 1)[0]  # the gate's "how: the interval ..." without its verdict's why
        return result(verdict, how, o.interval)
    if o.point is not None:
        verdict = judge_interval(claim, o.point, o.point)
        if o.verdict == "inconclusive" and verdict in ("delivered", "made-it-worse"):
            return result("cannot-tell", _reword(o.detail))  # withheld by the gate, as above
        return result(verdict, "values compared (no raw samples: noise not accounted for)")
    return result("cannot-tell", _reword(o.detail))


# --- 4. side effects ----------------------------------------------------------------------------------
# The parts of serving each of the default metrics (compare.rules.DEFAULT_METRICS) spans
# (llm_diagnose.diagnose.verify.claims.Part).
# Rates and whole-request times span every timed part: in a closed-loop run, a faster prefill
# sends the next request sooner.
_TIMED: frozenset[Part] = frozenset({"queue", "prefill", "decode"})
METRIC_PARTS: dict[str, frozenset[Part]] = {
    REQUEST_TTFT_P50: frozenset({"queue", "prefill"}),
    REQUEST_TTFT_P99: frozenset({"queue", "prefill"}),
    Q.TTFT_P50: frozenset({"queue", "prefill"}),
    Q.TTFT_P99: frozenset({"queue", "prefill"}),
    REQUEST_TPOT_P50: frozenset({"decode"}),
    Q.ITL_P50: frozenset({"decode"}),
    Q.ITL_P99: frozenset({"decode"}),
    Q.DECODE_BATCH1_ITL_P50: frozenset({"decode"}),
    Q.DECODE_BATCH1_ITL_P99: frozenset({"decode"}),
    REQUEST_E2E_P50: _TIMED,
    Q.E2E_P50: _TIMED,
    Q.QUEUE_TIME_P50: frozenset({"queue"}),
    Q.GEN_TOKENS_PER_S: _TIMED,
    Q.PROMPT_TOKENS_PER_S: _TIMED,
    Q.REQUESTS_PER_S: _TIMED,
    Q.DEVICE_FREE_FRACTION: frozenset({"memory"}),
    Q.KV_CAPACITY_TOKENS: frozenset({"memory"}),
    Q.PREEMPTION_RATE: frozenset({"memory"}),
    Q.PREFIX_HIT_RATE: frozenset({"cache"}),
    Q.SPEC_ACCEPTANCE_RATE: frozenset({"speculation"}),
    Q.SPEC_ACTIVE_ACCEPTANCE_RATE: frozenset({"speculation"}),
}

# What any change can make worse, whatever the technique: a setting that does not fit the server
# (a shorter max_model_len, a KV cache that no longer holds the longest request, a flag some inputs
# trip over) fails requests that were answered before.
ANY_CHANGE_CAN_CAUSE: frozenset[str] = frozenset({REQUEST_FAILED_FRACTION})


def unattributed(key: str, config: Sequence[ConfigChange]) -> str | None:
    """Why a metric that got worse between the runs is not the change's doing, or None when it can be.

    The change is what the configuration diff shows switched or changed (a fact discovered in one
    run only is not a change). Where no setting changed (the change is outside what the probes see)
    or one belongs to no technique, it could be anything: everything is attributable. Otherwise the
    metric must span only parts of serving the changed techniques can make worse
    (`llm_diagnose.diagnose.verify.claims.CAN_WORSEN`); a metric that spans others too (end-to-end
    time spans the decode) is not attributed, since the parts the change can worsen are judged on
    rows of their own (TTFT: queue and prefill).
    """
    if key in ANY_CHANGE_CAN_CAUSE:
        return None
    techniques = sorted({c.technique for c in config if c.set_differently})
    if not techniques or "" in techniques:
        return None
    reachable = frozenset().union(*(can_worsen(t) for t in techniques))
    spans = METRIC_PARTS.get(key, ALL_PARTS)
    beyond = sorted(spans - reachable)
    if not beyond:
        return None
    why = "; ".join(f"{t}: {CAN_WORSEN[t][1]}" for t in techniques if t in CAN_WORSEN)
    within = sorted(spans & reachable)
    # A metric that also spans parts the change can worsen (end to end: queue and prefill too) is
    # not the place to see them: those parts have rows of their own (TTFT), judged as they are.
    own = f"; its {' and '.join(within)} have their own rows (TTFT), judged on their own" if within else ""
    return (
        f"{key} times the {' and '.join(beyond)}, which {', '.join(techniques)} cannot make worse ({why}){own}. "
        "With one run of each configuration, the likeliest cause is that two server instances differ (or the "
        "host under them); to tell, run BEFORE's configuration again on a fresh server and pass it as --control "
        "(A/B/A): a move as large between BEFORE and it is the instances', not the change's"
    )


def side_effects(
    before: RunSide,
    after: RunSide,
    claimed: frozenset[str],
    settings: CompareSettings,
    config: Sequence[ConfigChange] = (),
) -> tuple[SideEffect, ...]:
    """Metrics beyond the claims whose whole interval moved past their tolerance, and pitfalls
    detected in AFTER and not in BEFORE (harmful), or no longer detected (not).

    A metric that got worse is harmful only where the change can make it worse (`unattributed`);
    elsewhere it is shown, not attributed, with what would tell. `config` is `config_diff`'s."""
    out: list[SideEffect] = []
    for rule in DEFAULT_METRICS:
        if rule.key in claimed:
            continue
        o: Outcome = compare_metric(rule, before.evidence, after.evidence, settings)
        if o.interval is not None and o.verdict in ("regression", "improvement"):
            worse = o.verdict == "regression"
            moved = f"{'worse' if worse else 'better'} beyond {o.tolerance} with the whole interval"
            not_ours = unattributed(rule.key, config) if worse else None
            out.append(
                SideEffect(
                    rule.key,
                    "metric",
                    worse and not_ours is None,
                    o.baseline,
                    o.current,
                    o.change,
                    moved if not_ours is None else f"{moved}, but not attributed to the change: {not_ours}",
                    attributed=not_ours is None,
                )
            )
    b_pit = {p.pitfall: p for p in before.diagnosis.pitfalls}
    a_pit = {p.pitfall: p for p in after.diagnosis.pitfalls}
    for pid in PITFALLS:
        b = b_pit[pid].detected if pid in b_pit else None
        a = a_pit[pid].detected if pid in a_pit else None
        if a is True and b is not True:
            out.append(
                SideEffect(f"pitfall:{pid}", "pitfall", True, "not detected", "detected", "", a_pit[pid].explanation)
            )
        elif b is True and a is False:
            out.append(
                SideEffect(f"pitfall:{pid}", "pitfall", False, "detected", "not detected", "", "no longer detected")
            )
    return tuple(out)


def slo_changes(before: Diagnosis, after: Diagnosis) -> tuple[SloChange, ...]:
    """Each declared objective's status in both runs (nothing when neither declared one)."""
    b = {c.objective.label: c for c in before.slo_checks}
    a = {c.objective.label: c for c in after.slo_checks}

    def shown(check) -> str:
        return "not declared" if check is None else f"{check.observed_text} ({check.status})"

    return tuple(SloChange(x, shown(b.get(x)), shown(a.get(x))) for x in list(b) + [x for x in a if x not in b])


# --- together -------------------------------------------------------------------------------------------
def _method(s: CompareSettings) -> str:
    return (
        f"Claims and side effects are judged by the gate's comparison: bootstrap {s.confidence:.0%} confidence "
        f"interval of the change from raw samples ({s.resamples} resamples, seed {s.seed}, at least {s.min_samples} "
        "samples per run; tail quantiles need more), medians known only by a summary bounded by their confidence "
        "intervals, other values compared as they are (said per claim). A claim is delivered when the whole interval "
        "is beyond its minimum effect the promised way, made worse when beyond it the other way, of no measurable "
        "effect when the interval lies within +-the minimum effect."
    )


def credit_to_mechanism(results: tuple[ClaimResult, ...]) -> tuple[ClaimResult, ...]:
    """One technique's judged claims, with outcomes it cannot have caused no longer credited to it.

    Where the technique's mechanism claim (`MECHANISMS`: prefix caching's hit rate) showed no
    effect or the wrong one, an outcome claim that moved the promised way is `cannot-tell`: it
    moved, but something else moved it (a server warming up, the host's load, another change).
    Where the mechanism showed no effect at all, an outcome that got worse is `cannot-tell` too:
    a technique that did nothing cannot have cost that much, and with one run of each
    configuration the likeliest cause is that the two server instances differ (CI: prefix caching
    with nothing to share, hit rate 0% -> 0%, TTFT +31% [+10%, +50%] on the second server; two
    instances of one configuration measured -33% [-42%, -21%] apart in time per token). A
    mechanism that moved the wrong way (a hit rate that fell) leaves a worse outcome worse.
    """
    mechanism = next((r for r in results if MECHANISMS.get(r.technique) == r.claim.key), None)
    if mechanism is None or mechanism.verdict not in ("no-measurable-effect", "made-it-worse"):
        return results
    moved = f"{mechanism.claim.key} did not ({mechanism.before} -> {mechanism.after}: {mechanism.verdict})"
    better = (
        f"; not credited to {mechanism.technique}: it moved the promised way, but its mechanism {moved}, so "
        "something else moved it (a freshly started server warming up, the host's load, another change)"
    )
    worse = (
        f"; not blamed on {mechanism.technique}: it moved the wrong way, but its mechanism {moved}, and a "
        "technique that did nothing cannot have cost that much: the likeliest cause is that the two server "
        "instances differ; run BEFORE's configuration again on a fresh server and pass it as --control to tell"
    )

    def credited(r: ClaimResult) -> ClaimResult:
        if r is mechanism:
            return r
        if r.verdict == "delivered":
            return replace(r, verdict="cannot-tell", basis=r.basis + better)
        if r.verdict == "made-it-worse" and mechanism.verdict == "no-measurable-effect":
            return replace(r, verdict="cannot-tell", basis=r.basis + worse)
        return r

    return tuple(credited(r) for r in results)


def claimed_keys(claims: Sequence[ClaimResult]) -> frozenset[str]:
    """The evidence keys the claims were judged on (each claim's key and its per-request counterparts)."""
    return frozenset(k for c in claims for k in _SOURCES.get(c.claim.key, (c.claim.key,)))


def judge_technique(
    technique: str, before: Evidence, after: Evidence, settings: CompareSettings
) -> tuple[ClaimResult, ...]:
    """Every claim of one technique, judged and then credited through its mechanism."""
    return credit_to_mechanism(tuple(judge_claim(technique, c, before, after, settings) for c in claims_for(technique)))


def verify(
    before: RunSide, after: RunSide, *, change_note: str = "", settings: CompareSettings | None = None
) -> VerifyResult:
    settings = settings or CompareSettings()
    config = config_diff(before.evidence, after.evidence) + target_diff(before.evidence, after.evidence)
    adopted = identify_adopted(config, before.diagnosis)
    elsewhere = not_the_same_target(before.evidence, after.evidence, config)
    comparability = compare_workloads(before, after, settings.tolerances)
    sides = (("BEFORE", before), ("AFTER", after))
    notes = [f"{side}: {line}" for side, run in sides for line in run.folder.skipped_notes()]
    notes += [f"{side}: {run.note}" for side, run in sides if run.note]
    if not any(c.changed for c in config):
        notes.append(
            "no configuration change discovered between the runs (the change may be outside what the probes see): "
            "judging the techniques BEFORE's diagnosis recommended"
        )
    for side, run in sides:
        failed = run.evidence.measurement(REQUEST_FAILED_FRACTION)
        if failed is not None and settings.failed_too_often(failed.value):
            notes.append(
                f"{side}: {failed.note}, more than {settings.max_failed_fraction:.0%}: its latencies cover only the "
                "requests the server answered (requests.jsonl has each fault)"
            )
    if not adopted:
        notes.append("no technique to judge: none adopted, none recommended")
    if elsewhere is not None:
        notes.append(
            f"not two runs of one server in order ({elsewhere}): no claim is credited or blamed on the technique; "
            "verify two runs of the same server, BEFORE first"
        )
    if (host := host_load_change(before.evidence, after.evidence)) is not None:
        notes.append(
            f"the host changed under the server: {_reword(host)}; timed claims and side effects that moved are "
            "cannot-tell, not the change's (rerun both on a quiet host)"
        )
    result = VerifyResult(
        before.label,
        after.label,
        config,
        adopted,
        comparability,
        change_note=change_note,
        notes=tuple(notes),
        method=_method(settings),
    )
    if not comparability.comparable:
        return result  # different workloads: no verdict at all
    claims = tuple(
        claim for t in adopted for claim in judge_technique(t.technique, before.evidence, after.evidence, settings)
    )
    if elsewhere is not None:
        claims = tuple(
            replace(c, verdict="cannot-tell", basis=f"{c.basis}; not credited: {elsewhere}")
            if c.verdict in ("delivered", "made-it-worse")
            else c
            for c in claims
        )
    claimed = claimed_keys(claims)
    return replace(
        result,
        claims=claims,
        side_effects=side_effects(before, after, claimed, settings, config),
        slo=slo_changes(before.diagnosis, after.diagnosis),
    )
