"""The tolerances of comparisons between two runs: one registry, named, with defaults and sources.

Every change the gate and verify call "the same" or "beyond the noise" is measured against one
of these names, unless a metric's own rule sets its own (`llm_diagnose.diagnose.compare.rules`:
a hit rate's 5 points, absolute). The comparison core reads the values in force through
`llm_diagnose.diagnose.compare.settings.CompareSettings.tolerances`. This module depends on
nothing of the package but the TOML reader, so whatever needs a default (a technique's claim
"by the gate's tolerance") can name it from anywhere, the tree included.

Two files set them, on top of the defaults, in this order:

- the `[tolerances]` table of a `--thresholds` file (`gate`, `verify`), flat or as tables:

      [tolerances]
      tolerance = 0.15
      [tolerances.workload]
      prompt_tokens = 0.2

- the `[gate]` table of a `gate --rules` file, for the names it shares (`tolerance`,
  `tail_tolerance`, `max_failed_fraction`): the rules are the gate's more specific word.

The tree's thresholds (`llm_diagnose.diagnose.tree.thresholds`) judge one run; these judge a
change between two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_diagnose.diagnose.toml_file import flatten

__all__ = [
    "Tolerance",
    "TOLERANCES",
    "Tolerances",
    "TolerancesError",
    "TOLERANCE",
    "TAIL_TOLERANCE",
    "MAX_FAILED_FRACTION",
    "PROMPT_TOKENS",
    "OUTPUT_TOKENS",
    "REQUESTS_SENT",
    "PREFIX_REUSE",
    "SEND_RATE",
    "checked_number",
]

# The names, spelt once.
TOLERANCE = "tolerance"
TAIL_TOLERANCE = "tail_tolerance"
MAX_FAILED_FRACTION = "max_failed_fraction"
PROMPT_TOKENS = "workload.prompt_tokens"
OUTPUT_TOKENS = "workload.output_tokens"
REQUESTS_SENT = "workload.requests_sent"
PREFIX_REUSE = "workload.prefix_reuse"
SEND_RATE = "workload.send_rate"


class TolerancesError(ValueError):
    """A tolerance that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Tolerance:
    name: str
    default: float
    unit: str  # "relative": a share of the value before (0.1 = 10%); "fraction": points of a share in [0, 1]
    meaning: str
    source: str  # why the default is what it is

    @property
    def high(self) -> float | None:
        return 1.0 if self.unit == "fraction" else None


_ALL: tuple[Tolerance, ...] = (
    Tolerance(
        TOLERANCE,
        0.10,
        "relative",
        "change of a median, mean or rate within which two runs count as the same (a gate rule that sets "
        "no tolerance of its own); verify's claims start from it as their smallest effect",
        "a tenth: beyond the drift two runs of one server on one host show between them, which the "
        "bootstrap interval (the noise within each run) does not cover",
    ),
    Tolerance(
        TAIL_TOLERANCE,
        0.20,
        "relative",
        "the same for a tail quantile (a key naming p90, p99, ...)",
        "tails are noisier: a p99 rests on the few samples past it",
    ),
    Tolerance(
        MAX_FAILED_FRACTION,
        0.05,
        "fraction",
        "share of the requests sent that a run may fail: above it the gate fails the current run whatever "
        "the baseline did, and verify says the run's latencies cover only the requests answered",
        "a healthy server fails none, and a gate that passes a server losing one request in twenty protects "
        "nobody; 1 turns the ceiling off (the comparison with the baseline still applies)",
    ),
    Tolerance(
        PROMPT_TOKENS,
        0.10,
        "relative",
        "median prompt tokens: beyond this the two runs verify compares did not put the same load on the server",
        "a difference in latency could come from a tenth more prefill alone",
    ),
    Tolerance(
        OUTPUT_TOKENS,
        0.10,
        "relative",
        "median output tokens: beyond this the two runs did not put the same load on the server",
        "as workload.prompt_tokens, for the decode",
    ),
    Tolerance(
        REQUESTS_SENT,
        0.10,
        "relative",
        "requests sent per experiment: beyond this the two runs did not put the same load on the server",
        "as workload.prompt_tokens: a tenth more requests is a tenth more work",
    ),
    Tolerance(
        PREFIX_REUSE,
        0.10,
        "fraction",
        "prefix.potential_fraction (the share of prompt tokens a prefix cache can serve), absolute: beyond this "
        "the two workloads shared prefixes differently",
        "ten points of reusable prompt move TTFT with prefix caching on, whatever the change did",
    ),
    Tolerance(
        SEND_RATE,
        0.25,
        "relative",
        "send rate and requests in flight: shown beside the workload checks, never deciding",
        "the load driver's experiments wait for responses (closed loop), so both follow the server's "
        "speed, which is what the change moves",
    ),
)

TOLERANCES: dict[str, Tolerance] = {t.name: t for t in _ALL}


def _shown(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


def checked_number(where: str, value: object, *, low: float, high: float | None = None, integer: bool = False) -> float:
    """A number from a file, checked for type, finiteness and range; the error names the field.

    NaN is refused first: it compares false with every bound, so `tolerance = nan` would pass
    the range check and then make every comparison with it false (issue 22: a +97% regression
    read as inconclusive).

    Raises:
        TolerancesError: naming `where`, with the range it accepts.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TolerancesError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise TolerancesError(f"{where} must be a finite number, got {value!r}")
    if value < low:
        most = "" if high is None else f" (and at most {_shown(high)})"
        raise TolerancesError(f"{where} must be at least {low:g}{most}, got {value!r}")
    if high is not None and value > high:
        raise TolerancesError(f"{where} must be between {low:g} and {_shown(high)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Tolerances:
    """The registry's values in force: its defaults, with what the files set (`source` says which)."""

    values: Mapping[str, float] = field(default_factory=lambda: {n: t.default for n, t in TOLERANCES.items()})
    overridden: frozenset[str] = frozenset()
    source: str = "defaults"

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    def set(self, overrides: Mapping[str, object], source: str, where: str = "tolerances.") -> Tolerances:
        """These values with `overrides` (name -> value) set, each checked against its tolerance's range;
        `where` prefixes a name in an error ("gate." for the rules' [gate] table)."""
        if not overrides:
            return self
        values = dict(self.values)
        for name, value in overrides.items():
            if name not in TOLERANCES:
                raise TolerancesError(
                    f"{source}: unknown tolerance {name!r} in [tolerances]; known: {', '.join(TOLERANCES)}"
                )
            values[name] = float(checked_number(f"{source} {where}{name}", value, low=0, high=TOLERANCES[name].high))
        shown = source if self.source == "defaults" else f"{self.source} + {source}"
        return Tolerances(values, self.overridden | frozenset(overrides), shown)

    def with_table(self, data: Mapping, source: str = "mapping") -> Tolerances:
        """These values with a file's `[tolerances]` table set (its other tables are not the registry's)."""
        table = data.get("tolerances", {})
        if not isinstance(table, Mapping):
            raise TolerancesError(f"{source}: tolerances must be a table ([tolerances])")
        return self.set(flatten(table), source)
