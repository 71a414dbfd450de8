"""`llm-diagnose run --url URL --out DIR`: attach to a live server, measure, diagnose."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.collect import RunPlan, gpu_selection_line, run_target
from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.commands.common import (
    add_slo_flags,
    add_trace_flags,
    add_workload_flags,
    declared_facts,
    load_evidence,
    load_slo,
    load_thresholds,
)
from llm_diagnose.diagnose.errors import ExitCode, UsageError
from llm_diagnose.diagnose.report.content import requests_line
from llm_diagnose.diagnose.runfolder import METRICS, out_path, prepare_out_dir
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.probes import quantities as Q

# The help names them. (Importing this module loads the probes.experiments package, HTTP client
# included, until that package's __init__ imports its submodules lazily.)
from llm_diagnose.probes.experiments.plan import ALL_EXPERIMENTS
from llm_diagnose.probes.load.budget import DEFAULT_MAX_RPS
from llm_diagnose.probes.results import Fact, NotMeasured, Provenance, Result

if TYPE_CHECKING:
    from llm_diagnose.probes.discovery import Discovered
    from llm_diagnose.probes.load.budget import ActiveBudget
    from llm_diagnose.probes.metrics.window import ScrapeRecord

# A run whose server failed more than this share of the requests it sent exits PARTIAL (4): its
# figures describe the few requests answered, not the server's service.
LOST_MOST_FRACTION = 0.5
# A plain server (no engine metrics) is attached after one completion of one token: that check may
# take at most this share of --budget-seconds, and at most PLAIN_CHECK_MAX_S (a server that cannot
# give one token in 30 s is not measured by this run); the experiments get the budget less what it took.
PLAIN_CHECK_SHARE = 0.25
PLAIN_CHECK_MAX_S = 30.0

EXAMPLE = """example:
  llm-diagnose run --url http://127.0.0.1:8000 --duration 60 --out runs/staging
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/staging-active --active \\
      --budget-requests 150 --budget-seconds 60
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/after --active --replay runs/staging-active
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/plain --active --model ./my-model
      (a plain `transformers serve ./my-model`: no engine metrics, measured from the client)
  llm-diagnose run --url http://10.0.0.7:8000 --duration 300 --interval 5 --out runs/prod-a --offline
  llm-diagnose run --url http://127.0.0.1:8000 --out runs/chat --slo itl:p99:100ms --slo ttft:p99:2s"""


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="attach to a live server, measure, diagnose",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Scrape the server's /metrics over a window (passive: no inference request is sent), "
        "discover its configuration, read GPU memory where a driver exists, and diagnose. With --active, a "
        "server without engine metrics (a plain OpenAI-compatible server: transformers serve, a gateway) is "
        "measured from the client once one POST /v1/completions answers.",
    )
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        help="where the metrics are, when not at URL/metrics (e.g. the PyTorch probe's side port "
        "http://127.0.0.1:9478/metrics)",
    )
    p.add_argument("--out", required=True, type=out_path, help="run folder (raw samples are written as taken)")
    p.add_argument(
        "--duration",
        type=argtypes.WINDOW_SECONDS,
        default=30.0,
        metavar="SECONDS",
        help="observation window (default 30; at most a week)",
    )
    p.add_argument(
        "--interval",
        type=argtypes.SCRAPE_INTERVAL,
        default=1.0,
        metavar="SECONDS",
        help=f"scrape interval (default 1; at least {argtypes.MIN_SCRAPE_INTERVAL_S:g})",
    )
    p.add_argument("--thresholds", metavar="FILE", help="TOML file overriding named thresholds (and its [slo] table)")
    active = p.add_argument_group("active probing (opt-in: sends real requests, within a hard budget)")
    active.add_argument(
        "--active",
        action="store_true",
        help="also run the experiments (decode latency, interference, heterogeneity, prefix, spec)",
    )
    active.add_argument(
        "--budget-requests", type=argtypes.REQUESTS, default=200, metavar="N", help="at most N requests (default 200)"
    )
    active.add_argument(
        "--budget-seconds",
        type=argtypes.LOAD_SECONDS,
        default=60.0,
        metavar="S",
        help="at most S seconds of load (default 60)",
    )
    active.add_argument(
        "--max-rps",
        type=argtypes.RATE,
        metavar="R",
        help=f"at most R request starts per second (default {DEFAULT_MAX_RPS:g} for the experiments, a guard for a "
        "server that serves others; a --replay keeps its recorded timing unless given R)",
    )
    active.add_argument(
        "--experiments",
        metavar="LIST",
        help=f"comma-separated subset of {','.join(ALL_EXPERIMENTS)} (default: all)",
    )
    active.add_argument(
        "--model",
        type=argtypes.model_name,
        metavar="NAME",
        help="the model the requests ask for (default: the first that GET /v1/models lists; a server that lists "
        "none, or answers it with an error, is sent requests that name no model, which a server pinned to one "
        "model serves)",
    )
    active.add_argument(
        "--replay",
        metavar="SOURCE",
        type=Path,
        help="instead of the experiments, send an earlier run's requests in its pattern: its folder, its "
        "inputs.jsonl (the exact bodies), its requests.jsonl (the same lengths), or a trace file; "
        "within the budget (with --active; not with --experiments)",
    )
    p.add_argument(
        "--gpus",
        type=gpu_list,
        metavar="LIST",
        help="the server's GPUs, comma-separated NVML indices or UUIDs as `nvidia-smi -L` lists them (default: "
        "those running the server's processes, else those running any compute process, else every GPU)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument(
        "--microbench",
        metavar="EVIDENCE",
        help="a `llm-diagnose microbench --run` evidence file (or folder) to diagnose with the run: Q5 sets the "
        "served time per token against its decode step (its microbenchmark keys join the run's evidence)",
    )
    add_workload_flags(p)
    add_slo_flags(p)
    add_trace_flags(p)
    p.set_defaults(func=run)


