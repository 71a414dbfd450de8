"""Microbenchmarks of a model in-process: step latencies, machine ceilings, roofline floors.

- `steps`: decode / prefill / mixed-step latency of a transformers causal LM on a static KV cache;
- `ceilings`: measured memory-copy bandwidth and matmul rate of the device;
- `roofline`: the bytes and FLOPs of each step and the floor they put under its latency;
- `run`: the grid over batch sizes, context and prompt lengths, and its evidence keys;
- `config_model`: a model of a config.json's shapes with random weights (no weights read), one
  device's tensor-parallel shard of it, fewer layers of it;
- `from_config`: the grid on such a model, scaled to the config's layer count where the shard does
  not fit, or the roofline floor where the step cannot be timed, each extrapolation named.

torch and transformers are imported inside functions: `roofline` is usable without them.
"""

from llm_diagnose.probes.microbench.roofline import Ceilings, Floor, ModelCosts, StepCost, roofline_floor
from llm_diagnose.probes.microbench.run import Grid, MicrobenchReport, StepResult, run_microbench

__all__ = [
    "Ceilings",
    "Floor",
    "ModelCosts",
    "StepCost",
    "roofline_floor",
    "Grid",
    "MicrobenchReport",
    "StepResult",
    "run_microbench",
]
