"""`llm-diagnose plan`: how many replicas (and GPUs) a workload needs at a target rate, today
and after each recommended technique, from a measured model of this server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.commands.common import (
    add_slo_flags,
    dumps,
    evidence_path,
    load_evidence,
    load_slo,
    load_thresholds,
)
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.runfolder import CAPACITY_PLAN as PLAN_FILE  # the report of --out shows the plan
from llm_diagnose.diagnose.runfolder import REQUESTS, out_path, prepare_out_dir, write_atomic

if TYPE_CHECKING:
    from llm_diagnose.diagnose.capacity import CapacityPlan
    from llm_diagnose.diagnose.capacity.live import LiveGoodput

__all__ = ["register", "run", "PLAN_FILE", "plan_from_args"]

SEARCH_SPAN = 3.0  # the live search brackets the predicted goodput: [g / 3, g x 3] (--search-span)
MAX_TRACE_REQUESTS = 2000  # the simulated workload: the trace's first requests

EXAMPLE = """example:
  llm-diagnose plan --evidence runs/staging --trace requests.jsonl --target-rps 40 --slo ttft:p99:2s --slo itl:p50:50ms
  llm-diagnose plan --evidence runs/staging --trace mooncake.jsonl --target-rps 40 --slo e2e:p90:5s --json
  llm-diagnose plan --evidence runs/staging --trace t.jsonl --target-rps 40 --slo ttft:p90:1s --out runs/staging \\
      --active --url http://127.0.0.1:8000 --budget-requests 150 --budget-seconds 90   # measured beside predicted"""


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="replicas and GPUs needed for a target rate (capacity planning)",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fit a performance model of the server to its recorded requests, predict the "
        "goodput (highest rate meeting the SLO) of one replica for the workload, and say "
        "how many replicas and GPUs the target rate needs, today and after each "
        "recommended technique. A latency SLO is required: goodput is defined by it.",
    )
    p.add_argument(
        "--evidence",
        required=True,
        metavar="DIR|FILE",
        help="a run folder (with requests.jsonl from an active run) or its evidence.json",
    )
    p.add_argument("--trace", required=True, type=Path, metavar="FILE", help="the workload, as a request trace")
    p.add_argument("--trace-format", default="auto", metavar="FORMAT", help="trace format (default: auto)")
    p.add_argument("--target-rps", required=True, type=float, metavar="R", help="the request rate to plan for")
    p.add_argument("--thresholds", metavar="FILE", help="TOML thresholds for the diagnosis (and its [slo] table)")
    p.add_argument(
        "--max-batched-tokens",
        type=int,
        metavar="N",
        help="the server's max_num_batched_tokens (default: vLLM's 2048, stated as an assumption)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--out", type=out_path, metavar="DIR", help=f"write {PLAN_FILE} (and the search's requests) here")
    active = p.add_argument_group("measured goodput (opt-in: sends real requests, within a hard budget)")
    active.add_argument("--active", action="store_true", help="also search the goodput against the live server")
    active.add_argument("--url", help="the server's base URL (with --active)")
    active.add_argument("--budget-requests", type=int, default=150, metavar="N", help="at most N requests (150)")
    active.add_argument("--budget-seconds", type=float, default=90.0, metavar="S", help="at most S seconds (90)")
    active.add_argument("--max-rps", type=float, metavar="R", help="never search above R requests/s")
    active.add_argument("--trial-requests", type=int, default=40, metavar="N", help="requests per rate trial (40)")
    active.add_argument("--search-steps", type=int, default=3, metavar="N", help="bisection steps after both ends (3)")
    active.add_argument(
        "--search-span",
        type=float,
        default=SEARCH_SPAN,
        metavar="X",
        help=f"search from the predicted goodput / X to x X ({SEARCH_SPAN:g}); wider where the model "
        "is known to be rough",
    )
    add_slo_flags(p)
    p.set_defaults(func=run)


def _records_beside(evidence_arg: str) -> list:
    from llm_diagnose.probes.load.records import read_records

    path = evidence_path(evidence_arg).parent / REQUESTS
    return list(read_records(path)) if path.exists() else []


