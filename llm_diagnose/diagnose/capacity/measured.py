"""The live search's answer beside the model's: what `plan --active` measured, and how far off the
model was there.

The headline goodput with --active is the measured one. Beside it: the goodput the plan's model
gives when it walks the same search (same start, same factor, same trials, same Poisson draws),
the one the model fitted before the search gave (what `plan` alone would have said), and the
model's error at the measured goodput's rate (its trial held back from the fit and replayed).
Where the model's goodput for the same search is more than DISAGREEMENT_FACTOR from the measured
one, or one side found no rate the other did, the model contradicts the server: no technique is
projected with it (`live_contradiction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_diagnose.diagnose.capacity.validate import ModelValidation
from llm_diagnose.probes.experiments.goodput import LiveSearch

__all__ = ["MeasuredGoodput", "live_contradiction", "DISAGREEMENT_FACTOR", "search_dict", "rate_words"]

# Measured / predicted goodput beyond this factor (either way) and the model's projections are
# withheld: the accuracy docs/commands/plan.md states for the model, measured on the 2-core box (benchmarks/RESULTS.md).
DISAGREEMENT_FACTOR = 3.0


def search_dict(s: LiveSearch | None) -> dict | None:
    if s is None:
        return None
    return {
        "goodput_rps": s.goodput_rps,
        "broken_at_rps": s.broken_at_rps,
        "bound": s.bound,
        "trials": [{"rate_rps": t.rate_rps, "met": t.met, "detail": t.detail} for t in s.trials],
    }


def rate_words(s: LiveSearch) -> str:
    if s.goodput_rps is None:
        low = min((t.rate_rps for t in s.trials), default=None)
        return "no rate tried" if low is None else f"below {low:.3g}/s"
    return ("at least " if s.bound == "at-least" else "") + f"{s.goodput_rps:.3g}/s"


@dataclass(frozen=True)
class MeasuredGoodput:
    """A live search's answer beside the model's, for the same requests and SLO."""

    search: LiveSearch  # the live search (experiments.ramp.RampSearch)
    predicted: LiveSearch | None = None  # the plan's model walking the same search
    predicted_before: LiveSearch | None = None  # the model fitted before the search (None: there was none)
    error_at_rate: ModelValidation | None = None  # the plan's model on the held-back trial(s) at error_rate_rps
    error_rate_rps: float | None = None
    requests: int = 0  # per trial: the trace's first requests every trial sent
    start_source: str = ""  # where the search's start rate came from

    def error_words(self) -> str:
        if self.error_at_rate is None or self.error_rate_rps is None:
            return "the model's error at the measured rate: not measured"
        if not self.error_at_rate.comparisons:
            return f"the model's error at {self.error_rate_rps:.3g}/s: nothing to compare (no completed request)"
        return (
            f"the model's error at {self.error_rate_rps:.3g}/s (that trial held back from its fit): "
            f"{self.error_at_rate.describe_each()}"
        )

    def to_dict(self) -> dict:
        return {
            "measured": search_dict(self.search),
            "predicted": search_dict(self.predicted),
            "predicted_before_search": search_dict(self.predicted_before),
            "error_at_rate": None
            if self.error_at_rate is None
            else {"rate_rps": self.error_rate_rps, **self.error_at_rate.to_dict(), "summary": self.error_words()},
            "requests_per_trial": self.requests,
            "start_source": self.start_source,
        }


def live_contradiction(measured: MeasuredGoodput | None) -> str | None:
    """Why the live search contradicts the model's goodput for the same search, in words; None where it does not.

    Both walked the same rule from the same start: they disagree where one found a goodput and
    the other none (it broke at every rate tried), or where the goodputs are more than
    DISAGREEMENT_FACTOR apart, unless the lower is only a lower bound ("at least": the budget or
    the ceiling stopped that side). A search stopped before its first trial contradicts nothing.
    """
    if measured is None or measured.predicted is None or not measured.search.trials:
        return None
    live, model = measured.search, measured.predicted
    g, p = live.goodput_rps, model.goodput_rps
    if g is None and p is None:
        return None
    if g is None or p is None:
        return f"the server's goodput is {rate_words(live)}, the model's for the same trials {rate_words(model)}"
    ratio = g / p
    if 1 / DISAGREEMENT_FACTOR <= ratio <= DISAGREEMENT_FACTOR:
        return None
    if (live.bound == "at-least" and ratio < 1) or (model.bound == "at-least" and ratio > 1):
        return None  # "at least" on the lower side is no contradiction (the budget or the ceiling stopped it)
    return (
        f"the server's goodput is {rate_words(live)}, the model's for the same trials {rate_words(model)}: "
        f"{max(ratio, 1 / ratio):.3g}x {'too low' if ratio > 1 else 'too high'}, beyond {DISAGREEMENT_FACTOR:g}x"
    )
