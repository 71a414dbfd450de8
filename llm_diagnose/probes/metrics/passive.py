"""Passive evidence: what a window of /metrics scrapes says, keyed by llm_diagnose.probes.quantities.

Nothing here sends a request: it reads the engine's own counters, gauges and histograms
over the window. Every key in `PASSIVE_KEYS` comes back, either measured or as an explicit
NotMeasured saying why (no such metric in this engine or version, no traffic in the window,
too few scrapes) and how to get it.

Statistics are over the window, never lifetime: counters as increases (resets handled),
histograms as bucket increases, gauges as the per-scrape readings (sampled at the scrape
interval, so bursts shorter than that can be missed).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llm_diagnose.probes.metrics.engines import (
    CONCEPTS,
    ENGINE_METRICS,
    Candidate,
    HitPair,
    Product,
    Sel,
    detect_engine,
)
from llm_diagnose.probes.metrics.histogram import bucket_mean_stdev, histogram_quantile, summary_from_buckets
from llm_diagnose.probes.metrics.window import CounterIncrease, HistogramIncrease, Window, label_values
from llm_diagnose.probes.quantities import (
    BAD_SAMPLES,
    BLOCK_SIZE,
    CONCURRENCY_MEAN,
    CONTINUOUS_BATCHING,
    DECODE_TIME_SHARE,
    E2E_P50,
    ENGINE_NAME,
    GEN_TOKENS_PER_S,
    GPU_MEMORY_UTILIZATION,
    INPUT_LEN_P50,
    ITL_P50,
    ITL_P99,
    KV_CACHE_BYTES,
    KV_CACHE_DTYPE,
    KV_CAPACITY_TOKENS,
    KV_MAX_CONCURRENCY,
    KV_OFFLOAD,
    KV_USAGE_MEAN,
    KV_USAGE_P95,
    LIVE_WINDOW_COMPLETE,
    LIVE_WINDOW_S,
    MAX_MODEL_LEN,
    NUM_SPECULATIVE_TOKENS,
    OUTPUT_LEN_CV,
    OUTPUT_LEN_P50,
    OUTPUT_LEN_P99,
    PAGED_KV,
    PREEMPTION_RATE,
    PREEMPTIONS,
    PREFIX_CACHING,
    PREFIX_HIT_RATE,
    PREFIX_QUERIED_TOKENS,
    PROMPT_ITL_CORRELATION,
    PROMPT_TOKENS_PER_S,
    QUEUE_TIME_P50,
    REQUESTS_PER_S,
    RUNNING_CAP_ESTIMATE,
    RUNNING_MAX,
    RUNNING_MEAN,
    SPEC_ACCEPTANCE_LENGTH,
    SPEC_ACCEPTANCE_RATE,
    SPEC_DECODE,
    TTFT_P50,
    TTFT_P99,
    WAITING_MEAN,
    WEIGHTS_BYTES,
)
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result, percentile

if TYPE_CHECKING:  # discovery imports this package: a runtime import would be circular
    from llm_diagnose.probes.discovery import Discovered

__all__ = ["passive_evidence", "PASSIVE_KEYS", "spearman", "MIN_CORRELATION_INTERVALS"]

GIB = 1 << 30
MIN_CORRELATION_INTERVALS = 6  # fewer intervals than this give a rank correlation of little meaning
FEW_CORRELATION_INTERVALS = 20  # below this, warn that the correlation is noisy
CAP_ESTIMATE_KV_CEILING = 0.8  # above this, a flat running batch is KV-bound, not capped by max_num_seqs
CAP_ESTIMATE_MIN_SCRAPES = 3  # a plateau, not a transient: the same batch size in this many scrapes
NO_TRAFFIC_HINT = "run longer under traffic, or with --active to send a workload"

PASSIVE_KEYS = (
    ENGINE_NAME,
    LIVE_WINDOW_S,
    LIVE_WINDOW_COMPLETE,
    BAD_SAMPLES,
    CONTINUOUS_BATCHING,
    PAGED_KV,
    PREFIX_CACHING,
    BLOCK_SIZE,
    KV_CACHE_DTYPE,
    GPU_MEMORY_UTILIZATION,
    KV_OFFLOAD,
    SPEC_DECODE,
    KV_CAPACITY_TOKENS,
    KV_CACHE_BYTES,
    WEIGHTS_BYTES,
    KV_USAGE_P95,
    KV_USAGE_MEAN,
    PREEMPTIONS,
    PREEMPTION_RATE,
    WAITING_MEAN,
    RUNNING_MEAN,
    RUNNING_MAX,
    RUNNING_CAP_ESTIMATE,
    CONCURRENCY_MEAN,
    QUEUE_TIME_P50,
    PREFIX_HIT_RATE,
    PREFIX_QUERIED_TOKENS,
    ITL_P50,
    ITL_P99,
    TTFT_P50,
    TTFT_P99,
    E2E_P50,
    DECODE_TIME_SHARE,
    SPEC_ACCEPTANCE_RATE,
    SPEC_ACCEPTANCE_LENGTH,
    PROMPT_ITL_CORRELATION,
    GEN_TOKENS_PER_S,
    PROMPT_TOKENS_PER_S,
    REQUESTS_PER_S,
    OUTPUT_LEN_P50,
    OUTPUT_LEN_P99,
    OUTPUT_LEN_CV,
    INPUT_LEN_P50,
)

_DESIGN_NOTES = {
    "vllm": "vLLM schedules every iteration (continuous batching) over a block-paged KV cache (PagedAttention)",
    "sglang": "SGLang schedules every iteration (continuous batching) over a token-paged KV pool (RadixAttention)",
    "trtllm": "TensorRT-LLM batches in flight (continuous batching) over a paged KV cache",
}


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation (ties get average ranks); None when either side is constant."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxx = math.fsum((a - mx) ** 2 for a in rx)
    syy = math.fsum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry)) / math.sqrt(sxx * syy)


@dataclass
class _Ctx:
    """What every producer needs: the window, the engine's name table, provenance, warnings."""

    window: Window
    engine: str | None
    version: tuple[int, ...] | None
    names: Mapping[str, tuple[Candidate, ...]]
    negative_readings: dict[str, int] = field(default_factory=dict)  # gauge selector -> readings below 0

    @property
    def duration(self) -> float:
        return self.window.duration_s

    def warnings(self, *extra: str) -> tuple[str, ...]:
        base = (f"partial window: {self.window.stopped_early}",) if self.window.stopped_early else ()
        return base + tuple(w for w in extra if w)

    def prov(self, method: str, what: str) -> Provenance:
        return Provenance(
            method,
            f"{self.window.source} {what}".strip(),
            taken_at=self.window.ended_at,
            window_s=round(self.duration, 3),
        )

    def resolve(self, concept: str) -> Candidate | None:
        return self.window.resolve(self.names.get(concept, ()))

    def missing(self, concept: str, hint: str = "") -> NotMeasured:
        looked = ", ".join(c.describe() for c in self.names.get(concept, ())) or "no known name"
        what = CONCEPTS[concept].description
        return NotMeasured(
            f"{self.engine or 'the engine'} exposes no metric for {what} (looked for: {looked})",
            hint or "a newer engine version may expose it",
            self.prov("prometheus", ""),
        )

    def counter(self, concept: str) -> CounterIncrease | None:
        cand = self.resolve(concept)
        return self.window.counter(cand) if isinstance(cand, Sel) else None

    def histogram(self, concept: str) -> HistogramIncrease | None:
        cand = self.resolve(concept)
        return self.window.histogram(cand) if isinstance(cand, Sel) else None


