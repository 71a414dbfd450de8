"""Active experiments against a live server: plan them, print the plan, run them, get evidence.

    plan = await prepare_plan(url, model, budget)          # GET /v1/models only: a provisional plan
    print(describe_plan(plan))                             # before anything is sent
    results = await run_experiments(url, model, budget, run_dir, plan=plan, metrics_url=url + "/metrics")

run_experiments sends one calibration request first and sizes the experiments from the speed it
measured and the engine's limits (llm_diagnose.probes.experiments.sizing), within the same budget.

`results` maps evidence keys (llm_diagnose/probes/quantities.py) to Measurements or NotMeasured; an
experiment that could not run (budget spent, server gone) leaves NotMeasured with the
reason. Every request is in `run_dir/requests.jsonl` as soon as it ends; experiment events
(phases, prefill injections) are in `run_dir/events.jsonl`.
"""

from llm_diagnose.probes.experiments.plan import ALL_EXPERIMENTS, ExperimentPlan, describe_plan
from llm_diagnose.probes.experiments.runner import (
    EXPERIMENT_KEYS,
    discover_model,
    metrics_reader,
    prepare_plan,
    run_experiments,
)
from llm_diagnose.probes.experiments.sizing import Calibration, EngineLimits, plan_experiments, size_experiments
from llm_diagnose.probes.load.budget import ActiveBudget

__all__ = [
    "ALL_EXPERIMENTS",
    "ActiveBudget",
    "ExperimentPlan",
    "plan_experiments",
    "size_experiments",
    "Calibration",
    "EngineLimits",
    "describe_plan",
    "prepare_plan",
    "run_experiments",
    "metrics_reader",
    "discover_model",
    "EXPERIMENT_KEYS",
]
