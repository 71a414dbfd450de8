"""Which figures the HTML report shows, drawn from what: pure functions of the evidence and the
loaded run folder (`llm_diagnose.diagnose.runfolder.RunFolder`); the drawing is `report.svg`.

A figure is drawn only from data that exists; otherwise it carries the reason, and the
report shows a "not measured: reason" box in its place.

Where each figure's data comes from (the key scheme this module reads):

- `output-lengths`: `tokens_out` of the completed requests in the run folder's
  `requests.jsonl` (`RunFolder.requests`); else the samples of `outputs.length_p50`
  (per-request output lengths); else that Measurement's summary alone (quantiles from the
  engine's histogram, drawn as a strip: min, p05-p95, median, p99, max).
- `itl-over-time`: every inter-token gap in `requests.jsonl` (`t_send`, `ttft_s`, `gaps_s`),
  at the time its token arrived, with prefill events marked from `events.jsonl`: records
  `{"event": NAME, "t": perf_counter seconds}` whose NAME contains "prefill" (the driver's
  `JsonlWriter.event`, on the same clock as `t_send`).
- `memory`: `memory.device_total_bytes`, `memory.weights_bytes`, `memory.kv_cache_bytes` and
  `memory.device_used_bytes`; what is used beyond weights and KV is shown as "other".
- `prefix-reuse`: `prefix.lru_fraction_c{N}` (share of prompt tokens an LRU prefix cache of N
  tokens would serve, one key per capacity N), plus `prefix.lru_fraction_at_capacity` at
  `kv.capacity_tokens` (the server's own point), `prefix.potential_fraction` (an unlimited
  cache) as the ceiling and `prefix.hit_rate` (live) for comparison.
- `decode-vs-batch`: `decode.step_latency_b{N}_s` (decode step latency at batch size N; its
  summary's p05-p95 as whiskers) and `decode.roofline_floor_b{N}_s` (the memory-bandwidth
  floor at batch N).

Lines of `requests.jsonl` or `events.jsonl` skipped as unreadable are counted in the captions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.report.svg import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    Chart,
    binned,
    histogram,
    percent,
    quantile_strip,
    short,
    stacked_bar,
)
from llm_diagnose.diagnose.runfolder import EVENTS, REQUESTS, RunFolder
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured

if TYPE_CHECKING:  # records.py's package loads the HTTP client: types only here
    from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "Figure",
    "figures",
    "output_lengths",
    "itl_over_time",
    "memory_breakdown",
    "prefix_reuse",
    "decode_vs_batch",
    "CURVE_KEY",
    "STEP_LATENCY_KEY",
    "ROOFLINE_KEY",
    "MAX_POINTS",
]

CURVE_KEY = re.compile(r"^prefix\.lru_fraction_c(\d+)$")
STEP_LATENCY_KEY = re.compile(r"^decode\.step_latency_b(\d+)_s$")
ROOFLINE_KEY = re.compile(r"^decode\.roofline_floor_b(\d+)_s$")
MAX_POINTS = 2000  # above this a time series is drawn as per-bin medians and maxima


@dataclass(frozen=True)
class Figure:
    id: str  # stable: the HTML element id, and what tests look for
    title: str
    svg: str = ""  # empty when not drawn
    missing: str = ""  # why it was not drawn
    caption: str = ""

    @property
    def drawn(self) -> bool:
        return bool(self.svg)


def _requests(run: RunFolder | None) -> tuple[RequestRecord, ...]:
    return () if run is None or run.requests is None else run.requests


def _skipped(run: RunFolder | None, name: str) -> str:
    """'; N unreadable line(s) of NAME skipped' where lines of that file were skipped, else ''."""
    n = run.skipped_in(name) if run is not None else 0
    return f"; {n} unreadable line(s) of {name} skipped" if n else ""


def _value(evidence: Evidence, key: str) -> float | None:
    r = evidence.get(key)
    if isinstance(r, Measurement):
        return r.value
    if isinstance(r, Fact) and isinstance(r.value, (int, float)) and not isinstance(r.value, bool):
        return float(r.value)
    return None


def _why_missing(evidence: Evidence | None, *keys: str, default: str) -> str:
    if evidence is None:
        return "no evidence.json beside the diagnosis"
    for key in keys:
        r = evidence.get(key)
        if isinstance(r, NotMeasured) and key in evidence.items:
            return f"{key}: {r.reason}" + (f" ({r.hint})" if r.hint else "")
    return default


def output_lengths(evidence: Evidence | None, run: RunFolder | None = None) -> Figure:
    fid, title = "output-lengths", "Output length distribution"
    lengths = [float(r.tokens_out) for r in _requests(run) if r.completed]
    source = f"{len(lengths)} completed requests in {REQUESTS}" + _skipped(run, REQUESTS)
    m = evidence.measurement(Q.OUTPUT_LEN_P50) if evidence is not None else None
    if len(lengths) < 2 and m is not None and len(m.samples) >= 2:
        lengths, source = list(m.samples), f"{len(m.samples)} samples of {Q.OUTPUT_LEN_P50}"
    if len(lengths) >= 2:
        return Figure(fid, title, histogram(sorted(lengths), title), caption=f"from {source}")
    if m is not None and m.summary is not None:
        return Figure(
            fid,
            title,
            quantile_strip(m.summary, title),
            caption=f"quantiles of {Q.OUTPUT_LEN_P50} (no per-request values: a summary only)",
        )
    return Figure(
        fid,
        title,
        missing=_why_missing(
            evidence,
            Q.OUTPUT_LEN_P50,
            Q.OUTPUT_LEN_CV,
            default="no per-request output lengths (requests.jsonl or samples of outputs.length_p50)",
        ),
    )


def itl_over_time(run: RunFolder | None) -> Figure:
    fid, title = "itl-over-time", "Inter-token latency over time, prefills marked"
    if run is None:
        return Figure(fid, title, missing=f"no run folder was given (per-request records live in its {REQUESTS})")
    if run.requests is None:
        return Figure(
            fid,
            title,
            missing=f"no {REQUESTS} in the run folder: per-request timings are recorded by an "
            "active run (llm-diagnose run --active)",
        )
    gaps = [(b, b - a) for r in run.requests for a, b in zip(r.absolute_event_times(), r.absolute_event_times()[1:])]
    sends = [r.t_send for r in run.requests if r.event_times]
    if not gaps:
        return Figure(
            fid, title, missing=f"{REQUESTS} holds no request with two or more tokens" + _skipped(run, REQUESTS)
        )
    prefills = run.prefill_times()
    origin = min(sends + prefills)
    gaps.sort()
    xs = [t - origin for t, _ in gaps]
    ys = [g * 1e3 for _, g in gaps]
    chart = Chart(
        title,
        "seconds since the first request",
        "inter-token latency (ms)",
        (0, max(xs + [p - origin for p in prefills])),
        (0, max(ys) * 1.08),
    )
    for p in prefills:
        chart.vline(p - origin, ORANGE, label="prefill injected", dash="3 3", opacity=0.6)
    caption = f"{len(gaps)} gaps from {len(sends)} requests; {len(prefills)} prefill events"
    if len(gaps) <= MAX_POINTS:
        chart.points(xs, ys, BLUE, label="gap")
    else:
        mids, medians, maxima = binned(xs, ys, bins=200)
        chart.points(mids, maxima, PURPLE, r=1.6, label="max per bin")
        chart.line(mids, medians, BLUE, label="median per bin")
        caption += " (binned: too many to draw one by one)"
    for name in (EVENTS, REQUESTS):
        caption += _skipped(run, name)
    return Figure(fid, title, chart.svg(), caption=caption)


def memory_breakdown(evidence: Evidence | None) -> Figure:
    fid, title = "memory", "Accelerator memory: weights, KV cache, free"
    total = _value(evidence, Q.DEVICE_TOTAL_BYTES) if evidence is not None else None
    if evidence is None or not total:
        return Figure(
            fid, title, missing=_why_missing(evidence, Q.DEVICE_TOTAL_BYTES, default="device memory was not measured")
        )
    weights, kv, used = (_value(evidence, k) for k in (Q.WEIGHTS_BYTES, Q.KV_CACHE_BYTES, Q.DEVICE_USED_BYTES))
    parts = [(name, v, c) for name, v, c in (("weights", weights, BLUE), ("KV cache", kv, GREEN)) if v]
    accounted = sum(v for _, v, _ in parts)
    if used is not None and used > accounted:
        parts.append(("other in use" if parts else "in use", used - accounted, PURPLE))
    elif used is None and not parts:
        return Figure(fid, title, missing="only the device total was measured (no used, weights or KV bytes)")
    in_use = sum(v for _, v, _ in parts)
    parts.append(("free", max(0.0, total - in_use), GREY))
    return Figure(
        fid,
        title,
        stacked_bar(parts, max(total, in_use), title),
        caption=f"of {total / (1 << 30):.2f} GiB on the device(s)"
        + ("; more than the device holds" if in_use > total else ""),
    )


def prefix_reuse(evidence: Evidence | None) -> Figure:
    fid, title = "prefix-reuse", "Prefix reuse against cache capacity"
    if evidence is None:
        return Figure(fid, title, missing=_why_missing(None, default=""))
    curve = sorted(
        (int(m.group(1)), r.value)
        for key, r in evidence.items.items()
        if (m := CURVE_KEY.match(key)) and isinstance(r, Measurement) and int(m.group(1)) > 0
    )
    capacity, at_capacity = _value(evidence, Q.KV_CAPACITY_TOKENS), _value(evidence, Q.PREFIX_AT_CAPACITY)
    own = [(capacity, at_capacity)] if capacity and at_capacity is not None else []
    if not curve and not own:
        return Figure(
            fid,
            title,
            missing=_why_missing(
                evidence,
                Q.PREFIX_AT_CAPACITY,
                Q.PREFIX_POTENTIAL,
                default="no reuse-vs-capacity data: analyse the prompts with --trace FILE",
            ),
        )
    xs = [c for c, _ in curve + own]
    lo, hi = min(xs), max(xs)
    log_x = hi / lo > 20
    chart = Chart(
        title,
        "prefix-cache capacity (tokens)" + (", log scale" if log_x else ""),
        "prompt tokens served",
        (lo / 1.3, hi * 1.3) if log_x else (0, hi * 1.1),
        (0, 1.0),
        log_x=log_x,
        y_format=percent,
    )
    potential, live = _value(evidence, Q.PREFIX_POTENTIAL), _value(evidence, Q.PREFIX_HIT_RATE)
    if potential is not None:
        chart.hline(potential, GREEN, label=f"unlimited cache {potential:.0%}")
    if live is not None:
        chart.hline(live, PURPLE, label=f"live hit rate {live:.0%}", dash="1 3")
    if curve:
        chart.line([c for c, _ in curve], [f for _, f in curve], BLUE, label="LRU cache of that size")
        chart.points([c for c, _ in curve], [f for _, f in curve], BLUE, r=3, opacity=1)
    for cap, at in own:
        chart.vline(cap, ORANGE, label=f"server's KV capacity {short(cap)}")
        chart.points([cap], [at], ORANGE, r=5, opacity=1)
    return Figure(
        fid,
        title,
        chart.svg(),
        caption=f"{len(curve)} capacities simulated"
        + ("; the server's own point from prefix.lru_fraction_at_capacity" if own else ""),
    )


def decode_vs_batch(evidence: Evidence | None) -> Figure:
    fid, title = "decode-vs-batch", "Decode step latency against batch size, with the roofline floor"
    if evidence is None:
        return Figure(fid, title, missing=_why_missing(None, default=""))
    steps: dict[int, Measurement] = {}
    floors: dict[int, float] = {}
    for key, r in evidence.items.items():
        if (m := STEP_LATENCY_KEY.match(key)) and isinstance(r, Measurement):
            steps[int(m.group(1))] = r
        elif (m := ROOFLINE_KEY.match(key)) and isinstance(r, Measurement):
            floors[int(m.group(1))] = r.value
    if not steps:
        return Figure(
            fid,
            title,
            missing="no decode step timings by batch size (decode.step_latency_b{N}_s): "
            "they come from the active decode-timing experiment",
        )
    batches = sorted(set(steps) | set(floors))
    lo, hi = max(min(batches), 1), max(batches)
    log_x = hi / lo >= 8
    top = max([m.summary.p95 if m.summary else m.value for m in steps.values()] + list(floors.values()))
    chart = Chart(
        title,
        "batch size (running sequences)" + (", log scale" if log_x else ""),
        "decode step latency (ms)",
        (lo / 1.3, hi * 1.3) if log_x else (0, hi * 1.1),
        (0, top * 1e3 * 1.15),
        log_x=log_x,
        x_ticks=batches,
    )
    if floors:
        fb = sorted(floors)
        chart.line(fb, [floors[b] * 1e3 for b in fb], GREY, width=2.5, dash="6 3", label="roofline floor")
    sb = sorted(steps)
    spreads = [(b, s) for b in sb if (s := steps[b].summary) is not None]
    if spreads:
        chart.whiskers(
            [b for b, _ in spreads],
            [s.p05 * 1e3 for _, s in spreads],
            [s.p95 * 1e3 for _, s in spreads],
            BLUE,
        )
    chart.line(sb, [steps[b].value * 1e3 for b in sb], BLUE, width=1.2)
    chart.points(sb, [steps[b].value * 1e3 for b in sb], BLUE, r=3.5, label="measured (p05-p95 whiskers)", opacity=1)
    return Figure(fid, title, chart.svg(), caption=f"{len(sb)} batch sizes measured")


def figures(evidence: Evidence | None, run: RunFolder | None = None) -> list[Figure]:
    """The report's five figures, in a fixed order, each drawn or saying why not."""
    return [
        output_lengths(evidence, run),
        itl_over_time(run),
        memory_breakdown(evidence),
        prefix_reuse(evidence),
        decode_vs_batch(evidence),
    ]