def _reset_warning(*incs: CounterIncrease | HistogramIncrease | None) -> str:
    """Counter resets and bad readings behind an increase (every counter/histogram figure calls this)."""
    n = sum(i.resets for i in incs if i is not None)
    text = (
        (
            f"{n} counter reset(s) in the window (server restarted?): increases counted from zero after each "
            "reset, as Prometheus rate() does"
        )
        if n
        else ""
    )
    return "; ".join(t for t in (text, _excluded_warning(sum(i.excluded for i in incs if i is not None))) if t)


def _excluded_warning(n: int) -> str:
    return (
        f"{n} bad reading(s) left out (see {BAD_SAMPLES}); increases span them from the last good reading" if n else ""
    )


def passive_evidence(window: Window, discovered: Discovered | None = None) -> dict[str, Result]:
    """Evidence from a scrape window; `discovered` (from llm_diagnose.probes.discovery.discover) adds its facts.

    Measured values override discovery's NotMeasured entries; discovery's facts stay where
    the metrics say nothing.
    """
    facts: Mapping[str, Result] = getattr(discovered, "facts", {}) or {}
    first = window.first_scrape()
    engine = getattr(discovered, "engine", None) or (detect_engine(first).engine if first is not None else None)
    ctx = _Ctx(window, engine, getattr(discovered, "version_tuple", None), ENGINE_METRICS.get(engine or "", {}))
    out: dict[str, Result] = dict(facts)

    if first is None:
        hole = NotMeasured(
            f"no successful scrape in the window ({window.describe()})",
            "check the metrics URL and that the server is up",
            ctx.prov("prometheus", ""),
        )
        for key in PASSIVE_KEYS:
            if key not in out or isinstance(out[key], NotMeasured):
                out[key] = hole
        out[LIVE_WINDOW_COMPLETE] = Fact(False, ctx.prov("scrape-loop", ""), note=window.describe())
        return out

    produced: dict[str, Result] = {}
    for producer in (
        _window_facts,
        _identity,
        _config,
        _kv_and_batch,
        _prefix,
        _latency,
        _spec,
        _interference,
        _throughput,
        _lengths,
    ):
        produced.update(producer(ctx))
    for key, result in produced.items():
        if key not in out or isinstance(out[key], NotMeasured) or not isinstance(result, NotMeasured):
            out[key] = result
    out[BAD_SAMPLES] = _bad_samples(ctx)  # after the producers: they find the negative gauge readings
    return out


