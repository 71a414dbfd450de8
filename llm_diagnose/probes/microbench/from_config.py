"""The decode step of a served model from its config.json alone: built, timed, scaled where it must be.

`measure_config(path, grid, ...)` builds the model of the config's shapes with random weights
(llm_diagnose.probes.microbench.config_model) on the device and runs the grid on it. Two
extrapolations, each named in every figure it touches (the provenance's source and the note):

- tensor parallel: a TP-N deployment is measured as one device's shard (widths / N), since that
  is what each device computes per step; the all-reduces between shards are not in the figure;
- layers: a shard larger than about half the device's free memory is built with k and 2k decoder
  layers, and each step is scaled to the config's layer count along the line through the two
  (bytes, FLOPs and time all grow by the same amount per layer; the embedding and lm_head are the
  fixed part).

`floors_from_config(...)`, for a model the host cannot build or run: the machine's ceilings
measured on the device and each decode step's roofline floor from the config's shapes, and the
figure says that a floor stands in for the step.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.microbench.ceilings import measure_matmul, measure_memcpy
from llm_diagnose.probes.microbench.config_model import build, config_dtype, describe, read_config, shard, with_layers
from llm_diagnose.probes.microbench.roofline import Ceilings, ModelCosts, StepCost, roofline_floor
from llm_diagnose.probes.microbench.run import Grid, MicrobenchReport, run_microbench
from llm_diagnose.probes.results import Fact, Measurement, Provenance, Result

__all__ = ["measure_config", "floors_from_config", "layers_that_fit", "extrapolate"]

MEMORY_SHARE = 0.5  # of the free memory the model under test may take (the rest: KV cache, activations, ceilings)
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _free_bytes(device: Any) -> float:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return float(torch.cuda.mem_get_info(dev)[0])
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def layers_that_fit(config: dict[str, Any], dtype: str, grid: Grid, free_bytes: float) -> int:
    """How many decoder layers of `config` fit MEMORY_SHARE of `free_bytes`, with the grid's KV cache."""
    try:
        one = ModelCosts.from_config(with_layers(config, 1), _BYTES[dtype])
    except ValueError:
        return config["num_hidden_layers"]  # shapes not countable: try the whole model
    per_layer = one.weight_bytes - one.lm_head_params * _BYTES[dtype]
    kv = max(grid.batches) * (max(grid.contexts) + max(grid.prompts, default=0) + 2) * one.kv_bytes_per_token
    fixed = 2 * one.lm_head_params * _BYTES[dtype]  # input embeddings and lm_head
    room = MEMORY_SHARE * free_bytes - fixed
    return max(0, int(room // max(per_layer + kv, 1.0)))


def measure_config(
    path: str | Path,
    grid: Grid,
    *,
    device: Any = "cpu",
    dtype: str | None = None,
    tp: int = 1,
    max_layers: int | None = None,
    budget_s: float = 0.3,
) -> MicrobenchReport:
    """The grid on a model of the config at `path` (random weights), sharded for `tp`, scaled in
    layers where fewer than the config's fit (or `max_layers` caps them). Raises ConfigError."""
    config = read_config(path)
    dtype = dtype or config_dtype(config)
    sharded, tp_note = shard(config, tp)
    layers = sharded["num_hidden_layers"]
    fit = max_layers if max_layers is not None else layers_that_fit(sharded, dtype, grid, _free_bytes(device))
    if fit >= layers:
        name = describe(path, dtype, tp_note)
        return run_microbench(build(sharded, device=device, dtype=dtype), grid, budget_s=budget_s, name=name)
    high = max(2, min(fit, layers - 1))
    low = max(1, high // 2)
    note = f"{low} and {high} of its {layers} decoder layers timed, each step scaled to {layers} along the line"
    reports = []
    for k in (low, high):
        model = build(with_layers(sharded, k), device=device, dtype=dtype)
        reports.append(run_microbench(model, grid, budget_s=budget_s, measure_ceilings=k == high, name=f"{k} layers"))
        del model
    return extrapolate(reports[0], low, reports[1], high, layers, describe(path, dtype, tp_note, note))


def _scaled(m1: Measurement, k1: int, m2: Measurement, k2: int, layers: int, what: str) -> Measurement:
    slope = (m2.value - m1.value) / (k2 - k1)
    warnings = m1.warnings + m2.warnings
    if slope <= 0:  # noise swamped the per-layer cost: scale in proportion (an over-estimate), and say so
        shift_of = lambda x: x * (layers / k2 - 1.0)  # noqa: E731
        warnings += (f"the {k1}-layer step was not faster than the {k2}-layer one: scaled in proportion instead",)
    else:
        shift_of = lambda x: (layers - k2) * slope  # noqa: E731
    samples = tuple(x + shift_of(x) for x in m2.samples)
    prov = replace(m2.provenance, source=f"{m2.provenance.source}; {what}")
    return Measurement(
        m2.value + shift_of(m2.value),
        m2.unit,
        prov,
        samples=samples,
        calls_per_sample=m2.calls_per_sample,
        warnings=warnings,
        note=f"{m2.note}; extrapolated: {m1.value * 1e3:.4g} ms at {k1} layers, {m2.value * 1e3:.4g} ms at {k2}",
    )


def _cost(c1: StepCost, k1: int, c2: StepCost, k2: int, layers: int) -> StepCost:
    per_bytes, per_flops = (c2.bytes - c1.bytes) / (k2 - k1), (c2.flops - c1.flops) / (k2 - k1)
    return StepCost(c2.bytes + (layers - k2) * per_bytes, c2.flops + (layers - k2) * per_flops)


def extrapolate(
    r1: MicrobenchReport, k1: int, r2: MicrobenchReport, k2: int, layers: int, name: str
) -> MicrobenchReport:
    """Every step of `r2` (k2 layers) scaled to `layers` along the line through `r1` (k1 layers)."""
    steps = []
    for s2 in r2.steps:
        s1 = next(
            s for s in r1.steps if (s.kind, s.batch, s.context, s.tokens) == (s2.kind, s2.batch, s2.context, s2.tokens)
        )
        latency = _scaled(s1.latency, k1, s2.latency, k2, layers, name)
        eager = None
        if s1.eager is not None and s2.eager is not None:
            eager = latency if s2.eager is s2.latency else _scaled(s1.eager, k1, s2.eager, k2, layers, name)
        cost = _cost(s1.cost, k1, s2.cost, k2, layers)
        steps.append(replace(s2, latency=latency, eager=eager, cost=cost, floor=None))
    if r2.memcpy is not None and r2.matmul is not None:
        ceilings = Ceilings(r2.memcpy.value, r2.matmul.value, "measured")
        steps = [replace(s, floor=roofline_floor(s.cost, ceilings)) for s in steps]
    return replace(r2, model=name, steps=tuple(steps), notes=(*r2.notes, name))


def floors_from_config(
    path: str | Path,
    grid: Grid,
    why: str,
    *,
    device: Any = "cpu",
    dtype: str | None = None,
    tp: int = 1,
    budget_s: float = 0.3,
) -> dict[str, Result]:
    """Evidence for a model whose step could not be timed (`why`): the device's measured ceilings
    and each decode step's roofline floor from the config's shapes, said to stand in for the step.
    Raises ConfigError, or ValueError where the config's shapes cannot be counted."""
    import torch

    config = read_config(path)
    dtype = dtype or config_dtype(config)
    sharded, tp_note = shard(config, tp)
    costs = ModelCosts.from_config(sharded, _BYTES[dtype])
    memcpy = measure_memcpy(device, budget_s=budget_s)
    matmul = measure_matmul(device, dtype=getattr(torch, dtype), budget_s=budget_s)
    ceilings = Ceilings(memcpy.value, matmul.value, "measured")
    what = describe(path, dtype, tp_note, f"the step was not timed ({why}): its roofline floor stands in")
    prov = Provenance(method="roofline", source=f"{what}; bytes and FLOPs counted from the config's shapes")
    items: dict[str, Result] = {
        Q.MEMCPY_BYTES_PER_S: memcpy,
        Q.MATMUL_FLOPS_PER_S: matmul,
        Q.MICROBENCH_MODEL: Fact(what, Provenance(method="microbenchmark", source=str(device))),
        Q.MICROBENCH_CONTEXT: Fact(max(grid.contexts), Provenance(method="microbenchmark", source=str(device))),
    }
    context = max(grid.contexts)
    for batch in grid.batches:
        cost = costs.decode_step(batch, context)
        floor = roofline_floor(cost, ceilings)
        note = (
            f"decode step, batch {batch}, context {context}: {cost.bytes / 1e6:.4g} MB, {cost.flops / 1e9:.4g} GFLOP; "
            f"memory {floor.memory_s * 1e6:.4g} us, compute {floor.compute_s * 1e6:.4g} us (not timed: {why})"
        )
        items[Q.decode_floor_key(batch)] = Measurement(floor.seconds, "s", prov, note=note)
        items[Q.decode_bound_key(batch)] = Fact(floor.bound, prov, note=f"batch {batch}, context {context}")
    return items
