"""Fitting the step model to a live run: a first guess from the token gaps, then the simulator
tuned until it reproduces the run's latency distributions, load level by load level.

The gaps a client sees are not always the engine's steps: on a busy host the API server
hands several tokens to the socket at once (gaps of ~0, then one long one). Per-request
times are robust to that: a request's last token arrives when its last step is done, however
the ones before were delivered. So the gap regression (llm_diagnose.diagnose.capacity.model) only seeds
the fit; the parameters are then chosen (Nelder-Mead over their logarithms, so each stays
positive) to minimise the mean absolute log error of the simulated TTFT and end-to-end latency
distributions of the calibration requests, replayed at their real send times with their real
lengths.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from llm_diagnose.diagnose.capacity.goodput import items_from_records
from llm_diagnose.diagnose.capacity.model import (
    MIN_OBSERVATIONS,
    ModelError,
    StepModel,
    _nonnegative_fit,
    fitted_range,
    step_observations,
    uncached_prompt,
)
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, simulate
from llm_diagnose.probes.load.records import RequestRecord

__all__ = ["fit_step_model", "replay_error", "replay_log_ratios"]

MIN_REQUESTS = 8
ITERATIONS = 120
RESTART_SCALES = (0.7, 0.25, 0.08)
FLOOR_S = 1e-7  # the smallest coefficient the search keeps (log space needs positive numbers)


def _group(record: RequestRecord) -> str:
    """The batch a request was sent with: its id without the per-request index ("ramp3-17" -> "ramp3")."""
    return record.request_id.rsplit("-", 1)[0]


def replay_log_ratios(
    model: StepModel,
    limits: EngineLimits,
    records: Sequence[RequestRecord],
    blocks_of: Callable[[RequestRecord], tuple] | None = None,
) -> list[float] | None:
    """log(measured / simulated) of the TTFT and e2e distributions (deciles and mean of each, per
    batch of requests), the records replayed at their send times; None when a simulated request
    never finished.

    Distributions, not request by request: one request joining the step after the one it
    joined live moves its own TTFT by a whole step, which would make the loss a staircase.
    Per batch (a load level of a ramp, a trial): pooled over a ramp, the light levels would
    hide the one where the queue built up.
    """
    done = sorted((r for r in records if r.completed and r.event_times), key=lambda r: r.t_send)
    sim = simulate(items_from_records(done, keep_arrivals=True, blocks_of=blocks_of), model, limits)
    # (record, simulated TTFT, simulated e2e) per batch of requests; one outcome per record replayed
    pairs: dict[str, list[tuple[RequestRecord, float, float]]] = {}
    for r, o in zip(done, sim.outcomes):
        if o.ttft_s is None or o.e2e_s is None:
            return None
        pairs.setdefault(_group(r), []).append((r, o.ttft_s, o.e2e_s))
    out: list[float] = []
    for group in pairs.values():
        for measured, simulated in (
            ([r.event_times[0] for r, _, _ in group], [ttft for _, ttft, _ in group]),
            ([r.e2e_s or 0.0 for r, _, _ in group], [e2e for _, _, e2e in group]),
        ):
            a, b = sorted(measured), sorted(simulated)
            picks = [statistics.fmean(a) / max(statistics.fmean(b), 1e-9)]
            picks += [max(a[i], 1e-6) / max(b[i], 1e-6) for i in (round(q * (len(a) - 1) / 10) for q in range(1, 10))]
            out.extend(math.log(x) for x in picks)
    return out


def replay_error(
    model: StepModel,
    limits: EngineLimits,
    records: Sequence[RequestRecord],
    blocks_of: Callable[[RequestRecord], tuple] | None = None,
) -> float:
    """Mean squared log error of the replay (see replay_log_ratios); inf when a request never finished."""
    return _mean_replay_ratio(model, limits, records, blocks_of, lambda x: x * x)


def _fit_loss(
    model: StepModel,
    limits: EngineLimits,
    records: Sequence[RequestRecord],
    blocks_of: Callable[[RequestRecord], tuple] | None,
) -> float:
    """Mean ABSOLUTE log error: what the fit minimises.

    Not the squared error: on a shared host one load level now and then runs several times
    slower than its neighbours (measured on a 2-core machine: the same 24 requests sent at once
    took 0.2 s and then 1.8 s at the median, in consecutive rounds), and a squared loss lets that
    one level drag every coefficient up (tests/test_capacity.py has such a level). The absolute
    error weighs it like any other: a median fit, where squares give a mean one.
    """
    return _mean_replay_ratio(model, limits, records, blocks_of, abs)


def _mean_replay_ratio(
    model: StepModel,
    limits: EngineLimits,
    records: Sequence[RequestRecord],
    blocks_of: Callable[[RequestRecord], tuple] | None,
    f: Callable[[float], float],
) -> float:
    ratios = replay_log_ratios(model, limits, records, blocks_of)
    return math.inf if not ratios else statistics.fmean(f(x) for x in ratios)


def _initial(records: Sequence[RequestRecord]) -> tuple[float, float, float, float, float]:
    obs = step_observations(records)
    if len(obs) >= MIN_OBSERVATIONS:
        fixed, per_seq, per_token = _nonnegative_fit(obs)
    else:
        fixed, per_seq, per_token = statistics.fmean(o.duration_s for o in obs) if obs else 1e-3, 0.0, 0.0
    done = [r for r in records if r.completed and r.event_times]
    quickest = min(r.event_times[0] for r in done)
    fixed = max(fixed, 1e-5)
    outside = max(quickest - fixed - per_token * statistics.median(uncached_prompt(r) for r in done), quickest / 4)
    # The time outside the engine, split evenly between the serialised and the overlapping part
    # until the replay of the load levels tells them apart (bursts show how much queues).
    return fixed, max(per_seq, fixed / 10), max(per_token, 1e-8), outside / 2, outside / 2


def _nelder_mead(
    f: Callable[[list[float]], float], x0: list[float], iterations: int, scale: float = 0.7
) -> list[float]:
    n = len(x0)
    simplex = [list(x0)] + [[x + (scale if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p)] for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]


def fit_step_model(
    records: Sequence[RequestRecord],
    limits: EngineLimits,
    *,
    blocks_of: Callable[[RequestRecord], tuple] | None = None,
    source: str = "requests.jsonl",
) -> StepModel:
    """The step model under which the simulator best reproduces `records` (see the module docstring).

    `limits` are the server's scheduler limits (its prefix caching included) while the records
    were taken. Raises ModelError with too few completed requests.
    """
    done = [r for r in records if r.completed and r.event_times and r.e2e_s]
    if len(done) < MIN_REQUESTS:
        raise ModelError(
            f"only {len(done)} completed requests to fit the model on (need {MIN_REQUESTS}): run "
            "the active experiments or a goodput search first"
        )
    x0 = [math.log(max(v, FLOOR_S)) for v in _initial(done)]

    def model_of(x: list[float]) -> StepModel:
        fixed, per_seq, per_token, overhead, latency = (math.exp(v) for v in x)
        return StepModel(fixed, per_seq, per_token, overhead, len(done), source, latency)

    def loss(x: list[float]) -> float:
        if any(v > 5 or v < math.log(FLOOR_S) - 5 for v in x):
            return math.inf
        return _fit_loss(model_of(x), limits, done, blocks_of)

    best = x0
    for scale in RESTART_SCALES:  # restarts: the loss is stepwise (discrete events), a simplex can stall
        best = _nelder_mead(loss, best, ITERATIONS, scale)
    fitted = model_of(best)
    return replace(
        fitted,
        source=f"simulator fitted to {len(done)} requests of {source} (replay error "
        f"{math.sqrt(replay_error(fitted, limits, done, blocks_of)):.0%} rms log)",
        fitted_range=fitted_range(done),
    )