def plan_from_args(args: argparse.Namespace) -> CapacityPlan:
    from llm_diagnose.diagnose.capacity import ModelError, items_from_trace, plan_capacity
    from llm_diagnose.diagnose.capacity.inputs import (
        fit_and_validate,
        limits_from_evidence,
        reuse_from_evidence,
        tensor_parallel_from_evidence,
    )
    from llm_diagnose.diagnose.tree import diagnose

    slo = load_slo(args)
    if not slo.latency_bound:
        raise UsageError(
            "plan needs a latency SLO: give --slo METRIC:pNN:LIMIT (e.g. --slo ttft:p99:2s) or an [slo] "
            "table in --thresholds; goodput is the highest rate at which it holds"
        )
    if not args.target_rps > 0:
        raise UsageError("--target-rps must be a positive number of requests per second")
    evidence = load_evidence(args.evidence)
    diagnosis = diagnose(evidence, load_thresholds(args.thresholds), slo=slo)
    limits = limits_from_evidence(evidence, max_batched_tokens=args.max_batched_tokens)
    tp, tp_source = tensor_parallel_from_evidence(evidence)
    trace = _load_trace(args.trace, args.trace_format)
    max_len = evidence.fact("engine.max_model_len")
    items = items_from_trace(
        trace[:MAX_TRACE_REQUESTS], limits.block_size, max_model_len=max_len if isinstance(max_len, int) else None
    )
    notes = [f"workload: the first {len(items)} requests of {args.trace}"]
    records = _records_beside(args.evidence)
    model = validation = None
    if records:
        try:
            fitted = fit_and_validate(records, limits, source=str(evidence_path(args.evidence).parent / REQUESTS))
            model, validation = fitted.model, fitted.validation
            notes.append(
                f"model error measured by fitting {fitted.fitted_on} recorded requests and replaying "
                f"{fitted.held_back} held back; the plan's model is refitted on all of them"
            )
        except ModelError as exc:
            notes.append(f"the recorded requests could not be fitted: {exc}")
    measured = None
    if args.active:
        live = _search_live(args, trace, items, limits, slo, model)
        model, validation, measured = live.model, live.validation, live.measured
        notes.extend(live.notes)
    if model is None:
        raise UsageError(
            "no measured model: the run folder has no requests.jsonl with enough completed requests. "
            "Record some with `llm-diagnose run --active`, or add --active --url URL here"
        )
    techniques = [r.technique for r in diagnosis.recommended]
    reuse, reuse_key = reuse_from_evidence(evidence)
    try:
        return plan_capacity(
            items,
            model,
            limits,
            slo,
            args.target_rps,
            tensor_parallel=tp,
            tensor_parallel_source=tp_source,
            techniques=techniques,
            reuse_fraction=reuse,
            reuse_source=reuse_key,
            validation=validation,
            measured=measured,
            workload=f"{args.trace} ({len(items)} requests)",
            notes=notes,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _load_trace(path: Path, fmt: str) -> tuple:
    from llm_diagnose.probes.load.replay import load_trace
    from llm_diagnose.probes.traces import TraceFormatError

    try:
        trace = load_trace(path, None if fmt == "auto" else fmt, limit=MAX_TRACE_REQUESTS)
    except (TraceFormatError, OSError) as exc:
        raise UsageError(f"--trace {path}: {exc}") from None
    if not trace:
        raise UsageError(f"--trace {path}: no request could be read from it")
    return trace


def _search_live(args: argparse.Namespace, trace, items, limits, slo, model) -> LiveGoodput:
    """`--active`: the live goodput search (llm_diagnose.diagnose.capacity.live), said before it is sent."""
    from llm_diagnose.diagnose.capacity.live import plan_live_search, run_live_search
    from llm_diagnose.probes.load.budget import ActiveBudget

    if not args.url:
        raise UsageError("--active needs --url: the server to measure")
    try:
        budget = ActiveBudget(args.budget_requests, args.budget_seconds, args.max_rps)
    except ValueError as exc:
        raise UsageError(f"budget: {exc}") from None
    search = plan_live_search(
        trace,
        items,
        limits,
        slo,
        model,
        budget,
        trial_requests=args.trial_requests,
        steps=args.search_steps,
        span=args.search_span,
    )
    print(search.describe(args.url), file=sys.stderr)
    return run_live_search(args.url, search, requests_out=None if args.out is None else args.out / REQUESTS)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.report.capacity import console_text

    if args.out is not None:
        prepare_out_dir(args.out, files=(PLAN_FILE, REQUESTS))  # before the search
    plan = plan_from_args(args)
    data = plan.to_dict()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out / PLAN_FILE, dumps(data))
        print(f"llm-diagnose: wrote {args.out / PLAN_FILE}", file=sys.stderr)
    sys.stdout.write(dumps(data) if args.json else console_text(data))
    return 0
