"""Prefix-cache evidence: the hit rate over the window and how many prompt tokens were looked up.

Why: a low hit rate on a workload with shared prefixes means prefill is recomputed. The rate
is the increase of hits over lookups (queries, or hits + misses) in the window, in tokens, or
in blocks converted with the block size; where an engine has only a hit-rate gauge (vLLM V0,
SGLang) it is the mean of the gauge's readings, with a warning that this is not a windowed
ratio. It warns where the figure is known to mislead: before vLLM 0.12 re-prefills of
preempted requests counted as hits, and hits come in whole blocks only.
"""

from __future__ import annotations

import statistics

from llm_diagnose.probes.metrics.engines import HitPair
from llm_diagnose.probes.metrics.passive.config import info_label, info_labels
from llm_diagnose.probes.metrics.passive.context import NO_TRAFFIC_HINT, PassiveContext, reset_warning, too_few
from llm_diagnose.probes.quantities import ENGINE_HIT_RATE_WARNING, PREFIX_HIT_RATE, PREFIX_QUERIED_TOKENS
from llm_diagnose.probes.results import Measurement, NotMeasured, Result
from llm_diagnose.probes.warning_codes import WarningCode, coded

__all__ = ["prefix_cache"]


def prefix_cache(ctx: PassiveContext) -> dict[str, Result]:
    """The prefix-cache hit rate and the tokens looked up: from hit/lookup counters, else the engine's gauge."""
    out: dict[str, Result] = {}
    pair = ctx.resolve("prefix")
    if isinstance(pair, HitPair):
        hits = ctx.window.counter(pair.hits)
        if not hits.intervals:
            out[PREFIX_HIT_RATE] = out[PREFIX_QUERIED_TOKENS] = too_few(ctx, pair.describe())
            return out
        counted = pair.queries if pair.queries is not None else pair.misses
        assert counted is not None  # a HitPair counts lookups or misses (see HitPair.describe)
        other = ctx.window.counter(counted)
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
        warns = [reset_warning(hits, other)]
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
                warnings=ctx.warnings(
                    coded(WarningCode.ENGINE_GAUGE, f"{ENGINE_HIT_RATE_WARNING}: mean of its readings")
                ),
            )
        else:
            out[PREFIX_HIT_RATE] = NotMeasured(
                "the engine's hit-rate gauge had no valid reading (-1: no queries)", NO_TRAFFIC_HINT, prov
            )
    else:
        out[PREFIX_HIT_RATE] = ctx.missing("prefix")
    out[PREFIX_QUERIED_TOKENS] = ctx.missing("prefix")
    return out


def _block_size(ctx: PassiveContext) -> int | None:
    infos = info_labels(ctx)
    if infos and (bs := info_label(infos[0], "block_size")) is not None and bs.isdigit():
        return int(bs)
    cand = ctx.resolve("block_size")
    value = ctx.window.latest(cand, "first") if cand is not None else None
    return None if value is None else int(value)


def _label_prefix_off(ctx: PassiveContext) -> bool:
    infos = info_labels(ctx)
    return bool(infos) and info_label(infos[0], "enable_prefix_caching") == "False"


def _version_below(ctx: PassiveContext, bound: tuple[int, ...]) -> bool:
    return ctx.version is not None and ctx.version < bound
