"""The model's error: held-back trials replayed through the simulator, set against what the server did.

Each held-back group of records (one trial of a goodput search, one phase of an experiment)
is replayed with its real send times, prompt and output lengths and the cache hits the
server reported; the simulator's percentiles are compared with the measured ones. The
stated error is the largest relative error over the compared statistics, so a plan can say
"the model was within X of the live server on data it was not fitted on".

Each comparison keeps the regime of its group (the most sequences it held together, the rate
it completed at), so the error can be stated where the plan runs (`at_regime`): an error
measured at 4 sequences says nothing of a plan at 60.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llm_diagnose.diagnose.capacity.goodput import items_from_records, values_from_records
from llm_diagnose.diagnose.capacity.model import StepModel, fitted_range
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, simulate
from llm_diagnose.probes.load.records import RequestRecord
from llm_diagnose.probes.results import percentile

__all__ = ["Comparison", "ModelValidation", "validate_model", "STATISTICS", "REGIME_FRACTION"]

STATISTICS = (("ttft", 50.0), ("ttft", 90.0), ("e2e", 50.0), ("e2e", 90.0), ("itl", None))  # None: the mean
# A held-back group speaks for the plan's regime when it held at least this share of the
# sequences the plan reaches (half: the step's growth with the batch is then mostly seen).
REGIME_FRACTION = 0.5


@dataclass(frozen=True)
class Comparison:
    group: str
    statistic: str  # "ttft p90", "itl mean"
    measured_s: float
    predicted_s: float
    sequences: int = 0  # the most sequences the group held together
    rate_rps: float = 0.0  # the rate the group completed at (requests / its span)

    @property
    def relative_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else float("inf")


@dataclass(frozen=True)
class ModelValidation:
    comparisons: tuple[Comparison, ...]

    @property
    def max_abs_error(self) -> float | None:
        return max((abs(c.relative_error) for c in self.comparisons), default=None)

    def median_abs_error(self) -> float | None:
        errs = [abs(c.relative_error) for c in self.comparisons]
        return statistics.median(errs) if errs else None

    def by_statistic(self) -> dict[str, float]:
        """Median absolute relative error of each statistic over the held-back groups."""
        out: dict[str, list[float]] = {}
        for c in self.comparisons:
            out.setdefault(c.statistic, []).append(abs(c.relative_error))
        return {k: statistics.median(v) for k, v in out.items()}

    def describe(self) -> str:
        if not self.comparisons:
            return "not validated: no held-back measurements"
        groups = len({c.group for c in self.comparisons})
        each = ", ".join(f"{k} {v:.0%}" for k, v in self.by_statistic().items())
        return (
            f"on {groups} held-back trial(s), median error {self.median_abs_error():.0%} (by statistic: {each}; "
            f"worst single {self.max_abs_error:.0%})"
        )

    def at_regime(self, sequences: int) -> ModelValidation:
        """The comparisons of groups that held at least REGIME_FRACTION of `sequences` together."""
        return ModelValidation(tuple(c for c in self.comparisons if c.sequences >= REGIME_FRACTION * sequences))

    def describe_at(self, sequences: int) -> str:
        """The error where the plan runs (`sequences` in a step), or why it is not known there."""
        if not self.comparisons:
            return "not validated: no held-back measurements"
        there = self.at_regime(sequences)
        if there.comparisons:
            return f"at the plan's regime (at least {REGIME_FRACTION * sequences:.3g} sequences): {there.describe()}"
        most = max(c.sequences for c in self.comparisons)
        return (
            f"not validated at the plan's regime: the held-back measurements held at most {most} sequences, "
            f"the plan {sequences}"
        )

    def describe_each(self) -> str:
        """Every comparison with its sign: 'ttft p90 +12%, e2e p50 -8%'."""
        return ", ".join(f"{c.statistic} {c.relative_error:+.0%}" for c in self.comparisons) or "nothing compared"

    def to_dict(self) -> dict:
        return {
            "max_abs_error": self.max_abs_error,
            "median_abs_error": self.median_abs_error(),
            "by_statistic": self.by_statistic(),
            "summary": self.describe(),
            "comparisons": [
                {
                    "group": c.group,
                    "statistic": c.statistic,
                    "measured_s": c.measured_s,
                    "predicted_s": c.predicted_s,
                    "relative_error": c.relative_error,
                    "sequences": c.sequences,
                    "rate_rps": c.rate_rps,
                }
                for c in self.comparisons
            ],
        }


def _statistic(values: Sequence[float], pct: float | None) -> float | None:
    finite = [v for v in values if v != float("inf")]
    if len(finite) < 2 or len(finite) < len(values):
        return None  # a failed request: no latency to compare
    return statistics.fmean(finite) if pct is None else percentile(sorted(finite), pct)


def validate_model(
    model: StepModel,
    limits: EngineLimits,
    groups: Mapping[str, Sequence[RequestRecord]],
    *,
    blocks_of: Callable[[RequestRecord], tuple] | None = None,
) -> ModelValidation:
    out = []
    for name, records in groups.items():
        done = [r for r in records if r.completed]
        if len(done) < 2:
            continue
        measured = values_from_records(done)
        predicted = simulate(items_from_records(done, keep_arrivals=True, blocks_of=blocks_of), model, limits).values()
        regime = fitted_range(done)
        for metric, pct in STATISTICS:
            m, p = _statistic(measured[metric], pct), _statistic(predicted[metric], pct)
            if m is None or p is None or m <= 0:
                continue  # nothing measured to compare with (a gap of 0: tokens arrived in one read)
            label = f"{metric} {'mean' if pct is None else f'p{pct:g}'}"
            out.append(Comparison(name, label, m, p, regime.max_sequences, regime.max_rate_rps))
    return ModelValidation(tuple(out))
