"""Which prefix-cache hit figures describe the workload diagnosed, and what the active experiment says.

The live probe reads hits over lookups in its own window from the engine's counters where they
exist. Where an engine has only a hit-rate gauge, the probe records the mean of the gauge's
readings (provenance `prometheus-gauge-samples`, warning `Q.ENGINE_HIT_RATE_WARNING`). Such a
figure covers whatever traffic the engine last counted, not this workload: SGLang's cache_hit_rate
is overwritten by every prefill batch and zeroed by decode logging, so it sat at 0 while the cache
was healthy (sgl-project/sglang#26608), and its fix makes it cumulative over the server's life
(#26837); the hit rate vLLM logs is a rolling window of the last 1000 requests over all traffic
(vllm-project/vllm#46938: "neither corresponds to this run"). Set beside this workload's trace, or
read as "the cache fails", it says nothing.

What does say whether the cache works is the active prefix experiment
(llm_diagnose.probes.experiments.prefix): repeats of a prefix this run put in the cache must hit
its full blocks, while prompts salted at their start must not hit at all (if they do, other
traffic shared the counters and the repeats' figure is not clean).
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.branch import Branches, needed
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.warning_codes import WarningCode

__all__ = ["engine_figure", "active_cache_check", "judge_cache_apart", "ENGINE_FIGURE_METHOD"]

# The provenance method of a value sampled from an engine's gauge (llm_diagnose.probes.metrics.passive.prefix).
ENGINE_FIGURE_METHOD = "prometheus-gauge-samples"


def engine_figure(ev: Evidence) -> str | None:
    """A phrase naming the live hit rate as the engine's own figure, or None where it is hits over
    lookups counted in the window (or absent)."""
    m = ev.measurement(Q.PREFIX_HIT_RATE)
    if m is None:
        return None
    warned = WarningCode.ENGINE_GAUGE in m.codes
    if m.provenance.method != ENGINE_FIGURE_METHOD and not warned:
        return None
    return f"{m.value:.0%}, the engine's own figure ({m.provenance.source})"


def active_cache_check(r: Reading) -> tuple[bool | None, str]:
    """(works, why) from the active prefix experiment: True where repeats of a prefix this run cached
    hit at least q2.active_repeat_min_hit, False where they hit less; None where the experiment did
    not run, or its salted prompts hit (other traffic in the counters: its figure is not clean)."""
    repeated = r.num(Q.PREFIX_ACTIVE_REPEATED_HIT_RATE)
    if repeated is None:
        return None, ""
    salted = r.num(Q.PREFIX_ACTIVE_SALTED_HIT_RATE)
    if salted is not None and not r.compare(Q.PREFIX_ACTIVE_SALTED_HIT_RATE, salted, "<=", "q2.dead_hit_rate"):
        return None, (
            f"the active experiment's salted prompts hit {salted:.0%}, where nothing can be cached: other traffic "
            "shared the counters, so its repeats' figure is not clean (run it on a quiet server)"
        )
    works = r.compare(Q.PREFIX_ACTIVE_REPEATED_HIT_RATE, repeated, ">=", "q2.active_repeat_min_hit")
    salted_text = f", salted prompts {salted:.0%}" if salted is not None else ""
    if works:
        return True, f"repeats of a prefix this run put in the cache hit {repeated:.0%}{salted_text}: the cache works"
    return False, (
        f"repeats of a prefix this run put in the cache hit only {repeated:.0%}{salted_text}: the cache does not "
        "keep or match a prefix it was just given (or its KV blocks are longer than the repeated prefix: "
        "hits come in whole blocks)"
    )


def judge_cache_apart(b: Branches) -> bool:
    """Q2's branch where prefix caching is on and the live hit rate cannot judge the cache (absent, or
    the engine's own figure): the active experiment's verdict, else the engine's figure set aside as
    on-unverified with what would settle it. True where it decided the status."""
    figure = engine_figure(b.ev)
    if figure is None and b.ev.measurement(Q.PREFIX_HIT_RATE) is not None:
        return False
    set_aside = (
        f"; the live hit rate ({figure}) covers whatever traffic the engine last counted, not this workload"
        if figure
        else ""
    )
    r = b.reading()
    works, why = active_cache_check(r)
    if works is not None:
        b.step("Q2.cache-keeps-a-repeated-prefix", works, why + set_aside)
        # The experiment measures the cache itself: its own confidence, whatever Q2 knows of the workload.
        conf = r.conf("direct") * r.quality(Q.PREFIX_ACTIVE_REPEATED_HIT_RATE)
        if works:
            b.add("prefix-caching", "in-place", "Q2", f"on and working: {why}{set_aside}", conf)
        elif needed(b.answers["Q2"], "yes") is False:
            b.add("prefix-caching", "in-place", "Q2", f"on; the workload shares no prefixes, though {why}", conf)
        else:
            b.add("prefix-caching", "not-working", "Q2", f"it is on, but {why}{set_aside}", conf)
        return True
    if figure is None:
        return False
    b.step("Q2.hit-rate-reaches-potential", None, f"{figure}: not this workload's window")
    doubt = f"; {why}" if why else ""
    b.add(
        "prefix-caching",
        "on-unverified",
        "Q2",
        f"on, but the live hit rate is {figure}: a figure over whatever traffic the engine last counted (SGLang's "
        "cache_hit_rate: the last prefill batch, or the server's lifetime; vLLM's logged rate: the last 1000 "
        f"requests) cannot describe this workload, so it is neither a hit nor a miss of it{doubt}; hit and query "
        "counters over the window, or the active prefix experiment (--active), would settle it",
    )
    return True
