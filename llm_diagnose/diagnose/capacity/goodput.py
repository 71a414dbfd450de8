"""Goodput: the highest rate at which the SLO holds, predicted from the model or judged live.

Both sides use the same search (`llm_diagnose.probes.experiments.goodput.RateSearch`, or the
live ramp's rule `experiments.ramp.RampSearch`: `predict_ramp`), the same Poisson draws
(`PoissonArrivals(rate, seed)`: the arrivals of one trial are the unit-rate draws over the
rate) and the same judgement (`SLO.met_by` on ttft / itl / e2e values, a failed or
unfinished request counting as infinitely late), so a prediction and a measurement differ
only in where the latencies came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from llm_diagnose.diagnose.capacity.model import StepModel
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest, simulate
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes.experiments.goodput import LiveSearch, RateSearch, Trial
from llm_diagnose.probes.experiments.ramp import RampPlan, RampSearch
from llm_diagnose.probes.load.pacing import PoissonArrivals, arrival_offsets
from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "values_from_records",
    "slo_judge",
    "at_rate",
    "predict_goodput",
    "predict_ramp",
    "GoodputPrediction",
    "items_from_trace",
    "items_from_records",
    "text_tokens",
]


def text_tokens(trace: Sequence) -> int:
    """Trace requests whose prompt length `items_from_trace` approximates (text, no stated length)."""
    return sum(1 for r in trace if r.text and r.input_tokens is None and (r.tokens is None or not len(r.tokens)))


def values_from_records(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """ttft / itl / e2e values the SLO is judged on; a request that did not complete is infinitely late."""
    inf = math.inf
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    for r in records:
        if r.completed and r.event_times:
            ttft.append(r.event_times[0])
            itl.extend(r.gaps_s)
            e2e.append(r.e2e_s if r.e2e_s is not None else inf)
        else:
            ttft.append(inf)
            e2e.append(inf)
    return {"ttft": ttft, "itl": itl, "e2e": e2e}


def _checks_text(slo: SLO, values: dict[str, list[float]]) -> str:
    return "; ".join(c.text for c in slo.check(values))


def slo_judge(slo: SLO):
    """A judge for `run_goodput_search`: records -> (met, the checks in words)."""
    if not slo.latency_bound:
        raise ValueError("goodput needs a latency objective (--slo ttft:p99:2s, ...)")

    def judge(records: Sequence[RequestRecord]) -> tuple[bool | None, str]:
        values = values_from_records(records)
        return slo.met_by(values), _checks_text(slo, values)

    return judge


def at_rate(items: Sequence[SimRequest], rate: float, seed: int = 0) -> list[SimRequest]:
    """The items arriving as a Poisson stream at `rate` (exactly the live trial's arrival times)."""
    offsets = arrival_offsets(PoissonArrivals(rate, seed), len(items))
    return [replace(it, arrival_s=off) for it, off in zip(items, offsets)]


@dataclass(frozen=True)
class GoodputPrediction:
    search: RateSearch
    model: StepModel
    limits: EngineLimits

    @property
    def goodput_rps(self) -> float | None:
        return self.search.goodput_rps


def predict_goodput(
    items: Sequence[SimRequest],
    model: StepModel,
    limits: EngineLimits,
    slo: SLO,
    *,
    low_rps: float,
    high_rps: float,
    steps: int,
    seed: int = 0,
) -> GoodputPrediction:
    """The model's answer to the search the live server would be put through (same rates, same draws)."""
    if not slo.latency_bound:
        raise ValueError("goodput needs a latency objective (--slo ttft:p99:2s, ...)")
    search = _walk(RateSearch(low_rps, high_rps, steps), items, model, limits, slo, seed)
    return GoodputPrediction(search, model, limits)


_Search = TypeVar("_Search", bound=LiveSearch)


def _walk(
    search: _Search, items: Sequence[SimRequest], model: StepModel, limits: EngineLimits, slo: SLO, seed: int
) -> _Search:
    """`search` walked with the simulator: each rate's trial is `items` at that rate (the same draws)."""
    while (rate := search.next_rate()) is not None:
        values = simulate(at_rate(items, rate, seed), model, limits).values()
        search.record(Trial(rate, slo.met_by(values), len(items), _checks_text(slo, values)))
    return search


def predict_ramp(
    items: Sequence[SimRequest], model: StepModel, limits: EngineLimits, slo: SLO, plan: RampPlan
) -> RampSearch:
    """The model walking the live ramp's rule (`plan`: same start, factor, ceiling, trials, draws)."""
    if not slo.latency_bound:
        raise ValueError("goodput needs a latency objective (--slo ttft:p99:2s, ...)")
    search = RampSearch(plan.start_rps, plan.steps, plan.factor, plan.max_rps, plan.max_trials)
    return _walk(search, items, model, limits, slo, plan.seed)


def items_from_trace(
    trace: Sequence, block_size: int, *, max_model_len: int | None = None, default_output_tokens: int = 128
) -> list[SimRequest]:
    """SimRequests (arrival 0) for trace requests (llm_diagnose.probes.traces TraceRequest), with prefix block keys.

    Mooncake hash ids each stand for 512 tokens, as the replay sends them: block j of a hash id
    is keyed (id, j). Token ids are keyed by the chained hash of their full blocks. Text without
    a stated length is counted, and keyed, by the approximate tokenizer of the trace analysis
    (`text_tokens`; a prompt counted as one token made a 200-token workload look free to
    prefill). Length-only requests have no keys (no prefix reuse is simulated for them).
    """
    from llm_diagnose.probes.load.replay import MOONCAKE_BLOCK_TOKENS
    from llm_diagnose.probes.traces.tokenize import ApproxTokenizer

    approx = ApproxTokenizer()
    out = []
    for r in trace:
        n_out = max(1, r.output_tokens or default_output_tokens)
        blocks: list[object] = []
        tokens = r.tokens
        if (tokens is None or not len(tokens)) and r.text and r.input_tokens is None:
            tokens = approx.encode(r.text)
        if tokens is not None and len(tokens):
            n_in = len(tokens)
            h: object = None
            for i in range(n_in // block_size):
                h = hash((h, tuple(int(t) for t in tokens[i * block_size : (i + 1) * block_size])))
                blocks.append(h)
        else:
            n_in = max(1, r.input_tokens or (len(r.hash_ids or ()) * MOONCAKE_BLOCK_TOKENS) or 1)
            per_id = max(1, MOONCAKE_BLOCK_TOKENS // block_size)
            for i, hid in enumerate(r.hash_ids or ()):
                for j in range(per_id):
                    if (i * per_id + j + 1) * block_size <= n_in:
                        blocks.append((hid, j))
        if max_model_len is not None and n_in + n_out > max_model_len:  # as trace_workload clips
            n_out = max(1, max_model_len - n_in)
        out.append(SimRequest(0.0, n_in, n_out, tuple(blocks)))
    return out


def items_from_records(
    records: Sequence[RequestRecord],
    *,
    keep_arrivals: bool = False,
    blocks_of: Callable[[RequestRecord], tuple] | None = None,
) -> list[SimRequest]:
    """SimRequests for what the server was actually sent (a replay, or a measured workload).

    Cache hits are the server's where it reported them (usage cached_tokens); otherwise the
    cache is simulated from `blocks_of(record)` (the prompt's block keys, where the caller
    knows them), and without either no hit is assumed.
    """
    done = [r for r in records if r.completed]
    t0 = min((r.t_send for r in done), default=0.0)
    out = []
    for r in sorted(done, key=lambda r: r.t_send):
        prompt = r.prompt_tokens if r.prompt_tokens is not None else (r.planned_prompt_tokens or 1)
        blocks = tuple(blocks_of(r)) if blocks_of is not None and r.cached_tokens is None else ()
        cached = r.cached_tokens if r.cached_tokens is not None else (None if blocks else 0)
        out.append(
            SimRequest(r.t_send - t0 if keep_arrivals else 0.0, max(1, prompt), max(1, r.tokens_out), blocks, cached)
        )
    return out
