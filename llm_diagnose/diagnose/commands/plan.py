"""`llm-diagnose plan`: how many replicas (and GPUs) a workload needs at a target rate, today
and after each recommended technique, from a measured model of this server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.commands import argtypes
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
from llm_diagnose.diagnose.runfolder import REQUESTS, out_path, prepare_out_dir, read_requests, write_atomic
from llm_diagnose.diagnose.text.control_chars import escape_controls

if TYPE_CHECKING:
    from llm_diagnose.diagnose.capacity import CapacityPlan
    from llm_diagnose.diagnose.capacity.live import LiveGoodput

__all__ = ["register", "run", "PLAN_FILE", "plan_from_args"]

SEARCH_SPAN = 2.0  # the live search's factor up from its start until the SLO breaks (--search-span)
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
    p.add_argument(
        "--target-rps",
        required=True,
        type=argtypes.RATE,
        metavar="R",
        help=f"the request rate to plan for (at most {argtypes.MAX_RATE_RPS:,.0f})",
    )
    p.add_argument("--thresholds", metavar="FILE", help="TOML thresholds for the diagnosis (and its [slo] table)")
    p.add_argument(
        "--max-batched-tokens",
        type=argtypes.TOKENS,
        metavar="N",
        help="the server's max_num_batched_tokens (default: vLLM's 2048, stated as an assumption)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--out", type=out_path, metavar="DIR", help=f"write {PLAN_FILE} (and the search's requests) here")
    active = p.add_argument_group("measured goodput (opt-in: sends real requests, within a hard budget)")
    active.add_argument("--active", action="store_true", help="also search the goodput against the live server")
    active.add_argument("--url", help="the server's base URL (with --active)")
    active.add_argument(
        "--budget-requests", type=argtypes.REQUESTS, default=150, metavar="N", help="at most N requests (150)"
    )
    active.add_argument(
        "--budget-seconds", type=argtypes.LOAD_SECONDS, default=90.0, metavar="S", help="at most S seconds (90)"
    )
    active.add_argument("--max-rps", type=argtypes.RATE, metavar="R", help="never search above R requests/s")
    active.add_argument(
        "--allow-busy-target",
        action="store_true",
        help="run the search even where the server already serves other clients (it pushes the server past its "
        "SLO, for them too); without it --active refuses such a server",
    )
    active.add_argument(
        "--trial-requests", type=argtypes.REQUESTS, default=40, metavar="N", help="requests per rate trial (40)"
    )
    active.add_argument(
        "--search-steps",
        type=argtypes.count(0, argtypes.MAX_SEARCH_STEPS, what="bisection steps"),
        default=3,
        metavar="N",
        help="bisection steps after the SLO first breaks (3)",
    )
    active.add_argument(
        "--search-span",
        type=argtypes.number_above(1.0, argtypes.MAX_SEARCH_SPAN, what="the span factor"),
        default=SEARCH_SPAN,
        metavar="X",
        help=f"the live search multiplies the rate by X from its start until the SLO breaks ({SEARCH_SPAN:g}), "
        "then bisects",
    )
    add_slo_flags(p)
    p.set_defaults(func=run)


def _records_beside(evidence_arg: str) -> tuple[list, str]:
    """The request records of the evidence's run folder (runfolder.read_requests: unreadable lines
    skipped and counted, a file of another schema refused, exit 2), and a note of what was skipped."""
    read = read_requests(evidence_path(evidence_arg).parent)
    if read is None:
        return [], ""
    records, lines = read
    return list(records), lines.describe() if lines.skipped else ""


def plan_from_args(args: argparse.Namespace) -> CapacityPlan:
    from llm_diagnose.diagnose.capacity import ModelError, items_from_trace, plan_capacity
    from llm_diagnose.diagnose.capacity.goodput import text_tokens
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
    if approximated := text_tokens(trace[:MAX_TRACE_REQUESTS]):
        notes.append(
            f"{approximated} prompts of the trace are text without a stated length: their tokens are approximated "
            "(the trace analysis's word-piece count); with --active the server's counts replace them"
        )
    records, skipped = _records_beside(args.evidence)
    if skipped:
        notes.append(skipped)
        print(f"llm-diagnose: {skipped}", file=sys.stderr)
    model = validation = None
    if records:
        try:
            fitted = fit_and_validate(records, limits, source=str(evidence_path(args.evidence).parent / REQUESTS))
            model, validation = fitted.model, fitted.validation
            notes.append(
                f"model error measured by fitting {fitted.fitted_on} recorded requests and replaying "
                f"{fitted.held_back} held back; "
                + (
                    "that model, refitted on all of them, is the one the live search is set against"
                    if args.active
                    else "the plan's model is refitted on all of them"
                )
            )
        except ModelError as exc:
            notes.append(f"the recorded requests could not be fitted: {exc}")
    measured = None
    if args.active:
        if not args.url:
            raise UsageError("--active needs --url: the server to measure")
        busy = _refuse_busy_target(args)
        live = _search_live(args, trace, items, limits, slo, model, records)
        model, validation, measured, items = live.model, live.validation, live.measured, list(live.items)
        notes.extend(live.notes)
        if busy:
            notes.append(busy)
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
    from llm_diagnose.probes.traces import EmptyTraceError, TraceError

    try:
        trace = load_trace(path, None if fmt == "auto" else fmt, limit=MAX_TRACE_REQUESTS)
    except EmptyTraceError as exc:  # its message names the file
        raise UsageError(f"--trace {exc}: a plan needs a trace of at least one request") from None
    except TraceError as exc:  # its message names the file (and the line)
        raise UsageError(f"--trace {exc}") from None
    except OSError as exc:
        raise UsageError(f"--trace {path}: {exc.strerror or exc}") from None
    if not trace:
        raise UsageError(f"--trace {path}: no request could be read from it: a plan needs at least one")
    return trace


def _refuse_busy_target(args: argparse.Namespace) -> str:
    """The production guard of `--active`: a load test on a server that already serves other
    clients (its running or waiting requests before anything is sent) is refused unless
    --allow-busy-target; allowed, the plan's notes say so. A load that cannot be read is said and
    the search goes on (the search meets an unreachable server itself). Returns the plan's note."""
    from llm_diagnose.probes.metrics.load_at_start import server_load_before_sending

    load = server_load_before_sending(args.url)
    if not load.busy:
        if load.requests is None:
            print(escape_controls(f"llm-diagnose: note: {load.describe()}"), file=sys.stderr)
        return ""
    if not args.allow_busy_target:
        raise UsageError(
            f"--active: {load.headline()}; the goodput search pushes it past its SLO, for them too: run it on a "
            "server that serves no one else, or add --allow-busy-target"
        )
    print(escape_controls(f"llm-diagnose: warning: {load.describe()} (--allow-busy-target)"), file=sys.stderr)
    return (
        f"the server was already serving {load.count_words()} of other clients when the search started "
        "(--allow-busy-target): the measured goodput is what was left beside them"
    )


def _search_live(args: argparse.Namespace, trace, items, limits, slo, model, records) -> LiveGoodput:
    """`--active`: the live goodput search (llm_diagnose.diagnose.capacity.live), said before it is sent."""
    from llm_diagnose.diagnose.capacity.live import plan_live_search, run_live_search
    from llm_diagnose.probes.http import redact_url
    from llm_diagnose.probes.load.budget import ActiveBudget

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
        factor=args.search_span,
        records=records,
    )
    print(search.describe(redact_url(args.url)), file=sys.stderr)
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