def _bad_samples(ctx: _Ctx) -> Result:
    """How many samples the window left out, and which: never silently dropped."""
    w = ctx.window
    n_page = len(w.bad_samples())
    n_negative = sum(ctx.negative_readings.values())
    parts = [w.describe_bad_samples()] if n_page else []
    parts += [f"{n} reading(s) of {what} below 0 left out" for what, n in ctx.negative_readings.items()]
    total = n_page + n_negative
    warnings = (
        (
            f"{total} bad sample(s) left out of every figure: the exporter wrote impossible values; the figures "
            "use the remaining readings",
        )
        if total
        else ()
    )
    return Measurement(
        float(total),
        "count",
        ctx.prov("scrape-loop", ""),
        warnings=warnings,
        note="; ".join(parts) if parts else "every sample of every good page was usable",
    )


# --- producers -------------------------------------------------------------------------------
def _window_facts(ctx: _Ctx) -> dict[str, Result]:
    w = ctx.window
    prov = ctx.prov("scrape-loop", "")
    ok = len(w.ok_records)
    out: dict[str, Result] = {LIVE_WINDOW_COMPLETE: Fact(w.stopped_early is None, prov, note=w.describe())}
    if ok >= 2:
        out[LIVE_WINDOW_S] = Measurement(w.duration_s, "s", prov, note=w.describe(), warnings=ctx.warnings())
    else:
        out[LIVE_WINDOW_S] = NotMeasured(f"only {ok} good scrape: a window needs two", "scrape for longer", prov)
    return out


def _identity(ctx: _Ctx) -> dict[str, Result]:
    out: dict[str, Result] = {}
    guess = detect_engine(ctx.window.first_scrape())  # type: ignore[arg-type]
    if guess.engine:
        evidence = "; ".join(guess.evidence)
        out[ENGINE_NAME] = Fact(
            guess.engine, ctx.prov("metric-prefix", ""), note=guess.describe + (f" ({evidence})" if evidence else "")
        )
    if ctx.engine in _DESIGN_NOTES:
        prov = Provenance("engine-design", ctx.engine, taken_at=ctx.window.ended_at)
        note = f"by design, not read from the server: {_DESIGN_NOTES[ctx.engine]}"
        out[CONTINUOUS_BATCHING] = Fact(True, prov, note=note)
        out[PAGED_KV] = Fact(True, prov, note=note)
    return out


def _info_labels(ctx: _Ctx) -> list[dict[str, str]]:
    cand = ctx.resolve("cache_config_info")
    scrape = ctx.window.last_scrape()
    if not isinstance(cand, Sel) or scrape is None:
        return []
    # The latest page that carries it: labels are static, but a restart may change them.
    for record in reversed(ctx.window.ok_records):
        assert record.scrape is not None
        found = label_values(record.scrape, cand.name)
        if found:
            return found
    return []


def _label(labels: Mapping[str, str], name: str) -> str | None:
    value = labels.get(name)
    return None if value in (None, "None", "") else value


def _config(ctx: _Ctx) -> dict[str, Result]:
    out: dict[str, Result] = {}
    infos = _info_labels(ctx)
    if infos:
        _vllm_cache_config(ctx, infos, out)
    capacity = ctx.resolve("kv_capacity_tokens")  # SGLang / TRT-LLM gauges (vLLM: cache_config_info above)
    if capacity is not None and KV_CAPACITY_TOKENS not in out:
        value = ctx.window.latest(capacity, CONCEPTS["kv_capacity_tokens"].aggregate)
        if value is not None:
            note = "KV blocks x tokens per block" if isinstance(capacity, Product) else "engine gauge"
            out[KV_CAPACITY_TOKENS] = Measurement(
                value, "tokens", ctx.prov("prometheus-gauge", capacity.describe()), note=note
            )
    block = ctx.resolve("block_size")
    if block is not None and BLOCK_SIZE not in out:
        value = ctx.window.latest(block, "first")
        if value is not None:
            out[BLOCK_SIZE] = Fact(int(value), ctx.prov("prometheus-gauge", block.describe()))
    context = ctx.resolve("context_len")
    if context is not None:
        value = ctx.window.latest(context, "first")
        if value is not None:
            out[MAX_MODEL_LEN] = Fact(int(value), ctx.prov("prometheus-gauge", context.describe()))
    for concept, key in (("weights_gib", WEIGHTS_BYTES), ("kv_cache_gib", KV_CACHE_BYTES)):
        cand = ctx.resolve(concept)
        value = ctx.window.latest(cand, "sum") if cand is not None else None
        if value is not None and key not in out:
            out[key] = Measurement(
                value * GIB,
                "bytes",
                ctx.prov("prometheus-gauge", cand.describe()),  # type: ignore[union-attr]
                note="engine-reported, GiB converted to bytes",
            )
    if WEIGHTS_BYTES not in out:
        out[WEIGHTS_BYTES] = NotMeasured(
            f"{ctx.engine or 'the engine'} does not expose the weights' size in /metrics",
            "the server log states it (vLLM: 'Model loading took X GiB')",
            ctx.prov("prometheus", ""),
        )
    if KV_CACHE_BYTES not in out:
        out[KV_CACHE_BYTES] = NotMeasured(
            f"{ctx.engine or 'the engine'} does not expose the KV cache's size in bytes"
            + (
                " (vLLM reports kv_cache_memory_bytes only when --kv-cache-memory-bytes sets it)"
                if ctx.engine == "vllm"
                else ""
            ),
            "kv.capacity_tokens gives its size in tokens; NVML on the GPU host shows device memory",
            ctx.prov("prometheus", ""),
        )
    if KV_CAPACITY_TOKENS not in out:
        out[KV_CAPACITY_TOKENS] = ctx.missing("kv_capacity_tokens")
    _spec_config(ctx, out)
    _offload_config(ctx, infos, out)
    return out


