"""`llm-diagnose demo`: the embedded default, a bottleneck found, fixed and proven on a real vLLM.

It makes the tiny model (no download) and starts a real vLLM CPU server on 127.0.0.1 with a
realistic misconfiguration: prefix caching off, while its users (the demo's own workload,
nobody else's server) all send the same long system prompt. It scrapes and diagnoses the server
exactly as `run` would (with the workload's own trace analysis), restarts it with the setting
the diagnosis recommends, plays the same workload again, and prints `verify`'s table: each
promised effect before and after, with its interval and verdict. Run folders: OUT/before and
OUT/after.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.commands.common import add_slo_flags, load_slo
from llm_diagnose.diagnose.errors import ExitCode, TargetError, UsageError
from llm_diagnose.diagnose.runfolder import REQUESTS, out_path, prepare_out_dir
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Provenance

# The misconfiguration the demo starts with, and the fix the diagnosis is expected to find: a
# shared system prompt of six 128-token blocks on a server without prefix caching.
MISCONFIGURATION = "prefix caching off"
FIX_TECHNIQUE = "prefix-caching"
FIX_FLAG = "--enable-prefix-caching"

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
        type=argtypes.WINDOW_SECONDS,
        default=25.0,
        metavar="SECONDS",
        help="observation window while the workload runs (default 25)",
    )
    p.add_argument(
        "--requests", type=argtypes.REQUESTS, default=96, help="requests the demo workload sends (default 96)"
    )
    # The chat workload is declared interactive; no latency objective is declared by default:
    # a 1.45 M-parameter model on CPU says nothing about a real service's targets, so Q5 uses
    # the fixed q5 thresholds unless --slo gives one.
    add_slo_flags(p)
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"llm-diagnose demo: {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """The whole story: a misconfigured server diagnosed, fixed as recommended, and the fix proven."""
    from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model
    from llm_diagnose.diagnose.demo.vllm_server import vllm_available
    from llm_diagnose.diagnose.demo.workload import DemoWorkload
    from llm_diagnose.diagnose.report import console

    ok, why = vllm_available()
    if not ok:
        raise UsageError(f"the demo needs vLLM in this Python ({why}): run `make demo`, which installs it")
    slo = load_slo(args)
    out = prepare_out_dir(args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))
    before_dir, after_dir = prepare_out_dir(out / "before"), prepare_out_dir(out / "after")
    workdir = args.workdir.resolve()
    _say(f"making the tiny model in {workdir / 'model'}")
    model_dir = make_tiny_model(workdir / "model")
    # Arrivals spread over most of the window, leaving a few scrapes for the tail to finish. The
    # same seeded workload runs before and after: the same requests in the same pattern.
    workload = DemoWorkload(requests=args.requests, spread_s=max(1.0, args.duration - 5.0))

    _say(f"1/3 {MISCONFIGURATION}: the server runs without it, the workload shares a long system prompt")
    before = _observe(model_dir, workdir, before_dir, workload, args, slo, prefix_caching=False)
    sys.stdout.write(console.render(before.diagnosis, before.evidence))
    fix = next((r for r in before.diagnosis.recommendations if r.technique == FIX_TECHNIQUE), None)
    if fix is None or fix.status != "recommended":
        print(f"\nthe diagnosis did not recommend {FIX_TECHNIQUE} ({fix.status if fix else 'absent'}): "
              f"nothing to fix and verify; run folder: {before_dir}")  # fmt: skip
        return ExitCode.PARTIAL if before.partial else ExitCode.OK
    print(f"\nThe diagnosis recommends {FIX_TECHNIQUE}: vllm {FIX_FLAG}. Restarting the server with it.")

    _say(f"2/3 the same workload again, on a server started with {FIX_FLAG}")
    after = _observe(model_dir, workdir, after_dir, workload, args, slo, prefix_caching=True)

    _say("3/3 verify: did the change deliver what the diagnosis promised?")
    from llm_diagnose.diagnose.report.html_pair import PairSide, render_pair
    from llm_diagnose.diagnose.runfolder import RunFolder, write_output
    from llm_diagnose.diagnose.verify.judge import RunSide, verify
    from llm_diagnose.diagnose.verify.render import render_text

    folders = RunFolder.load(before_dir), RunFolder.load(after_dir)
    result = verify(
        RunSide.of(folders[0], before.diagnosis),
        RunSide.of(folders[1], after.diagnosis),
        change_note=f"server restarted with {FIX_FLAG}, as recommended",
    )
    print()
    sys.stdout.write(render_text(result))
    page = out / "before-after.html"
    write_output(
        page, render_pair(PairSide(before.diagnosis, folders[0]), PairSide(after.diagnosis, folders[1]), result)
    )
    print(f"\nrun folders: {before_dir} (before), {after_dir} (after); both side by side: {page}")
    print(f"again, offline: llm-diagnose verify {before_dir} {after_dir}")
    return ExitCode.PARTIAL if (before.partial or after.partial) else result.exit_code()


def _observe(model_dir, workdir, out, workload, args, slo, *, prefix_caching: bool):
    """Start the tiny vLLM, drive the workload while scraping, diagnose; the RunResult."""
    from llm_diagnose.diagnose.collect import RunPlan, run_target
    from llm_diagnose.diagnose.demo.vllm_server import VllmServer
    from llm_diagnose.diagnose.demo.workload import WARM_UP_REQUESTS

    trace = workload.write_trace(out / "workload.jsonl")
    _say("starting a real vLLM CPU server on 127.0.0.1 (about 30-60 s)")
    with VllmServer(model_dir, workdir / "server", prefix_caching=prefix_caching) as server:
        _say(f"server ready at {server.url}; warming it up: {WARM_UP_REQUESTS} unrecorded requests, no shared prefix")
        if not workload.warm_up(server.url, server.model_name, workdir / "warm-up-requests.jsonl"):
            raise TargetError(f"the server answered none of the warm-up requests (server log: {server.log_path})")
        _say(
            f"sending {args.requests} requests with a shared system prompt "
            f"({workload.concurrency} at a time) while scraping /metrics for {args.duration:g} s"
        )
        sent: list[tuple[int, int]] = []

        async def drive(base_url, found, run_dir):
            completed, failed, health = await workload.drive(base_url, server.model_name, run_dir / REQUESTS)
            sent.append((completed, failed))
            return health.measurements(f"the demo's workload against {base_url}")

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
            f"none of the demo's {failed} requests completed (see {out / REQUESTS} and the server log "
            f"{server.log_path})"
        )
    _say(f"{completed} requests completed, {failed} failed")
    return result
