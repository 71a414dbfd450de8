"""`llm-diagnose trace FILE`: what a request trace says about prefix reuse, lengths and arrivals."""

from __future__ import annotations

import argparse
import sys

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.commands.common import dumps, load_thresholds
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.runfolder import check_out_file, out_path, write_output
from llm_diagnose.diagnose.trace_findings import Finding, trace_evidence, trace_findings
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.traces import FORMATS, TraceAnalysis, TraceError, analyze_trace

EXAMPLE = """examples:
  llm-diagnose trace conversation_trace.jsonl --kv-capacity-tokens 500000
  llm-diagnose trace gateway.log.jsonl --tokenizer ./model --json | jq '.findings[].id'
  llm-diagnose trace AzureLLMInferenceTrace_conv.csv --evidence-out trace-evidence.json
  llm-diagnose trace requests.jsonl --thresholds team.toml   # findings judged as decide judges them

Findings are judged with the decision tree's named thresholds (q2.dynamic_prefix_fraction,
q2.dynamic_miss_share, q2.unstable_serialization_fraction, kv_offload.min_gap; severity:
q2.dynamic_prefix_critical), the same ones decide uses on the --evidence-out file.
Prompt text is never printed (lengths, positions, hashes and categories only) unless --show-text."""


def register(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="analyse a request trace (prefix reuse, lengths, arrivals, prompt pitfalls)",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure, offline, what capacity planning needs from a request trace.",
    )
    p.add_argument("file", help="the trace (JSONL or CSV; .gz is read too)")
    p.add_argument("--format", default="auto", choices=("auto",) + FORMATS, help="trace format (default: detect)")
    p.add_argument(
        "--block-size",
        type=argtypes.TOKENS,
        metavar="N",
        help="prefix-cache block size in tokens (default 16 as vLLM on GPU; 128 for vLLM on CPU; "
        "Mooncake hash ids fix 512)",
    )
    p.add_argument(
        "--kv-capacity-tokens",
        type=argtypes.TOKENS,
        metavar="N",
        help="also simulate an LRU prefix cache of N tokens (the server's KV capacity)",
    )
    p.add_argument("--tokenizer", metavar="DIR", help="model directory (tokenizer.json) for exact token counts")
    p.add_argument(
        "--assume-tpot-ms",
        type=argtypes.number_above(0.0, argtypes.MAX_TPOT_MS, what="milliseconds per output token"),
        metavar="MS",
        help="time per output token, to estimate concurrency when the trace has no completion times",
    )
    p.add_argument("--strict", action="store_true", help="fail on the first unreadable line instead of skipping it")
    p.add_argument("--show-text", action="store_true", help="include short snippets of what varies between prompts")
    p.add_argument(
        "--thresholds", metavar="FILE", help="TOML file overriding named thresholds (as decide's; [slo] is ignored)"
    )
    p.add_argument("--json", action="store_true", help="print the analysis as JSON")
    p.add_argument(
        "--evidence-out",
        metavar="FILE",
        type=out_path,
        help="also write the measurements as an evidence file for decide",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)  # a bad file fails before the (long) analysis
    if args.evidence_out:
        check_out_file(args.evidence_out, "--evidence-out")
    try:
        analysis = analyze_trace(
            args.file,
            fmt=args.format,
            block_size=args.block_size,
            kv_capacity_tokens=args.kv_capacity_tokens,
            tokenizer=args.tokenizer,
            strict=args.strict,
            show_text=args.show_text,
            assumed_tpot_s=None if args.assume_tpot_ms is None else args.assume_tpot_ms / 1e3,
        )
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if args.evidence_out:
        write_output(args.evidence_out, trace_evidence(analysis).to_json(), "--evidence-out")
    findings = trace_findings(analysis, thresholds)
    if args.json:
        doc = analysis.to_dict()
        doc["findings"] = [f.to_dict() for f in findings]
        doc["thresholds"] = thresholds.source
        sys.stdout.write(dumps(doc))
    else:
        sys.stdout.write(render(analysis, findings, thresholds))
    return 0


