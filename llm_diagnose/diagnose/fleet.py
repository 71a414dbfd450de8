"""The fleet view: replicas of one deployment compared with each other, from their evidence.

Pure functions over per-replica `Evidence` (built by `llm-diagnose fleet` from a Prometheus
server, or by hand in tests). It answers three things:

- which replicas diverge, on the prefix-cache hit rate, KV usage (p95), preemptions, the
  waiting queue and the prefill load, each against a named `fleet.*` threshold, and which
  configuration difference (prefix caching, block size, KV capacity) or load imbalance
  explains it where one does;
- what the fleet as a whole achieves (the hit rate weighted by looked-up tokens);
- whether requests that share prefixes land on different replicas (`routing`): the fleet's
  hit rate against the reuse the same requests would get from one cache (a trace of the
  fleet's traffic, `prefix.lru_fraction_at_capacity` or else `prefix.potential_fraction`).

Limits, said where they apply: with two replicas the divergent one cannot be told from the
other (both are listed); the routing signal needs a trace of the same traffic and cannot
tell prefix-blind routing from eviction under KV pressure on its own (preemptions are shown
beside it); a replica with prefix caching off serves no prompt token from cache, so its
cached share is 0, not unknown.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from llm_diagnose.diagnose.tree.diagnosis import Comparison
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, Result

__all__ = [
    "Divergence",
    "ConfigDifference",
    "RoutingFinding",
    "FleetView",
    "fleet_view",
    "render_text",
    "TABLE_KEYS",
    "CONFIG_KEYS",
]

# Columns of the per-replica table, in order.
TABLE_KEYS = (
    Q.PREFIX_HIT_RATE,
    Q.PREFIX_QUERIED_TOKENS,
    Q.KV_USAGE_P95,
    Q.KV_USAGE_MEAN,
    Q.PREEMPTIONS,
    Q.WAITING_MEAN,
    Q.RUNNING_MEAN,
    Q.REQUESTS_PER_S,
    Q.PROMPT_TOKENS_PER_S,
    Q.TTFT_P50,
)
# Configuration that should be equal across the replicas of one deployment.
CONFIG_KEYS = (
    Q.ENGINE_NAME,
    Q.PREFIX_CACHING,
    Q.BLOCK_SIZE,
    Q.KV_CACHE_DTYPE,
    Q.KV_CAPACITY_TOKENS,
    Q.SPEC_DECODE,
    Q.KV_OFFLOAD,
    Q.GPU_MEMORY_UTILIZATION,
)
CACHING_OFF_NOTE = "prefix caching is off: no prompt token is served from cache (0, not unknown)"


@dataclass(frozen=True)
class _Compared:
    key: str
    what: str
    threshold: str
    rule: Literal["spread", "some-vs-none", "ratio"]
    related: tuple[str, ...]  # configuration keys that can explain a divergence
    load_explains: bool  # a load imbalance explains it too


_COMPARED = (
    _Compared(
        Q.PREFIX_HIT_RATE,
        "prefix-cache hit rate",
        "fleet.max_hit_rate_spread",
        "spread",
        (Q.PREFIX_CACHING, Q.BLOCK_SIZE),
        False,
    ),
    _Compared(
        Q.KV_USAGE_P95,
        "KV-cache usage p95",
        "fleet.max_kv_usage_spread",
        "spread",
        (Q.KV_CAPACITY_TOKENS, Q.KV_CACHE_DTYPE, Q.PREFIX_CACHING),
        True,
    ),
    _Compared(
        Q.PREEMPTIONS,
        "preemptions",
        "fleet.min_preemptions",
        "some-vs-none",
        (Q.KV_CAPACITY_TOKENS, Q.KV_CACHE_DTYPE, Q.PREFIX_CACHING),
        True,
    ),
    _Compared(
        Q.WAITING_MEAN, "waiting requests (mean)", "fleet.max_waiting_spread", "spread", (Q.KV_CAPACITY_TOKENS,), True
    ),
    _Compared(Q.PROMPT_TOKENS_PER_S, "prompt tokens per second (load)", "fleet.max_load_ratio", "ratio", (), False),
)


@dataclass(frozen=True)
class Divergence:
    key: str
    what: str
    comparison: Comparison  # spread (or ratio, or max count) against the named threshold; holds = diverges
    values: Mapping[str, float]  # replica -> value
    high: tuple[str, ...]  # replicas above the fleet's median by more than half the limit
    low: tuple[str, ...]
    explained_by: tuple[str, ...] = ()  # configuration keys that differ among these replicas, or "load"

    def describe(self) -> str:
        c = self.comparison
        shown = "max/min" if c.evidence.endswith("ratio") else "spread"
        text = f"{self.what}: {shown} {c.value:.3g} {c.op} {c.limit:.3g} ({c.threshold})"
        if self.high:
            text += f"; high: {', '.join(self.high)}"
        if self.low:
            text += f"; low: {', '.join(self.low)}"
        if len(self.values) == 2:
            text += " (two replicas: either may be the odd one)"
        if self.explained_by:
            text += f"; differs with: {', '.join(self.explained_by)}"
        return text

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "what": self.what,
            "comparison": self.comparison.to_dict(),
            "values": dict(self.values),
            "high": list(self.high),
            "low": list(self.low),
            "explained_by": list(self.explained_by),
            "summary": self.describe(),
        }


@dataclass(frozen=True)
class ConfigDifference:
    key: str
    values: Mapping[str, object]  # replica -> the value it reports

    def describe(self) -> str:
        by_value: dict[str, list[str]] = {}
        for replica, value in self.values.items():
            by_value.setdefault(_shown(value), []).append(replica)
        return f"{self.key}: " + "; ".join(f"{v} on {', '.join(rs)}" for v, rs in by_value.items())

    def to_dict(self) -> dict:
        return {"key": self.key, "values": dict(self.values), "summary": self.describe()}


@dataclass(frozen=True)
class RoutingFinding:
    """Whether requests sharing prefixes land on different replicas (prefix-blind routing)."""

    status: Literal["suspected", "not-indicated", "unknown"]
    reason: str
    comparison: Comparison | None = None  # fleet hit rate / reference against fleet.routing_ratio
    fleet_hit_rate: float | None = None
    reference: float | None = None
    reference_key: str = ""
    caveats: tuple[str, ...] = ()
    hint: str = ""

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "comparison": self.comparison.to_dict() if self.comparison else None,
            "fleet_hit_rate": self.fleet_hit_rate,
            "reference": self.reference,
            "reference_key": self.reference_key,
            "caveats": list(self.caveats),
            "hint": self.hint,
        }


@dataclass(frozen=True)
class FleetView:
    replicas: tuple[str, ...]
    table: Mapping[str, Mapping[str, float | None]]  # replica -> key -> value (None: not measured)
    notes: Mapping[str, Mapping[str, str]]  # replica -> key -> why a cell is what it is
    fleet: Mapping[str, float | None]  # fleet-wide figures
    divergences: tuple[Divergence, ...]  # every comparison made; `comparison.holds` says which diverge
    config_differences: tuple[ConfigDifference, ...]
    routing: RoutingFinding
    remarks: tuple[str, ...] = field(default=())

    @property
    def diverging(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if d.comparison.holds)

    def to_dict(self) -> dict:
        return {
            "replicas": list(self.replicas),
            "table": {r: dict(v) for r, v in self.table.items()},
            "notes": {r: dict(v) for r, v in self.notes.items() if v},
            "fleet": dict(self.fleet),
            "diverging": [d.key for d in self.diverging],
            "comparisons": [d.to_dict() for d in self.divergences],
            "config_differences": [c.to_dict() for c in self.config_differences],
            "routing": self.routing.to_dict(),
            "remarks": list(self.remarks),
        }


def _shown(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _value(result: Result | None) -> float | None:
    return float(result.value) if isinstance(result, Measurement) else None


def _cell(evidence: Evidence, key: str) -> tuple[float | None, str]:
    """A replica's value for `key`, with a note when it is not the plain measurement."""
    value = _value(evidence.items.get(key))
    if value is not None:
        return value, ""
    if key == Q.PREFIX_HIT_RATE and evidence.fact(Q.PREFIX_CACHING) is False:
        prompts = _value(evidence.items.get(Q.PROMPT_TOKENS_PER_S))
        if prompts is not None and prompts > 0:
            return 0.0, CACHING_OFF_NOTE
    missing = evidence.missing(key)
    return None, missing.reason if missing is not None else "not measured"


