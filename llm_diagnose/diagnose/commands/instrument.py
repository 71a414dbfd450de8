"""`llm-diagnose instrument -- CMD ...`: run a PyTorch server with the in-process probe."""

from __future__ import annotations

import argparse
import shutil
import sys

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.errors import UsageError

# The help names them. (Importing this module loads the torch_probe package, the Prometheus
# client included, until that package's __init__ imports its recorder lazily.)
from llm_diagnose.probes.torch_probe import DEFAULT_HOST, DEFAULT_PORT, METRICS

EXAMPLE = f"""example:
  llm-diagnose instrument -- transformers serve ./my-model --port 8000 --continuous-batching
  llm-diagnose instrument --port 9500 -- python server.py --workers 1
  curl http://127.0.0.1:{DEFAULT_PORT}/metrics      (in another shell: the probe's page, llmd_torch:* series)

The command runs in this process's place (exec), with the probe loaded at interpreter start-up
through a sitecustomize on PYTHONPATH. Every transformers model loaded with from_pretrained is
instrumented: forward timings per phase, KV-cache accounting (allocated vs used token slots,
continuous batching's paged cache included), CUDA allocator statistics, finished requests.
The metrics ({len(METRICS)} series prefixed llmd_torch:) are served on a side port bound to
{DEFAULT_HOST} unless --host says otherwise. Other PyTorch servers: call
llm_diagnose.probes.torch_probe.start() and llm_diagnose.probes.torch_probe.instrument(model) in their code."""


def register(sub) -> None:
    p = sub.add_parser(
        "instrument",
        help="run a PyTorch serving command with the in-process probe",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start a PyTorch/transformers server with the llm-diagnose probe inside it, "
        "exposing Prometheus metrics on a side port.",
    )
    p.add_argument(
        "--port", type=argtypes.port, default=DEFAULT_PORT, help=f"side port for the metrics (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind the metrics to (default {DEFAULT_HOST}; 0.0.0.0 exposes them to the network)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.probes.torch_probe.launcher import exec_instrumented

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run: give it after --, e.g. llm-diagnose instrument -- python server.py")
    if shutil.which(command[0]) is None:
        raise UsageError(f"command not found: {command[0]!r} (not on PATH and not an executable file)")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"llm-diagnose: warning: the probe's metrics will be reachable on {args.host}:{args.port} "
            "from other machines",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        exec_instrumented(command, args.port, args.host)
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
    return 0  # pragma: no cover - exec does not return
