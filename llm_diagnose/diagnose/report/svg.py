"""Inline SVG plots for the HTML report: no plotting library, no script, no network.

A figure is drawn only from data that exists; otherwise it carries the reason, and the
report shows a "not measured: reason" box in its place. All text is XML-escaped here.

Where each figure's data comes from (the key scheme this module reads):

- `output-lengths`: `tokens_out` of the completed requests in the run folder's
  `requests.jsonl` (read with `llm_diagnose.probes.load.records.read_records`); else the samples of
  `outputs.length_p50` (per-request output lengths); else that Measurement's summary alone
  (quantiles from the engine's histogram, drawn as a strip: min, p05-p95, median, p99, max).
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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from llm_diagnose.diagnose.runfolder import EVENTS, REQUESTS
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.records import RequestRecord, read_records
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, percentile

__all__ = [
    "Figure",
    "Chart",
    "RunRecords",
    "figures",
    "nice_ticks",
    "read_jsonl",
    "CURVE_KEY",
    "STEP_LATENCY_KEY",
    "ROOFLINE_KEY",
]

CURVE_KEY = re.compile(r"^prefix\.lru_fraction_c(\d+)$")
STEP_LATENCY_KEY = re.compile(r"^decode\.step_latency_b(\d+)_s$")
ROOFLINE_KEY = re.compile(r"^decode\.roofline_floor_b(\d+)_s$")

# Colour-blind-safe (Okabe-Ito) and readable in greyscale by lightness.
BLUE, ORANGE, GREEN, PURPLE, GREY, RED = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#B8B8B8", "#D55E00"
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


# --- drawing -----------------------------------------------------------------------------
def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick positions (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    n = int(math.floor((hi - first) / step + 1e-9)) + 1
    return [round(first + i * step, 12) for i in range(n)]


def short(v: float) -> str:
    """A tick label: 3 significant digits with k/M/G."""
    a = abs(v)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= factor:
            return f"{v / factor:.3g}{suffix}"
    return "0" if v == 0 else f"{v:.3g}"


def percent(v: float) -> str:
    return f"{v:.0%}"


def _f(v: float) -> str:
    return f"{v:.1f}"


class Chart:
    """One x-y plot area with axes, ticks, a legend and the marks added to it."""

    W, H = 640, 300
    LEFT, RIGHT, TOP, BOTTOM = 64, 20, 12, 44

    def __init__(
        self,
        title: str,
        xlabel: str,
        ylabel: str,
        x_range: tuple[float, float],
        y_range: tuple[float, float],
        *,
        log_x: bool = False,
        x_ticks: Sequence[float] | None = None,
        x_format: Callable[[float], str] = short,
        y_format: Callable[[float], str] = short,
        y_ticks: bool = True,
    ) -> None:
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.log_x = log_x
        self.x0, self.x1 = self._widen(*x_range, positive=log_x)
        self.y0, self.y1 = self._widen(*y_range)
        self.x_ticks = list(x_ticks) if x_ticks is not None else (None if log_x else nice_ticks(self.x0, self.x1))
        self.x_format, self.y_format, self.show_y_ticks = x_format, y_format, y_ticks
        self.marks: list[str] = []
        self.legend: list[tuple[str, str]] = []

    @staticmethod
    def _widen(lo: float, hi: float, positive: bool = False) -> tuple[float, float]:
        if hi > lo:
            return lo, hi
        if positive:  # a log axis around one value: half to double it
            return lo / 2, hi * 2
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad

    # coordinates
    def x(self, v: float) -> float:
        if self.log_x:
            frac = (math.log(v) - math.log(self.x0)) / (math.log(self.x1) - math.log(self.x0))
        else:
            frac = (v - self.x0) / (self.x1 - self.x0)
        return self.LEFT + frac * (self.W - self.LEFT - self.RIGHT)

    def y(self, v: float) -> float:
        frac = (v - self.y0) / (self.y1 - self.y0)
        return self.H - self.BOTTOM - frac * (self.H - self.TOP - self.BOTTOM)

    # marks
    def _legend(self, label: str | None, color: str) -> None:
        if label and all(label != seen for seen, _ in self.legend):
            self.legend.append((label, color))

    def points(
        self,
        xs: Sequence[float],
        ys: Sequence[float],
        color: str,
        *,
        r: float = 2.2,
        label: str | None = None,
        opacity: float = 0.7,
    ) -> None:
        dots = "".join(f'<circle cx="{_f(self.x(a))}" cy="{_f(self.y(b))}" r="{r}"/>' for a, b in zip(xs, ys))
        self.marks.append(f'<g fill="{color}" fill-opacity="{opacity}">{dots}</g>')
        self._legend(label, color)

    def line(
        self,
        xs: Sequence[float],
        ys: Sequence[float],
        color: str,
        *,
        width: float = 1.8,
        dash: str = "",
        label: str | None = None,
    ) -> None:
        pts = " ".join(f"{_f(self.x(a))},{_f(self.y(b))}" for a, b in zip(xs, ys))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        self.marks.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{width}"{dash_attr}/>')
        self._legend(label, color)

    def vline(self, x: float, color: str, *, label: str | None = None, dash: str = "4 3", opacity: float = 0.9) -> None:
        px = _f(self.x(x))
        self.marks.append(
            f'<line x1="{px}" x2="{px}" y1="{self.TOP}" y2="{self.H - self.BOTTOM}" stroke="{color}" '
            f'stroke-width="1.2" stroke-dasharray="{dash}" stroke-opacity="{opacity}"/>'
        )
        self._legend(label, color)

    def hline(self, y: float, color: str, *, label: str | None = None, dash: str = "4 3") -> None:
        py = _f(self.y(y))
        self.marks.append(
            f'<line x1="{self.LEFT}" x2="{self.W - self.RIGHT}" y1="{py}" y2="{py}" stroke="{color}" '
            f'stroke-width="1.2" stroke-dasharray="{dash}"/>'
        )
        self._legend(label, color)

    def bars(self, edges: Sequence[float], counts: Sequence[float], color: str, *, label: str | None = None) -> None:
        rects = []
        for lo, hi, c in zip(edges, edges[1:], counts):
            x0, x1, top = self.x(lo), self.x(hi), self.y(c)
            rects.append(
                f'<rect x="{_f(x0)}" y="{_f(top)}" width="{_f(max(x1 - x0 - 1, 1))}" '
                f'height="{_f(self.y(self.y0) - top)}"/>'
            )
        self.marks.append(f'<g fill="{color}">{"".join(rects)}</g>')
        self._legend(label, color)

    def whiskers(self, xs: Sequence[float], lows: Sequence[float], highs: Sequence[float], color: str) -> None:
        segs = "".join(
            f'<line x1="{_f(self.x(a))}" x2="{_f(self.x(a))}" y1="{_f(self.y(lo))}" y2="{_f(self.y(hi))}"/>'
            for a, lo, hi in zip(xs, lows, highs)
        )
        self.marks.append(f'<g stroke="{color}" stroke-width="1.5">{segs}</g>')

    def box(self, x0: float, x1: float, y0: float, y1: float, color: str, *, label: str | None = None) -> None:
        left, right, top, bottom = self.x(x0), self.x(x1), self.y(y1), self.y(y0)
        self.marks.append(
            f'<rect x="{_f(left)}" y="{_f(top)}" width="{_f(max(right - left, 1))}" '
            f'height="{_f(bottom - top)}" fill="{color}" fill-opacity="0.35" stroke="{color}"/>'
        )
        self._legend(label, color)

    def text(self, x: float, y: float, label: str, *, anchor: str = "middle") -> None:
        self.marks.append(
            f'<text x="{_f(self.x(x))}" y="{_f(self.y(y))}" text-anchor="{anchor}" '
            f'font-size="11">{escape(label)}</text>'
        )

    # assembly
    def _x_tick_positions(self) -> list[float]:
        if self.x_ticks is not None:
            return [t for t in self.x_ticks if self.x0 <= t <= self.x1]
        lo, hi = math.floor(math.log10(self.x0)), math.ceil(math.log10(self.x1))
        return [10.0**k for k in range(lo, hi + 1) if self.x0 <= 10.0**k <= self.x1]

    def _legend_marks(self) -> tuple[list[str], float]:
        """The legend under the plot, wrapped into as many rows as it needs; and where it ends."""
        out, right = [], self.W - self.RIGHT
        x, y = float(self.LEFT), float(self.H + 4)
        for label, color in self.legend:
            width = 22 + 6.6 * len(label)
            if x + width > right and x > self.LEFT:
                x, y = float(self.LEFT), y + 16
            out.append(
                f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="10" height="10" fill="{color}"/>'
                f'<text x="{_f(x + 14)}" y="{_f(y)}">{escape(label)}</text>'
            )
            x += width
        return out, (y + 10 if self.legend else float(self.H))

    def svg(self) -> str:
        bottom, right = self.H - self.BOTTOM, self.W - self.RIGHT
        body = [
            f"<title>{escape(self.title)}</title>",
            f'<rect x="{self.LEFT}" y="{self.TOP}" width="{right - self.LEFT}" height="{bottom - self.TOP}" '
            f'fill="#fafafa" stroke="#999"/>',
        ]
        for t in self._x_tick_positions():
            px = _f(self.x(t))
            body.append(
                f'<line x1="{px}" x2="{px}" y1="{bottom}" y2="{bottom + 4}" stroke="#999"/>'
                f'<text x="{px}" y="{bottom + 16}" text-anchor="middle">{escape(self.x_format(t))}</text>'
            )
        if self.show_y_ticks:
            for t in nice_ticks(self.y0, self.y1):
                py = _f(self.y(t))
                body.append(
                    f'<line x1="{self.LEFT - 4}" x2="{right}" y1="{py}" y2="{py}" stroke="#e4e4e4"/>'
                    f'<text x="{self.LEFT - 7}" y="{py}" dy="4" text-anchor="end">'
                    f"{escape(self.y_format(t))}</text>"
                )
        body.extend(self.marks)
        body.append(
            f'<text x="{(self.LEFT + right) / 2}" y="{self.H - 12}" text-anchor="middle">{escape(self.xlabel)}</text>'
        )
        body.append(
            f'<text transform="translate(14 {(self.TOP + bottom) / 2}) rotate(-90)" '
            f'text-anchor="middle">{escape(self.ylabel)}</text>'
        )
        legend, height = self._legend_marks()
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {self.W} {_f(height)}" '
            f'width="{self.W}" height="{_f(height)}" role="img" aria-label="{escape(self.title)}" '
            f'font-family="system-ui, sans-serif" font-size="11" fill="#222">' + "".join(body + legend) + "</svg>"
        )


# --- per-request files in the run folder ----------------------------------------------------
def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """The JSON objects of a JSON-lines file, and how many lines could not be read.

    A line cut short (a run interrupted while writing) is skipped and counted, not fatal.
    """
    records, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # cut short, or nested too deeply to read
            bad += 1
            continue
        if isinstance(obj, dict):
            records.append(obj)
        else:
            bad += 1
    return records, bad


@dataclass(frozen=True)
class RunRecords:
    """What the active driver recorded in the run folder, or why there is nothing."""

    requests: list[RequestRecord] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    unreadable_lines: int = 0  # in events.jsonl (read_records skips cut request lines itself)
    missing: str = ""

    @classmethod
    def load(cls, run_dir: Path | None) -> RunRecords:
        if run_dir is None:
            return cls(missing="no run folder was given (per-request records live in its requests.jsonl)")
        path = Path(run_dir) / REQUESTS
        if not path.exists():
            return cls(
                missing=f"no {REQUESTS} in the run folder: per-request timings are recorded by an "
                "active run (llm-diagnose run --active)"
            )
        events_path = Path(run_dir) / EVENTS
        events, bad = read_jsonl(events_path) if events_path.exists() else ([], 0)
        return cls(list(read_records(path)), events, bad)

    def prefill_times(self) -> list[float]:
        return [t for e in self.events if "prefill" in str(e.get("event", "")) and (t := _num(e, "t")) is not None]


def _num(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


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


# --- the figures -----------------------------------------------------------------------------
def output_lengths(evidence: Evidence | None, records: RunRecords) -> Figure:
    fid, title = "output-lengths", "Output length distribution"
    lengths = [float(r.tokens_out) for r in records.requests if r.completed]
    source = f"{len(lengths)} completed requests in {REQUESTS}"
    m = evidence.measurement(Q.OUTPUT_LEN_P50) if evidence is not None else None
    if len(lengths) < 2 and m is not None and len(m.samples) >= 2:
        lengths, source = list(m.samples), f"{len(m.samples)} samples of {Q.OUTPUT_LEN_P50}"
    if len(lengths) >= 2:
        return Figure(fid, title, _histogram(sorted(lengths), title), caption=f"from {source}")
    if m is not None and m.summary is not None:
        return Figure(
            fid,
            title,
            _quantile_strip(m.summary, title),
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


def _histogram(values: list[float], title: str) -> str:
    lo, hi = values[0], values[-1]
    if hi == lo:  # every request the same length: one bar, centred on it
        edges, counts, ticks = [lo - 0.5, lo + 0.5], [len(values)], [lo]
        x_range = (lo - 2, lo + 2)
    else:
        bins = min(40, max(5, math.ceil(math.sqrt(len(values)))))
        width = max((hi - lo) / bins, 1.0)  # lengths are whole tokens: no bin narrower than one
        bins = max(1, math.ceil((hi - lo) / width))
        edges = [lo + i * width for i in range(bins + 1)]
        counts = [0] * bins
        for v in values:
            counts[min(int((v - lo) / width), bins - 1)] += 1
        ticks, x_range = None, (edges[0], edges[-1])
    chart = Chart(title, "output tokens per request", "requests", x_range, (0, max(counts) * 1.1), x_ticks=ticks)
    chart.bars(edges, counts, BLUE, label="requests")
    chart.vline(percentile(values, 50), ORANGE, label=f"median {percentile(values, 50):.0f}")
    chart.vline(percentile(values, 99), RED, label=f"p99 {percentile(values, 99):.0f}")
    return chart.svg()


def _quantile_strip(s, title: str) -> str:
    chart = Chart(title, "output tokens per request", "", (s.min, s.max), (0, 1), y_ticks=False)
    chart.line([s.min, s.max], [0.5, 0.5], GREY, label="min-max")
    chart.box(s.p05, s.p95, 0.3, 0.7, BLUE, label="p05-p95")
    chart.line([s.median, s.median], [0.25, 0.75], ORANGE, width=3, label=f"median {s.median:.0f}")
    chart.points([s.p99], [0.5], RED, r=4, label=f"p99 {s.p99:.0f}", opacity=1)
    return chart.svg()


def itl_over_time(records: RunRecords) -> Figure:
    fid, title = "itl-over-time", "Inter-token latency over time, prefills marked"
    if records.missing:
        return Figure(fid, title, missing=records.missing)
    gaps = [
        (b, b - a) for r in records.requests for a, b in zip(r.absolute_event_times(), r.absolute_event_times()[1:])
    ]
    sends = [r.t_send for r in records.requests if r.event_times]
    if not gaps:
        return Figure(fid, title, missing=f"{REQUESTS} holds no request with two or more tokens")
    prefills = records.prefill_times()
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
        mids, medians, maxima = _binned(xs, ys, bins=200)
        chart.points(mids, maxima, PURPLE, r=1.6, label="max per bin")
        chart.line(mids, medians, BLUE, label="median per bin")
        caption += " (binned: too many to draw one by one)"
    if records.unreadable_lines:
        caption += f"; {records.unreadable_lines} unreadable line(s) of {EVENTS} skipped"
    return Figure(fid, title, chart.svg(), caption=caption)


def _binned(xs: list[float], ys: list[float], bins: int) -> tuple[list[float], list[float], list[float]]:
    lo, hi = xs[0], xs[-1]
    width = (hi - lo) / bins or 1.0
    groups: dict[int, list[float]] = {}
    for x, y in zip(xs, ys):
        groups.setdefault(min(int((x - lo) / width), bins - 1), []).append(y)
    keys = sorted(groups)
    return (
        [lo + (k + 0.5) * width for k in keys],
        [percentile(sorted(groups[k]), 50) for k in keys],
        [max(groups[k]) for k in keys],
    )


def memory_breakdown(evidence: Evidence | None) -> Figure:
    fid, title = "memory", "Accelerator memory: weights, KV cache, free"
    total = _value(evidence, Q.DEVICE_TOTAL_BYTES) if evidence is not None else None
    if not total:
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
        _stacked_bar(parts, max(total, in_use), title),
        caption=f"of {total / (1 << 30):.2f} GiB on the device(s)"
        + ("; more than the device holds" if in_use > total else ""),
    )


def _stacked_bar(parts: list[tuple[str, float, str]], scale: float, title: str) -> str:
    w, left, bar_w = 640, 20, 600
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {w} {80 + 18 * len(parts)}" '
        f'width="{w}" height="{80 + 18 * len(parts)}" role="img" aria-label="{escape(title)}" '
        f'font-family="system-ui, sans-serif" font-size="12" fill="#222"><title>{escape(title)}</title>'
    ]
    x = float(left)
    for name, v, color in parts:
        seg = bar_w * v / scale
        out.append(f'<rect x="{_f(x)}" y="16" width="{_f(max(seg, 0))}" height="36" fill="{color}" stroke="#fff"/>')
        x += seg
    for i, (name, v, color) in enumerate(parts):
        y = 74 + 18 * i
        out.append(
            f'<rect x="{left}" y="{y - 10}" width="12" height="12" fill="{color}"/>'
            f'<text x="{left + 18}" y="{y}">{escape(name)}: {v / (1 << 30):.2f} GiB ({v / scale:.0%})</text>'
        )
    out.append("</svg>")
    return "".join(out)


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
    if own:
        chart.vline(capacity, ORANGE, label=f"server's KV capacity {short(capacity)}")
        chart.points([capacity], [at_capacity], ORANGE, r=5, opacity=1)
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
    with_spread = [b for b in sb if steps[b].summary is not None]
    if with_spread:
        chart.whiskers(
            with_spread,
            [steps[b].summary.p05 * 1e3 for b in with_spread],
            [steps[b].summary.p95 * 1e3 for b in with_spread],
            BLUE,
        )
    chart.line(sb, [steps[b].value * 1e3 for b in sb], BLUE, width=1.2)
    chart.points(sb, [steps[b].value * 1e3 for b in sb], BLUE, r=3.5, label="measured (p05-p95 whiskers)", opacity=1)
    return Figure(fid, title, chart.svg(), caption=f"{len(sb)} batch sizes measured")


def figures(evidence: Evidence | None, run_dir: Path | None = None) -> list[Figure]:
    """The report's five figures, in a fixed order, each drawn or saying why not."""
    records = RunRecords.load(run_dir)
    return [
        output_lengths(evidence, records),
        itl_over_time(records),
        memory_breakdown(evidence),
        prefix_reuse(evidence),
        decode_vs_batch(evidence),
    ]
