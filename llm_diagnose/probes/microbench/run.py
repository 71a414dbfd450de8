"""A grid of step microbenchmarks with the machine's ceilings and each step's roofline floor.

`run_microbench(model, grid)` measures the copy bandwidth and matmul rate of the model's
device, then decode steps over batch sizes and context lengths (under the device's timer: CUDA
graphs on a GPU; and eagerly on the host clock, dispatch included), prefills over prompt lengths,
and the mixed-step proxy (decodes plus a prefill chunk against the decodes alone). Every step
carries its bytes, FLOPs and floor, so a report can say how far it is from its physical limit.
A measured ceiling that a timed step beat is raised to that step's rate (`bound_by_steps`):
a ceiling bounds every step, or a floor would land above the step it floors.
`MicrobenchReport.evidence_items()` turns the result into evidence keys (llm_diagnose.probes.quantities).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.microbench.ceilings import measure_matmul, measure_memcpy
from llm_diagnose.probes.microbench.roofline import Ceilings, Floor, ModelCosts, StepCost, roofline_floor
from llm_diagnose.probes.microbench.steps import StepBench
from llm_diagnose.probes.results import Fact, Measurement, Provenance, Result
from llm_diagnose.probes.timing import Timer

__all__ = ["Grid", "StepResult", "MicrobenchReport", "run_microbench", "ratio_of_medians", "bound_by_steps"]


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...] = (1, 4, 16)
    contexts: tuple[int, ...] = (128, 512)
    prompts: tuple[int, ...] = (128, 512)
    mixed_decodes: int = 8  # decode tokens in the mixed step
    mixed_chunk: int = 128  # prefill-chunk tokens added to them
    mixed_context: int | None = None  # None: the largest context
    mixed: bool = True  # False: no mixed-step proxy
    eager: bool = True  # also time each decode step eagerly (host clock, dispatch included); a CPU's step is
    #   eager already, so there it costs nothing

    @property
    def reference_context(self) -> int:
        """The context length at which the per-batch evidence keys are reported."""
        return max(self.contexts)


@dataclass(frozen=True)
class StepResult:
    kind: Literal["decode", "prefill"]
    batch: int
    context: int  # cached tokens before the step (0 for a prefill)
    tokens: int  # new tokens per sequence in the step
    latency: Measurement
    cost: StepCost
    floor: Floor | None  # None when the ceilings were not measured
    eager: Measurement | None = None  # decode only: the step launched eagerly, dispatch included

    @property
    def efficiency(self) -> float | None:
        return None if self.floor is None else self.floor.efficiency(self.latency.value)


def ratio_of_medians(num: Measurement, den: Measurement, what: str) -> Measurement:
    """num / den of two timings, with a conservative interval (CI ends divided crosswise) in the note."""
    interval = ""
    if num.summary is not None and den.summary is not None and den.summary.ci_low > 0:
        interval = (
            f"; 95% interval {num.summary.ci_low / den.summary.ci_high:.3g}"
            f"-{num.summary.ci_high / den.summary.ci_low:.3g}"
        )
    return Measurement(
        value=num.value / den.value,
        unit="ratio",
        provenance=Provenance(method="microbenchmark-ratio", source=num.provenance.source, timer=num.provenance.timer),
        warnings=tuple(dict.fromkeys(num.warnings + den.warnings)),
        note=f"{what}: {num.value * 1e3:.4g} ms / {den.value * 1e3:.4g} ms{interval}",
    )


@dataclass(frozen=True)
class MicrobenchReport:
    model: str
    device: str
    dtype: str
    reference_context: int
    steps: tuple[StepResult, ...]
    memcpy: Measurement | None = None
    matmul: Measurement | None = None
    mixed_ratio: Measurement | None = None
    notes: tuple[str, ...] = field(default=())

    def decode(self, batch: int, context: int) -> StepResult | None:
        return next((s for s in self.steps if s.kind == "decode" and s.batch == batch and s.context == context), None)

    def evidence_items(self) -> dict[str, Result]:
        items: dict[str, Result] = {}
        if self.memcpy is not None:
            items[Q.MEMCPY_BYTES_PER_S] = self.memcpy
        if self.matmul is not None:
            items[Q.MATMUL_FLOPS_PER_S] = self.matmul
        if self.mixed_ratio is not None:
            items[Q.MIXED_STEP_RATIO] = self.mixed_ratio
        floor_prov = Provenance(
            method="roofline",
            source=f"{self.model}: bytes and FLOPs counted from its modules; ceilings measured on " + self.device,
        )
        what = Provenance(method="microbenchmark", source=self.device)
        items[Q.MICROBENCH_MODEL] = Fact(self.model, what)
        items[Q.MICROBENCH_CONTEXT] = Fact(self.reference_context, what)
        for s in self.steps:
            if s.kind == "decode" and s.context == self.reference_context:
                lat_key, floor_key, bound_key = (
                    Q.decode_step_latency_key(s.batch),
                    Q.decode_floor_key(s.batch),
                    Q.decode_bound_key(s.batch),
                )
            elif s.kind == "prefill":
                lat_key, floor_key, bound_key = Q.prefill_latency_key(s.tokens), Q.prefill_floor_key(s.tokens), None
            else:
                continue
            items[lat_key] = s.latency
            if s.eager is not None and s.kind == "decode":
                items[Q.decode_eager_step_latency_key(s.batch)] = s.eager
            if s.floor is not None:
                items[floor_key] = Measurement(
                    s.floor.seconds,
                    "s",
                    floor_prov,
                    note=(
                        f"{s.latency.note}: {s.cost.bytes / 1e6:.4g} MB, {s.cost.flops / 1e9:.4g} GFLOP; "
                        f"memory {s.floor.memory_s * 1e6:.4g} us, compute {s.floor.compute_s * 1e6:.4g} us; "
                        f"measured step is {1 / max(s.efficiency or 1e-12, 1e-12):.3g}x the floor"
                    ),
                )
                if bound_key:
                    items[bound_key] = Fact(s.floor.bound, floor_prov, note=f"batch {s.batch}, context {s.context}")
        return items

    def table(self) -> str:
        """Markdown: one row per step (latency, floor, bound, efficiency)."""
        rows = [
            "| step | batch | context | tokens | median | 95% CI | floor | bound | floor/median | timer | eager |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in self.steps:
            ci = (
                f"{s.latency.summary.ci_low * 1e3:.4g}-{s.latency.summary.ci_high * 1e3:.4g} ms"
                if s.latency.summary
                else "-"
            )
            floor = f"{s.floor.seconds * 1e3:.4g} ms" if s.floor else "-"
            bound = s.floor.bound if s.floor else "-"
            eff = f"{s.efficiency:.1%}" if s.efficiency is not None else "-"
            timer = s.latency.provenance.method + (" (!)" if s.latency.warnings else "")
            eager = f"{s.eager.value * 1e3:.4g} ms" if s.eager is not None else "-"
            rows.append(
                f"| {s.kind} | {s.batch} | {s.context} | {s.tokens} | {s.latency.value * 1e3:.4g} ms | {ci} "
                f"| {floor} | {bound} | {eff} | {timer} | {eager} |"
            )
        return "\n".join(rows) + "\n"


def bound_by_steps(
    ceiling: Measurement, steps: Sequence[StepResult], work: Callable[[StepCost], float], what: str
) -> Measurement:
    """`ceiling`, or the fastest rate a timed step reached where that is higher.

    A roofline ceiling must bound every step's rate, or a floor lands above the step it floors.
    A square-matmul sweep can miss the kernel path a step takes (a bf16 `mm` without native
    bf16 on the CPU runs slower than the model's skinny linears), and a copy far past the
    caches misses weights a small model keeps in them. The rate of the step's fastest timed
    sample (work / its seconds per call) is then the best figure measured, and becomes the
    ceiling, with the sweep's figure in the note and a warning saying why.
    """
    best_rate, best = 0.0, None
    for s in steps:
        rate = work(s.cost) / min(s.latency.samples) if s.latency.samples else 0.0
        if rate > best_rate:
            best_rate, best = rate, s
    if best is None or best_rate <= ceiling.value:
        return ceiling
    rates = tuple(work(best.cost) / t for t in best.latency.samples)
    label = best.latency.note or f"{best.kind} step"
    return Measurement(
        value=best_rate,
        unit=ceiling.unit,
        provenance=best.latency.provenance,
        samples=rates,
        calls_per_sample=best.latency.calls_per_sample,
        warnings=(
            f"{what} raised to the fastest sample of a timed step ({label}): the measured "
            f"{ceiling.value:.4g} {ceiling.unit} is below what that step reached, so it was no ceiling",
        ),
        note=f"{what}: fastest sample of the {label}, {work(best.cost):.6g} per step; "
        f"measured ceiling was {ceiling.value:.4g} {ceiling.unit} ({ceiling.note})",
    )


def run_microbench(
    model: Any,
    grid: Grid = Grid(),
    *,
    timer: Timer | None = None,
    budget_s: float = 0.3,
    ceilings: Ceilings | None = None,
    measure_ceilings: bool = True,
    name: str | None = None,
) -> MicrobenchReport:
    """Measure the ceilings (unless given or switched off) and every step of `grid`."""
    bench = StepBench(model, timer=timer, budget_s=budget_s)
    device = bench.device
    costs = ModelCosts.from_model(model)
    memcpy = matmul = None
    if ceilings is None and measure_ceilings:
        memcpy = measure_memcpy(device, timer=bench.timer, budget_s=budget_s)
        matmul = measure_matmul(device, dtype=next(model.parameters()).dtype, timer=bench.timer, budget_s=budget_s)

    # Floors come after every step is timed: a measured ceiling a step beats is raised to that step's rate.
    steps: list[StepResult] = []
    on_host_clock = bench.timer is not None and bench.timer.name == "cpu"
    for context in grid.contexts:
        for batch in grid.batches:
            step = bench.decode(batch, context)
            # On the CPU clock the step is eager already: the same figure, not a second timing.
            eager = step if on_host_clock else (bench.eager_decode(batch, context) if grid.eager else None)
            steps.append(StepResult("decode", batch, context, 1, step, costs.decode_step(batch, context), None, eager))
    for prompt in grid.prompts:
        steps.append(StepResult("prefill", 1, 0, prompt, bench.prefill(prompt), costs.prefill(prompt), None))
    if memcpy is not None and matmul is not None:
        swept = (memcpy, matmul)
        memcpy = bound_by_steps(memcpy, steps, lambda c: c.bytes, "copy bandwidth")
        matmul = bound_by_steps(matmul, steps, lambda c: c.flops, "matmul rate")
        raised = (memcpy, matmul) != swept
        ceilings = Ceilings(
            memcpy.value, matmul.value, "measured" + ("; raised to a timed step's rate" if raised else "")
        )
    if ceilings is not None:
        steps = [replace(s, floor=roofline_floor(s.cost, ceilings)) for s in steps]
    ratio = None
    if grid.mixed:
        mixed_context = grid.mixed_context or grid.reference_context
        alone = bench.packed(grid.mixed_decodes, mixed_context)
        mixed = bench.packed(grid.mixed_decodes + grid.mixed_chunk, mixed_context)
        ratio = ratio_of_medians(
            mixed,
            alone,
            f"{grid.mixed_decodes} decodes + a {grid.mixed_chunk}-token prefill "
            f"chunk vs the decodes alone, context {mixed_context} (packed proxy)",
        )
    return MicrobenchReport(
        model=name or type(model).__name__,
        device=str(device),
        dtype=str(next(model.parameters()).dtype),
        reference_context=grid.reference_context,
        steps=tuple(steps),
        memcpy=memcpy,
        matmul=matmul,
        mixed_ratio=ratio,
        notes=(f"timer: {bench.timer.name}",) if bench.timer is not None else (),
    )
