"""Where a prediction stands against the regime its model was fitted on.

A model fitted on a run that never held more than a few sequences has seen only the start of
the step's growth with the batch: its per-sequence cost may fit to about zero, and a plan
that runs at ten times that batch then treats batching as free (seen: fitted on 1-8 sequences,
the model said a step costs 24.5 ms + 0.0000 ms a sequence and predicted 60x the goodput a
sweep measured). So every prediction is set against the model's `FittedRange`: the operating
point the simulation reaches at the predicted goodput (its most sequences and tokens in one
step, and the rate) is within the range, or an extrapolation, said in words.

Beyond the range the uncertainty is widened by a pessimistic model: the per-sequence cost is
raised by the most the fitted data could hide. Over 1..n sequences, a cost of c a sequence
moves the step at n by (n - 1) x c; within the model's measured error e of the step at batch 1
(`hidden_per_seq_s`: e x step(1) / (n - 1)) the fit cannot tell it from zero. The goodput of
that model is the low end of the band; the fitted model's is the high end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llm_diagnose.diagnose.capacity.model import StepModel
from llm_diagnose.diagnose.capacity.simulate import SimResult

__all__ = [
    "OperatingPoint",
    "Regime",
    "judge_regime",
    "hidden_per_seq_s",
    "model_error_for_widening",
    "DEFAULT_HIDDEN_ERROR",
    "MIN_HIDDEN_ERROR",
]

# The step error the fit cannot see, where its error was not measured (no held-back data): a
# quarter of a step, about the median error measured on held-back trials (docs/commands/plan.md).
DEFAULT_HIDDEN_ERROR = 0.25
MIN_HIDDEN_ERROR = 0.10  # a measured error below this is not trusted to bound what is hidden
MAX_HIDDEN_ERROR = 1.0


@dataclass(frozen=True)
class OperatingPoint:
    """The regime a simulated trial reached: the rate, and the most sequences and tokens in one step."""

    rate_rps: float
    sequences: int
    step_tokens: int

    @classmethod
    def of(cls, rate_rps: float, result: SimResult) -> OperatingPoint:
        return cls(rate_rps, result.max_running, result.max_step_tokens)

    def to_dict(self) -> dict:
        return {"rate_rps": self.rate_rps, "sequences": self.sequences, "step_tokens": self.step_tokens}


@dataclass(frozen=True)
class Regime:
    """A prediction's operating point against the fitted range."""

    point: OperatingPoint
    beyond: tuple[str, ...]  # why it is an extrapolation, in words; empty: within the fitted range
    per_seq_note: str | None  # where the per-sequence cost is not trusted beyond the range, and why
    pessimistic: StepModel | None  # the model of the band's low end (None within the range)

    @property
    def extrapolated(self) -> bool:
        return bool(self.beyond)

    def to_dict(self) -> dict:
        return {
            "operating_point": self.point.to_dict(),
            "extrapolation": list(self.beyond),
            "per_sequence_cost_note": self.per_seq_note,
            "pessimistic_per_seq_s": None if self.pessimistic is None else self.pessimistic.per_seq_s,
        }


def model_error_for_widening(measured: float | None) -> float:
    """The step error the band assumes hidden: the model's measured error, within [MIN, MAX]."""
    if measured is None:
        return DEFAULT_HIDDEN_ERROR
    return min(MAX_HIDDEN_ERROR, max(MIN_HIDDEN_ERROR, measured))


def hidden_per_seq_s(model: StepModel, sequences: int, error: float) -> float:
    """The largest per-sequence cost that `error` of the batch-1 step hides over 1..`sequences`."""
    return model.step_s(1, 0) * error / max(1, sequences - 1)


def judge_regime(model: StepModel, point: OperatingPoint, error: float) -> Regime:
    """`point` against `model.fitted_range`; beyond it, the pessimistic model (see the module docstring).

    A model without a fitted range (given by hand) is not judged: nothing says where it holds.
    """
    fitted = model.fitted_range
    if fitted is None:
        return Regime(point, (), None, None)
    beyond = []
    if point.sequences > fitted.max_sequences:
        beyond.append(
            f"{point.sequences} sequences in a step, where the model was fitted on up to {fitted.max_sequences}"
        )
    if point.step_tokens > fitted.max_step_tokens:
        beyond.append(
            f"{point.step_tokens:,} tokens in a step, where the model was fitted on up to {fitted.max_step_tokens:,}"
        )
    if point.rate_rps > fitted.max_rate_rps:
        beyond.append(
            f"{point.rate_rps:.3g} requests/s, where the model was fitted on up to {fitted.max_rate_rps:.3g}/s"
        )
    if not beyond:
        return Regime(point, (), None, None)
    hidden = hidden_per_seq_s(model, fitted.max_sequences, error)
    note = None
    if point.sequences > fitted.max_sequences and model.per_seq_s < hidden:
        note = (
            f"the per-sequence step cost ({model.per_seq_s * 1e3:.4f} ms) was fitted on 1-{fitted.max_sequences} "
            f"sequences, where up to {hidden * 1e3:.3g} ms would hide within the model's {error:.0%} error: "
            f"batching beyond {fitted.max_sequences} sequences is not known to be free, so the low end assumes "
            f"{(model.per_seq_s + hidden) * 1e3:.3g} ms a sequence"
        )
    return Regime(point, tuple(beyond), note, replace(model, per_seq_s=model.per_seq_s + hidden))
