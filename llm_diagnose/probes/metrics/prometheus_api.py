"""A fleet's engine metrics read back from a Prometheus server, as one `Window` per replica.

Instead of scraping every replica, ask the Prometheus that already scrapes them. Its HTTP
query API returns, per stored series, the samples of one scrape after another; every series
of one target scrape carries that scrape's timestamp. Grouping the samples by replica (the
`instance` label by default) and then by timestamp gives back the pages, one `Scrape` per
scrape (`exposition.scrape_from_samples`, the same rules as parsing a page), so the windows
feed `passive.passive_evidence` exactly like the scraper's own: one evidence computation.

Two ways to read a window [start, end]:
- raw samples (default): `/api/v1/query` with a range selector `SEL[duration]` at `end`:
  every sample Prometheus stored, at its scrape time. The same pages the direct scraper
  would have seen, at Prometheus's scrape interval.
- `step`: `/api/v1/query_range`, one value per series every `step` seconds (the latest
  sample at or before each step, Prometheus's 5-minute lookback). Far less data for long
  windows; counters still add up to the same increases, gauges are read at the steps.
  A step shorter than the scrape interval repeats samples (the gauges' means weigh them
  twice), so pick one at least as long as the scrape interval.

Which series: every sample name with an engine prefix (`ENGINE_PREFIXES`: `vllm:`, `sglang:`,
...) that matches the user's label matchers, plus `up` for the same matchers, which marks
scrapes that failed (`up == 0`) and targets without engine series.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode

import aiohttp

from llm_diagnose.probes.bounded_json import JSONBoundsError, loads_bounded
from llm_diagnose.probes.http import (
    HTTPStatusError,
    JSONOutOfBounds,
    MalformedMetrics,
    NotJSON,
    ProbeHTTPError,
    ResponseTooLarge,
    TargetUnreachable,
    decode_json,
    get_text,
    make_session,
    normalize_base_url,
    redact_url,
)
from llm_diagnose.probes.metrics.engines import ENGINE_PREFIXES
from llm_diagnose.probes.metrics.exposition import Labels, scrape_from_samples
from llm_diagnose.probes.metrics.window import ScrapeRecord, Window

__all__ = [
    "DEFAULT_REPLICA_LABEL",
    "PROMETHEUS_TOKEN_ENV",
    "PrometheusError",
    "NotPrometheus",
    "PrometheusRefused",
    "MalformedAnswer",
    "AnswerTooLarge",
    "EmptySelection",
    "InvalidSelector",
    "FleetWindows",
    "selector_matchers",
    "engine_series_query",
    "parse_matrix",
    "windows_from_matrix",
    "read_fleet",
    "MAX_ANSWER_BYTES",
    "MAX_UNIX_TIME",
]

DEFAULT_REPLICA_LABEL = "instance"  # Prometheus sets it to the target's host:port
PROMETHEUS_TOKEN_ENV = "LLM_DIAGNOSE_PROMETHEUS_TOKEN"  # a Bearer token for Prometheus (not the engines' key)
QUERY_TIMEOUT_S = 60.0  # a range query over a fleet reads many series: longer than a /metrics GET
# The longest query answer read. Ten minutes of one vLLM replica's raw samples (445 series every
# 15 s) are ~0.5 MB of JSON, so 128 MiB is hours of tens of replicas; past it, a coarser --step or a
# shorter window reads the same fleet in less (the JSON would take gigabytes of memory to parse).
MAX_ANSWER_BYTES = 128 << 20
# A sample's time: unix seconds up to the end of year 9999 (what a date can show); the query's
# window, give or take TIME_SLACK_S of rounding, bounds it tighter where read_fleet knows it.
MAX_UNIX_TIME = 253402300799.0
TIME_SLACK_S = 1.0
_NO_REPLICA = "(no replica label)"


# --- errors -----------------------------------------------------------------------------------
class PrometheusError(ProbeHTTPError):
    """Prometheus (or whatever answered) did not give a usable query result."""


class NotPrometheus(PrometheusError):
    """The URL does not serve the Prometheus HTTP query API."""


class PrometheusRefused(PrometheusError):
    """Prometheus answered with its error document (`errorType` bad_data: a bad selector)."""

    def __init__(self, message: str, url: str | None = None, error_type: str = "") -> None:
        super().__init__(message, url)
        self.error_type = error_type


class MalformedAnswer(PrometheusError):
    """JSON that is not the shape the query API documents; the message says which field."""


class AnswerTooLarge(PrometheusError):
    """The answer is longer than MAX_ANSWER_BYTES: not read."""


class EmptySelection(PrometheusError):
    """No engine series match the selector in the window."""


class InvalidSelector(ValueError):
    """The --selector text is not label matchers in braces."""


# --- the query ---------------------------------------------------------------------------------
def selector_matchers(selector: str) -> str:
    """The label matchers inside `{...}` (empty for `{}` or ""), checked only for shape:
    Prometheus itself rejects a matcher it cannot parse (as a `bad_data` refusal)."""
    text = selector.strip()
    if not text:
        return ""
    if not (text.startswith("{") and text.endswith("}")):
        raise InvalidSelector(
            f"selector {selector!r} must be label matchers in braces, e.g. "
            '\'{job="vllm"}\' or \'{namespace="serving",pod=~"vllm-.*"}\''
        )
    inner = text[1:-1].strip().rstrip(",").strip()
    if re.search(r"(^|[\s,{])__name__\s*(=|!=|=~|!~)", inner):
        raise InvalidSelector(
            "the selector must not match __name__: llm-diagnose selects the engine series "
            "itself; give only labels such as job, namespace or pod"
        )
    return inner


def _names_regex() -> str:
    prefixes = sorted({p for group in ENGINE_PREFIXES.values() for p in group})
    assert all(re.fullmatch(r"[A-Za-z_:]+", p) for p in prefixes)  # nothing to escape inside the PromQL string
    return "(" + "|".join(prefixes) + ").*"


def engine_series_query(selector: str) -> str:
    """PromQL selecting every engine sample name that matches the selector's labels."""
    inner = selector_matchers(selector)
    return "{" + f'__name__=~"{_names_regex()}"' + (f", {inner}" if inner else "") + "}"


