"""Evidence about the window and the engine, not the workload.

It produces live.window_s, live.window_complete, the count of bad samples left out, the
engine's name, and the design facts of each supported engine (continuous batching, paged KV).

Why: every other figure is only as good as its window. A judge needs to know how long it was,
whether it stopped early, and how many impossible readings were dropped before trusting a
rate or a quantile. The design facts come from the engine's name, not from the server, and
their provenance ("engine-design") says so.
"""

from __future__ import annotations

from llm_diagnose.probes.metrics.engines import detect_engine
from llm_diagnose.probes.metrics.passive.context import PassiveContext
from llm_diagnose.probes.quantities import (
    CONTINUOUS_BATCHING,
    ENGINE_NAME,
    LIVE_WINDOW_COMPLETE,
    LIVE_WINDOW_S,
    PAGED_KV,
)
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result

__all__ = ["bad_samples", "identity", "window_facts"]

_DESIGN_NOTES = {
    "vllm": "vLLM schedules every iteration (continuous batching) over a block-paged KV cache (PagedAttention)",
    "sglang": "SGLang schedules every iteration (continuous batching) over a token-paged KV pool (RadixAttention)",
    "trtllm": "TensorRT-LLM batches in flight (continuous batching) over a paged KV cache",
}


def window_facts(ctx: PassiveContext) -> dict[str, Result]:
    """The window's length and whether it ran to its end."""
    w = ctx.window
    prov = ctx.prov("scrape-loop", "")
    ok = w.n_ok
    # Complete: it ran to its end, and enough of its planned scrapes answered (Window.incomplete).
    out: dict[str, Result] = {LIVE_WINDOW_COMPLETE: Fact(w.incomplete is None, prov, note=w.describe())}
    if ok >= 2:
        out[LIVE_WINDOW_S] = Measurement(w.duration_s, "s", prov, note=w.describe(), warnings=ctx.warnings())
    else:
        out[LIVE_WINDOW_S] = NotMeasured(f"only {ok} good scrape: a window needs two", "scrape for longer", prov)
    return out


def identity(ctx: PassiveContext) -> dict[str, Result]:
    """The engine as its metric names show it, and the design facts every release of that engine has."""
    out: dict[str, Result] = {}
    first = ctx.window.first_scrape()
    assert first is not None  # passive_evidence runs the producers only after a good scrape
    guess = detect_engine(first)
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


def bad_samples(ctx: PassiveContext) -> Result:
    """How many samples the window left out, and which: never silently dropped."""
    w = ctx.window
    n_page = w.bad_sample_count
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
