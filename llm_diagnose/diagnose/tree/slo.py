"""Service-level objectives: what latency the workload's users accept, as declared input.

An SLO is a set of latency objectives, each "metric at percentile <= limit", plus whether
anyone waits at all. The tree reads it (Q5 asks whether decode latency breaks the ITL
objective; a workload with no latency objective and nobody waiting is offline batch), and
capacity planning searches for the highest rate at which every objective still holds.

Written in TOML as a table, or on the command line as `METRIC:pNN:LIMIT`:

    [slo]
    interactive = true
    ttft_p99_s = 2.0
    itl_p50_s = 0.05
    e2e_p95_s = 30

    --slo ttft:p99:2s --slo itl:p50:50ms --slo e2e:p95:30s

Against evidence (`SLO.check_evidence`), an objective is judged from the evidence key that
holds its percentile (`EVIDENCE_KEYS`), else from the raw samples a measurement of the metric
carries, else bounded by a neighbouring percentile (a p90 is at least the p50 and at most the
p99), else left unjudged, never guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.toml_file import read_toml
from llm_diagnose.diagnose.tree.controlled import preferred
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, percentile

if TYPE_CHECKING:  # only for annotations: the judging reads evidence through .get()
    from llm_diagnose.diagnose.tree.evidence import Evidence

__all__ = ["METRICS", "EVIDENCE_KEYS", "Objective", "ObjectiveCheck", "SLO", "SLOError"]

# ttft: send to first token; itl: gap between tokens of one stream; e2e: send to last token.
METRICS = ("ttft", "itl", "e2e")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_FLAG = re.compile(r"^(?P<metric>[a-z0-9]+):p(?P<pct>\d+(?:\.\d+)?):(?P<value>\d+(?:\.\d+)?)(?P<unit>s|ms|us)$")
_KEY = re.compile(r"^(?P<metric>[a-z0-9]+)_p(?P<pct>\d+(?:_\d+)?)_s$")

# The evidence keys that hold a percentile of each metric (llm_diagnose/probes/quantities.py), in seconds.
EVIDENCE_KEYS: dict[str, dict[float, str]] = {
    "itl": {50.0: Q.ITL_P50, 99.0: Q.ITL_P99},
    "ttft": {50.0: Q.TTFT_P50, 99.0: Q.TTFT_P99},
    "e2e": {50.0: Q.E2E_P50},
}


def _pct(p: float) -> str:
    """A percentile as written in keys and labels, exactly (`99`, `99.9`; never rounded to `100`)."""
    short = f"{p:g}"
    return short if float(short) == p else repr(p)


class SLOError(ValueError):
    """An objective that cannot be read; the message says what a valid one looks like."""


@dataclass(frozen=True)
class Objective:
    metric: str  # one of METRICS
    percentile: float  # 0 < p < 100, e.g. 99.0
    limit_s: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise SLOError(f"unknown SLO metric {self.metric!r}: use one of {', '.join(METRICS)}")
        if not 0 < self.percentile < 100:
            raise SLOError(f"SLO percentile p{self.percentile:g} must be between p0 and p100 (exclusive)")
        if not (math.isfinite(self.limit_s) and self.limit_s > 0):
            raise SLOError(f"SLO limit for {self.metric} must be a positive number of seconds")

    @property
    def key(self) -> str:
        """Its name in TOML and JSON: `itl_p50_s`, `ttft_p99_9_s`."""
        return f"{self.metric}_p{_pct(self.percentile)}_s".replace(".", "_")

    @property
    def label(self) -> str:
        limit = f"{self.limit_s * 1e3:g} ms" if self.limit_s < 1 else f"{self.limit_s:g} s"
        return f"{self.metric} p{_pct(self.percentile)} <= {limit}"

    @classmethod
    def parse(cls, text: str) -> Objective:
        """`itl:p50:50ms` -> Objective("itl", 50, 0.05)."""
        m = _FLAG.match(text.strip().lower())
        if m is None:
            raise SLOError(
                f"cannot read SLO {text!r}: write METRIC:pNN:LIMIT, e.g. ttft:p99:2s or itl:p50:50ms "
                f"(metrics: {', '.join(METRICS)})"
            )
        return cls(m["metric"], float(m["pct"]), float(m["value"]) * _UNITS[m["unit"]])

    def check(self, values: Sequence[float]) -> ObjectiveCheck:
        """Whether `values` (seconds, one per request or per token gap) meet this objective."""
        if not values:
            return ObjectiveCheck(self, None, 0, None)
        observed = percentile(sorted(values), self.percentile)
        return ObjectiveCheck(self, observed, len(values), observed <= self.limit_s)

    def check_evidence(self, evidence: Evidence) -> ObjectiveCheck:
        """Whether the evidence shows this objective met, in order of directness: the key that
        holds this percentile; the raw samples behind a key of this metric (enough of them to
        have one beyond the percentile); a bound from a neighbouring percentile (percentiles
        only grow with p: a p50 above the limit breaks a p90 objective, a p99 within it meets
        one); else not judged, with what would measure it."""
        keys = EVIDENCE_KEYS.get(self.metric, {})
        known: dict[float, tuple[str, Measurement]] = {}
        for p, served in keys.items():
            key = preferred(evidence, served)  # the controlled experiment's figure where it measured one
            result = evidence.get(key)
            if isinstance(result, Measurement):
                known[p] = (key, result)
        if self.percentile in known:
            key, m = known[self.percentile]
            return ObjectiveCheck(self, m.value, m.n, m.value <= self.limit_s, evidence=key, how=f"from {key}")
        needed = math.ceil(100.0 / (100.0 - self.percentile))
        for key, m in known.values():
            if len(m.samples) >= needed:
                observed = percentile(sorted(m.samples), self.percentile)
                return ObjectiveCheck(
                    self,
                    observed,
                    len(m.samples),
                    observed <= self.limit_s,
                    evidence=key,
                    how=f"p{self.percentile:g} of the {len(m.samples)} samples behind {key}",
                )
        below = [(m.value, p, k) for p, (k, m) in known.items() if p < self.percentile and m.value > self.limit_s]
        if below:
            value, p, key = max(below)
            return ObjectiveCheck(
                self,
                value,
                known[p][1].n,
                False,
                evidence=key,
                bound="at least",
                how=f"p{self.percentile:g} >= p{p:g} ({key})",
            )
        above = [(m.value, p, k) for p, (k, m) in known.items() if p > self.percentile and m.value <= self.limit_s]
        if above:
            value, p, key = min(above)
            return ObjectiveCheck(
                self,
                value,
                known[p][1].n,
                True,
                evidence=key,
                bound="at most",
                how=f"p{self.percentile:g} <= p{p:g} ({key})",
            )
        have = ", ".join(f"p{p:g}" for p in sorted(known)) or "none"
        return ObjectiveCheck(
            self,
            None,
            0,
            None,
            evidence="",
            how=(
                f"the evidence holds no {self.metric} p{self.percentile:g} and no percentile that bounds it "
                f"(measured here: {have}; evidence keys of {self.metric}: {', '.join(keys.values()) or 'none'})"
            ),
        )

    def to_dict(self) -> dict:
        return {"metric": self.metric, "percentile": self.percentile, "limit_s": self.limit_s}

    @classmethod
    def from_dict(cls, d: Mapping) -> Objective:
        try:
            metric, pct, limit = str(d["metric"]), float(d["percentile"]), float(d["limit_s"])
        except (KeyError, TypeError, ValueError):
            raise SLOError(f"an SLO objective needs metric, percentile and limit_s: got {dict(d)!r}") from None
        return cls(metric, pct, limit)


@dataclass(frozen=True)
class ObjectiveCheck:
    objective: Objective
    observed_s: float | None  # the measured percentile (or its bound); None when there were no values
    n: int
    met: bool | None  # None: nothing to judge
    evidence: str = ""  # the evidence key it was judged from, where it was judged from evidence
    how: str = ""  # how the percentile was obtained, or why it could not be
    bound: str = ""  # "": observed_s is the percentile; "at least" / "at most": a bound on it

    @property
    def status(self) -> str:
        return {True: "met", False: "broken", None: "not judged"}[self.met]

    @property
    def observed_text(self) -> str:
        if self.observed_s is None:
            return "not measured"
        value = f"{self.observed_s * 1e3:.1f} ms" if self.observed_s < 1 else f"{self.observed_s:.3g} s"
        return (f"{self.bound} " if self.bound else "") + value + (f" over {self.n}" if self.n > 1 else "")

    @property
    def text(self) -> str:
        if self.observed_s is None:
            return f"{self.objective.label}: not measured"
        return f"{self.objective.label}: {self.observed_text} ({self.status})"

    def to_dict(self) -> dict:
        return {
            "objective": self.objective.key,
            "label": self.objective.label,
            **self.objective.to_dict(),
            "observed_s": self.observed_s,
            "bound": self.bound,
            "n": self.n,
            "met": self.met,
            "status": self.status,
            "evidence": self.evidence,
            "how": self.how,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> ObjectiveCheck:
        met = d.get("met")
        observed = d.get("observed_s")
        return cls(
            Objective.from_dict(d),
            None if observed is None else float(observed),
            int(d.get("n", 0)),
            None if met is None else bool(met),
            evidence=str(d.get("evidence", "")),
            how=str(d.get("how", "")),
            bound=str(d.get("bound", "")),
        )


@dataclass(frozen=True)
class SLO:
    """Declared objectives. `interactive=False` means nobody waits for single responses."""

    objectives: tuple[Objective, ...] = ()
    interactive: bool | None = None  # None: not declared
    source: str = "default"

    def __post_init__(self) -> None:
        metrics = [o.metric for o in self.objectives]
        if self.interactive is False and self.objectives:
            raise SLOError(
                "an SLO with latency objectives cannot be offline (--offline, or interactive = false): "
                "drop the one or the others"
            )
        if len(set(zip(metrics, (o.percentile for o in self.objectives)))) != len(metrics):
            raise SLOError("the same metric and percentile is given twice in the SLO")

    @property
    def declared(self) -> bool:
        return bool(self.objectives) or self.interactive is not None

    @property
    def latency_bound(self) -> bool:
        """Someone waits and at least one latency objective says how long they accept."""
        return bool(self.objectives)

    def equivalent(self, other: SLO) -> bool:
        """The same objectives and the same `interactive`, wherever each was declared."""
        return set(self.objectives) == set(other.objectives) and self.interactive == other.interactive

    def for_metric(self, metric: str) -> tuple[Objective, ...]:
        return tuple(o for o in self.objectives if o.metric == metric)

    def check(self, values: Mapping[str, Sequence[float]]) -> tuple[ObjectiveCheck, ...]:
        """Each objective against the values of its metric (`{"ttft": [...], "itl": [...], "e2e": [...]}`)."""
        return tuple(o.check(values.get(o.metric, ())) for o in self.objectives)

    def check_evidence(self, evidence: Evidence, metrics: Iterable[str] = METRICS) -> tuple[ObjectiveCheck, ...]:
        """Each objective of `metrics` judged from evidence (see `Objective.check_evidence`)."""
        wanted = set(metrics)
        return tuple(o.check_evidence(evidence) for o in self.objectives if o.metric in wanted)

    def met_by(self, values: Mapping[str, Sequence[float]]) -> bool | None:
        """True when every objective holds; False when one breaks; None when one could not be judged."""
        results = [c.met for c in self.check(values)]
        if any(r is False for r in results):
            return False
        return None if any(r is None for r in results) or not results else True

    # --- reading and writing ------------------------------------------------------------------
    @classmethod
    def from_flags(cls, flags: Iterable[str], interactive: bool | None = None) -> SLO:
        objectives = tuple(Objective.parse(f) for f in flags)
        return cls(objectives, True if objectives and interactive is None else interactive, "command line")

    @classmethod
    def from_mapping(cls, table: Mapping, source: str = "mapping") -> SLO:
        objectives = []
        interactive = table.get("interactive")
        if interactive is not None and not isinstance(interactive, bool):
            raise SLOError(f"{source}: [slo] interactive must be true or false")
        for key, value in table.items():
            if key == "interactive":
                continue
            m = _KEY.match(key)
            if m is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SLOError(
                    f"{source}: [slo] {key} = {value!r} is not an objective: write e.g. "
                    "ttft_p99_s = 2.0 or itl_p50_s = 0.05 (seconds)"
                )
            try:  # the objective's own checks (a known metric, 0 < p < 100, a finite positive limit)
                objectives.append(Objective(m["metric"], float(m["pct"].replace("_", ".")), float(value)))
            except SLOError as exc:
                raise SLOError(f"{source}: [slo] {key} = {value!r}: {exc}") from None
        if objectives and interactive is None:
            interactive = True
        return cls(tuple(objectives), interactive, source)

    @classmethod
    def from_toml(cls, path: str | Path) -> SLO:
        """The `[slo]` table of a TOML file (the same file may hold `[thresholds]`); none: undeclared."""
        table = read_toml(path, "SLO file", SLOError).get("slo", {})
        if not isinstance(table, Mapping):
            raise SLOError(f"{path}: slo must be a table ([slo])")
        return cls.from_mapping(table, str(path))

    def merged(self, other: SLO) -> SLO:
        """`other` (e.g. flags) over self (e.g. a file): objectives of the same metric and percentile replaced."""
        if not other.declared:
            return self
        if not self.declared:
            return other
        mine = {(o.metric, o.percentile): o for o in self.objectives}
        mine.update({(o.metric, o.percentile): o for o in other.objectives})
        interactive = other.interactive if other.interactive is not None else self.interactive
        return SLO(tuple(mine.values()), interactive, f"{self.source} + {other.source}")

    def to_dict(self) -> dict:
        return {
            "interactive": self.interactive,
            "source": self.source,
            "objectives": {o.key: o.limit_s for o in self.objectives},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> SLO:
        interactive = d.get("interactive")
        if interactive is not None and not isinstance(interactive, bool):
            raise SLOError(f"slo.interactive must be true, false or null, got {interactive!r}")
        slo = cls.from_mapping(dict(d.get("objectives", {})), str(d.get("source", "file")))
        return cls(slo.objectives, interactive, slo.source)