def _config_value(evidence: Evidence, key: str) -> object | None:
    r = evidence.items.get(key)
    if isinstance(r, Fact):
        return r.value
    if isinstance(r, Measurement):
        return r.value
    return None


def _config_differences(evidence: Mapping[str, Evidence]) -> tuple[ConfigDifference, ...]:
    out = []
    for key in CONFIG_KEYS:
        values = {name: v for name, e in evidence.items() if (v := _config_value(e, key)) is not None}
        if len({_shown(v) for v in values.values()}) > 1:
            out.append(ConfigDifference(key, values))
    return tuple(out)


def _compare(
    spec: _Compared, values: Mapping[str, float], t: Thresholds, differing: set[str], load_imbalanced: bool
) -> Divergence | None:
    if len(values) < 2:
        return None
    limit = t[spec.threshold]
    vs = list(values.values())
    median = statistics.median(vs)
    if spec.rule == "spread":
        observed, op = max(vs) - min(vs), ">"
        holds = observed > limit
        evidence_name = f"spread of {spec.key} over replicas"
        high = tuple(r for r, v in values.items() if v >= median + limit / 2) if holds else ()
        low = tuple(r for r, v in values.items() if v <= median - limit / 2) if holds else ()
    elif spec.rule == "some-vs-none":
        observed, op = max(vs), ">="
        holds = observed >= limit and min(vs) == 0
        evidence_name = f"max {spec.key} over replicas, with one at 0"
        high = tuple(r for r, v in values.items() if v >= limit) if holds else ()
        low = tuple(r for r, v in values.items() if v == 0) if holds else ()
    else:  # ratio
        if min(vs) <= 0:
            observed = float("inf") if max(vs) > 0 else 1.0
        else:
            observed = max(vs) / min(vs)
        op = ">"
        holds = observed > limit
        evidence_name = f"max/min {spec.key} over replicas: ratio"
        high = tuple(r for r, v in values.items() if v == max(vs)) if holds else ()
        low = tuple(r for r, v in values.items() if v == min(vs)) if holds else ()
    if observed == float("inf"):
        observed = 1e9  # finite for JSON: one replica had no prefill load at all
    explained = tuple(k for k in spec.related if k in differing)
    if holds and spec.load_explains and load_imbalanced:
        explained += ("load",)
    return Divergence(
        spec.key,
        spec.what,
        Comparison(spec.threshold, evidence_name, observed, op, limit, holds),
        dict(values),
        high,
        low,
        explained if holds else (),
    )


