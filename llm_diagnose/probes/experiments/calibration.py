"""The one request sent before anything is sized, and the limits the engine states.

`calibrate` sends one short streamed request at batch 1 (CALIBRATION_PROMPT_TOKENS prompt,
CALIBRATION_OUTPUT_TOKENS output) and reads the server's speed off it: the time per output
token (the stream's span over its tokens) and the prefill time per prompt token ((TTFT - one
step) / prompt tokens: an upper bound, since the request's fixed cost is in it). Where prompts
are text sized by a guessed tokens-per-word ratio (no `/tokenize`), the response's
`usage.prompt_tokens` corrects the ratio for every prompt after it.

`engine_limits` gathers what the engine states about itself: discovery's facts (max_num_seqs,
max_num_batched_tokens where the server exposes its configuration), one /metrics page (the KV
capacity; the fullest step vllm:iteration_tokens_total has counted since the server started, a
lower bound on the step budget) and max_model_len.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments.common import ExperimentContext, send_until
from llm_diagnose.probes.experiments.sizing import (
    CALIBRATION_OUTPUT_TOKENS,
    CALIBRATION_PROMPT_TOKENS,
    DEFAULT_MAX_MODEL_LEN,
    Calibration,
    EngineLimits,
)
from llm_diagnose.probes.load.records import RequestRecord, RequestSpec
from llm_diagnose.probes.results import Measurement, NotMeasured, Result

__all__ = ["calibrate", "calibration_from", "engine_limits", "calibration_results", "CALIBRATION_SHARE"]

# The calibration request may take at most this share of the budget's time: a server so slow that
# one short request takes more leaves no room for the experiments anyway (they are then skipped,
# with the budget that would let them run).
CALIBRATION_SHARE = 0.25
# A step is never planned faster than this, whatever the gaps say (sizing.FASTEST_TOKEN_S): a
# stream read in one go has gaps of ~0.
MIN_SPAN_S = 1e-4


def calibration_from(record: RequestRecord | None, spent_s: float) -> Calibration:
    """The server's speed from the calibration request's record (assumed, with why, if it says too little)."""
    if record is None:
        return Calibration.assumed("the calibration request was not sent: the budget refused it")
    times = record.event_times
    if len(times) < 2 or record.ttft_s is None:
        why = record.fault_detail or (record.fault.value if record.fault else "") or f"{len(times)} token event(s)"
        return Calibration.assumed(f"the calibration request gave no speed ({why})")
    tokens = max(2, record.tokens_out)
    first = record.event_tokens[0] if record.event_tokens else 1
    span = times[-1] - times[0]
    per_token = span / max(1, tokens - first)
    planned = record.planned_prompt_tokens or CALIBRATION_PROMPT_TOKENS
    # The server's count where it is plausible for the prompt sent (prompts.PLAUSIBLE_TOKENS_PER_WORD).
    plausible = record.prompt_tokens and planned / 4 <= record.prompt_tokens <= 8 * planned
    prompt = record.prompt_tokens if plausible and record.prompt_tokens else planned
    prefill = max(record.ttft_s - per_token, 0.1 * record.ttft_s) / prompt
    whole = " (its tokens arrived together: the step time is a floor)" if span < MIN_SPAN_S else ""
    counted = "as the server counted them" if plausible else "as planned"
    return Calibration(
        per_token,
        prefill,
        f"measured: one request of {prompt} prompt tokens ({counted}) and {tokens} output tokens, TTFT "
        f"{record.ttft_s * 1e3:.1f} ms{whole}",
        measured=True,
        spent_s=spent_s,
    )


async def calibrate(ctx: ExperimentContext, until: float, started: float) -> Calibration:
    """Send the calibration request (stopped at `until`); the speed it shows. `started`: when the
    budget's clock started, for what sizing has left. Corrects `ctx.prompts` from its usage."""
    max_len = ctx.max_model_len or DEFAULT_MAX_MODEL_LEN
    prompt_tokens = max(16, min(CALIBRATION_PROMPT_TOKENS, (max_len - CALIBRATION_OUTPUT_TOKENS - 1) // 2))
    prompt = ctx.prompts.body(prompt_tokens, ctx.rng, ctx.endpoint)
    spec = RequestSpec(
        "calibration-0",
        prompt,
        CALIBRATION_OUTPUT_TOKENS,
        ctx.endpoint,
        "calibration",
        "calibration",
        planned_prompt_tokens=prompt_tokens,
    )
    # Nothing is known of the server yet: its first token may wait as long as the calibration's share.
    with ctx.driver.client.no_progress_floor(until - time.perf_counter()):
        record = await send_until(ctx.driver, spec, until, "calibration: ran past its share of the budget")
    calibration = calibration_from(record, time.perf_counter() - started)
    if record is not None and record.prompt_tokens and isinstance(prompt, str):
        how = "the calibration request" + (" (the chat template's tokens included)" if ctx.endpoint == "chat" else "")
        corrected = ctx.prompts.corrected(record.prompt_tokens, len(prompt.split()), how)
        if corrected is not ctx.prompts:
            ctx.prompts = corrected
            ctx.notes.append(f"prompt lengths {corrected.source}")
    ctx.events.event(
        "calibration",
        time_per_token_s=round(calibration.time_per_token_s, 6),
        prefill_s_per_token=round(calibration.prefill_s_per_token, 7),
        measured=calibration.measured,
        source=calibration.source,
        prompts=ctx.prompts.describe(),
    )
    return calibration


def calibration_results(calibration: Calibration, source: str) -> dict[str, Result]:
    """The calibration as evidence: what the experiments were sized from."""
    from llm_diagnose.probes.results import Provenance

    if not calibration.measured:
        hole = NotMeasured(f"the experiments were sized at an {calibration.source}")
        return {Q.CALIBRATION_ITL: hole, Q.CALIBRATION_PREFILL_PER_TOKEN: hole}
    prov = Provenance(method="active-probe/calibration", source=source)
    return {
        Q.CALIBRATION_ITL: Measurement(calibration.time_per_token_s, "s", prov, note=calibration.source),
        Q.CALIBRATION_PREFILL_PER_TOKEN: Measurement(
            calibration.prefill_s_per_token,
            "s",
            prov,
            note=f"(TTFT - one step) / prompt tokens: an upper bound; {calibration.source}",
        ),
    }


async def engine_limits(
    ctx: ExperimentContext, facts: Mapping[str, Result] | None, max_model_len: int | None
) -> EngineLimits:
    """The engine's limits from discovery's facts and one /metrics page (no page without a scraper)."""
    items: dict[str, Result] = dict(facts or {})
    record = None
    if ctx.metrics is not None:
        try:
            record = await ctx.metrics()
        except Exception as exc:  # noqa: BLE001 - a failed scrape loses the limits, not the run
            ctx.notes.append(f"a metrics scrape failed ({type(exc).__name__}: {exc})")
    if record is not None and getattr(record, "ok", False):
        from llm_diagnose.probes.metrics.passive import passive_evidence
        from llm_diagnose.probes.metrics.window import Window

        page = passive_evidence(Window("metrics", (record,)))
        for key in (Q.KV_CAPACITY_TOKENS,):
            if not isinstance(items.get(key), (Measurement,)) and isinstance(page.get(key), Measurement):
                items[key] = page[key]
        seen = _largest_step_seen(record)
        if seen is not None:
            items[Q.STEP_TOKENS_MAX] = seen
    return EngineLimits.from_evidence(items, max_model_len)


def _largest_step_seen(record) -> Measurement | None:  # noqa: ANN001 - a ScrapeRecord
    """More tokens than the lower edge of the fullest step's bucket, over the server's life (vLLM)."""
    from llm_diagnose.probes.metrics.engines import ENGINE_METRICS, Sel
    from llm_diagnose.probes.metrics.histogram import histogram_quantile, merge_buckets
    from llm_diagnose.probes.results import Provenance

    scrape = record.scrape
    for candidate in ENGINE_METRICS["vllm"]["iteration_tokens"]:
        if not isinstance(candidate, Sel) or not scrape.histograms.get(candidate.name):
            continue
        series = scrape.histograms[candidate.name]
        fullest = histogram_quantile(1.0, merge_buckets([s.buckets for s in series]))
        if fullest is None or fullest.lower <= 0:
            return None
        return Measurement(
            int(fullest.lower) + 1,
            "tokens",
            Provenance(method="prometheus-histogram", source=candidate.name),
            note=f"the fullest step since the server started held {fullest.bound_note} tokens",
        )
    return None
