"""A trace analysis as evidence: its figures under the catalogue's keys (llm_diagnose/probes/quantities.py).

Every item carries Provenance(method="trace-analysis", source=<the trace>); figures that rest
on the approximate tokenizer say so in their warnings; what the trace cannot give is a
NotMeasured with the reason and how to get it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result

if TYPE_CHECKING:
    from llm_diagnose.probes.traces.analysis import TraceAnalysis

__all__ = ["trace_evidence", "METHOD"]

METHOD = "trace-analysis"


def trace_evidence(a: TraceAnalysis) -> dict[str, Result]:
    prov = Provenance(
        METHOD,
        a.path,
        taken_at=a.taken_at,
        window_s=a.arrivals.span_s if a.arrivals and a.arrivals.span_s > 0 else None,
    )
    approx = (
        []
        if a.tokenizer is None or a.tokenizer_exact
        else [f"token counts from the {a.tokenizer}; pass --tokenizer DIR for exact counts"]
    )
    items: dict[str, Result] = {}

    def put(
        key: str, value, unit: str, *, note: str = "", summary=None, missing: str = "", hint: str = "", warnings=()
    ):
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            items[key] = NotMeasured(missing or "the trace does not give it", hint, prov)
        else:
            items[key] = Measurement(float(value), unit, prov, summary=summary, note=note, warnings=tuple(warnings))

    put(
        Q.TRACE_REQUESTS,
        a.requests,
        "count",
        note=f"{a.read.skipped} unreadable lines skipped" if a.read.skipped else "",
    )
    for stats, p50, p99, cv, top in (
        (a.input_tokens, Q.INPUT_LEN_P50, Q.INPUT_LEN_P99, None, None),
        (a.output_tokens, Q.OUTPUT_LEN_P50, Q.OUTPUT_LEN_P99, Q.OUTPUT_LEN_CV, Q.OUTPUT_TOP1_SHARE),
    ):
        exact = stats is None or stats.source == "trace" or a.tokenizer_exact
        note = "" if stats is None else f"lengths from: {stats.source}"
        w = () if exact else approx
        missing = "the trace gives no lengths for this side"
        put(
            p50,
            None if stats is None else stats.p50,
            "tokens",
            note=note,
            warnings=w,
            missing=missing,
            summary=None if stats is None else stats.summary,
        )
        put(
            p99,
            None if stats is None else stats.p99,
            "tokens",
            note=note,
            warnings=w,
            missing=missing,
            summary=None if stats is None else stats.summary,
        )
        if cv is not None and top is not None:  # (the output side)
            put(cv, None if stats is None else stats.cv, "ratio", note=note, warnings=w, missing=missing)
            put(
                top,
                None if stats is None else stats.top1pct_token_share,
                "fraction",
                note=note,
                warnings=w,
                missing=missing,
            )

    pr = a.prefix_reuse
    no_prefix = a.not_measured.get("prefix_reuse", "")
    block_note = "" if pr is None else f"block size {pr.block_size} tokens, full blocks only"
    put(
        Q.PREFIX_POTENTIAL,
        None if pr is None else pr.token_fraction,
        "fraction",
        note=block_note,
        warnings=approx,
        missing=no_prefix,
        hint="use a trace with prompts, token ids or hash ids",
    )
    put(
        Q.PREFIX_AT_CAPACITY,
        None if pr is None else pr.lru_token_fraction,
        "fraction",
        note=f"{block_note}; LRU of {pr.capacity_tokens} tokens" if pr and pr.capacity_tokens else block_note,
        warnings=approx,
        missing=no_prefix or "no KV capacity given",
        hint="pass --kv-capacity-tokens N (the server's kv.capacity_tokens)",
    )
    sim = a.similarity
    put(
        Q.DYNAMIC_PREFIX_FRACTION,
        None if sim is None else sim.dynamic_fraction,
        "fraction",
        note="" if sim is None else f"estimated from {sim.windows} content windows (sampling {sim.sampling:g})",
        warnings=approx,
        missing=a.not_measured.get("dynamic_prefix", ""),
        hint="use a trace with prompt text or token ids",
    )
    ser = a.serialization
    put(
        Q.UNSTABLE_SERIALIZATION_FRACTION,
        None if ser is None else ser.unstable_fraction,
        "fraction",
        note="" if ser is None else f"{ser.payloads} JSON payloads in {ser.requests_with_payloads} requests checked",
        missing=a.not_measured.get("serialization", ""),
        hint="use a trace with prompt text or chat messages",
    )

    arr = a.arrivals
    no_arrivals = a.not_measured.get("arrivals", "")
    put(Q.ARRIVAL_RATE_MEAN, None if arr is None else arr.rate_mean_per_s, "1/s", missing=no_arrivals)
    put(Q.TIMESTAMP_RESOLUTION, None if arr is None else arr.resolution_s, "s", missing=no_arrivals)
    put(
        Q.ARRIVAL_DISPERSION,
        None if arr is None else arr.dispersion,
        "ratio",
        note="" if arr is None or arr.dispersion_bin_s is None else f"bins of {arr.dispersion_bin_s:g} s",
        missing=no_arrivals or "too few bins",
    )
    put(
        Q.INTERARRIVAL_CV,
        None if arr is None else arr.interarrival_cv,
        "ratio",
        missing=no_arrivals or (arr.interarrival_note if arr else ""),
    )
    estimate = arr is not None and arr.concurrency_source.startswith("estimate")
    put(
        Q.CONCURRENCY_MEAN,
        None if arr is None else arr.concurrency_mean,
        "count",
        note="" if arr is None else arr.concurrency_source,
        warnings=("an estimate, not a measurement",) if estimate else (),
        missing=no_arrivals or "the trace has arrival times but no completion times",
        hint="a trace with end times (or latencies) gives it; --assume-tpot-ms N estimates it",
    )
    return items
