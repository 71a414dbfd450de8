"""Validated argparse types for every command's numbers: durations, rates, counts, times.

Every numeric flag of every command is parsed by one of these, so a value is refused before the
command touches a file or a server, with the flag's name and the accepted range in one line
(`llm-diagnose: error: argument --interval: ...`, exit 2; argparse adds the flag name). Each value
must be finite and within named bounds: NaN compares false with every limit (a NaN window reads as
"not too long" and then as zero scrapes), infinity and 1e300 reach `datetime`, `int()` or a replica
count, and a value a hundred times past anything sensible (a scrape every 0.1 ms) only burns the
target and the disk.

The bounds are named here, once; docs/commands/ quote them. One type here is not a
number: `model_name` (run --model), bounded the same way.
"""

from __future__ import annotations

import argparse
import math
import re
import time
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = [
    "MIN_SCRAPE_INTERVAL_S",
    "MAX_WINDOW_S",
    "MAX_FLEET_WINDOW_S",
    "MIN_STEP_S",
    "MAX_LOAD_SECONDS",
    "MAX_RATE_RPS",
    "MAX_REQUESTS",
    "MAX_TOKENS",
    "MAX_BATCH",
    "MAX_SEARCH_STEPS",
    "MAX_SEARCH_SPAN",
    "MAX_TPOT_MS",
    "MAX_MICROBENCH_BUDGET_S",
    "MAX_UNIX_TIME",
    "seconds",
    "rate",
    "count",
    "counts",
    "number_above",
    "port",
    "model_name",
    "MAX_MODEL_NAME_CHARS",
    "duration",
    "parse_duration",
    "parse_time",
    "WINDOW_SECONDS",
    "SCRAPE_INTERVAL",
    "LOAD_SECONDS",
    "REQUESTS",
    "RATE",
    "TOKENS",
]

# Scrapes: a /metrics page takes 15-30 ms to render and parse; 10 a second is already 50x what
# Prometheus does (15 s). Below 0.1 s the scraper measures itself (issue 22: 800 scrapes in 3 s).
MIN_SCRAPE_INTERVAL_S = 0.1
MAX_WINDOW_S = 7 * 86400.0  # a week of live watching (run, demo): past it, run again
MAX_FLEET_WINDOW_S = 366 * 86400.0  # a year of Prometheus history (its default retention is 15 days)
MIN_STEP_S = 0.001  # Prometheus's own resolution: milliseconds
MAX_LOAD_SECONDS = 86400.0  # an active budget of a day of load
MAX_RATE_RPS = 1e6  # requests per second: a million is beyond any one fleet a plan is made for
MAX_REQUESTS = 1_000_000  # requests one command may send or simulate per budget / trial
MAX_TOKENS = 10**12  # token counts (block size, KV capacity, batched tokens, lengths): a trillion
MAX_BATCH = 65_536  # microbench decode batch
MAX_SEARCH_STEPS = 30  # bisection steps: 30 halvings resolve the bracket to a billionth
MAX_SEARCH_SPAN = 1000.0
MAX_TPOT_MS = 3_600_000.0  # an hour per output token
MAX_MICROBENCH_BUDGET_S = 3600.0
# A served model's name: a hub id (at most 96 characters) or a local folder (PATH_MAX, 4,096 bytes).
MAX_MODEL_NAME_CHARS = 4096
MAX_UNIX_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()  # the last second datetime can show

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def _g(x: float) -> str:
    return f"{x:,.0f}" if x >= 1e4 and float(x).is_integer() else f"{x:g}"


def _span(seconds: float) -> str:
    """A duration in the largest unit of _UNITS that writes it whole: 31622400 -> `366d`."""
    for unit in ("w", "d", "h", "m", "s", "ms"):
        n = seconds / _UNITS[unit]
        if n >= 1 and abs(n - round(n)) < 1e-9:
            return f"{round(n)}{unit}"
    return f"{seconds:g}s"


def _finite(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number ({what})") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number ({what})")
    return value


def _between(value: float, text: str, low: float, high: float, what: str, *, above: bool = False) -> float:
    """`value` within [low, high] (`above`: low excluded), else the error that says the range."""
    if (value <= low if above else value < low) or value > high:
        bound = f"above {_g(low)}" if above else f"at least {_g(low)}"
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: {what} must be {bound} and at most {_g(high)}")
    return value


def seconds(low: float, high: float, *, what: str = "seconds") -> Callable[[str], float]:
    """A finite number of seconds in [low, high] (low > 0: a duration is never zero)."""

    def parse(text: str) -> float:
        return _between(_finite(text, what), text, low, high, what)

    parse.__name__ = "seconds"
    return parse


def rate(high: float = MAX_RATE_RPS) -> Callable[[str], float]:
    """A finite rate in (0, high] requests per second."""

    def parse(text: str) -> float:
        what = "requests per second"
        return _between(_finite(text, what), text, 0.0, high, what, above=True)

    parse.__name__ = "rate"
    return parse


