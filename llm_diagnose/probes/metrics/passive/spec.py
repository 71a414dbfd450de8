"""Speculative-decoding evidence: how many drafted tokens were accepted over the window.

It produces the acceptance rate (accepted / drafted tokens) and the acceptance length (tokens
per verification step, the bonus token included).

Why: speculative decoding pays only when drafts are accepted; a low rate means the draft
work is wasted. vLLM's counters give windowed ratios; SGLang's and TensorRT-LLM's gauges cover
their last logging interval and are averaged over their non-zero readings. A server without
draft metrics gets "not configured".
"""

from __future__ import annotations

import statistics

from llm_diagnose.probes.metrics.passive.context import NO_TRAFFIC_HINT, PassiveContext, reset_warning
from llm_diagnose.probes.quantities import SPEC_ACCEPTANCE_LENGTH, SPEC_ACCEPTANCE_RATE
from llm_diagnose.probes.results import Measurement, NotMeasured, Result

__all__ = ["speculative"]


def speculative(ctx: PassiveContext) -> dict[str, Result]:
    """Acceptance rate and length: from the draft counters, else the engine's gauges, else 'not configured'."""
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
                warnings=ctx.warnings(reset_warning(accepted, drafted)),
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
                warnings=ctx.warnings(reset_warning(drafts)),
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