MAX_GPU_INDEX = 1023  # NVML numbers a node's GPUs from 0; no node has a thousand
_GPU_INDEX = argtypes.count(0, MAX_GPU_INDEX, what="a GPU index")
_GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f-]{8,}")


def gpu_list(text: str) -> tuple[int | str, ...]:
    """argparse type of --gpus: comma-separated NVML indices (0,1) or UUIDs (GPU-5d3c...)."""
    pieces = [p.strip() for p in text.split(",") if p.strip()]
    if not pieces:
        raise argparse.ArgumentTypeError(f"{text!r} lists no GPU (indices such as 0,1 or UUIDs such as GPU-5d3c...)")
    out: list[int | str] = []
    for piece in pieces:
        if _GPU_UUID.fullmatch(piece):
            out.append(piece)
        elif piece.isdigit():
            out.append(_GPU_INDEX(piece))
        else:
            raise argparse.ArgumentTypeError(
                f"{piece!r} is neither a GPU index nor a GPU UUID (e.g. 0,1 or GPU-5d3c..., as `nvidia-smi -L` lists; "
                "for a MIG instance, give its GPU)"
            )
    return tuple(dict.fromkeys(out))  # each once, in the order given


def _check_gpus(gpus: tuple[int | str, ...]) -> None:
    """--gpus against this node's GPUs, before the target is touched: one that it lacks is a usage
    error. Without a driver they cannot be checked; the memory keys then say why nothing was read."""
    from llm_diagnose.probes.nvml import UnknownGpu, check_gpus

    try:
        unavailable = check_gpus(gpus)
    except UnknownGpu as exc:
        raise UsageError(f"--gpus: {exc}") from None
    if unavailable is not None:
        print(f"llm-diagnose: note: --gpus not checked: {unavailable.reason}", file=sys.stderr)


class Progress:
    """One status line per scrape on a terminal; a line every 10 scrapes otherwise."""

    def __init__(self, planned: int, stream=None) -> None:
        self.planned = planned
        self.stream = sys.stderr if stream is None else stream  # the stderr of now, not of the import
        self.tty = self.stream.isatty()

    def __call__(self, record: ScrapeRecord, index: int) -> None:
        state = "ok" if record.ok else f"failed ({record.error})"
        line = escape_controls(f"[{index + 1}/{self.planned}] scrape {state}")  # the error may quote the page
        if self.tty:
            self.stream.write("\r" + line[:100].ljust(100))
            if index + 1 >= self.planned:
                self.stream.write("\n")
        elif index % 10 == 0 or not record.ok:
            self.stream.write(line + "\n")
        self.stream.flush()


def _budget(args: argparse.Namespace):
    """The active budget; without --max-rps the experiments keep to DEFAULT_MAX_RPS, a replay to
    its recorded timing (the pattern is what the user asked to send)."""
    from llm_diagnose.probes.load.budget import ActiveBudget

    max_rps = args.max_rps
    if max_rps is None and args.replay is None:
        max_rps = DEFAULT_MAX_RPS
    try:
        return ActiveBudget(max_requests=args.budget_requests, max_seconds=args.budget_seconds, max_rps=max_rps)
    except ValueError as exc:
        raise UsageError(f"active budget: {exc}") from None


