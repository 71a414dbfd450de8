"""Drawing inline SVG for the HTML report: no plotting library, no script, no network.

`Chart` is one x-y plot area (axes, ticks, legend, marks); `histogram`, `quantile_strip` and
`stacked_bar` draw whole plots from plain numbers. Nothing here reads evidence or files: which
figure is drawn from what is `llm_diagnose.diagnose.report.figures`. All text is XML-escaped here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from llm_diagnose.probes.results import Summary, percentile

__all__ = [
    "Chart",
    "nice_ticks",
    "short",
    "percent",
    "histogram",
    "quantile_strip",
    "stacked_bar",
    "binned",
    "BLUE",
    "ORANGE",
    "GREEN",
    "PURPLE",
    "GREY",
    "RED",
]

# Colour-blind-safe (Okabe-Ito) and readable in greyscale by lightness.
BLUE, ORANGE, GREEN, PURPLE, GREY, RED = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#B8B8B8", "#D55E00"


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


# --- whole plots ---------------------------------------------------------------------------
def histogram(values: list[float], title: str) -> str:
    """Output lengths as bars (whole tokens: no bin narrower than one), median and p99 marked; `values` sorted."""
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


def quantile_strip(s: Summary, title: str) -> str:
    """A summary alone (no per-request values) as a strip: min-max, p05-p95, median, p99."""
    chart = Chart(title, "output tokens per request", "", (s.min, s.max), (0, 1), y_ticks=False)
    chart.line([s.min, s.max], [0.5, 0.5], GREY, label="min-max")
    chart.box(s.p05, s.p95, 0.3, 0.7, BLUE, label="p05-p95")
    chart.line([s.median, s.median], [0.25, 0.75], ORANGE, width=3, label=f"median {s.median:.0f}")
    chart.points([s.p99], [0.5], RED, r=4, label=f"p99 {s.p99:.0f}", opacity=1)
    return chart.svg()


def stacked_bar(parts: list[tuple[str, float, str]], scale: float, title: str) -> str:
    """One horizontal bar of (name, bytes, colour) parts on `scale` bytes, with a legend in GiB and shares."""
    w, left, bar_w = 640, 20, 600
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {w} {80 + 18 * len(parts)}" '
        f'width="{w}" height="{80 + 18 * len(parts)}" role="img" aria-label="{escape(title)}" '
        f'font-family="system-ui, sans-serif" font-size="12" fill="#222"><title>{escape(title)}</title>'
    ]
    x = float(left)
    for _name, v, color in parts:
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


def binned(xs: list[float], ys: list[float], bins: int) -> tuple[list[float], list[float], list[float]]:
    """Bin centres, medians and maxima of a time series too long to draw point by point (`xs` sorted)."""
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