def _up_query(selector: str) -> str:
    inner = selector_matchers(selector)
    return "up" + ("{" + inner + "}" if inner else "")


# --- the answer -------------------------------------------------------------------------------
Point = tuple[float, float]  # (unix time, value)
SeriesPoints = tuple[Mapping[str, str], tuple[Point, ...]]


def _number(text: object, where: str) -> float:
    if not isinstance(text, (str, int, float)) or isinstance(text, bool):
        raise MalformedAnswer(f"{where} is {text!r}, not a number")
    try:
        return float(text)  # Prometheus writes values as strings: "1.5", "NaN", "+Inf"
    except ValueError:
        raise MalformedAnswer(f"{where} is {text!r}, not a number") from None


def _time(text: object, where: str, window: tuple[float, float] | None) -> float:
    """A sample's time: finite, a date (1970 to year 9999), and inside the queried window."""
    t = _number(text, where)
    low, high = (0.0, MAX_UNIX_TIME) if window is None else (window[0] - TIME_SLACK_S, window[1] + TIME_SLACK_S)
    if not (math.isfinite(t) and max(0.0, low) <= t <= min(MAX_UNIX_TIME, high)):
        span = "a date" if window is None else "inside the queried window"
        raise MalformedAnswer(f"{where} is {text!r}, not a time {span}")
    return t


