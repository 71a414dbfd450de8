"""`llm-diagnose demo`: the embedded default, a real local vLLM diagnosed end to end.

It makes the tiny model (no download), starts a real vLLM CPU server on 127.0.0.1, plays a
small shared-prefix workload against it (its own users, nobody else's server), scrapes and
diagnoses it exactly as `run` would, adds the workload's own trace analysis, prints the
diagnosis and the run folder, and stops the server.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from llm_diagnose.diagnose.commands.common import add_slo_flags, load_slo
from llm_diagnose.diagnose.errors import ExitCode, TargetError, UsageError
from llm_diagnose.diagnose.runfolder import REQUESTS, out_path, prepare_out_dir
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Provenance

EXAMPLE = """example:
  llm-diagnose demo                       # run folder under ./runs/demo-<time>
  llm-diagnose demo --out runs/demo --duration 25
  llm-diagnose demo --slo itl:p99:50ms     # judge the chat workload against an SLO (default: none declared)"""


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="diagnose a real local vLLM running a tiny model (the embedded default)",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--out", type=out_path, help="run folder (default: runs/demo-<timestamp>)")
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path(".cache/demo"),
        help="where the tiny model and the server's caches live (default .cache/demo)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=25.0,
        metavar="SECONDS",
        help="observation window while the workload runs (default 25)",
    )
    p.add_argument("--requests", type=int, default=96, help="requests the demo workload sends (default 96)")
    # The chat workload is declared interactive; no latency objective is declared by default:
    # a 1.45 M-parameter model on CPU says nothing about a real service's targets, so Q5 uses
    # the fixed q5 thresholds unless --slo gives one.
    add_slo_flags(p)
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"llm-diagnose demo: {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.collect import RunPlan, run_target
    from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model
    from llm_diagnose.diagnose.demo.vllm_server import VllmServer, vllm_available
    from llm_diagnose.diagnose.demo.workload import DemoWorkload
    from llm_diagnose.diagnose.report import console

    ok, why = vllm_available()
    if not ok:
        raise UsageError(f"the demo needs vLLM in this Python ({why}): run `make demo`, which installs it")
    if args.requests < 1 or args.duration <= 0:
        raise UsageError("--requests and --duration must be positive")
    slo = load_slo(args)
    out = prepare_out_dir(args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))
    workdir = args.workdir.resolve()
    _say(f"making the tiny model in {workdir / 'model'}")
    model_dir = make_tiny_model(workdir / "model")
    # Arrivals spread over most of the window, leaving a few scrapes for the tail to finish.
    workload = DemoWorkload(requests=args.requests, spread_s=max(1.0, args.duration - 5.0))
    out.mkdir(parents=True, exist_ok=True)
    trace = workload.write_trace(out / "workload.jsonl")
    _say("starting a real vLLM CPU server on 127.0.0.1 (about 30-60 s)")
    with VllmServer(model_dir, workdir / "server") as server:
        _say(
            f"server ready at {server.url}; sending {args.requests} requests with a shared system prompt "
            f"({workload.concurrency} at a time) while scraping /metrics for {args.duration:g} s"
        )

        sent: list[tuple[int, int]] = []

        async def drive(base_url, found, run_dir):
            sent.append(await workload.drive(base_url, server.model_name, run_dir / REQUESTS))
            return {}

        plan = RunPlan(
            url=server.url,
            out_dir=out,
            duration_s=args.duration,
            interval_s=1.0,
            trace=trace,
            trace_format="prompts",
            slo=slo,
            extra_items={Q.INTERACTIVE: Fact(True, Provenance("declared", "the demo's chat workload"))},
        )
        result = run_target(plan, active=drive)
    completed, failed = sent[0]
    if completed == 0:
        raise TargetError(
            f"none of the demo's {failed} requests completed (see {out / REQUESTS} and the "
            f"server log {server.log_path})"
        )
    _say(f"{completed} requests completed, {failed} failed")
    sys.stdout.write(console.render(result.diagnosis, result.evidence))
    print(f"\nrun folder: {out} (evidence.json, diagnosis.json, summary.txt, metrics.jsonl, workload.jsonl)")
    print(f"re-diagnose offline: llm-diagnose decide {out}")
    return ExitCode.PARTIAL if result.partial else ExitCode.OK
