"""A predicted goodput that respects the engine's ceiling and says where the model extrapolates.

    g = predict_bounded(items, model, limits, slo, error=0.25, low_rps=0.01, high_rps=2000, steps=16)
    g.central_rps     # the fitted model's goodput, never above g.ceiling.rps
    g.clipped         # the model alone met the SLO at the ceiling: the ceiling is its answer
    g.regime          # the operating point at g.central_rps against the fitted range
    g.low_rps         # beyond the fitted range: the band's low end (the pessimistic model's goodput)
    g.goodput_rps     # the plan's figure: the low end where the per-sequence cost is not trusted, else central

The search runs up to the ceiling and no further: a trial of a few dozen requests can meet a
latency objective at any rate its requests fit in one batch, which is no sustained rate
(`capacity.ceiling`). The operating point is the simulated trial at the predicted goodput, with
the same Poisson draws as the search.

Where the plan runs beyond the sequences the model was fitted on and its per-sequence cost
fitted below what that range could show (`Regime.per_seq_note`), the zero is not a measurement:
the plan's figure is then the band's low end (the largest cost the data allow), the fitted
model's the high end. Elsewhere the fitted model's goodput is the figure and the low end widens it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llm_diagnose.diagnose.capacity.ceiling import Ceiling, engine_ceiling
from llm_diagnose.diagnose.capacity.goodput import at_rate, predict_goodput
from llm_diagnose.diagnose.capacity.model import StepModel
from llm_diagnose.diagnose.capacity.regime import OperatingPoint, Regime, judge_regime
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest, simulate
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes.experiments.goodput import RateSearch

__all__ = ["BoundedGoodput", "predict_bounded", "clip_to_ceiling"]


@dataclass(frozen=True)
class BoundedGoodput:
    search: RateSearch  # the model's search, its high end at most the ceiling
    ceiling: Ceiling
    regime: Regime | None  # None: no goodput in range, no operating point
    low: RateSearch | None = None  # beyond the fitted range: the pessimistic model's search

    @property
    def central_rps(self) -> float | None:
        g = self.search.goodput_rps
        return None if g is None else min(g, self.ceiling.rps)

    @property
    def low_rps(self) -> float | None:
        return None if self.low is None else self.low.goodput_rps

    @property
    def trusts_low_end(self) -> bool:
        """The plan's figure is the band's low end: the per-sequence cost is not trusted where the plan runs."""
        return self.low is not None and self.regime is not None and self.regime.per_seq_note is not None

    @property
    def goodput_rps(self) -> float | None:
        return self.low_rps if self.trusts_low_end else self.central_rps

    @property
    def clipped(self) -> bool:
        """The model met the SLO at the ceiling: it would have said more, and the engine forbids more."""
        g = self.search.goodput_rps
        return g is not None and self.search.bound == "at-least" and g >= self.ceiling.rps * (1 - 1e-9)

    @property
    def bound(self) -> str:
        if self.trusts_low_end and self.low is not None:
            return self.low.bound if self.low.bound != "at-least" else self.bound_of_central()
        return self.bound_of_central()

    def bound_of_central(self) -> str:
        return "ceiling" if self.clipped else self.search.bound


def clip_to_ceiling(goodput_rps: float | None, ceiling: Ceiling) -> tuple[float | None, bool]:
    """(goodput, whether it was above the ceiling and so clipped to it)."""
    if goodput_rps is None or goodput_rps <= ceiling.rps:
        return goodput_rps, False
    return ceiling.rps, True


def _search_range(low_rps: float, high_rps: float, ceiling: Ceiling) -> tuple[float, float]:
    high = min(high_rps, ceiling.rps)
    return min(low_rps, high / 2), high


def predict_bounded(
    items: Sequence[SimRequest],
    model: StepModel,
    limits: EngineLimits,
    slo: SLO,
    *,
    error: float,
    low_rps: float,
    high_rps: float,
    steps: int,
    seed: int = 0,
) -> BoundedGoodput:
    """The model's goodput for `items` up to the engine's ceiling, placed against its fitted range
    (`error`: the step error the band assumes hidden, capacity.regime.model_error_for_widening)."""
    ceiling = engine_ceiling(items, model, limits)
    lo, hi = _search_range(low_rps, high_rps, ceiling)
    search = predict_goodput(items, model, limits, slo, low_rps=lo, high_rps=hi, steps=steps, seed=seed).search
    g = search.goodput_rps
    if g is None or not math.isfinite(g):
        return BoundedGoodput(search, ceiling, None)
    point = OperatingPoint.of(g, simulate(at_rate(items, g, seed), model, limits))
    regime = judge_regime(model, point, error)
    if regime.pessimistic is None:
        return BoundedGoodput(search, ceiling, regime)
    low_ceiling = engine_ceiling(items, regime.pessimistic, limits)
    p_lo, p_hi = _search_range(lo, g, low_ceiling)
    low = predict_goodput(items, regime.pessimistic, limits, slo, low_rps=p_lo, high_rps=p_hi, steps=steps, seed=seed)
    return BoundedGoodput(search, ceiling, regime, low.search)
