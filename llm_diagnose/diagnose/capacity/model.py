"""A measured performance model of one serving replica: how long one scheduler step takes.

    step_s(batch, prefill_tokens) = fixed_s + per_seq_s * batch + per_prefill_token_s * prefill_tokens

fitted by least squares on steps reconstructed from a live run's per-token records
(requests.jsonl): every inter-token gap of a stream is one engine step; the sequences in
that step are the streams whose token span overlaps the gap; the prefill tokens in it are
the uncached prompt tokens of the streams whose first token arrived at the end of the gap.
A continuous-batching engine runs one step for everyone, so the same step is seen once per
stream in it: the fit is weighted by tokens, as the latency a user sees is.

The model is linear on purpose: decode steps grow with the batch (memory reads of every
sequence's KV) and prefill with its tokens (compute), and three numbers can be checked by
hand. Its error is not assumed but measured: `llm_diagnose.diagnose.capacity.validate` replays held-back
trials through the simulator and compares the percentiles the live server produced.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "StepModel",
    "StepObservation",
    "ModelError",
    "FittedRange",
    "fitted_range",
    "group_name",
    "step_observations",
    "uncached_prompt",
]

MIN_OBSERVATIONS = 30  # fewer gaps than this cannot pin three coefficients


class ModelError(ValueError):
    """The records cannot support a model (too few, or no variation); the message says what to measure."""


@dataclass(frozen=True)
class StepObservation:
    duration_s: float
    batch: int  # sequences in the step (decoding, or prefilled in it)
    prefill_tokens: int  # uncached prompt tokens computed in the step


@dataclass(frozen=True)
class FittedRange:
    """The regime the records a model was fitted on cover: beyond it the model extrapolates."""

    max_sequences: int  # the most streams seen decoding together (their token spans overlapping)
    max_step_tokens: int  # the most tokens seen in one step: its sequences plus the prefill tokens in it
    max_rate_rps: float  # the fastest a batch of the records (a trial, a level) completed: requests / its span

    def describe(self) -> str:
        return (
            f"1-{self.max_sequences} sequences, up to {self.max_step_tokens:,} tokens a step and "
            f"{self.max_rate_rps:.3g} requests/s"
        )

    def to_dict(self) -> dict:
        return {
            "max_sequences": self.max_sequences,
            "max_step_tokens": self.max_step_tokens,
            "max_rate_rps": self.max_rate_rps,
        }


@dataclass(frozen=True)
class StepModel:
    """Seconds per scheduler step, and the per-request delay outside the engine."""

    fixed_s: float
    per_seq_s: float
    per_prefill_token_s: float
    request_overhead_s: float = 0.0  # front-end time per request (HTTP, input processing), served one at a time
    observations: int = 0
    source: str = ""
    # Delay per request outside the engine that overlaps between requests (transport, the hop
    # from the API server to the engine, wake-ups). Without it, a fit must explain a lone
    # request's time to first token with serialised front-end time, and then predicts a burst
    # of N requests queueing N x that long, which the live server did not do (its TTFTs in a
    # burst of 24 were within 70-90 ms of each other, not spread over 24 x 12 ms).
    request_latency_s: float = 0.0
    fitted_range: FittedRange | None = None  # None: not known (a model given by hand)

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_seq_s", "per_prefill_token_s", "request_overhead_s", "request_latency_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a non-negative number (got {v})")
        if self.fixed_s + self.per_seq_s <= 0:
            raise ValueError("a step must take some time: fixed_s + per_seq_s must be positive")

    def step_s(self, batch: int, prefill_tokens: int) -> float:
        return self.fixed_s + self.per_seq_s * batch + self.per_prefill_token_s * prefill_tokens

    def describe(self) -> str:
        return (
            f"step = {self.fixed_s * 1e3:.3f} ms + {self.per_seq_s * 1e3:.4f} ms x sequences + "
            f"{self.per_prefill_token_s * 1e6:.3f} us x prefill tokens; {self.request_overhead_s * 1e3:.2f} ms "
            f"per request in the front end, one at a time, and {self.request_latency_s * 1e3:.2f} ms of latency "
            f"per request, overlapping" + (f" ({self.observations} steps, {self.source})" if self.observations else "")
        )

    def to_dict(self) -> dict:
        return {
            "fixed_s": self.fixed_s,
            "per_seq_s": self.per_seq_s,
            "per_prefill_token_s": self.per_prefill_token_s,
            "request_overhead_s": self.request_overhead_s,
            "request_latency_s": self.request_latency_s,
            "observations": self.observations,
            "source": self.source,
            "fitted_range": None if self.fitted_range is None else self.fitted_range.to_dict(),
        }


def uncached_prompt(record: RequestRecord) -> int:
    """Prompt tokens the engine had to compute for this request (the server's counts where it sent them)."""
    prompt = record.prompt_tokens if record.prompt_tokens is not None else (record.planned_prompt_tokens or 0)
    return max(0, prompt - (record.cached_tokens or 0))


def group_name(record: RequestRecord) -> str:
    """The batch a request was sent in: experiment, phase, and its id without the per-request
    index (one trial of a search, one level of a ramp: "goodput3-17" -> "goodput3")."""
    return "/".join(x for x in (record.experiment, record.phase, record.request_id.rsplit("-", 1)[0]) if x) or "run"


def fitted_range(records: Sequence[RequestRecord]) -> FittedRange:
    """The regime `records` cover (see FittedRange): steps from their token gaps, rates per batch."""
    obs = step_observations(records)
    spans: dict[str, list[RequestRecord]] = {}
    for r in _usable(records):
        spans.setdefault(group_name(r), []).append(r)
    rates = [
        len(rs) / span
        for rs in spans.values()
        if len(rs) >= 2 and (span := max(r.t_send + r.event_times[-1] for r in rs) - min(r.t_send for r in rs)) > 0
    ]
    return FittedRange(
        max((o.batch for o in obs), default=1),
        max((o.batch + o.prefill_tokens for o in obs), default=1),
        max(rates, default=0.0),
    )


def _usable(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.completed and len(r.event_times) >= 2]


def step_observations(records: Sequence[RequestRecord]) -> list[StepObservation]:
    """One observation per inter-token gap of every completed stream (see the module docstring)."""
    usable = _usable(records)
    starts = sorted(r.t_send + r.event_times[0] for r in usable)
    ends = sorted(r.t_send + r.event_times[-1] for r in usable)
    firsts = sorted((r.t_send + r.event_times[0], uncached_prompt(r)) for r in usable)
    first_times = [t for t, _ in firsts]
    cumulative = [0]
    for _, n in firsts:
        cumulative.append(cumulative[-1] + n)
    out = []
    for r in usable:
        times = r.absolute_event_times()
        for a, b in zip(times, times[1:]):
            # Sequences in the step: first token before its end, last token after its start.
            batch = bisect.bisect_left(starts, b) - bisect.bisect_right(ends, a)
            lo, hi = bisect.bisect_right(first_times, a), bisect.bisect_right(first_times, b)
            out.append(StepObservation(b - a, max(1, batch), cumulative[hi] - cumulative[lo]))
    return out


def _solve(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """Least squares by the normal equations (a handful of columns); None when singular."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    for col in range(k):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-12 * max(1.0, max(abs(x) for row in a for x in row)):
            return None
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for i in range(col + 1, k):
            f = a[i][col] / a[col][col]
            for j in range(col, k):
                a[i][j] -= f * a[col][j]
            b[i] -= f * b[col]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (b[i] - sum(a[i][j] * x[j] for j in range(i + 1, k))) / a[i][i]
    return x


def _nonnegative_fit(obs: Sequence[StepObservation]) -> tuple[float, float, float]:
    """(fixed, per_seq, per_prefill_token), each >= 0: drop a column that fits negative, refit."""
    columns = [0, 1, 2]
    features = [(1.0, float(o.batch), float(o.prefill_tokens)) for o in obs]
    ys = [o.duration_s for o in obs]
    while columns:
        x = _solve([[f[c] for c in columns] for f in features], ys)
        if x is None:  # no variation in a column (one batch size, or no prefill seen): drop the last
            columns = columns[:-1]
            continue
        if all(v >= 0 for v in x):
            coef = [0.0, 0.0, 0.0]
            for c, v in zip(columns, x):
                coef[c] = v
            return coef[0], coef[1], coef[2]
        columns = [c for c, v in zip(columns, x) if v != min(x)]
    return statistics.fmean(ys), 0.0, 0.0
