"""How two runs are compared: the bootstrap's settings and the tolerances in force.

One object, passed to every comparison (`llm_diagnose.diagnose.compare.metric.compare_metric`),
read by the gate (`[gate]` of its rules file sets it) and by verify alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_diagnose.diagnose.tolerances import MAX_FAILED_FRACTION, TAIL_TOLERANCE, TOLERANCE, Tolerances

__all__ = ["CompareSettings"]


@dataclass(frozen=True)
class CompareSettings:
    confidence: float = 0.95  # level of the bootstrap confidence interval of a change
    resamples: int = 2000  # bootstrap resamples per comparison
    seed: int = 0  # seeded: the same two runs always give the same verdicts
    min_samples: int = 8  # fewer raw samples than this in either run: inconclusive
    tolerances: Tolerances = field(default_factory=Tolerances)

    @property
    def tolerance(self) -> float:
        """The relative tolerance of a median, mean or rate whose rule sets none."""
        return self.tolerances[TOLERANCE]

    @property
    def tail_tolerance(self) -> float:
        """The same for a tail quantile."""
        return self.tolerances[TAIL_TOLERANCE]

    @property
    def max_failed_fraction(self) -> float:
        return self.tolerances[MAX_FAILED_FRACTION]

    def failed_too_often(self, failed_fraction: float) -> bool:
        """Whether a run failed more of the requests it sent than `max_failed_fraction` allows: the
        gate's ceiling (a regression) and verify's note (latencies of the answered requests only)."""
        return failed_fraction > self.max_failed_fraction
