"""`llm-diagnose run --url URL --out DIR`: attach to a live server, measure, diagnose."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.collect import RunPlan, run_target
from llm_diagnose.diagnose.commands.common import (
    add_slo_flags,
    add_trace_flags,
    add_workload_flags,
    declared_facts,
    load_slo,
    load_thresholds,
)
from llm_diagnose.diagnose.errors import ExitCode, UsageError
from llm_diagnose.diagnose.runfolder import METRICS, out_path, prepare_out_dir

# The help names them. (Importing this module loads the probes.experiments package, HTTP client
# included, until that package's __init__ imports its submodules lazily.)
from llm_diagnose.probes.experiments.plan import ALL_EXPERIMENTS

if TYPE_CHECKING:
    from llm_diagnose.probes.metrics.window import ScrapeRecord

EXAMPLE = """example:
  llm-diagnose run --url http://127.0.0.1:8000 --duration 60 --out runs/staging
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/staging-active --active \\
      --budget-requests 150 --budget-seconds 60
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/after --active --replay runs/staging-active
  llm-diagnose run --url http://10.0.0.7:8000 --duration 300 --interval 5 --out runs/prod-a --offline
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/chat --slo itl:p99:100ms --slo ttft:p99:2s"""


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="attach to a live server, measure, diagnose",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Scrape the server's /metrics over a window (passive: no inference request is sent), "
        "discover its configuration, read GPU memory where a driver exists, and diagnose.",
    )
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        help="where the metrics are, when not at URL/metrics (e.g. the PyTorch probe's side port "
        "http://127.0.0.1:9478/metrics)",
    )
    p.add_argument("--out", required=True, type=out_path, help="run folder (raw samples are written as taken)")
    p.add_argument("--duration", type=float, default=30.0, metavar="SECONDS", help="observation window (default 30)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="scrape interval (default 1)")
    p.add_argument("--thresholds", metavar="FILE", help="TOML file overriding named thresholds (and its [slo] table)")
    active = p.add_argument_group("active probing (opt-in: sends real requests, within a hard budget)")
    active.add_argument(
        "--active",
        action="store_true",
        help="also run the experiments (decode latency, interference, heterogeneity, prefix, spec)",
    )
    active.add_argument(
        "--budget-requests", type=int, default=200, metavar="N", help="at most N requests (default 200)"
    )
    active.add_argument(
        "--budget-seconds", type=float, default=60.0, metavar="S", help="at most S seconds of load (default 60)"
    )
    active.add_argument("--max-rps", type=float, metavar="R", help="at most R request starts per second")
    active.add_argument(
        "--experiments",
        metavar="LIST",
        help=f"comma-separated subset of {','.join(ALL_EXPERIMENTS)} (default: all)",
    )
    active.add_argument(
        "--replay",
        metavar="SOURCE",
        type=Path,
        help="instead of the experiments, send an earlier run's requests in its pattern: its folder, its "
        "inputs.jsonl (the exact bodies), its requests.jsonl (the same lengths), or a trace file; "
        "within the budget (with --active; not with --experiments)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    add_workload_flags(p)
    add_slo_flags(p)
    add_trace_flags(p)
    p.set_defaults(func=run)


class Progress:
    """One status line per scrape on a terminal; a line every 10 scrapes otherwise."""

    def __init__(self, planned: int, stream=sys.stderr) -> None:
        self.planned = planned
        self.stream = stream
        self.tty = stream.isatty()

    def __call__(self, record: ScrapeRecord, index: int) -> None:
        state = "ok" if record.ok else f"failed ({record.error})"
        line = f"[{index + 1}/{self.planned}] scrape {state}"
        if self.tty:
            self.stream.write("\r" + line[:100].ljust(100))
            if index + 1 >= self.planned:
                self.stream.write("\n")
        elif index % 10 == 0 or not record.ok:
            self.stream.write(line + "\n")
        self.stream.flush()


def _budget(args: argparse.Namespace):
    from llm_diagnose.probes.load.budget import ActiveBudget

    try:
        return ActiveBudget(max_requests=args.budget_requests, max_seconds=args.budget_seconds, max_rps=args.max_rps)
    except ValueError as exc:
        raise UsageError(f"active budget: {exc}") from None


def _read_replay(args: argparse.Namespace):
    """The --replay source, read before anything is sent or written; bad input is a usage error.

    --replay with --experiments is refused rather than one of them ignored: they ask for different
    traffic, and a replay meant to be comparable must not quietly become something else.
    """
    from llm_diagnose.probes.load.replay_inputs import ReplayError, read_replay_source

    if not args.active:
        raise UsageError("--replay sends requests: add --active (and a budget) to allow it")
    if args.experiments is not None:
        raise UsageError("--replay sends the recorded requests instead of the experiments: drop --experiments")
    budget = _budget(args)
    try:
        return read_replay_source(args.replay, trace_limit=budget.max_requests)
    except ReplayError as exc:
        raise UsageError(str(exc)) from None


def _replay_hook(args: argparse.Namespace, source):
    """Plan the replay (one GET /v1/models for the served model), say what will be sent, return the sender."""
    from llm_diagnose.probes.experiments import discover_model
    from llm_diagnose.probes.http import ProbeHTTPError, make_session, normalize_base_url
    from llm_diagnose.probes.load.replay_inputs import plan_replay, run_replay

    budget = _budget(args)

    async def served() -> str | None:
        async with make_session() as session:
            try:
                return (await discover_model(session, normalize_base_url(args.url)))[0]
            except ProbeHTTPError:
                return None  # run_target meets the same failure and says so

    plan = plan_replay(source, budget, asyncio.run(served()))
    print(f"llm-diagnose: --active will send, {budget.describe()}:\n{plan.describe()}", file=sys.stderr)

    async def active(base_url, found, run_dir):
        return await run_replay(base_url, plan, budget, run_dir)

    return active


def _active_hook(args: argparse.Namespace):
    """Plan the experiments, say what will be sent, and return the coroutine that sends it."""
    from llm_diagnose.probes.experiments import describe_plan, prepare_plan, run_experiments

    listed = ",".join(ALL_EXPERIMENTS) if args.experiments is None else args.experiments
    chosen = tuple(e.strip() for e in listed.split(",") if e.strip())
    unknown = sorted(set(chosen) - set(ALL_EXPERIMENTS))
    if unknown or not chosen:
        raise UsageError(
            f"--experiments: unknown {', '.join(unknown) or '(none given)'}; choose from {','.join(ALL_EXPERIMENTS)}"
        )
    budget = _budget(args)
    plan = asyncio.run(prepare_plan(args.url, None, budget, chosen))  # GET /v1/models only
    print(f"llm-diagnose: --active will send, {budget.describe()}:\n{describe_plan(plan)}", file=sys.stderr)

    async def active(base_url, found, run_dir):
        return await run_experiments(base_url, found.model, budget, run_dir, plan=plan, metrics_url=found.metrics_url)

    return active


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.report import console

    if args.duration <= 0 or args.interval <= 0:
        raise UsageError("--duration and --interval must be positive numbers of seconds")
    if args.interval > args.duration:
        raise UsageError(f"--interval ({args.interval:g} s) is longer than --duration ({args.duration:g} s)")
    thresholds, slo = load_thresholds(args.thresholds), load_slo(args)  # before the target is touched
    replay = _read_replay(args) if args.replay is not None else None  # bad input: nothing sent
    prepare_out_dir(args.out)  # an unusable --out fails now, not after the window
    if replay is not None:
        active = _replay_hook(args, replay)
    else:
        active = _active_hook(args) if args.active else None
    duration = max(args.duration, args.budget_seconds) if active else args.duration  # watch the whole load
    plan = RunPlan(
        url=args.url,
        out_dir=args.out,
        duration_s=duration,
        interval_s=args.interval,
        thresholds=thresholds,
        slo=slo,
        extra_items=declared_facts(args),
        metrics_url=args.metrics_url,
        trace=args.trace,
        trace_format=args.trace_format,
        block_size=args.block_size,
        kv_capacity_tokens=args.kv_capacity_tokens,
    )
    planned = int(duration // args.interval) + 1
    if not args.quiet:
        mode = "active: the requests above, within the budget" if active else "passive: no requests sent"
        print(
            f"llm-diagnose: watching {args.url} for {duration:g} s ({mode}); raw scrapes -> {args.out}/metrics.jsonl",
            file=sys.stderr,
        )
    try:
        result = run_target(plan, on_sample=None if args.quiet else Progress(planned), active=active)
    except KeyboardInterrupt:
        print(
            f"\nllm-diagnose: interrupted; the scrapes taken so far are in {args.out / METRICS}: diagnose them "
            f"with `llm-diagnose decide {args.out}` (or report/gate on the folder)",
            file=sys.stderr,
        )
        return ExitCode.INTERRUPTED
    sys.stdout.write(console.render(result.diagnosis, result.evidence, verbose=False))
    print(f"\nrun folder: {result.out_dir} (evidence.json, diagnosis.json, summary.txt, metrics.jsonl)")
    if result.restarts:
        print(
            f"llm-diagnose: the server restarted during the window ({len(result.restarts)} time(s)); "
            f"see {args.out}/summary.txt",
            file=sys.stderr,
        )
    if result.partial:
        print(
            f"llm-diagnose: error: partial run: {result.partial}; the diagnosis covers what was measured",
            file=sys.stderr,
        )
        return ExitCode.PARTIAL
    return ExitCode.OK