def _vllm_cache_config(ctx: _Ctx, infos: list[dict[str, str]], out: dict[str, Result]) -> None:
    labels = infos[0]  # every DP engine shares one CacheConfig; engine "0" comes first
    prov = ctx.prov("prometheus-info-labels", "vllm:cache_config_info")
    if (bs := _label(labels, "block_size")) is not None and bs.isdigit():
        out[BLOCK_SIZE] = Fact(int(bs), prov)
    if (pc := _label(labels, "enable_prefix_caching")) in ("True", "False"):
        out[PREFIX_CACHING] = Fact(pc == "True", prov, note=f"enable_prefix_caching={pc}")
    if (dtype := _label(labels, "cache_dtype")) is not None:
        out[KV_CACHE_DTYPE] = Fact(dtype, prov, note="'auto' means the model's dtype")
    if (util := _label(labels, "gpu_memory_utilization")) is not None:
        try:
            out[GPU_MEMORY_UTILIZATION] = Fact(float(util), prov)
        except ValueError:
            pass
    # Capacity per DP engine: kv_cache_size_tokens (>=0.24, right for hybrid models too), else
    # num_gpu_blocks x block_size; summed over engines.
    tokens, how = 0, None
    for info in infos:
        size = _label(info, "kv_cache_size_tokens")
        blocks, bsz = _label(info, "num_gpu_blocks"), _label(info, "block_size")
        if size is not None and _is_number(size):
            tokens += int(float(size))
            how = "kv_cache_size_tokens"
        elif blocks is not None and bsz is not None and blocks.isdigit() and bsz.isdigit():
            tokens += int(blocks) * int(bsz)
            how = how or "num_gpu_blocks x block_size"
    if how:
        per = f" over {len(infos)} DP engines" if len(infos) > 1 else ""
        out[KV_CAPACITY_TOKENS] = Measurement(float(tokens), "tokens", prov, note=f"{how}{per}")
    # vLLM's own "maximum concurrency" figure (requests of max_model_len tokens, >=0.24), summed over engines.
    conc = [float(c) for info in infos if (c := _label(info, "kv_cache_max_concurrency")) and _is_number(c)]
    if conc:
        out[KV_MAX_CONCURRENCY] = Measurement(
            math.fsum(conc),
            "requests",
            prov,
            note="kv_cache_max_concurrency: requests of max_model_len tokens the KV cache holds at once",
        )
    mem = [float(m) for info in infos if (m := _label(info, "kv_cache_memory_bytes")) and _is_number(m)]
    if mem:
        out[KV_CACHE_BYTES] = Measurement(
            math.fsum(mem),
            "bytes",
            prov,
            note="kv_cache_memory_bytes as configured (--kv-cache-memory-bytes, or VLLM_CPU_KVCACHE_SPACE on CPU)",
        )


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _spec_config(ctx: _Ctx, out: dict[str, Result]) -> None:
    if ctx.engine != "vllm":
        return
    drafts = ctx.resolve("spec_draft_tokens") or ctx.resolve("spec_acceptance_rate_gauge")
    prov = ctx.prov("metric-presence", "vllm:spec_decode_*")
    if drafts is not None:
        out[SPEC_DECODE] = Fact(True, prov, note="spec_decode metrics are present")
        # vLLM V1 registers one per-position acceptance counter for each drafted position at
        # start-up (v1/spec_decode/metrics.py), so counting them gives k even on an idle server.
        scrape = ctx.window.last_scrape()
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        positions = {s.label("position") for s in scrape.series(name)} - {None} if scrape is not None else set()
        if positions:
            out[NUM_SPECULATIVE_TOKENS] = Fact(
                len(positions),
                ctx.prov("metric-presence", name),
                note="one per-position acceptance counter per drafted position",
            )
    else:
        out[SPEC_DECODE] = Fact(
            False,
            prov,
            note="inferred: vLLM registers spec_decode metrics only when "
            "--speculative-config is set, and none are present",
        )