def _fleet_hit_rate(
    evidence: Mapping[str, Evidence], table: Mapping[str, Mapping[str, float | None]]
) -> tuple[float | None, float | None]:
    """Hits over looked-up tokens across the fleet (replicas with the prefix cache off look up nothing)."""
    hits = queried = 0.0
    for name in evidence:
        rate, tokens = table[name].get(Q.PREFIX_HIT_RATE), table[name].get(Q.PREFIX_QUERIED_TOKENS)
        if rate is not None and tokens is not None and tokens > 0:
            hits += rate * tokens
            queried += tokens
    return (hits / queried if queried > 0 else None), (queried if queried > 0 else None)


def _routing(
    evidence: Mapping[str, Evidence],
    table: Mapping[str, Mapping[str, float | None]],
    fleet_hit: float | None,
    trace: Mapping[str, Result],
    t: Thresholds,
) -> RoutingFinding:
    hint = (
        "pass --trace FILE: the fleet's request log for the same window (the reuse one cache would get "
        "on those requests)"
    )
    off = sorted(n for n, e in evidence.items() if e.fact(Q.PREFIX_CACHING) is False)
    if off:
        return RoutingFinding(
            "unknown",
            f"prefix caching is off on {', '.join(off)}: routing cannot be judged until every replica caches prefixes",
            hint="start them with --enable-prefix-caching (vLLM), then look again",
        )
    hitting = [n for n in evidence if table[n].get(Q.PREFIX_HIT_RATE) is not None]
    if len(hitting) < 2:
        return RoutingFinding(
            "unknown",
            f"{len(hitting)} replica(s) looked up prompt tokens in the window: routing needs at least two with traffic",
            hint="a window with traffic",
        )
    reference, reference_key = None, ""
    for key in (Q.PREFIX_AT_CAPACITY, Q.PREFIX_POTENTIAL):
        if (v := _value(trace.get(key))) is not None:
            reference, reference_key = v, key
            break
    if reference is None or fleet_hit is None:
        return RoutingFinding(
            "unknown",
            "no trace of the fleet's requests: the reuse the traffic holds is unknown, "
            "so a low hit rate cannot be pinned on routing",
            fleet_hit_rate=fleet_hit,
            hint=hint,
        )
    if reference < t["q2.min_reuse_fraction"]:
        return RoutingFinding(
            "not-indicated",
            f"the trace shares little ({reference_key} = {reference:.3g} < "
            f"q2.min_reuse_fraction {t['q2.min_reuse_fraction']:.3g}): routing "
            "by prefix has nothing to gain",
            fleet_hit_rate=fleet_hit,
            reference=reference,
            reference_key=reference_key,
        )
    ratio = fleet_hit / reference
    limit = t["fleet.routing_ratio"]
    comparison = Comparison(
        "fleet.routing_ratio", f"fleet {Q.PREFIX_HIT_RATE} / {reference_key}", ratio, "<", limit, ratio < limit
    )
    caveats = []
    preempting = sorted(n for n in evidence if (table[n].get(Q.PREEMPTIONS) or 0) > 0)
    if preempting:
        caveats.append(
            f"{', '.join(preempting)} preempted requests in the window: eviction under KV pressure "
            "also lowers hit rates"
        )
    if reference_key == Q.PREFIX_POTENTIAL:
        caveats.append(
            "the reference is an unlimited cache: a replica's finite KV cache reaches less; give "
            "--kv-capacity-tokens (or let the trace use the replicas' capacity) for the LRU figure"
        )
    caveats.append("the trace must be the traffic of this window, and its block size the replicas'")
    below = sorted(n for n in hitting if (table[n][Q.PREFIX_HIT_RATE] or 0.0) < limit * reference)
    if comparison.holds:
        reason = (
            f"the fleet serves {fleet_hit:.1%} of looked-up tokens from cache where one cache would serve "
            f"{reference:.1%} of the same requests ({reference_key}); "
            f"{len(below)} of {len(hitting)} replicas are below {limit:g} of it: requests sharing "
            "prefixes land on different replicas"
        )
        return RoutingFinding(
            "suspected",
            reason,
            comparison,
            fleet_hit,
            reference,
            reference_key,
            tuple(caveats),
            hint="route by prefix (session or prefix affinity: e.g. the vLLM production-stack "
            "router's prefix-aware routing, llm-d's KV-cache-aware scheduler, SGLang's "
            "cache-aware router)",
        )
    reason = (
        f"the fleet's hit rate {fleet_hit:.1%} reaches {ratio:.0%} of the reuse one cache would get "
        f"({reference:.1%}, {reference_key}): routing loses little"
    )
    return RoutingFinding("not-indicated", reason, comparison, fleet_hit, reference, reference_key, tuple(caveats))


