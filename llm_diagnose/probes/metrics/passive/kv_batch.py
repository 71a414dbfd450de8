"""Load level over the window: KV cache usage, the running and waiting batch, preemptions.

From the engine's gauges and its preemption counter it produces KV usage (p95, mean), running
and waiting requests (mean, max), concurrency (running + waiting), an estimate of the
running-batch cap, the fullest engine step in tokens (vLLM's iteration_tokens_total: how much of
the step budget steps use), and preemptions (count and rate).

Why: these say whether the server is saturated and by what. A full KV cache with preemptions
is bound by memory; a running batch that plateaus while requests wait and KV has room is
capped by max_num_seqs. Gauges are read once per scrape, so each figure keeps its per-scrape
samples; readings below 0 are left out and recorded in the context for bad_samples.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from llm_diagnose.probes.metrics.engines import CONCEPTS, Sel
from llm_diagnose.probes.metrics.histogram import histogram_quantile
from llm_diagnose.probes.metrics.passive.context import NO_TRAFFIC_HINT, PassiveContext, reset_warning, too_few
from llm_diagnose.probes.quantities import (
    BAD_SAMPLES,
    CONCURRENCY_MEAN,
    KV_USAGE_MEAN,
    KV_USAGE_P95,
    PREEMPTION_RATE,
    PREEMPTIONS,
    RUNNING_CAP_ESTIMATE,
    RUNNING_MAX,
    RUNNING_MEAN,
    STEP_TOKENS_MAX,
    WAITING_MEAN,
)
from llm_diagnose.probes.results import Measurement, NotMeasured, Result, percentile

__all__ = ["CAP_ESTIMATE_KV_CEILING", "CAP_ESTIMATE_MIN_SCRAPES", "kv_and_batch"]

CAP_ESTIMATE_KV_CEILING = 0.8  # above this, a flat running batch is KV-bound, not capped by max_num_seqs
CAP_ESTIMATE_MIN_SCRAPES = 3  # a plateau, not a transient: the same batch size in this many scrapes


def kv_and_batch(ctx: PassiveContext) -> dict[str, Result]:
    """KV usage, running/waiting, concurrency, the running-batch cap and preemptions over the window."""
    out: dict[str, Result] = {}
    kv_note = (
        "vLLM counts cached-but-evictable prefix blocks as free"
        if ctx.engine == "vllm"
        else "SGLang: used tokens / max_total_num_tokens"
        if ctx.engine == "sglang"
        else ""
    )
    out.update(
        _gauge_measurements(
            ctx,
            "kv_usage",
            "fraction",
            {KV_USAGE_P95: lambda v: percentile(sorted(v), 95), KV_USAGE_MEAN: statistics.fmean},
            kv_note,
        )
    )
    out.update(_gauge_measurements(ctx, "running", "count", {RUNNING_MEAN: statistics.fmean, RUNNING_MAX: max}))
    waiting_cand = ctx.resolve("waiting")
    waiting_note = (
        'reason="capacity" only: deferred requests (LoRA budget, KV transfer) excluded'
        if isinstance(waiting_cand, Sel) and waiting_cand.where
        else ""
    )
    out.update(_gauge_measurements(ctx, "waiting", "count", {WAITING_MEAN: statistics.fmean}, waiting_note))
    out[CONCURRENCY_MEAN] = _concurrency(ctx)
    out[RUNNING_CAP_ESTIMATE] = _running_cap(ctx)
    out[STEP_TOKENS_MAX] = _fullest_step(ctx)

    inc = ctx.counter("preemptions")
    if inc is None:
        hole = ctx.missing("preemptions")
        out[PREEMPTIONS] = out[PREEMPTION_RATE] = hole
    elif not inc.intervals:
        out[PREEMPTIONS] = out[PREEMPTION_RATE] = too_few(ctx, inc.selector)
    else:
        prov = ctx.prov("prometheus-counter-delta", inc.selector)
        warn = ctx.warnings(reset_warning(inc))
        out[PREEMPTIONS] = Measurement(inc.total, "count", prov, warnings=warn, note="increase over the window")
        out[PREEMPTION_RATE] = Measurement(
            inc.rate,
            "1/s",
            prov,
            samples=tuple(i.rate for i in inc.intervals),
            warnings=warn,
            note="samples: rate in each scrape interval",
        )
    return out


def _gauge_measurements(
    ctx: PassiveContext, concept: str, unit: str, stats: dict[str, Callable[[list[float]], float]], note: str = ""
) -> dict[str, Result]:
    cand = ctx.resolve(concept)
    if cand is None:
        hole = ctx.missing(concept)
        return dict.fromkeys(stats, hole)
    series = ctx.window.gauge(cand, CONCEPTS[concept].aggregate)
    values = list(series.values)
    prov = ctx.prov("prometheus-gauge-samples", cand.describe())
    if series.negative:
        ctx.negative_readings[series.selector] = series.negative
    if not values:
        hole = NotMeasured(f"{cand.describe()} had no finite reading in the window", NO_TRAFFIC_HINT, prov)
        return dict.fromkeys(stats, hole)
    agg = CONCEPTS[concept].aggregate
    how = f"{len(values)} scrapes" + (
        " (max over DP ranks per scrape)" if agg == "max" else " (summed over DP ranks per scrape)"
    )
    excluded = (
        f"{series.excluded} scrape(s) left out: a bad or negative reading (see {BAD_SAMPLES})"
        if series.excluded
        else ""
    )
    return {
        key: Measurement(
            fn(values),
            unit,
            prov,
            samples=tuple(values),
            warnings=ctx.warnings(excluded),
            note=f"{how}{'; ' + note if note else ''}",
        )
        for key, fn in stats.items()
    }


def _concurrency(ctx: PassiveContext) -> Result:
    run, wait = ctx.resolve("running"), ctx.resolve("waiting")
    if run is None or wait is None:
        return ctx.missing("running" if run is None else "waiting")
    totals = []
    for r in ctx.window.ok_records:
        assert r.scrape is not None
        a, b = ctx.window.gauge_value(r.scrape, run, "sum"), ctx.window.gauge_value(r.scrape, wait, "sum")
        if a is not None and b is not None and math.isfinite(a + b):
            totals.append(a + b)
    prov = ctx.prov("prometheus-gauge-samples", f"{run.describe()} + {wait.describe()}")
    if not totals:
        return NotMeasured("no scrape carried both running and waiting", NO_TRAFFIC_HINT, prov)
    if not any(totals) and (littles := _littles_law_concurrency(ctx)) is not None:
        return littles
    return Measurement(
        statistics.fmean(totals),
        "count",
        prov,
        samples=tuple(totals),
        warnings=ctx.warnings(),
        note="running + waiting per scrape",
    )


def _littles_law_concurrency(ctx: PassiveContext) -> Measurement | None:
    """Mean requests in flight by Little's law: end-to-end seconds finished per second of window.

    Used only when every scrape read zero requests in flight although requests finished: requests
    shorter than the scrape interval fall between the scrapes, so the point samples say 0 (seen on
    vLLM CPU: 10 requests of ~85 ms in 3 s, six scrapes, all 0). Requests that finish within the
    window make the estimate; the ones caught at its edges are short here by construction.
    """
    e2e = ctx.histogram("e2e")
    if e2e is None or e2e.count <= 0 or e2e.sum <= 0 or not e2e.intervals:
        return None
    span = sum(t1 - t0 for t0, t1, _, _ in e2e.intervals)
    if span <= 0:
        return None
    per_interval = tuple(s / (t1 - t0) for t0, t1, _, s in e2e.intervals if t1 > t0)
    return Measurement(
        e2e.sum / span,
        "count",
        ctx.prov("prometheus-histogram-window", f"{e2e.selector} (sum over window seconds)"),
        samples=per_interval,
        warnings=ctx.warnings(reset_warning(e2e)),
        note=f"Little's law: {e2e.count:g} finished requests' end-to-end seconds per second of window "
        "(every scrape read 0 in flight: the requests fell between the scrapes)",
    )


def _running_cap(ctx: PassiveContext) -> Result:
    """The running-batch plateau while requests wait and KV has room: a lower bound on max_num_seqs."""
    run, wait, kv = ctx.resolve("running"), ctx.resolve("waiting"), ctx.resolve("kv_usage")
    if run is None or wait is None:
        return ctx.missing("running" if run is None else "waiting")
    prov = ctx.prov("prometheus-gauge-samples", f"{run.describe()} while {wait.describe()} > 0")
    preempted = ctx.counter("preemptions")
    if preempted is not None and preempted.total > 0:
        return NotMeasured(
            "the window had preemptions: the batch was bounded by KV capacity, so its size says "
            "nothing about max_num_seqs",
            "read --max-num-seqs from the launch command",
            prov,
        )
    capped = []
    for r in ctx.window.ok_records:
        assert r.scrape is not None
        n_run = ctx.window.gauge_value(r.scrape, run, "sum")
        n_wait = ctx.window.gauge_value(r.scrape, wait, "sum")
        usage = ctx.window.gauge_value(r.scrape, kv, "max") if kv is not None else None
        if n_run and n_wait and n_wait > 0 and (usage is None or usage < CAP_ESTIMATE_KV_CEILING):
            capped.append(n_run)
    # Admission is checked against the blocks a prompt needs now, so a single scrape with
    # requests waiting can be a transient; a cap shows as the same batch size again and again.
    plateau = max(capped) if capped else None
    if plateau is None or capped.count(plateau) < CAP_ESTIMATE_MIN_SCRAPES:
        return NotMeasured(
            f"no plateau of the running batch while requests waited with KV usage below "
            f"{CAP_ESTIMATE_KV_CEILING:g} ({len(capped)} such scrapes)",
            "only a saturating load reveals the cap: run with --active, or read it from the launch "
            "command (--max-num-seqs)",
            prov,
        )
    return Measurement(
        plateau,
        "count",
        prov,
        samples=tuple(capped),
        warnings=ctx.warnings(),
        note=f"running batch stayed at {plateau:g} in {capped.count(plateau)} scrapes while requests "
        f"waited and KV usage was below {CAP_ESTIMATE_KV_CEILING:g}",
    )


def _fullest_step(ctx: PassiveContext) -> Result:
    """Tokens in the fullest engine step over the window: how much of the step budget steps use.

    vLLM counts each step's tokens (prefill and decode together) in iteration_tokens_total; the
    highest bucket that gained an observation holds the fullest step. Its upper edge is reported
    (the step held at most that many, more than the edge below): a step budget is often a bucket
    edge itself (2048, 8192), and a fullest step at the budget says long prompts filled it."""
    inc = ctx.histogram("iteration_tokens")
    if inc is None:
        return ctx.missing("iteration_tokens", "vLLM counts tokens per step (vllm:iteration_tokens_total)")
    if not inc.intervals:
        return too_few(ctx, inc.selector)
    prov = ctx.prov("prometheus-histogram-window", inc.selector)
    fullest = histogram_quantile(1.0, inc.buckets)
    if fullest is None or inc.count <= 0:
        return NotMeasured("no engine step ran in the window", NO_TRAFFIC_HINT, prov)
    cached = " (computed prompt tokens only: cache hits are left out from vLLM 0.24)" if ctx.engine == "vllm" else ""
    return Measurement(
        fullest.honest_value if fullest.in_overflow_bucket else fullest.upper,
        "tokens",
        prov,
        warnings=ctx.warnings(reset_warning(inc)),
        note=f"the fullest of {inc.count:.0f} engine steps held {fullest.bound_note} tokens{cached}",
    )
