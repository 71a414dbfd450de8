"""What is compared between two runs, per quantity: which way is better and what change is tolerated.

`DEFAULT_METRICS` are the quantities the gate compares and verify watches for side effects:
latency and throughput quantiles (per request from `requests.jsonl` where the run has one, else
the engine's own), memory and KV headroom, hit rates. A rule that sets no tolerance takes the
registry's (`llm_diagnose.diagnose.tolerances`: `tolerance`, for tails `tail_tolerance`);
one that sets its own (a fraction's absolute points) keeps it. The gate's rules file overrides
any rule (`[metrics."key"]`, `llm_diagnose.diagnose.gate.rules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llm_diagnose.diagnose.compare.request_measurements import (
    REQUEST_E2E_P50,
    REQUEST_FAILED_FRACTION,
    REQUEST_TPOT_P50,
    REQUEST_TTFT_P50,
    REQUEST_TTFT_P99,
)
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.compare.statistic import is_tail, statistic_name
from llm_diagnose.probes import quantities as Q

__all__ = ["Better", "MetricRule", "DEFAULT_METRICS", "REQUEST_FAILED_RULE"]

Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class MetricRule:
    key: str
    better: Better
    tolerance: float | None = None  # relative (0.1 = 10%); None: the registry's, for its statistic
    tolerance_abs: float | None = None  # absolute, in the key's unit; replaces `tolerance`
    statistic: str | None = None  # None: named by the key (p99 for *_p99*, mean for *_mean), else median
    min_samples: int | None = None
    severity: str | None = None  # what a regression of this metric is to the gate; None: its [gate] default

    @property
    def relative(self) -> bool:
        return self.tolerance_abs is None

    def tolerance_in(self, settings: CompareSettings) -> float:
        """The tolerance that applies: the rule's own, else the registry's for its statistic."""
        if self.tolerance_abs is not None:
            return self.tolerance_abs
        if self.tolerance is not None:
            return self.tolerance
        return settings.tail_tolerance if is_tail(statistic_name(self.key, self.statistic)) else settings.tolerance

    def describe_tolerance(self, settings: CompareSettings) -> str:
        tol = self.tolerance_in(settings)
        if not self.relative:
            return f"{tol:g} {self.better}-is-better, absolute"
        return f"{tol:.0%} {self.better}-is-better"


def _m(key: str, better: Better, tolerance: float | None = None, tolerance_abs: float | None = None) -> MetricRule:
    return MetricRule(key, better, tolerance, tolerance_abs)


# Relative rules take the registry's tolerance (tails: tail_tolerance). Fractions get absolute
# ones (a hit rate going from 2% to 3% is +50% relative and means nothing); so does queueing
# time, which is 0 on an idle server.
# A failed request is no latency sample: a server that answers fast by failing half its requests
# must not pass. Failures are compared between the runs (2 points of the requests sent, absolute:
# one failure in 40 is within a run's noise, ten are not), and the registry's `max_failed_fraction`
# caps the current run's share whatever the baseline did (`CompareSettings.failed_too_often`).
REQUEST_FAILED_RULE = MetricRule(REQUEST_FAILED_FRACTION, "lower", tolerance_abs=0.02, statistic="mean")

DEFAULT_METRICS: tuple[MetricRule, ...] = (
    REQUEST_FAILED_RULE,
    _m(REQUEST_TTFT_P50, "lower"),
    _m(REQUEST_TTFT_P99, "lower"),
    _m(REQUEST_TPOT_P50, "lower"),
    _m(REQUEST_E2E_P50, "lower"),
    _m(Q.TTFT_P50, "lower"),
    _m(Q.TTFT_P99, "lower"),
    _m(Q.ITL_P50, "lower"),
    _m(Q.ITL_P99, "lower"),
    _m(Q.DECODE_BATCH1_ITL_P50, "lower"),  # the decode experiment's, beside what the server served
    _m(Q.DECODE_BATCH1_ITL_P99, "lower"),
    _m(Q.E2E_P50, "lower"),
    _m(Q.QUEUE_TIME_P50, "lower", tolerance_abs=0.05),
    _m(Q.GEN_TOKENS_PER_S, "higher"),
    _m(Q.PROMPT_TOKENS_PER_S, "higher"),
    _m(Q.REQUESTS_PER_S, "higher"),
    _m(Q.DEVICE_FREE_FRACTION, "higher", tolerance_abs=0.05),
    _m(Q.KV_CAPACITY_TOKENS, "higher", 0.05),
    _m(Q.PREEMPTION_RATE, "lower", tolerance_abs=0.05),
    _m(Q.PREFIX_HIT_RATE, "higher", tolerance_abs=0.05),
    _m(Q.SPEC_ACCEPTANCE_RATE, "higher", tolerance_abs=0.05),
    _m(Q.SPEC_ACTIVE_ACCEPTANCE_RATE, "higher", tolerance_abs=0.05),
)