def _will_send(args: argparse.Namespace, budget, plan_text: str) -> str:
    """The line printed before anything is sent: the budget (and where its rate is the default), then the plan."""
    rate = (
        " (the default --max-rps, a guard for a server that serves others: give --max-rps to change it)"
        if args.max_rps is None and budget.max_rps is not None
        else ""
    )
    return escape_controls(f"llm-diagnose: --active will send, {budget.describe()}{rate}:\n{plan_text}")


def _load_before_sending(args: argparse.Namespace):
    """The server's running and waiting requests before the first is sent (read 3 times over 1 s,
    load_at_start); where it already serves others, one line says so (the run goes on: its
    experiments are bounded)."""
    from llm_diagnose.probes.metrics.load_at_start import server_load_before_sending

    load = server_load_before_sending(args.url, args.metrics_url)
    if load.busy:
        print(escape_controls(f"llm-diagnose: warning: {load.describe()}"), file=sys.stderr)
    return load


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

    plan = plan_replay(source, budget, args.model or asyncio.run(served()))
    load = _load_before_sending(args)
    print(_will_send(args, budget, plan.describe()), file=sys.stderr)

    async def send(base_url, found, run_dir, budget_left):
        return {**load.evidence(), **await run_replay(base_url, plan, budget_left, run_dir)}

    return _attaching(args, budget, send)


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
    plan = asyncio.run(prepare_plan(args.url, args.model, budget, chosen))  # GET /v1/models only
    load = _load_before_sending(args)
    print(_will_send(args, budget, describe_plan(plan)), file=sys.stderr)

    async def send(base_url, found, run_dir, budget_left):
        # Discovery's facts (max_num_seqs, the step budget where the server shows its configuration)
        # size the experiments, with the calibration request's measured speed. A plain server has no
        # metrics page to read between experiments.
        results = await run_experiments(
            base_url,
            args.model or found.model,
            budget_left,
            run_dir,
            plan=plan,
            metrics_url=None if found.plain else found.metrics_url,
            engine_facts=found.facts,
        )
        return {**load.evidence(), **results}

    return _attaching(args, budget, send)


def _attaching(args: argparse.Namespace, budget: ActiveBudget, send):
    """The active hook run_target calls with what discovery found: `send(base_url, found, run_dir,
    budget)` sends the run's requests; a plain server (no engine metrics) is checked first, and
    the budget that check left is the one sent with. --model becomes the served model's fact."""

    async def active(base_url, found, run_dir):
        attached: dict[str, Result] = {}
        budget_left = budget
        if found.plain:
            budget_left, attached = await _attach_plain(base_url, found, budget, args.model or found.model)
        if args.model:
            listed = f"; /v1/models listed {found.model!r}" if found.model and found.model != args.model else ""
            attached[Q.ENGINE_MODEL] = Fact(
                args.model, Provenance("declared", "command line"), note=f"the requests name it (--model){listed}"
            )
        items = await send(base_url, found, run_dir, budget_left)
        return _with_attachment(items, attached)

    return active


async def _attach_plain(
    base_url: str, found: Discovered, budget: ActiveBudget, model: str | None
) -> tuple[ActiveBudget, dict[str, Result]]:
    """A target without engine metrics (discovery's `plain`): say so, send the one completion that
    checks it serves completions, and return the budget left with the attachment's evidence.

    Raises:
        UsageError: the budget has no request left for the experiments after the check (nothing sent).
        NotAnLLMServer, TargetUnreachable, HTTPStatusError: the check got no completion (exit 3).
    """
    from llm_diagnose.probes.discovery import CHECK_MAX_TOKENS, PLAIN_SERVER, check_completions, plain_server_remedy
    from llm_diagnose.probes.http import make_session

    if budget.max_requests < 2:
        raise UsageError(
            f"{found.plain}: attaching it as a {PLAIN_SERVER} takes one request of the budget to check that it "
            "serves completions, and --budget-requests 1 leaves none for the experiments: raise --budget-requests"
        )
    timeout_s = min(PLAIN_CHECK_MAX_S, PLAIN_CHECK_SHARE * budget.max_seconds)
    named = f"model {model!r}" if model else "no model name"
    print(
        escape_controls(
            f"llm-diagnose: note: {found.plain}: attaching it as a {PLAIN_SERVER}, measured from the client only; "
            f"first one POST /v1/completions of {CHECK_MAX_TOKENS} token ({named}, within {timeout_s:g} s, one "
            "request of the budget) checks that it serves completions"
        ),
        file=sys.stderr,
    )
    t0 = time.monotonic()
    async with make_session() as session:
        check = await check_completions(session, base_url, model, timeout_s=timeout_s)
    spent_s = time.monotonic() - t0
    left = dataclasses.replace(
        budget, max_requests=budget.max_requests - 1, max_seconds=max(budget.max_seconds - spent_s, 1e-3)
    )
    remedy = plain_server_remedy(found.engine)
    prov = Provenance("discovery", found.base_url)
    attached: dict[str, Result] = {
        Q.ACTIVE_NOTES: Fact(
            f"attached as a {PLAIN_SERVER}: {found.plain}; {check.description} (the check took 1 request and "
            f"{spent_s:.1f} s of the budget); the engine's own figures are not measured ({remedy})",
            prov,
        ),
        Q.SERVER_REQUESTS_AT_START: NotMeasured(
            f"not measured here, because {found.plain}: the server's own requests in flight are an engine figure",
            remedy,
            prov,
        ),
    }
    model_fact = check.model_fact(found.base_url + "/v1/completions")
    if model_fact is not None and Q.ENGINE_MODEL not in found.facts:  # /v1/models named none
        attached[Q.ENGINE_MODEL] = model_fact
    return left, attached


