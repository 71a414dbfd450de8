"""Where the served time per token goes: the hardware's decode step, per-step dispatch, the
engine's own work above the step, and the path from the engine to the client.

The served inter-token gap (decode.itl_p50_s) is set against the decode step of the same model
on the same device, as `llm-diagnose microbench` measured it in-process (random weights of the
model's shapes, at the run's batch and context):

- the hardware's step: the step replayed from a CUDA graph (decode.step_latency_b{n}_s whose
  provenance is `cuda-graph-replay`: no per-kernel host dispatch), else that step's roofline
  floor (decode.roofline_floor_b{n}_s: its bytes over the measured copy bandwidth, its FLOPs over
  the measured matmul rate), which no real step beats;
- dispatch: the eager step (decode.eager_step_latency_b{n}_s, or a step timed on the host clock:
  every kernel launched from Python) minus the hardware's step: what a graph-captured or compiled
  step removes. Measured against the floor it also holds the kernels' distance from the
  roofline, and says so. An eager step far above the served gap (beyond q5.step_close_ratio) does
  not describe how the server dispatches, and is not used to split;
- delivery: the share of the served gap the engine's own ITL histogram does not see
  (decode.client_server_itl_ratio, the decode experiment's client mean over the engine's):
  detokenizing and streaming in the API server, proxies;
- the engine's overhead above the step: what is left (scheduling, sampling, structured-output
  masks, LoRA adapters, the all-reduce of tensor parallelism).

Each part keeps its basis (keys, timer, batch, extrapolation). A part whose inputs were not
measured is absent, never zero. The step is compared at the batch the served gap was taken at
(the decode experiment's batch-1 phase, else the running batch) and only within
q5.step_batch_ratio of it; a served gap below what the step allows (under the floor, or under
the graph step by more than q5.step_close_ratio) says the microbenchmark does not describe this
server, and the step is not used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from llm_diagnose.diagnose.tree.controlled import preferred
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement
from llm_diagnose.probes.warning_codes import WarningCode

__all__ = ["GRAPH_METHODS", "Part", "Decomposition", "decompose", "ms"]

# Timers that time a step without per-kernel host dispatch (llm_diagnose.probes.timing).
GRAPH_METHODS = frozenset({"cuda-graph-replay"})
_BATCH_KEY = re.compile(r"^decode\.(step_latency|eager_step_latency|roofline_floor)_b(\d+)_s$")


def ms(seconds: float) -> str:
    """Milliseconds with three significant digits: 0.0604 ms, 1.39 ms, 160 ms."""
    return f"{seconds * 1e3:.3g} ms"


@dataclass(frozen=True)
class Part:
    name: str  # "hardware step", "dispatch", "delivery", "engine overhead"
    seconds: float
    share: float  # of the served time per token
    basis: str  # where the figure comes from


@dataclass(frozen=True)
class _Steps:
    """What the microbenchmark measured at one batch size."""

    batch: int
    graph: Measurement | None = None
    eager: Measurement | None = None
    floor: Measurement | None = None
    eager_key: str = ""


@dataclass(frozen=True)
class Decomposition:
    served_s: float | None = None
    served_basis: str = ""
    served_batch: float | None = None
    step_s: float | None = None  # the hardware's step
    step_kind: str = ""  # "graph-replayed step" or "roofline floor"
    step_basis: str = ""
    eager_s: float | None = None
    parts: tuple[Part, ...] = ()
    mismatch: str = ""  # why the step measured does not describe the served gap ("" where it does)
    tail_ratio: float | None = None  # p99 / median gap
    growth: float | None = None
    growth_basis: str = ""
    jump: float | None = None  # steepest rise between neighbouring levels over the rise in streams
    jump_basis: str = ""
    delivery_ratio: float | None = None  # client mean gap / the engine's mean ITL

    @property
    def over_step(self) -> float | None:
        """served / the hardware's step, where both describe the same server."""
        if self.served_s is None or not self.step_s or self.mismatch:
            return None
        return self.served_s / self.step_s

    def part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    def text(self) -> str:
        """One line: the served time and each part with its share and basis."""
        if self.served_s is None:
            return "the served inter-token gap was not measured"
        head = f"of {ms(self.served_s)} per token ({self.served_basis})"
        if not self.parts:
            return head + ": " + (self.mismatch or "the decode step was not measured")
        body = "; ".join(f"{p.name} {ms(p.seconds)} ({p.share:.0%}; {p.basis})" for p in self.parts)
        return f"{head}: {body}" + (f" [{self.mismatch}]" if self.mismatch else "")