# --- the console view -----------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def render(a: TraceAnalysis, findings: tuple[Finding, ...], thresholds: Thresholds) -> str:
    out = [
        f"trace {a.path} ({a.format}, {a.content}): {a.requests} requests"
        + (f", {a.read.skipped} lines skipped" if a.read.skipped else "")
    ]
    if a.tokenizer:
        out.append(f"  tokens counted with: {a.tokenizer}")
    for name, lengths in (("input tokens", a.input_tokens), ("output tokens", a.output_tokens)):
        if lengths is None:
            out.append(f"{name}: not measured ({a.not_measured.get(name.replace(' ', '_'), '')})")
            continue
        out.append(
            f"{name}: p50 {lengths.p50:g}  mean {lengths.mean:.1f}  p90 {lengths.p90:g}  p99 {lengths.p99:g}  "
            f"max {lengths.max}  cv {_num(lengths.cv)}  p99/p50 {_num(lengths.tail_ratio)}  "
            f"longest 1% carry {_pct(lengths.top1pct_token_share)}"
        )
    r = a.arrivals
    if r is None:
        out.append(f"arrivals: not measured ({a.not_measured.get('arrivals', '')})")
    else:
        out.append(
            f"arrivals: {_num(r.rate_mean_per_s)}/s over {r.span_s:.0f} s, peak {_num(r.rate_peak_per_s)}/s "
            f"(bins of {_num(r.rate_bin_s)} s); clock tick {_num(r.resolution_s)} s"
        )
        out.append(
            f"  burstiness (variance/mean per {_num(r.dispersion_bin_s)} s bin; Poisson 1): {_num(r.dispersion)}"
            + (
                "; inter-arrival cv " + _num(r.interarrival_cv)
                if r.interarrival_cv is not None
                else f"; {r.interarrival_note}"
                if r.interarrival_note
                else ""
            )
        )
        if r.concurrency_mean is not None:
            out.append(
                f"  concurrency: mean {r.concurrency_mean:.1f}"
                + (f", peak {r.concurrency_peak}" if r.concurrency_peak is not None else "")
                + f" ({r.concurrency_source})"
            )
    p = a.prefix_reuse
    if p is None:
        out.append(f"prefix reuse: not measured ({a.not_measured.get('prefix_reuse', '')})")
    else:
        out.append(
            f"prefix reuse (blocks of {p.block_size}): an unlimited cache serves {_pct(p.token_fraction)} of "
            f"prompt tokens; {_pct(p.requests_with_hit_fraction)} of requests hit"
        )
        if p.lru_token_fraction is not None:
            out.append(
                f"  an LRU cache of {p.capacity_tokens} tokens serves {_pct(p.lru_token_fraction)} "
                f"(gap {_pct(p.capacity_gap)})"
            )
        out.append(
            f"  multi-turn: {_pct(p.continuation_requests_fraction)} of requests extend an earlier prompt; "
            f"{_pct(p.history_token_fraction)} of prompt tokens are re-sent history"
        )
        for g in p.top_groups[:5]:
            out.append(
                f"  shared prefix {g.prefix_hash}: {g.shared_tokens} tokens, reused by {g.requests} requests "
                f"({_pct(g.share)})"
            )
    s = a.similarity
    if s is not None:
        out.append(
            f"similar content: {_pct(s.seen_fraction)} of prompt content repeats earlier prompts; "
            f"{_pct(s.dynamic_fraction)} comes after a divergence, out of the prefix cache's reach"
        )
    if a.serialization is not None and a.serialization.payloads:
        z = a.serialization
        out.append(
            f"JSON payloads: {z.payloads} in {z.requests_with_payloads} requests; "
            f"{z.unstable_requests} requests reorder keys of an earlier payload"
        )
    if thresholds.overridden:
        out.append(f"findings judged with thresholds from {thresholds.source}")
    for f in findings:
        out.append(f"[{f.severity}] {f.id}: {f.message}")
        if f.fix:
            out.append(f"  fix: {f.fix}")
    for w in a.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out) + "\n"