def fleet_view(
    evidence: Mapping[str, Evidence], thresholds: Thresholds | None = None, trace: Mapping[str, Result] | None = None
) -> FleetView:
    """Compare the replicas' evidence; `trace` holds a trace analysis of the fleet's traffic (optional)."""
    t = thresholds or Thresholds()
    names = tuple(sorted(evidence))
    table: dict[str, dict[str, float | None]] = {}
    notes: dict[str, dict[str, str]] = {}
    for name in names:
        row, why = {}, {}
        for key in TABLE_KEYS:
            value, note = _cell(evidence[name], key)
            row[key] = value
            if note:
                why[key] = note
        table[name], notes[name] = row, why
    differences = _config_differences(evidence)
    differing = {d.key for d in differences}
    compared: list[Divergence] = []
    load = None
    for spec in reversed(_COMPARED):  # load first: it explains the others
        values = {n: v for n in names if (v := table[n].get(spec.key)) is not None}
        d = _compare(spec, values, t, differing, bool(load and load.comparison.holds))
        if d is not None:
            compared.append(d)
            if spec.key == Q.PROMPT_TOKENS_PER_S:
                load = d
    compared.reverse()
    fleet_hit, queried = _fleet_hit_rate(evidence, table)

    def total(key: str) -> float | None:
        vs = [v for n in names if (v := table[n].get(key)) is not None]
        return sum(vs) if vs else None

    fleet = {
        "replicas": float(len(names)),
        Q.PREFIX_HIT_RATE: fleet_hit,
        Q.PREFIX_QUERIED_TOKENS: queried,
        Q.PREEMPTIONS: total(Q.PREEMPTIONS),
        Q.REQUESTS_PER_S: total(Q.REQUESTS_PER_S),
        Q.PROMPT_TOKENS_PER_S: total(Q.PROMPT_TOKENS_PER_S),
    }
    remarks = []
    if len(names) < 2:
        remarks.append("one replica: nothing to compare it with")
    if any(notes[n].get(Q.PREFIX_HIT_RATE) == CACHING_OFF_NOTE for n in names):
        remarks.append(
            "the fleet's hit rate covers the replicas that look prefixes up; those with prefix caching "
            "off serve none of their prompt tokens from cache"
        )
    idle = [n for n in names if not table[n].get(Q.REQUESTS_PER_S)]
    if idle:
        remarks.append(
            f"no finished requests in the window on {', '.join(idle)}: its latency and length figures are not measured"
        )
    routing = _routing({n: evidence[n] for n in names}, table, fleet_hit, dict(trace or {}), t)
    return FleetView(names, table, notes, fleet, tuple(compared), differences, routing, tuple(remarks))


