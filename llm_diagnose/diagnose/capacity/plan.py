"""The capacity plan: replicas (and GPUs) for a target rate, today and after each technique.

Goodput per replica comes from the simulator for each scenario (`capacity.bounded`: never above
the engine's ceiling, and marked where the model extrapolates beyond the range it was fitted
on, with the band's low end), or for today with `--active` from the live search (the measured
goodput, with the model's error at that rate: `capacity.measured`). The replicas needed for
`target_rps` follow from one assumption, stated in every plan: a load balancer that spreads
Poisson arrivals at random over R identical replicas gives each a Poisson stream at target/R
(thinning), so R replicas meet the SLO while target/R is at most one replica's goodput. GPUs
are replicas x the tensor-parallel degree the diagnosis reports (config.tensor_parallel_size;
Q1 says whether the model needs more than one device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llm_diagnose.diagnose.capacity.bounded import BoundedGoodput, clip_to_ceiling, predict_bounded
from llm_diagnose.diagnose.capacity.ceiling import Ceiling, engine_ceiling
from llm_diagnose.diagnose.capacity.goodput import at_rate
from llm_diagnose.diagnose.capacity.measured import MeasuredGoodput, live_contradiction
from llm_diagnose.diagnose.capacity.model import StepModel
from llm_diagnose.diagnose.capacity.regime import model_error_for_widening
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest, simulate
from llm_diagnose.diagnose.capacity.trial_size import one_batch_note
from llm_diagnose.diagnose.capacity.validate import ModelValidation
from llm_diagnose.diagnose.tree.slo import SLO

__all__ = [
    "Scenario",
    "MeasuredGoodput",
    "CapacityPlan",
    "plan_capacity",
    "replicas_needed",
    "live_contradiction",
    "PREDICTION_RANGE",
    "KV_QUANT_CAPACITY_FACTOR",
    "MAX_REPLICAS",
    "beyond_max_replicas",
]

PREDICTION_RANGE = (0.01, 2000.0)  # requests/s per replica the offline search covers
PREDICTION_STEPS = 16  # geometric bisection: the bracket ends within ~1% of each other
KV_QUANT_CAPACITY_FACTOR = 2.0  # fp8 KV instead of 16-bit: twice the tokens in the same bytes
# The most replicas a plan counts. Past it the count is said in words ("more than 100,000
# replicas"): a deployment that size is planned with a bigger replica (more GPUs each), not by
# multiplying this one, and a target of 1e300 requests/s must not print a count of 300 digits.
MAX_REPLICAS = 100_000


def beyond_max_replicas(target_rps: float, per_replica_rps: float | None) -> bool:
    """Whether the target needs more than MAX_REPLICAS replicas of this goodput."""
    if per_replica_rps is None or per_replica_rps <= 0:
        return False
    return not target_rps / per_replica_rps <= MAX_REPLICAS  # NaN and inf included


def replicas_needed(target_rps: float, per_replica_rps: float | None) -> int | None:
    """ceil(target / per-replica goodput); None when one replica meets the SLO at no rate in range,
    or when that is more than MAX_REPLICAS (`beyond_max_replicas` says which)."""
    if per_replica_rps is None or per_replica_rps <= 0 or beyond_max_replicas(target_rps, per_replica_rps):
        return None
    return max(1, math.ceil(target_rps / per_replica_rps - 1e-9))


@dataclass(frozen=True)
class Scenario:
    name: str  # "today", or the technique applied
    technique: str | None
    goodput_rps: float | None  # per replica
    bound: str  # the search's bound (bracketed, at-least, below-range), or "ceiling": clipped to it
    replicas: int | None
    gpus: int | None
    assumption: str
    # MAX_REPLICAS where the target needs more replicas than that (`replicas` is then None).
    replicas_more_than: int | None = None
    source: str = "model"  # "model" (simulated) or "measured" (the live search, --active)
    ceiling: Ceiling | None = None  # the engine's ceiling for the workload (capacity.ceiling)
    clipped: bool = False  # the goodput was above the ceiling (the model's, or a short trial's) and is the ceiling
    extrapolation: tuple[str, ...] = ()  # why the goodput lies beyond the model's fitted range; empty: within it
    per_seq_note: str | None = None  # the per-sequence cost is not trusted beyond the fitted range, and why
    goodput_low_rps: float | None = None  # beyond the fitted range: the band's low end
    goodput_high_rps: float | None = None  # beyond the fitted range: the band's high end (the fitted model's)
    replicas_at_low: int | None = None  # replicas if the band's low end holds
    operating_point: dict | None = None  # the regime at the goodput (sequences and tokens in a step, the rate)
    one_batch: bool = False  # the trial at the goodput is about one batch, not a stream (capacity.trial_size)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "technique": self.technique,
            "goodput_per_replica_rps": self.goodput_rps,
            "bound": self.bound,
            "replicas": self.replicas,
            "replicas_more_than": self.replicas_more_than,
            "gpus": self.gpus,
            "assumption": self.assumption,
            "source": self.source,
            "ceiling_rps": None if self.ceiling is None or not math.isfinite(self.ceiling.rps) else self.ceiling.rps,
            "ceiling": None if self.ceiling is None else self.ceiling.describe(),
            "clipped_to_ceiling": self.clipped,
            "extrapolation": list(self.extrapolation),
            "per_sequence_cost_note": self.per_seq_note,
            "goodput_low_rps": self.goodput_low_rps,
            "goodput_high_rps": self.goodput_high_rps,
            "replicas_at_low": self.replicas_at_low,
            "operating_point": self.operating_point,
            "one_batch": self.one_batch,
        }


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
    error_at_plan: str = ""  # the model's error where today's goodput runs (its regime, or the measured rate)

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
            "model_error_at_plan": self.error_at_plan,
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


def _counted(
    name: str,
    technique: str | None,
    goodput: float | None,
    bound: str,
    target: float,
    tp: int,
    note: str,
    **extra,
) -> Scenario:
    """The scenario with its replica count (or, past MAX_REPLICAS, the count in words)."""
    reps = replicas_needed(target, goodput)
    if bound == "at-least" and reps is not None:
        note += f"; one replica met the SLO even at {goodput:g}/s, so {reps} is an upper bound"
    if beyond_max_replicas(target, goodput):
        note += (
            f"; the target needs more than {MAX_REPLICAS:,} replicas of {goodput:.3g}/s each "
            f"(MAX_REPLICAS): not counted; plan with a larger replica or a lower target"
        )
        return Scenario(name, technique, goodput, bound, None, None, note, replicas_more_than=MAX_REPLICAS, **extra)
    return Scenario(name, technique, goodput, bound, reps, None if reps is None else reps * tp, note, **extra)


def _ceiling_words(ceiling: Ceiling) -> str:
    return (
        f"the engine's ceiling for this workload is {ceiling.describe()}: a trial of a few dozen requests can meet "
        "the SLO at any rate at which they fit in one batch, a sustained rate cannot pass the ceiling"
    )


def _modelled(
    name: str, technique: str | None, g: BoundedGoodput, target: float, tp: int, note: str, requests: int
) -> Scenario:
    """A scenario from the model: bounded by the ceiling, marked where it extrapolates, and
    where its trial of `requests` is one batch rather than a stream (capacity.trial_size)."""
    extra: dict = {"source": "model", "ceiling": g.ceiling, "clipped": g.clipped}
    if g.clipped:
        note += "; the fitted model met the SLO at the ceiling, so its goodput is the ceiling ("
        note += _ceiling_words(g.ceiling) + ")"
    regime = g.regime
    if regime is not None:
        extra["operating_point"] = regime.point.to_dict()
        batch = one_batch_note(regime.point.sequences, requests)
        if batch is not None:
            note += "; " + batch
            extra["one_batch"] = True
    if regime is not None and regime.extrapolated:
        low = "below the search's low end" if g.low_rps is None else f"{g.low_rps:.3g}/s"
        high = "none in range" if g.central_rps is None else f"{g.central_rps:.3g}/s"
        note += (
            f"; extrapolation: at the fitted model's goodput the simulation runs {'; '.join(regime.beyond)}: "
            f"the goodput lies between {low} (the per-sequence step cost raised by what the fit could hide) and "
            f"{high} (the fitted model)"
            + (
                ", and the plan takes the low end: the fitted per-sequence cost is not trusted there"
                if g.trusts_low_end
                else ""
            )
        )
        extra.update(
            extrapolation=regime.beyond,
            per_seq_note=regime.per_seq_note,
            goodput_low_rps=g.low_rps,
            goodput_high_rps=g.central_rps,
            replicas_at_low=replicas_needed(target, g.low_rps),
        )
    return _counted(name, technique, g.goodput_rps, g.bound, target, tp, note, **extra)


def _measured(
    m: MeasuredGoodput, ceiling: Ceiling, target: float, tp: int, note: str, sequences: int | None
) -> Scenario:
    """Today from the live search: the measured goodput, never above the engine's ceiling;
    `sequences`: the most in one step of the model's replay of the trial at that goodput."""
    goodput, clipped = clip_to_ceiling(m.search.goodput_rps, ceiling)
    note += (
        f"; measured live: {len(m.search.trials)} trials of the workload's first {m.requests} requests"
        + (f", from {m.start_source}" if m.start_source else "")
        + f"; {m.error_words()}"
    )
    batch = None if sequences is None else one_batch_note(sequences, m.requests, measured=True)
    if batch is not None:
        note += "; in the model's replay of the trial, " + batch
    if clipped:
        note += "; the server met the SLO above the ceiling in a short trial, so the goodput is the ceiling ("
        note += _ceiling_words(ceiling) + ")"
    bound = "ceiling" if clipped else m.search.bound
    return _counted(
        "today",
        None,
        goodput,
        bound,
        target,
        tp,
        note,
        source="measured",
        ceiling=ceiling,
        clipped=clipped,
        one_batch=batch is not None,
    )


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
    if not (target_rps > 0 and math.isfinite(target_rps)):
        raise ValueError("the target rate must be a positive finite number of requests per second")
    lo, hi = PREDICTION_RANGE
    error = model_error_for_widening(None if validation is None else validation.median_abs_error())

    def predict(its: Sequence[SimRequest], lim: EngineLimits) -> BoundedGoodput:
        return predict_bounded(
            its, model, lim, slo, error=error, low_rps=lo, high_rps=hi, steps=PREDICTION_STEPS, seed=seed
        )

    keys = any(it.blocks for it in items)
    today_note = (
        f"the server as configured ({limits.source}); prefix caching {'on' if limits.prefix_caching else 'off'}"
    )
    extra_notes = list(notes)
    error_at_plan = ""
    if measured is not None:
        ceiling = engine_ceiling(items, model, limits)
        contradicted = live_contradiction(measured)
        # The trial at the goodput the plan states (the clipped one), replayed by the model: not
        # where the model does not reproduce the trials (then nothing of it is said).
        g, _ = clip_to_ceiling(measured.search.goodput_rps, ceiling)
        trial = items[: measured.requests]
        sequences = None
        if g and trial and contradicted is None:
            sequences = simulate(at_rate(trial, g, seed), model, limits).max_running
        today = _measured(measured, ceiling, target_rps, tensor_parallel, today_note, sequences)
        if contradicted is not None:
            extra_notes.append(
                f"the live search contradicts the model: {contradicted}. Today's goodput is the measured one; "
                "no technique is projected with this model, which does not reproduce the trials it was fitted "
                "on. To settle it, measure again on a warm server under a steady host load (a stall in one "
                "trial moves the fit), and plan again"
            )
            techniques = ()
        error_at_plan = measured.error_words()
    else:
        bounded = predict(items, limits)
        today = _modelled("today", None, bounded, target_rps, tensor_parallel, today_note, len(items))
        if validation is not None and bounded.regime is not None:
            error_at_plan = f"model error {validation.describe_at(bounded.regime.point.sequences)}"
    scenarios = [today]
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
                _modelled(
                    "prefix-caching",
                    technique,
                    predict(its, on),
                    target_rps,
                    tensor_parallel,
                    why + "; step time per computed token unchanged",
                    len(its),
                )
            )
        elif technique == "quantization":
            if limits.kv_capacity_tokens is None:
                extra_notes.append("quantization not projected: the KV capacity is unknown (kv.capacity_tokens)")
                continue
            more = replace(limits, kv_capacity_tokens=int(limits.kv_capacity_tokens * KV_QUANT_CAPACITY_FACTOR))
            scenarios.append(
                _modelled(
                    "kv-quantization",
                    technique,
                    predict(items, more),
                    target_rps,
                    tensor_parallel,
                    f"fp8 KV cache: {KV_QUANT_CAPACITY_FACTOR:g}x the KV tokens ({more.kv_capacity_tokens:,}) in "
                    "the same memory; step time unchanged (dequantization not modelled); gains only where KV "
                    "capacity binds",
                    len(items),
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
        error_at_plan,
    )