def _served(r: Reading) -> tuple[float | None, str, float | None, bool]:
    """The served gap, what it is, the batch it was taken at (None: not measured), and whether the
    same gaps' tail may be read (not where the client's gaps gave way to the engine's mean)."""
    key = preferred(r.evidence, Q.ITL_P50)  # the decode experiment's batch-1 figure where it measured one
    value = r.num(key)
    if value is None:
        return None, "", None, False
    m = r.evidence.measurement(key)
    method = m.provenance.method if m is not None else "configured"
    if method.startswith("active-probe/decode"):
        # Gaps a starved client read in bunches (a median of 0) are not a time per token: the engine's
        # own mean ITL over the same batch-1 phase is (CI, a 99%-busy host: client median 0 ms, 67% of
        # gaps under 50 us, the engine's histogram 6.4 ms).
        engine = r.num(Q.DECODE_SERVER_ITL_MEAN)
        doubt = r.disbelieved(key)
        if engine is not None and engine > 0 and (value <= 0 or doubt is not None):
            why = "the client that timed the gaps was starved" if doubt else f"{key} is {value:g}: bunched"
            return engine, f"the engine's own mean ITL over the decode experiment's batch-1 phase ({why})", 1.0, False
        return value, "median gap of the decode experiment's one-at-a-time streams", 1.0, True
    for key in (Q.RUNNING_MEAN, Q.CONCURRENCY_MEAN):
        batch = r.num(key)
        if batch is not None:
            return value, f"median gap ({method}) at a mean running batch of {batch:.3g} ({key})", max(batch, 1.0), True
    return value, f"median gap ({method}); the batch it was taken at was not measured", None, True


def _measured_steps(r: Reading) -> dict[int, _Steps]:
    found: dict[int, _Steps] = {}
    for key in sorted(r.evidence.items):
        match = _BATCH_KEY.match(key)
        m = r.evidence.measurement(key) if match else None
        if match is None or m is None or not m.value > 0:
            continue
        kind, batch = match.group(1), int(match.group(2))
        slot = found.get(batch) or _Steps(batch)
        if kind == "roofline_floor":
            slot = replace(slot, floor=m)
        elif kind == "eager_step_latency":
            slot = replace(slot, eager=m, eager_key=key)  # sorted keys: it comes before step_latency
        elif m.provenance.method in GRAPH_METHODS:
            slot = replace(slot, graph=m)
        elif slot.eager is None:  # a step timed on the host clock is an eager step (the CPU timer, eager CUDA events)
            slot = replace(slot, eager=m, eager_key=key)
        found[batch] = slot
    return found


def _pick(steps: dict[int, _Steps], served_batch: float) -> _Steps:
    return min(steps.values(), key=lambda s: (abs(math.log2(s.batch) - math.log2(served_batch)), s.batch))


def _basis(key: str, m: Measurement) -> str:
    extra = f", {m.note}" if m.note and len(m.note) <= 80 else ""
    return f"{key}, {m.provenance.method}{extra}"


def decompose(r: Reading) -> Decomposition:
    """The served time per token split into its parts, from what the evidence holds."""
    served, served_basis, served_batch, tail_trusted = _served(r)
    # Where a starved client's (or bunched) gaps gave way to the engine's mean, their p99 is the client's
    # own lateness, not a tail of the server's: no stall is read from it (CI, a 99%-busy host: client
    # p99 19 ms over an engine mean of 6.3 ms read as "stalls, not the step").
    p50, p99 = served, (r.num(preferred(r.evidence, Q.ITL_P99)) if tail_trusted else None)
    tail = p99 / p50 if p50 and p99 is not None else None
    growth = r.num(Q.DECODE_ITL_GROWTH)
    growth_m = r.evidence.measurement(Q.DECODE_ITL_GROWTH)
    growth_basis = growth_m.note if growth_m is not None else ""
    jump = r.num(Q.DECODE_ITL_JUMP)
    jump_m = r.evidence.measurement(Q.DECODE_ITL_JUMP)
    ratio_m = r.evidence.measurement(Q.DECODE_CLIENT_SERVER_ITL_RATIO)
    ratio = r.num(Q.DECODE_CLIENT_SERVER_ITL_RATIO)
    if ratio_m is not None and WarningCode.CLIENT_STARVED in ratio_m.codes:
        ratio = None  # the gap between client and engine is the client's own lateness, not delivery
    base = Decomposition(
        served_s=served,
        served_basis=served_basis,
        served_batch=served_batch,
        tail_ratio=tail,
        growth=growth,
        growth_basis=growth_basis,
        jump=jump,
        jump_basis=jump_m.note if jump_m is not None else "",
        delivery_ratio=ratio,
    )
    if served is None or served <= 0:
        return base
    delivery = _delivery(served, ratio)
    steps = _measured_steps(r)
    usable = {b: s for b, s in steps.items() if s.graph is not None or s.floor is not None}
    if not usable:
        why = (
            "only an eager step was measured (no graph-replayed step, no roofline floor): the hardware's share "
            "cannot be told from dispatch"
            if steps
            else ""
        )
        return replace(base, mismatch=why, parts=(delivery,) if delivery else ())
    if served_batch is None:
        return replace(
            base,
            mismatch="the batch the served gap was taken at was not measured (batch.running_mean), so no "
            "step can be matched to it",
            parts=(delivery,) if delivery else (),
        )
    chosen = _pick(usable, served_batch)
    apart = max(chosen.batch, served_batch) / min(chosen.batch, served_batch)
    hw, kind, key = (
        (chosen.graph, "graph-replayed step", Q.decode_step_latency_key(chosen.batch))
        if chosen.graph is not None
        else (chosen.floor, "roofline floor", Q.decode_floor_key(chosen.batch))
    )
    assert hw is not None
    model = r.text(Q.MICROBENCH_MODEL)
    step_basis = f"{kind} at batch {chosen.batch}: {_basis(key, hw)}" + (f"; timed: {model}" if model else "")
    eager = chosen.eager.value if chosen.eager is not None else None
    base = replace(base, step_s=hw.value, step_kind=kind, step_basis=step_basis, eager_s=eager)
    if apart > r.thresholds["q5.step_batch_ratio"]:
        why = (
            f"the step was measured at batch {chosen.batch}, the served gap at a batch of {served_batch:.3g}: "
            f"{apart:.2g}x apart, beyond q5.step_batch_ratio ({r.thresholds['q5.step_batch_ratio']:g})"
        )
        return replace(base, mismatch=why, parts=(delivery,) if delivery else ())
    below = served < hw.value if chosen.graph is None else served < hw.value / r.thresholds["q5.step_close_ratio"]
    if below:
        why = (
            f"the served gap ({ms(served)}) is below what the {kind} allows ({ms(hw.value)}): the microbenchmark "
            "does not describe this server (another device, dtype, quantization or model?)"
        )
        return replace(base, mismatch=why, parts=(delivery,) if delivery else ())
    eager_fits = chosen.eager is None or served * r.thresholds["q5.step_close_ratio"] >= chosen.eager.value
    if not eager_fits:  # the server does not dispatch like the eager step (or the bench host was busier)
        chosen = replace(chosen, eager=None)
    return replace(base, parts=_parts(served, hw.value, kind, key, chosen, ratio))


