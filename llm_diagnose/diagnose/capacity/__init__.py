"""Capacity planning: a measured performance model, goodput, and replicas for a target rate.

    model = fit_step_model(records, limits)                 # llm_diagnose.diagnose.capacity.fit
    prediction = predict_goodput(items, model, limits, slo, low_rps=0.1, high_rps=100, steps=10)
    plan = plan_capacity(items, model, limits, slo, target_rps=40, techniques=("prefix-caching",))

`simulate` is the continuous-batching replica the model drives; `validate_model` states the
model's error on held-back measurements, with the regime each was measured at. `engine_ceiling`
is the highest rate the engine's own limits allow a workload, whatever the model says: no plan
prints a goodput above it. `predict_bounded` is the model's goodput under that ceiling, set
against the range the model was fitted on (`regime`: beyond it, marked an extrapolation with a
widened band). `live` (`plan_live_search`, `run_live_search`) plans `plan --active`'s search up
from a rate the server demonstrably meets and judges it (`measured`); the search that sends the
load is `llm_diagnose.probes.experiments.ramp`, run by `experiments.goodput.run_goodput_search`.
"""

from llm_diagnose.diagnose.capacity.bounded import BoundedGoodput, predict_bounded
from llm_diagnose.diagnose.capacity.ceiling import Ceiling, engine_ceiling
from llm_diagnose.diagnose.capacity.fit import fit_step_model
from llm_diagnose.diagnose.capacity.goodput import (
    at_rate,
    items_from_records,
    items_from_trace,
    predict_goodput,
    slo_judge,
    values_from_records,
)
from llm_diagnose.diagnose.capacity.model import FittedRange, ModelError, StepModel
from llm_diagnose.diagnose.capacity.plan import CapacityPlan, MeasuredGoodput, Scenario, plan_capacity, replicas_needed
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest, simulate
from llm_diagnose.diagnose.capacity.validate import ModelValidation, validate_model

__all__ = [
    "BoundedGoodput",
    "predict_bounded",
    "Ceiling",
    "engine_ceiling",
    "FittedRange",
    "fit_step_model",
    "at_rate",
    "items_from_records",
    "items_from_trace",
    "predict_goodput",
    "slo_judge",
    "values_from_records",
    "ModelError",
    "StepModel",
    "CapacityPlan",
    "MeasuredGoodput",
    "Scenario",
    "plan_capacity",
    "replicas_needed",
    "EngineLimits",
    "SimRequest",
    "simulate",
    "ModelValidation",
    "validate_model",
]