_COLUMNS = (
    (Q.PREFIX_HIT_RATE, "hit rate", "{:.2f}"),
    (Q.PREFIX_QUERIED_TOKENS, "looked up", "{:.0f}"),
    (Q.KV_USAGE_P95, "KV p95", "{:.2f}"),
    (Q.PREEMPTIONS, "preempt", "{:.0f}"),
    (Q.WAITING_MEAN, "waiting", "{:.2f}"),
    (Q.REQUESTS_PER_S, "req/s", "{:.2f}"),
    (Q.PROMPT_TOKENS_PER_S, "prompt tok/s", "{:.0f}"),
)


def render_text(view: FleetView) -> str:
    """A short console summary: the table, the configuration that differs, what diverges, routing."""
    width = max([len("replica")] + [len(n) for n in view.replicas] + [len("fleet")])
    head = "  ".join(["replica".ljust(width)] + [label.rjust(max(len(label), 7)) for _, label, _ in _COLUMNS])
    lines = [head]

    def row(name: str, values: Mapping[str, float | None], marks: Mapping[str, str]) -> str:
        cells = [name.ljust(width)]
        for key, label, fmt in _COLUMNS:
            v = values.get(key)
            text = "-" if v is None else fmt.format(v) + ("*" if marks.get(key) == CACHING_OFF_NOTE else "")
            cells.append(text.rjust(max(len(label), 7)))
        return "  ".join(cells)

    for name in view.replicas:
        lines.append(row(name, view.table[name], view.notes.get(name, {})))
    lines.append(row("fleet", view.fleet, {}))
    if any(CACHING_OFF_NOTE in n.values() for n in view.notes.values()):
        lines.append(f"  * {CACHING_OFF_NOTE}")
    lines.append("  - not measured (see the replica's evidence.json for why)")
    lines.append("")
    for c in view.config_differences:
        lines.append(f"configuration differs: {c.describe()}")
    for d in view.diverging:
        lines.append(f"diverges: {d.describe()}")
    if not view.diverging and len(view.replicas) > 1:
        compared = ", ".join(d.what for d in view.divergences) or "nothing (too few measured values)"
        lines.append(f"no divergence beyond the fleet.* thresholds in: {compared}")
    r = view.routing
    lines.append(f"prefix-aware routing: {r.status}: {r.reason}")
    for caveat in r.caveats:
        lines.append(f"  caveat: {caveat}")
    if r.hint:
        lines.append(f"  next: {r.hint}")
    for remark in view.remarks:
        lines.append(f"note: {remark}")
    return "\n".join(lines) + "\n"