def _with_attachment(items: dict[str, Result], attached: dict[str, Result]) -> dict[str, Result]:
    """The sent requests' evidence with the attachment's; its note goes before theirs."""
    out = {**items, **attached}
    note, theirs = attached.get(Q.ACTIVE_NOTES), items.get(Q.ACTIVE_NOTES)
    if isinstance(note, Fact) and isinstance(theirs, Fact):
        out[Q.ACTIVE_NOTES] = dataclasses.replace(theirs, value=f"{note.value}; {theirs.value}")
    return out


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.report import console
    from llm_diagnose.probes.http import redact_url

    if args.interval > args.duration:
        raise UsageError(f"--interval ({args.interval:g} s) is longer than --duration ({args.duration:g} s)")
    thresholds, slo = load_thresholds(args.thresholds), load_slo(args)  # before the target is touched
    extra = declared_facts(args)
    if args.microbench:  # read before the target is touched; its own keys only (join_evidence's rule)
        bench = load_evidence(args.microbench).items
        extra = {**{k: v for k, v in bench.items() if Q.is_microbench_key(k)}, **extra}
    if args.model is not None and not args.active:
        raise UsageError("--model names the model the requests ask for: add --active (a passive run sends none)")
    replay = _read_replay(args) if args.replay is not None else None  # bad input: nothing sent
    if args.gpus:
        _check_gpus(args.gpus)
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
        extra_items=extra,
        metrics_url=args.metrics_url,
        trace=args.trace,
        trace_format=args.trace_format,
        block_size=args.block_size,
        kv_capacity_tokens=args.kv_capacity_tokens,
        gpus=args.gpus,
        attach_plain=active is not None,  # the hooks above check a plain server before they send
    )
    planned = int(duration // args.interval) + 1
    if not args.quiet:
        mode = "active: the requests above, within the budget" if active else "passive: no requests sent"
        print(
            f"llm-diagnose: watching {redact_url(args.url)} for {duration:g} s ({mode}); "
            f"raw scrapes -> {args.out}/metrics.jsonl",
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
    if gpu_line := gpu_selection_line(result.evidence.items):
        print(escape_controls(f"llm-diagnose: note: {gpu_line}"), file=sys.stderr)
    if result.restarts:
        print(
            f"llm-diagnose: the server restarted during the window ({len(result.restarts)} time(s)); "
            f"see {args.out}/summary.txt",
            file=sys.stderr,
        )
    if result.partial:
        print(
            escape_controls(
                f"llm-diagnose: error: partial run: {result.partial}; the diagnosis covers what was measured"
            ),
            file=sys.stderr,
        )
        return ExitCode.PARTIAL
    lost = result.evidence.measurement(Q.ACTIVE_FAILED_FRACTION)
    if lost is not None and lost.value > LOST_MOST_FRACTION:
        sent = requests_line(result.evidence)
        print(
            f"llm-diagnose: error: the server failed most of the requests sent: {sent[0] if sent else lost.note}; "
            f"the diagnosis covers only the requests it answered (see {args.out}/requests.jsonl and the server's log)",
            file=sys.stderr,
        )
        return ExitCode.PARTIAL
    return ExitCode.OK