def _delivery(served: float, ratio: float | None, room: float | None = None) -> Part | None:
    """The part of the served gap outside the engine, at most the `room` seconds other parts left."""
    if ratio is None:
        return None
    seconds = served * (1.0 - 1.0 / ratio) if ratio > 1.0 else 0.0
    if room is not None:
        seconds = min(seconds, room)
    basis = f"the engine's ITL histogram saw {1 / ratio:.0%} of the client's gap ({Q.DECODE_CLIENT_SERVER_ITL_RATIO})"
    return Part("delivery", seconds, seconds / served, basis)


def _parts(served: float, hw: float, kind: str, key: str, at: _Steps, ratio: float | None) -> tuple[Part, ...]:
    parts = [Part("hardware step", hw, hw / served, f"{kind}, {key}")]
    left = max(served - hw, 0.0)
    if at.eager is not None:
        dispatch = min(max(at.eager.value - hw, 0.0), left)
        name = "dispatch" if kind == "graph-replayed step" else "dispatch and kernels above the floor"
        how = (
            "eager step minus the graph-replayed one"
            if kind == "graph-replayed step"
            else "eager step minus the floor: no graph-replayed step was measured to split them"
        )
        parts.append(Part(name, dispatch, dispatch / served, f"{how}; eager step {ms(at.eager.value)}, {at.eager_key}"))
        left -= dispatch
    out = _delivery(served, ratio, left) if left > 0 else None
    if out is not None and out.seconds > 0:
        parts.append(out)
        left -= out.seconds
    above = "the eager step" if at.eager is not None else f"the {kind}"
    rest = "engine overhead" if ratio is not None else "server overhead"
    parts.append(Part(rest, left, left / served, f"served gap above {above}" + (" and delivery" if out else "")))
    return tuple(parts)


def sharp_growth(d: Decomposition, th) -> tuple[bool | None, str]:
    """Whether tokens slow down with concurrency more than batching explains, and the reading.

    The decode experiment's ladder may climb to tens of streams, where a compute-bound step's gap
    grows about linearly with them: its whole growth says little. Its steepest rise between two
    neighbouring levels, over the rise in streams (`decode.itl_superlinear_jump`), is 1 for a fully
    compute-bound step; at or above q5.sharp_itl_jump it is a pathology or contention. Evidence
    without it (older runs) falls back to the whole growth against q5.sharp_itl_growth, set for a
    ladder of at most 8 streams."""
    if d.jump is not None:
        limit = th["q5.sharp_itl_jump"]
        return d.jump >= limit, (
            f"{Q.DECODE_ITL_JUMP} = {d.jump:.3g} (q5.sharp_itl_jump {limit:g})"
            + (f": {d.jump_basis}" if d.jump_basis else "")
        )
    if d.growth is not None:
        limit = th["q5.sharp_itl_growth"]
        return d.growth >= limit, (
            f"{Q.DECODE_ITL_GROWTH} = {d.growth:.3g} (q5.sharp_itl_growth {limit:g})"
            + (f": {d.growth_basis}" if d.growth_basis else "")
        )
    return None, ""