def number_above(low: float, high: float, *, what: str) -> Callable[[str], float]:
    """A finite number in (low, high]: one that must exceed `low` (a search span above 1, a time above 0)."""

    def parse(text: str) -> float:
        return _between(_finite(text, what), text, low, high, what, above=True)

    parse.__name__ = "number"
    return parse


def _whole(text: str, what: str) -> int:
    s = text.strip()
    if not re.fullmatch(r"[+-]?\d{1,19}", s):  # no float syntax, no 5,000-digit integer to convert
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})")
    return int(s)


def count(low: int, high: int, *, what: str = "a count") -> Callable[[str], int]:
    """A whole number in [low, high]."""

    def parse(text: str) -> int:
        return int(_between(_whole(text, what), text, low, high, what))

    parse.__name__ = "count"
    return parse


def counts(low: int, high: int, *, what: str) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated whole numbers, each in [low, high]; at least one."""
    one = count(low, high, what=what)

    def parse(text: str) -> tuple[int, ...]:
        pieces = [p for p in text.split(",") if p.strip()]
        if not pieces:
            raise argparse.ArgumentTypeError(f"{text!r} lists no number ({what}, comma-separated)")
        return tuple(one(p) for p in pieces)

    parse.__name__ = "counts"
    return parse


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free one)."""
    return count(0, 65535, what="a TCP port")(text)


def model_name(text: str) -> str:
    """A model name for the requests' `model` field (run --model): not empty, at most
    MAX_MODEL_NAME_CHARS, no control character (it travels in JSON bodies and printed lines).
    Spaces around it are dropped: no server names a model with them."""
    name = text.strip()
    if not name:
        raise argparse.ArgumentTypeError("an empty model name: give the name the server serves, e.g. Qwen/Qwen3-8B")
    if len(name) > MAX_MODEL_NAME_CHARS:
        raise argparse.ArgumentTypeError(
            f"a model name of {len(name):,} characters: at most {MAX_MODEL_NAME_CHARS:,} (a hub id or a folder path)"
        )
    bad = next((ch for ch in name if unicodedata.category(ch)[0] == "C"), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"the model name holds a control character ({ascii(bad)}): give it as served")
    return name


# --- durations and times with units (fleet) -------------------------------------------------------
def parse_duration(text: str, low: float, high: float) -> float:
    """`90`, `90s`, `10m`, `1h30m`, `500ms` -> seconds in [low, high].

    Raises:
        argparse.ArgumentTypeError: not a duration, not finite, or out of range.
    """
    s = text.strip()
    examples = "examples: 90s, 10m, 2h, 1h30m"
    try:
        value = float(s)
    except ValueError:
        parts = _DURATION.findall(s)
        if not parts or "".join(n + u for n, u in parts) != s:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration ({examples})") from None
        value = sum(float(n) * _UNITS[u] for n, u in parts)  # inf past 1e308 (a 400-digit number): refused below
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration ({examples})")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero ({examples})")
    if value < low or value > high:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: from {_span(low)} to {_span(high)}")
    return value


def duration(low: float, high: float) -> Callable[[str], float]:
    """argparse type of a duration with units (see `parse_duration`)."""

    def parse(text: str) -> float:
        return parse_duration(text, low, high)

    parse.__name__ = "duration"
    return parse


def parse_time(text: str) -> float:
    """ISO-8601 (a naive time is UTC), unix seconds, or `now` -> unix seconds, between 1970 and
    the end of year 9999 (what a date can show).

    Raises:
        argparse.ArgumentTypeError: not a time, or outside that span.
    """
    s = text.strip()
    if s == "now":
        return time.time()
    try:
        value = float(s)
    except ValueError:
        try:
            moment = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time (ISO-8601 such as 2026-12-01T14:00:00Z, unix seconds, or now)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        try:
            value = moment.timestamp()
        except (OverflowError, ValueError):  # 0001-01-01 with a positive offset: before year 1
            value = -1.0
    if not math.isfinite(value) or not 0 <= value <= MAX_UNIX_TIME:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time between 1970-01-01 and 9999-12-31 (unix seconds 0 to {MAX_UNIX_TIME:.0f})"
        )
    return value


# --- the types the commands share (one per kind of flag, so a flag means the same everywhere) -----
WINDOW_SECONDS = seconds(MIN_SCRAPE_INTERVAL_S, MAX_WINDOW_S, what="seconds of observation")  # run/demo --duration
SCRAPE_INTERVAL = seconds(MIN_SCRAPE_INTERVAL_S, MAX_WINDOW_S, what="seconds between scrapes")  # run --interval
LOAD_SECONDS = seconds(MIN_SCRAPE_INTERVAL_S, MAX_LOAD_SECONDS, what="seconds of load")  # --budget-seconds
REQUESTS = count(1, MAX_REQUESTS, what="requests")  # --budget-requests, --trial-requests, demo --requests
RATE = rate(MAX_RATE_RPS)  # --max-rps, --target-rps
TOKENS = count(1, MAX_TOKENS, what="tokens")  # --block-size, --kv-capacity-tokens, --max-batched-tokens
