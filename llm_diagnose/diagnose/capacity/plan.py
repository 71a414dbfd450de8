"""The capacity plan: replicas (and GPUs) for a target rate, today and after each technique.

Goodput per replica comes from the simulator (`predict_goodput`) for each scenario; the
replicas needed for `target_rps` follow from one assumption, stated in every plan: a load
balancer that spreads Poisson arrivals at random over R identical replicas gives each a
Poisson stream at target/R (thinning), so R replicas meet the SLO while target/R is at most
one replica's goodput. GPUs are replicas x the tensor-parallel degree the diagnosis reports
(config.tensor_parallel_size; Q1 says whether the model needs more than one device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llm_diagnose.diagnose.capacity.goodput import predict_goodput
from llm_diagnose.diagnose.capacity.model import StepModel
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest
from llm_diagnose.diagnose.capacity.validate import ModelValidation
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes.experiments.goodput import RateSearch

__all__ = [
    "Scenario",
    "MeasuredGoodput",
    "CapacityPlan",
    "plan_capacity",
    "replicas_needed",
    "live_contradiction",
    "PREDICTION_RANGE",
    "KV_QUANT_CAPACITY_FACTOR",
]

PREDICTION_RANGE = (0.01, 2000.0)  # requests/s per replica the offline search covers
PREDICTION_STEPS = 16  # geometric bisection: the bracket ends within ~1% of each other
KV_QUANT_CAPACITY_FACTOR = 2.0  # fp8 KV instead of 16-bit: twice the tokens in the same bytes


def replicas_needed(target_rps: float, per_replica_rps: float | None) -> int | None:
    """ceil(target / per-replica goodput); None when one replica meets the SLO at no rate in range."""
    if per_replica_rps is None or per_replica_rps <= 0:
        return None
    return max(1, math.ceil(target_rps / per_replica_rps - 1e-9))


@dataclass(frozen=True)
class Scenario:
    name: str  # "today", or the technique applied
    technique: str | None
    goodput_rps: float | None  # per replica
    bound: str  # RateSearch.bound
    replicas: int | None
    gpus: int | None
    assumption: str

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "technique": self.technique,
            "goodput_per_replica_rps": self.goodput_rps,
            "bound": self.bound,
            "replicas": self.replicas,
            "gpus": self.gpus,
            "assumption": self.assumption,
        }


@dataclass(frozen=True)
class MeasuredGoodput:
    """A live search's answer beside the model's, for the same workload and SLO."""

    search: RateSearch
    predicted: RateSearch | None = None
    # The span the bracket was centred on the prediction with (prediction / span to x span);
    # None where it was not (no model before the search, or clipped by --max-rps).
    centred_span: float | None = None

    def to_dict(self) -> dict:
        def one(s: RateSearch | None) -> dict | None:
            if s is None:
                return None
            return {
                "goodput_rps": s.goodput_rps,
                "broken_at_rps": s.broken_at_rps,
                "bound": s.bound,
                "trials": [{"rate_rps": t.rate_rps, "met": t.met, "detail": t.detail} for t in s.trials],
            }

        return {"measured": one(self.search), "predicted": one(self.predicted)}


def live_contradiction(measured: MeasuredGoodput | None) -> str | None:
    """Why the live search contradicts the model's goodput, in words; None where it does not.

    Where the search's bracket is centred on the model's prediction (prediction / span to x span,
    unclipped: `MeasuredGoodput.centred_span`), an edge found inside it agrees within the span,
    whatever its exact ratio, and the two answers stand side by side. The live search contradicts
    the model only at an end of that bracket: the server met the SLO at the high end itself, or
    broke it at the low end in a trial the client did not stall in, where the model says
    otherwise. A search the budget stopped early, a bracket not centred on a prediction (no
    model before the search, or --max-rps below its high end) contradict nothing.
    """
    if measured is None or measured.predicted is None or measured.centred_span is None:
        return None
    live, model = measured.search, measured.predicted
    held_high = live.goodput_rps is not None and math.isclose(live.goodput_rps, live.high_rps)
    if live.bound == "at-least" and held_high and model.bound != "at-least":
        model_breaks = model.broken_at_rps if model.broken_at_rps is not None else model.low_rps
        return (
            f"the server met the SLO at {live.high_rps:.3g}/s, the search's high end, where the model "
            f"predicted a goodput of {_rate_words(model)}: the model is at least "
            f"{live.high_rps / model_breaks:.3g}x too low here"
        )
    broke_low = any(t.rate_rps == live.low_rps and t.met is False and not t.client_stalled for t in live.trials)
    if live.bound == "below-range" and broke_low and model.bound != "below-range" and model.goodput_rps:
        return (
            f"the server broke the SLO at {live.low_rps:.3g}/s, the search's low end, where the model "
            f"predicted a goodput of {_rate_words(model)}: the model is at least "
            f"{model.goodput_rps / live.low_rps:.3g}x too high here"
        )
    return None


def _rate_words(s: RateSearch) -> str:
    if s.goodput_rps is None:
        return f"below {s.low_rps:.3g}/s"
    return ("at least " if s.bound == "at-least" else "") + f"{s.goodput_rps:.3g}/s"


@dataclass(frozen=True)
class CapacityPlan:
    target_rps: float
    slo: SLO
    tensor_parallel: int
    tensor_parallel_source: str
    model: StepModel
    limits: EngineLimits
    scenarios: tuple[Scenario, ...]
    workload: str
    validation: ModelValidation | None = None
    measured: MeasuredGoodput | None = None
    notes: tuple[str, ...] = ()

    @property
    def today(self) -> Scenario:
        return self.scenarios[0]

    def curve(self, max_replicas: int | None = None) -> dict[str, list[tuple[int, float]]]:
        """Goodput of R replicas (R x one replica's, by the thinning assumption), per scenario."""
        needed = [s.replicas for s in self.scenarios if s.replicas]
        top = max_replicas or max(4, min(64, max(needed, default=1) + 1))
        return {
            s.name: [(r, r * s.goodput_rps) for r in range(1, top + 1)]
            for s in self.scenarios
            if s.goodput_rps is not None
        }

    def to_dict(self) -> dict:
        return {
            "target_rps": self.target_rps,
            "slo": [o.label for o in self.slo.objectives],
            "tensor_parallel_size": self.tensor_parallel,
            "tensor_parallel_source": self.tensor_parallel_source,
            "workload": self.workload,
            "model": self.model.to_dict(),
            "limits": {
                "max_num_seqs": self.limits.max_num_seqs,
                "max_batched_tokens": self.limits.max_batched_tokens,
                "kv_capacity_tokens": self.limits.kv_capacity_tokens,
                "block_size": self.limits.block_size,
                "prefix_caching": self.limits.prefix_caching,
                "source": self.limits.source,
            },
            "model_error": None if self.validation is None else self.validation.to_dict(),
            "scenarios": [s.to_dict() for s in self.scenarios],
            "measured_goodput": None if self.measured is None else self.measured.to_dict(),
            "assumptions": list(ASSUMPTIONS),
            "notes": list(self.notes),
        }


ASSUMPTIONS = (
    "replicas are identical and a load balancer spreads arrivals at random (Poisson thinning): R replicas "
    "sustain R x one replica's goodput",
    "arrivals are Poisson at the target rate, with the workload's request lengths (trace or measured)",
    "the step model (fitted to this server's requests) holds on the planned hardware: plan on the hardware "
    "you measured",
)


def _scenario(name: str, technique: str | None, s: RateSearch, target: float, tp: int, assumption: str) -> Scenario:
    reps = replicas_needed(target, s.goodput_rps)
    note = assumption
    if s.bound == "at-least" and reps is not None:
        note += f"; one replica met the SLO even at {s.goodput_rps:g}/s, so {reps} is an upper bound"
    return Scenario(name, technique, s.goodput_rps, s.bound, reps, None if reps is None else reps * tp, note)


def with_reuse(items: Sequence[SimRequest], reuse_fraction: float, block_size: int) -> list[SimRequest]:
    """Items whose prompts hit the cache for `reuse_fraction` of their tokens (full blocks only)."""
    out = []
    for it in items:
        hit = int(reuse_fraction * it.prompt_tokens) // block_size * block_size
        out.append(replace(it, cached_tokens=min(hit, it.prompt_tokens - 1)))
    return out


def plan_capacity(
    items: Sequence[SimRequest],
    model: StepModel,
    limits: EngineLimits,
    slo: SLO,
    target_rps: float,
    *,
    tensor_parallel: int = 1,
    tensor_parallel_source: str = "assumed 1",
    techniques: Sequence[str] = (),
    reuse_fraction: float | None = None,
    reuse_source: str = "",
    validation: ModelValidation | None = None,
    measured: MeasuredGoodput | None = None,
    workload: str = "",
    seed: int = 0,
    notes: Sequence[str] = (),
) -> CapacityPlan:
    """Scenarios: today, then each technique in `techniques` the model can project.

    Techniques it projects: `prefix-caching` (with the trace's block keys, or at
    `reuse_fraction` of prompt tokens), `quantization` (KV capacity x KV_QUANT_CAPACITY_FACTOR).
    Any other is listed in the notes as not projected.
    """
    if not slo.latency_bound:
        raise ValueError(
            "a capacity plan needs a latency objective (--slo ttft:p99:2s, ...): goodput is the "
            "highest rate at which it holds"
        )
    if not target_rps > 0:
        raise ValueError("the target rate must be positive")
    lo, hi = PREDICTION_RANGE

    def predict(its: Sequence[SimRequest], lim: EngineLimits) -> RateSearch:
        prediction = predict_goodput(its, model, lim, slo, low_rps=lo, high_rps=hi, steps=PREDICTION_STEPS, seed=seed)
        return prediction.search

    keys = any(it.blocks for it in items)
    today_note = (
        f"the server as configured ({limits.source}); prefix caching {'on' if limits.prefix_caching else 'off'}"
    )
    extra_notes = list(notes)
    contradicted = live_contradiction(measured)
    if measured is not None and contradicted is not None:
        # The live answer replaces the model's; projections by the same model are withheld.
        sent = max((t.requests for t in measured.search.trials), default=0)
        today_note += f"; measured live on {sent} requests of the workload, not modelled ({contradicted})"
        scenarios = [_scenario("today", None, measured.search, target_rps, tensor_parallel, today_note)]
        extra_notes.append(
            f"the live search contradicts the model: {contradicted}. Today's goodput is the measured one; "
            "no technique is projected with this model. To settle it, record the requests the model is "
            "fitted on from the same warm server under the same host load as the search, and plan again"
        )
        techniques = ()
    else:
        scenarios = [_scenario("today", None, predict(items, limits), target_rps, tensor_parallel, today_note)]
    for technique in dict.fromkeys(techniques):
        if technique == "prefix-caching":
            if limits.prefix_caching:
                continue
            on = replace(limits, prefix_caching=True)
            if keys:
                its, why = (
                    items,
                    "the prefix cache serves the workload's repeated full blocks (its block keys), LRU "
                    "within the KV capacity",
                )
            elif reuse_fraction is not None:
                its = with_reuse(items, reuse_fraction, limits.block_size)
                why = f"the cache serves the measured reuse: {reuse_fraction:.0%} of prompt tokens ({reuse_source})"
            else:
                extra_notes.append(
                    "prefix-caching not projected: no block keys in the workload and no measured reuse "
                    "(give a trace with token ids or hash ids)"
                )
                continue
            scenarios.append(
                _scenario(
                    "prefix-caching",
                    technique,
                    predict(its, on),
                    target_rps,
                    tensor_parallel,
                    why + "; step time per computed token unchanged",
                )
            )
        elif technique == "quantization":
            if limits.kv_capacity_tokens is None:
                extra_notes.append("quantization not projected: the KV capacity is unknown (kv.capacity_tokens)")
                continue
            more = replace(limits, kv_capacity_tokens=int(limits.kv_capacity_tokens * KV_QUANT_CAPACITY_FACTOR))
            scenarios.append(
                _scenario(
                    "kv-quantization",
                    technique,
                    predict(items, more),
                    target_rps,
                    tensor_parallel,
                    f"fp8 KV cache: {KV_QUANT_CAPACITY_FACTOR:g}x the KV tokens ({more.kv_capacity_tokens:,}) in "
                    "the same memory; step time unchanged (dequantization not modelled); gains only where KV "
                    "capacity binds",
                )
            )
        else:
            extra_notes.append(f"{technique} is recommended but not projected: the model has no term for it")
    return CapacityPlan(
        target_rps,
        slo,
        tensor_parallel,
        tensor_parallel_source,
        model,
        limits,
        tuple(scenarios),
        workload,
        validation,
        measured,
        tuple(extra_notes),
    )