def parse_matrix(
    document: object, shown_url: str, window: tuple[float, float] | None = None
) -> tuple[list[SeriesPoints], tuple[str, ...]]:
    """The series of a `matrix` answer and its warnings. Every sample's time must be a date
    (1970 to year 9999) and, where `window` (start, end) is given, inside it.

    Raises:
        PrometheusRefused: the answer is Prometheus's error document.
        MalformedAnswer: any other shape than the documented one.
    """

    def bad(what: str) -> MalformedAnswer:
        return MalformedAnswer(
            f"{shown_url} answered JSON that is not a Prometheus query result ({what}): "
            "is this the Prometheus server's own URL, not a proxy or another API?",
            None,
        )

    if not isinstance(document, Mapping) or "status" not in document:
        raise bad("no 'status' field")
    if document["status"] == "error":
        raise PrometheusRefused(
            f"Prometheus refused the query ({document.get('errorType', '?')}): {str(document.get('error', ''))[:300]}",
            None,
            str(document.get("errorType", "")),
        )
    if document["status"] != "success":
        raise bad(f"status {document['status']!r}")
    data = document.get("data")
    if not isinstance(data, Mapping):
        raise bad("'data' is not an object")
    if data.get("resultType") != "matrix":
        raise bad(f"resultType {data.get('resultType')!r}, expected 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise bad("'data.result' is not a list")
    out: list[SeriesPoints] = []
    for i, item in enumerate(result):
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("metric"), Mapping)
            or not isinstance(item.get("values"), list)
        ):
            raise bad(f"data.result[{i}] lacks 'metric' or 'values'")
        metric = item["metric"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
            raise bad(f"data.result[{i}].metric has a label that is not a string")
        points = []
        for j, pair in enumerate(item["values"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise bad(f"data.result[{i}].values[{j}] is not a [time, value] pair")
            where = f"data.result[{i}].values[{j}]"
            try:
                points.append((_time(pair[0], where + " time", window), _number(pair[1], where + " value")))
            except MalformedAnswer as exc:
                raise bad(str(exc)) from None
        out.append((dict(metric), tuple(points)))
    warnings = document.get("warnings") or ()
    return out, tuple(str(w) for w in warnings) if isinstance(warnings, list) else ()


@dataclass(frozen=True)
class FleetWindows:
    """One window per replica, read from Prometheus, and how they were read."""

    prometheus: str  # redacted base URL
    selector: str
    query: str  # the PromQL sent
    start: float  # unix seconds
    end: float
    step_s: float | None  # None: raw samples
    replica_label: str
    windows: Mapping[str, Window]  # replica -> its window, sorted by replica
    without_engine: tuple[str, ...] = ()  # targets `up` knows that carry no engine series
    warnings: tuple[str, ...] = field(default=())

    @property
    def method(self) -> str:
        return (
            "raw samples (query with a range selector)"
            if self.step_s is None
            else f"query_range at a {self.step_s:g} s step"
        )


def windows_from_matrix(
    series: Sequence[SeriesPoints],
    up: Sequence[SeriesPoints],
    *,
    replica_label: str,
    source_of: Callable[[str], str],
    planned_s: float | None = None,
) -> tuple[dict[str, Window], tuple[str, ...]]:
    """Rebuild each replica's scrapes from query results: samples grouped by replica, then by time.

    `up == 0` points with no engine samples at that time become failed records, as a failed
    scrape does in the scraper's window. Returns the windows and the replicas `up` lists
    that carry no engine series.
    """
    pages: dict[str, dict[float, list[tuple[str, Labels, float]]]] = defaultdict(lambda: defaultdict(list))
    for metric, points in series:
        name = metric.get("__name__", "")
        replica = metric.get(replica_label, _NO_REPLICA)
        labels: Labels = frozenset((k, v) for k, v in metric.items() if k != "__name__")
        for t, value in points:
            pages[replica][t].append((name, labels, value))
    failed: dict[str, list[float]] = defaultdict(list)
    last_up: dict[str, tuple[float, float]] = {}
    for metric, points in up:
        replica = metric.get(replica_label, _NO_REPLICA)
        for t, value in points:
            if value == 0:
                failed[replica].append(t)
            if replica not in last_up or t > last_up[replica][0]:
                last_up[replica] = (t, value)
    windows: dict[str, Window] = {}
    for replica in sorted(pages):
        source = source_of(replica)
        records = []
        for t, samples in pages[replica].items():
            try:
                records.append(ScrapeRecord(t, t, scrape_from_samples(samples, None, source)))
            except MalformedMetrics as exc:
                records.append(ScrapeRecord(t, t, None, str(exc)))
        for t in failed.get(replica, ()):
            if t not in pages[replica]:
                records.append(ScrapeRecord(t, t, None, "Prometheus recorded up=0: its scrape of this replica failed"))
        records.sort(key=lambda r: r.t_mono)
        stopped = None
        if replica in last_up and last_up[replica][1] == 0:
            stopped = "its last scrapes in the window failed (up=0): the replica went down or stopped answering"
        notes = (f"{len(failed[replica])} failed scrapes (up=0) in the window",) if failed.get(replica) else ()
        windows[replica] = Window(
            source, tuple(records), planned_duration_s=planned_s, stopped_early=stopped, notes=notes
        )
    without = tuple(sorted(r for r in last_up if r not in pages))
    return windows, without


# --- the HTTP side ----------------------------------------------------------------------------
async def _query(
    session: aiohttp.ClientSession,
    base: str,
    path: str,
    params: Mapping[str, str],
    window: tuple[float, float] | None = None,
) -> tuple[list[SeriesPoints], tuple[str, ...]]:
    url = f"{base}{path}?{urlencode(params)}"
    shown = redact_url(f"{base}{path}")
    try:
        answer = await get_text(session, url, max_bytes=MAX_ANSWER_BYTES)
    except TargetUnreachable as exc:
        raise TargetUnreachable(f"Prometheus: {exc} (check --prometheus)", url) from None
    except ResponseTooLarge as exc:
        raise AnswerTooLarge(
            f"{shown} answered more than {exc.limit:,} bytes (MAX_ANSWER_BYTES): not read; read less "
            "at once: a shorter window, --step SECONDS, or a --selector matching fewer replicas",
            url,
        ) from None
    except HTTPStatusError as exc:
        document = _json_or_none(exc.body)
        if isinstance(document, Mapping) and document.get("status") == "error":
            parse_matrix(document, shown)  # raises PrometheusRefused with Prometheus's own words
        if exc.status in (401, 403):
            raise NotPrometheus(
                f"{shown} answered HTTP {exc.status}: this Prometheus wants credentials; set "
                f"{PROMETHEUS_TOKEN_ENV} to a Bearer token it accepts",
                url,
            ) from None
        raise NotPrometheus(
            f"{shown} answered HTTP {exc.status}: is {redact_url(base)} a Prometheus server "
            "(the URL its web UI is on, e.g. http://prometheus:9090)?",
            url,
        ) from None
    advice = f"is {redact_url(base)} a Prometheus server?"
    try:
        document = decode_json(answer, url, advice=advice)
    except NotJSON as exc:
        raise NotPrometheus(str(exc), url) from None
    except JSONOutOfBounds as exc:
        raise MalformedAnswer(str(exc), url) from None
    return parse_matrix(document, shown, window)


def _json_or_none(text: str) -> object:
    try:
        return loads_bounded(text)
    except JSONBoundsError:
        return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _duration(seconds: float) -> str:
    return f"{max(1, int(math.ceil(seconds * 1000)))}ms"


async def read_fleet(
    prometheus_url: str,
    selector: str,
    start: float,
    end: float,
    *,
    step_s: float | None = None,
    replica_label: str = DEFAULT_REPLICA_LABEL,
    session: aiohttp.ClientSession | None = None,
    token: str | None = None,
) -> FleetWindows:
    """Each replica's window over [start, end] (unix seconds) from the Prometheus at `prometheus_url`.

    Raises:
        InvalidSelector: the selector is not label matchers in braces.
        InvalidTargetURL, TargetUnreachable: as llm_diagnose.probes.http.
        NotPrometheus, PrometheusRefused, MalformedAnswer: the URL is not a usable Prometheus.
        EmptySelection: no engine series match the selector in the window.
    """
    if not (math.isfinite(start) and math.isfinite(end) and 0 <= start < end <= MAX_UNIX_TIME):
        raise ValueError(f"the window must be dates, ending after it starts (start {start}, end {end})")
    if step_s is not None and not (math.isfinite(step_s) and step_s > 0):
        raise ValueError("step must be a positive number of seconds")
    window = (start, end)
    base = normalize_base_url(prometheus_url)
    query = engine_series_query(selector)
    up = _up_query(selector)
    own = session is None
    session = session or make_session(timeout_s=QUERY_TIMEOUT_S, api_key=token)
    try:
        if step_s is None:
            at = {"time": f"{end:.3f}"}
            series, warns = await _query(
                session, base, "/api/v1/query", {"query": f"{query}[{_duration(end - start)}]", **at}, window
            )
            up_series, _ = await _query(
                session, base, "/api/v1/query", {"query": f"{up}[{_duration(end - start)}]", **at}, window
            )
        else:
            span = {"start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
            series, warns = await _query(session, base, "/api/v1/query_range", {"query": query, **span}, window)
            up_series, _ = await _query(session, base, "/api/v1/query_range", {"query": up, **span}, window)
    finally:
        if own:
            await session.close()
    shown = redact_url(base)
    windows, without = windows_from_matrix(
        series,
        up_series,
        replica_label=replica_label,
        planned_s=end - start,
        source_of=lambda r: f'{shown} {{{replica_label}="{r}"}}',
    )
    if not windows:
        targets = f" (up lists targets without engine series: {', '.join(without)})" if without else ""
        raise EmptySelection(
            f"Prometheus at {shown} holds no engine series (vllm:, sglang:, trtllm, ...) for {selector or '{}'} "
            f"between {_iso(start)} and {_iso(end)}{targets}: check the selector's labels (job, namespace) and the "
            "window, and that the engines are scraped",
            base,
        )
    return FleetWindows(shown, selector, query, start, end, step_s, replica_label, windows, without, warns)