def _offload_config(ctx: _Ctx, infos: list[dict[str, str]], out: dict[str, Result]) -> None:
    scrape = ctx.window.last_scrape()
    names = scrape.names() if scrape is not None else frozenset()
    offload_series = sorted(
        n for n in names if n.startswith(("vllm:kv_offload_", "vllm:simple_kv_offload_", "trtllm_kv_cache_offload_"))
    )
    size = _label(infos[0], "kv_offloading_size") if infos else None
    if size is not None or offload_series:
        why = f"kv_offloading_size={size}" if size is not None else f"offload metrics present ({offload_series[0]})"
        out[KV_OFFLOAD] = Fact(True, ctx.prov("prometheus-info-labels", "offload configuration"), note=why)
    elif infos and "kv_offloading_size" in infos[0]:
        out[KV_OFFLOAD] = Fact(
            False,
            ctx.prov("prometheus-info-labels", "vllm:cache_config_info"),
            note="kv_offloading_size=None and no offload metrics; a connector set with "
            "--kv-transfer-config (LMCache, ...) shows as external_prefix_cache_* hits",
        )


def _gauge_measurements(
    ctx: _Ctx, concept: str, unit: str, stats: dict[str, Callable[[list[float]], float]], note: str = ""
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


def _kv_and_batch(ctx: _Ctx) -> dict[str, Result]:
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

    inc = ctx.counter("preemptions")
    if inc is None:
        hole = ctx.missing("preemptions")
        out[PREEMPTIONS] = out[PREEMPTION_RATE] = hole
    elif not inc.intervals:
        out[PREEMPTIONS] = out[PREEMPTION_RATE] = _too_few(ctx, inc.selector)
    else:
        prov = ctx.prov("prometheus-counter-delta", inc.selector)
        warn = ctx.warnings(_reset_warning(inc))
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


def _concurrency(ctx: _Ctx) -> Result:
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
    return Measurement(
        statistics.fmean(totals),
        "count",
        prov,
        samples=tuple(totals),
        warnings=ctx.warnings(),
        note="running + waiting per scrape",
    )


def _running_cap(ctx: _Ctx) -> Result:
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


def _too_few(ctx: _Ctx, what: str) -> NotMeasured:
    return NotMeasured(
        f"a counter increase needs two good scrapes; the window has {len(ctx.window.ok_records)}",
        "scrape for longer",
        ctx.prov("prometheus-counter-delta", what),
    )


def _version_below(ctx: _Ctx, bound: tuple[int, ...]) -> bool:
    return ctx.version is not None and ctx.version < bound


def _prefix(ctx: _Ctx) -> dict[str, Result]:
    out: dict[str, Result] = {}
    pair = ctx.resolve("prefix")
    if isinstance(pair, HitPair):
        hits = ctx.window.counter(pair.hits)
        if not hits.intervals:
            out[PREFIX_HIT_RATE] = out[PREFIX_QUERIED_TOKENS] = _too_few(ctx, pair.describe())
            return out
        other = ctx.window.counter(pair.queries or pair.misses)  # type: ignore[arg-type]
        looked_up = other.total if pair.queries is not None else hits.total + other.total
        prov = ctx.prov("prometheus-counter-delta", pair.describe())
        block = _block_size(ctx)
        queried = looked_up if pair.unit == "tokens" else (looked_up * block if block else None)
        if queried is None:
            out[PREFIX_QUERIED_TOKENS] = NotMeasured(
                "the engine counts cache lookups in blocks and its block size is not exposed", "", prov
            )
        else:
            out[PREFIX_QUERIED_TOKENS] = Measurement(
                queried,
                "tokens",
                prov,
                warnings=ctx.warnings(),
                note="looked up in the window" + ("" if pair.unit == "tokens" else f" ({looked_up:.0f} blocks)"),
            )
        if looked_up <= 0:
            if _label_prefix_off(ctx):
                reason = "prefix caching is off (cache_config_info enable_prefix_caching=False): nothing is looked up"
                hint = "start the server with --enable-prefix-caching to let repeated prefixes hit"
            else:
                reason, hint = "no prompt tokens were looked up in the prefix cache in the window", NO_TRAFFIC_HINT
            out[PREFIX_HIT_RATE] = NotMeasured(reason, hint, prov)
            return out
        warns = [_reset_warning(hits, other)]
        preempted = ctx.counter("preemptions")
        if (
            ctx.engine == "vllm"
            and preempted is not None
            and preempted.total > 0
            and (_version_below(ctx, (0, 12)) or pair.hits.name.startswith("vllm:gpu_"))
        ):
            warns.append(
                "before vLLM 0.12 re-prefills of preempted requests counted as hits, inflating this rate "
                "(vLLM issue #25780); the window had preemptions"
            )
        notes = [f"increase over the window, in {pair.unit}"]
        if block and pair.unit == "tokens" and block > 1:
            notes.append(f"hits come in whole blocks of {block} tokens: a shared prefix shorter than that never hits")
        out[PREFIX_HIT_RATE] = Measurement(
            min(1.0, max(0.0, hits.total / looked_up)),
            "fraction",
            prov,
            warnings=ctx.warnings(*warns),
            note="; ".join(notes),
        )
        return out

    gauge_c = ctx.resolve("prefix_hit_rate_gauge")
    if gauge_c is not None:
        # V0 reports -1 when nothing was queried; SGLang's gauge covers the last prefill batch only.
        values = [v for v in ctx.window.gauge(gauge_c, "max", floor=None).values if v >= 0]
        prov = ctx.prov("prometheus-gauge-samples", gauge_c.describe())
        if values:
            out[PREFIX_HIT_RATE] = Measurement(
                statistics.fmean(values),
                "fraction",
                prov,
                samples=tuple(values),
                warnings=ctx.warnings("engine-computed gauge, not a windowed token ratio: mean of its readings"),
            )
        else:
            out[PREFIX_HIT_RATE] = NotMeasured(
                "the engine's hit-rate gauge had no valid reading (-1: no queries)", NO_TRAFFIC_HINT, prov
            )
    else:
        out[PREFIX_HIT_RATE] = ctx.missing("prefix")
    out[PREFIX_QUERIED_TOKENS] = ctx.missing("prefix")
    return out


def _block_size(ctx: _Ctx) -> int | None:
    infos = _info_labels(ctx)
    if infos and (bs := _label(infos[0], "block_size")) is not None and bs.isdigit():
        return int(bs)
    cand = ctx.resolve("block_size")
    value = ctx.window.latest(cand, "first") if cand is not None else None
    return None if value is None else int(value)


def _label_prefix_off(ctx: _Ctx) -> bool:
    infos = _info_labels(ctx)
    return bool(infos) and _label(infos[0], "enable_prefix_caching") == "False"


def _quantile_result(ctx: _Ctx, concept: str, q: float, unit: str, empty_reason: str) -> Result:
    cand = ctx.resolve(concept)
    if not isinstance(cand, Sel):
        return ctx.missing(concept)
    inc = ctx.window.histogram(cand)
    prov = ctx.prov("prometheus-histogram-window", cand.describe())
    if not inc.intervals:
        return _too_few(ctx, cand.describe())
    if inc.count <= 0:
        return NotMeasured(empty_reason, NO_TRAFFIC_HINT, prov)
    est = histogram_quantile(q, inc.buckets)
    if est is None:
        return NotMeasured(f"{cand.describe()} has no +Inf bucket: its quantiles cannot be read", "", prov)
    warns = [_reset_warning(inc)]
    if est.in_first_bucket:
        warns.append(f"p{q * 100:g} lies in the first bucket (<= {est.upper:g}): reported as that upper bound")
    if est.in_overflow_bucket:
        warns.append(f"p{q * 100:g} lies beyond the last finite bucket: reported as its lower bound {est.lower:g}")
    return Measurement(
        est.honest_value,
        unit,
        prov,
        summary=summary_from_buckets(inc.buckets, inc.sum),
        warnings=ctx.warnings(*warns),
        note=f"p{q * 100:g} over {inc.count:.0f} observations in the window: {est.bound_note}",
    )


def _latency(ctx: _Ctx) -> dict[str, Result]:
    no_requests = "no requests finished in the window; run longer or with --active"
    out: dict[str, Result] = {
        ITL_P50: _quantile_result(ctx, "itl", 0.50, "s", "no output tokens were generated in the window"),
        ITL_P99: _quantile_result(ctx, "itl", 0.99, "s", "no output tokens were generated in the window"),
        TTFT_P50: _quantile_result(ctx, "ttft", 0.50, "s", "no request got its first token in the window"),
        TTFT_P99: _quantile_result(ctx, "ttft", 0.99, "s", "no request got its first token in the window"),
        E2E_P50: _quantile_result(ctx, "e2e", 0.50, "s", no_requests),
        QUEUE_TIME_P50: _quantile_result(ctx, "queue_time", 0.50, "s", no_requests),
    }
    out[DECODE_TIME_SHARE] = _decode_share(ctx, no_requests)
    return out


def _decode_share(ctx: _Ctx, no_requests: str) -> Result:
    e2e = ctx.histogram("e2e")
    if e2e is None:
        return ctx.missing("e2e")
    decode = ctx.histogram("decode_time")
    ttft = ctx.histogram("ttft") if decode is None else None
    what = f"{(decode or ttft).selector if (decode or ttft) else '?'} / {e2e.selector}"
    prov = ctx.prov("prometheus-histogram-window", what)
    if not e2e.intervals:
        return _too_few(ctx, e2e.selector)
    if e2e.count <= 0 or e2e.sum <= 0:
        return NotMeasured(no_requests, NO_TRAFFIC_HINT, prov)
    if decode is not None:
        share, note = decode.sum / e2e.sum, "sum of decode times / sum of end-to-end latencies of the finished requests"
    elif ttft is not None:
        share = 1.0 - ttft.sum / e2e.sum
        note = "1 - (sum of TTFT / sum of end-to-end latency): queueing counts as non-decode time"
    else:
        return ctx.missing("decode_time")
    return Measurement(
        min(1.0, max(0.0, share)), "fraction", prov, warnings=ctx.warnings(_reset_warning(e2e)), note=note
    )


def _spec(ctx: _Ctx) -> dict[str, Result]:
    out: dict[str, Result] = {}
    accepted, drafted, drafts = (
        ctx.counter("spec_accepted_tokens"),
        ctx.counter("spec_draft_tokens"),
        ctx.counter("spec_drafts"),
    )
    not_configured = NotMeasured(
        "speculative decoding is not configured (the server exposes no draft counters)",
        "only relevant with --speculative-config (vLLM) / --speculative-algorithm (SGLang)",
        ctx.prov("metric-presence", "spec_decode"),
    )
    if accepted is not None and drafted is not None:
        prov = ctx.prov("prometheus-counter-delta", f"{accepted.selector} / {drafted.selector}")
        if drafted.total > 0:
            out[SPEC_ACCEPTANCE_RATE] = Measurement(
                accepted.total / drafted.total,
                "fraction",
                prov,
                warnings=ctx.warnings(_reset_warning(accepted, drafted)),
                note=f"{accepted.total:.0f} of {drafted.total:.0f} drafted tokens accepted in the window",
            )
        else:
            out[SPEC_ACCEPTANCE_RATE] = NotMeasured(
                "no draft tokens were proposed in the window", NO_TRAFFIC_HINT, prov
            )
        if drafts is not None and drafts.total > 0:
            out[SPEC_ACCEPTANCE_LENGTH] = Measurement(
                1.0 + accepted.total / drafts.total,
                "tokens",
                ctx.prov("prometheus-counter-delta", f"1 + {accepted.selector} / {drafts.selector}"),
                warnings=ctx.warnings(_reset_warning(drafts)),
                note="bonus token included",
            )
    for concept, key, unit in (
        ("spec_acceptance_rate_gauge", SPEC_ACCEPTANCE_RATE, "fraction"),
        ("spec_acceptance_length_gauge", SPEC_ACCEPTANCE_LENGTH, "tokens"),
    ):
        if key in out:
            continue
        cand = ctx.resolve(concept)
        if cand is None:
            continue
        # SGLang/TRT-LLM gauges cover the last logging interval and read 0 when nothing was drafted.
        values = [v for v in ctx.window.gauge(cand, "max").values if v > 0]
        prov = ctx.prov("prometheus-gauge-samples", cand.describe())
        out[key] = (
            Measurement(
                statistics.fmean(values),
                unit,
                prov,
                samples=tuple(values),
                warnings=ctx.warnings("engine gauge over its last logging interval: mean of the non-zero readings"),
            )
            if values
            else NotMeasured(
                f"{cand.describe()} stayed 0: no speculative verification in the window "
                "(not configured, or no traffic)",
                NO_TRAFFIC_HINT,
                prov,
            )
        )
    out.setdefault(SPEC_ACCEPTANCE_RATE, not_configured)
    out.setdefault(SPEC_ACCEPTANCE_LENGTH, not_configured)
    return out


def _interference(ctx: _Ctx) -> dict[str, Result]:
    prompt_c = ctx.resolve("prompt_tokens_computed") or ctx.resolve("prompt_tokens")
    itl_c = ctx.resolve("itl")
    if not isinstance(prompt_c, Sel) or not isinstance(itl_c, Sel):
        return {PROMPT_ITL_CORRELATION: ctx.missing("itl" if itl_c is None else "prompt_tokens")}
    prompts, itl = ctx.window.counter(prompt_c), ctx.window.histogram(itl_c)
    prov = ctx.prov("prometheus-interval-correlation", f"rate({prompt_c.describe()}) vs mean {itl_c.describe()}")
    pairs = [(p.rate, s / c) for p, (_, _, c, s) in zip(prompts.intervals, itl.intervals) if c > 0]
    if len(pairs) < MIN_CORRELATION_INTERVALS:
        return {
            PROMPT_ITL_CORRELATION: NotMeasured(
                f"only {len(pairs)} scrape intervals had decode steps (need {MIN_CORRELATION_INTERVALS})",
                NO_TRAFFIC_HINT,
                prov,
            )
        }
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
    if rho is None:
        return {
            PROMPT_ITL_CORRELATION: NotMeasured(
                "the prompt-token rate (or the mean ITL) did not vary across intervals: nothing to correlate",
                "a mixed workload (new prompts arriving during decoding) shows interference; try --active",
                prov,
            )
        }
    warns = (
        []
        if len(pairs) >= FEW_CORRELATION_INTERVALS
        else [f"only {len(pairs)} intervals: the rank correlation is noisy"]
    )
    computed = "computed prompt tokens (cache hits excluded)" if prompt_c.where else "prompt tokens"
    return {
        PROMPT_ITL_CORRELATION: Measurement(
            rho,
            "ratio",
            prov,
            warnings=ctx.warnings(*warns),
            note=f"Spearman rank correlation over {len(pairs)} scrape intervals of {computed}/s vs that interval's mean "
            "inter-token latency; passive and correlational: an active experiment measures the inflation",
        )
    }


def _throughput(ctx: _Ctx) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for concept, key in (
        ("generation_tokens", GEN_TOKENS_PER_S),
        ("prompt_tokens", PROMPT_TOKENS_PER_S),
        ("requests_finished", REQUESTS_PER_S),
    ):
        inc = ctx.counter(concept)
        if inc is None:
            out[key] = ctx.missing(concept)
        elif not inc.intervals:
            out[key] = _too_few(ctx, inc.selector)
        else:
            out[key] = Measurement(
                inc.rate,
                "1/s",
                ctx.prov("prometheus-counter-delta", inc.selector),
                samples=tuple(i.rate for i in inc.intervals),
                warnings=ctx.warnings(_reset_warning(inc)),
                note=f"{inc.total:.0f} over {inc.duration_s:.1f} s; samples: rate per scrape interval",
            )
    return out


def _lengths(ctx: _Ctx) -> dict[str, Result]:
    no_requests = "no requests finished in the window; run longer or with --active"
    out: dict[str, Result] = {
        OUTPUT_LEN_P50: _quantile_result(ctx, "output_length", 0.50, "tokens", no_requests),
        OUTPUT_LEN_P99: _quantile_result(ctx, "output_length", 0.99, "tokens", no_requests),
        INPUT_LEN_P50: _quantile_result(ctx, "input_length", 0.50, "tokens", no_requests),
    }
    for key in (OUTPUT_LEN_P50, OUTPUT_LEN_P99, INPUT_LEN_P50):
        r = out[key]
        if isinstance(r, Measurement):
            out[key] = Measurement(
                r.value,
                r.unit,
                r.provenance,
                summary=r.summary,
                warnings=r.warnings,
                note=r.note + "; estimated from the per-request length histogram's buckets",
            )
    out[OUTPUT_LEN_CV] = _length_cv(ctx, no_requests)
    return out


def _length_cv(ctx: _Ctx, no_requests: str) -> Result:
    inc = ctx.histogram("output_length")
    if inc is None:
        return ctx.missing("output_length")
    prov = ctx.prov("prometheus-histogram-window", inc.selector)
    if not inc.intervals:
        return _too_few(ctx, inc.selector)
    if inc.count <= 0:
        return NotMeasured(no_requests, NO_TRAFFIC_HINT, prov)
    mean = inc.sum / inc.count
    if mean <= 0:
        return NotMeasured("the finished requests produced no output tokens", NO_TRAFFIC_HINT, prov)
    nonempty = [
        (lo, hi)
        for (lo, _), (hi, c1), c0 in zip(
            [(0.0, 0.0)] + list(inc.buckets[:-1]), inc.buckets, [0.0] + [c for _, c in inc.buckets[:-1]]
        )
        if c1 - c0 > 0
    ]
    if len(nonempty) == 1 and math.isfinite(nonempty[0][1]):
        lo, hi = nonempty[0]
        bound = math.sqrt(max(0.0, (mean - lo) * (hi - mean))) / mean
        return Measurement(
            0.0,
            "ratio",
            prov,
            warnings=ctx.warnings("every output length fell in one histogram bucket: the spread inside it is unknown"),
            note=f"estimated from histogram buckets: all {inc.count:.0f} lengths in ({lo:g}, {hi:g}] with mean "
            f"{mean:.1f}; the CV is between 0 and {bound:.2f}",
        )
    est = bucket_mean_stdev(inc.buckets, inc.sum)
    assert est is not None
    _, sd = est
    return Measurement(
        sd / mean,
        "ratio",
        prov,
        warnings=ctx.warnings(_reset_warning(inc)),
        note=f"estimated from histogram buckets (bucket midpoints around the exact mean {mean:.1f} "
        f"over {inc.count:.0f} requests); coarse buckets make it approximate",
    )
