"""`llm-diagnose decide EVIDENCE.json`: diagnose saved evidence offline."""

from __future__ import annotations

import argparse
import sys

from llm_diagnose.diagnose.commands.common import (
    add_slo_flags,
    add_trace_flags,
    add_workload_flags,
    declared_facts,
    join_evidence,
    load_evidence,
    load_slo,
    load_thresholds,
)

EXAMPLE = """example:
  llm-diagnose decide runs/staging/evidence.json --thresholds slo.toml
  llm-diagnose decide runs/staging --slo itl:p99:100ms --slo ttft:p99:2s
  llm-diagnose decide runs/staging runs/mb   (joined with a microbench: Q5 sets the served time per token
                                             against the decode step)
  llm-diagnose decide runs/staging --json | jq '.recommendations[] | select(.status=="recommended")'"""


def register(sub) -> None:
    p = sub.add_parser(
        "decide",
        help="diagnose saved evidence (offline)",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Answer the six questions from an evidence file and print the diagnosis.",
    )
    p.add_argument("evidence", help="evidence.json, or a run folder holding one")
    p.add_argument(
        "more",
        nargs="*",
        metavar="MICROBENCH",
        help="evidence to join with it, e.g. `llm-diagnose microbench --out`'s: each item keeps its provenance; "
        "a key both hold keeps the run's, except the microbenchmark's own (decode.step_latency_*, machine.*, ...)",
    )
    p.add_argument("--thresholds", metavar="FILE", help="TOML file overriding named thresholds (and its [slo] table)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--brief", action="store_true", help="verdict and recommendations only")
    add_workload_flags(p)
    add_slo_flags(p)
    add_trace_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.collect import trace_items_for
    from llm_diagnose.diagnose.report import console
    from llm_diagnose.diagnose.tree import diagnose

    evidence = load_evidence(args.evidence)
    for more in args.more:
        evidence = join_evidence(evidence, load_evidence(more))
    thresholds, slo = load_thresholds(args.thresholds), load_slo(args)  # bad flags fail before any work
    extra = {
        **trace_items_for(
            evidence.items,
            args.trace,
            args.trace_format,
            block_size=args.block_size,
            kv_capacity_tokens=args.kv_capacity_tokens,
        ),
        **declared_facts(args),
    }
    if extra:
        evidence = evidence.with_items(extra)
    diagnosis = diagnose(evidence, thresholds, slo=slo)
    if args.json:
        sys.stdout.write(diagnosis.to_json())
    else:
        sys.stdout.write(console.render(diagnosis, evidence, verbose=not args.brief))
    return 0
