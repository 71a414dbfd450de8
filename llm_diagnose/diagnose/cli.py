"""The command line: a thin layer over the library.

Every sub-command lives in `llm_diagnose/diagnose/commands/<name>.py` with `register(subparsers)`, which
adds its parser and sets `func`. `func(args) -> int` returns the exit code; library errors
(`llm_diagnose.diagnose.errors`) become one line on stderr and their documented exit code.

Commands are imported lazily: a run imports the module of its own command alone, and
`llm-diagnose --help` imports none (it lists COMMANDS' one-line summaries), so an offline
`decide` never loads the HTTP client or the Prometheus parser that `run` needs. A command module
keeps its own imports light for the same reason: `register` builds the parser, and what the
command runs is imported inside the handler.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Collection

from llm_diagnose.diagnose.errors import DiagnoseError, ExitCode
from llm_diagnose.diagnose.text.control_chars import escape_controls

# The sub-commands, in the order of `llm-diagnose --help`, with the line it shows for each (the
# same text as the `help=` of the command's own parser: tests/test_cli_decide.py holds them equal).
COMMANDS: dict[str, str] = {
    "decide": "diagnose saved evidence (offline)",
    "run": "attach to a live server, measure, diagnose",
    "demo": "diagnose a real local vLLM running a tiny model (the embedded default)",
    "trace": "analyse a request trace (prefix reuse, lengths, arrivals, prompt pitfalls)",
    "report": "write a diagnosis as HTML, Markdown or JSON",
    "export": "write a run's per-request records and scrapes as CSV or Parquet tables",
    "gate": "compare two runs; fail on a regression beyond the noise",
    "verify": "compare two runs before and after a change: did the adopted technique deliver?",
    "instrument": "run a PyTorch serving command with the in-process probe",
    "microbench": "time a model's decode/prefill steps against the machine's ceilings",
    "fleet": "read a fleet's engine metrics from Prometheus and compare the replicas",
    "plan": "replicas and GPUs needed for a target rate (capacity planning)",
}

EPILOG = """exit codes: 0 done; 1 gate found a regression (verify: a claim made worse); 2 bad usage or input;
3 target unreachable or not an LLM server; 4 partial run (results kept);
5 gate inconclusive (with --fail-on-inconclusive; verify: runs not comparable); 130 interrupted (results kept)"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, the usage hint, exit 2 (argparse's own code)
        self.print_usage(sys.stderr)
        self.exit(
            ExitCode.USAGE, f"llm-diagnose: error: {message} (see 'llm-diagnose {self.prog.split()[-1]} --help')\n"
        )

    def _get_values(self, action, arg_strings):
        # `--duration=--`: Python 3.11's argparse drops the "--" and hands the command an empty
        # list instead of a number, past the flag's type (issue 22: a TypeError in `run`).
        if action.nargs is None and action.option_strings and arg_strings == ["--"]:
            raise argparse.ArgumentError(action, "expected one argument, got '--'")
        return super()._get_values(action, arg_strings)


class _VersionAction(argparse.Action):
    """`--version`, looked up when asked for: the lookup imports the evidence module, which the
    parser of every other invocation does without."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(_version() + "\n")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser(full: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The command line. The sub-commands named in `full` (default: all) get their whole parser
    (their module is imported and registers it); the others are listed by name and summary only,
    enough for the top-level help and for argparse to tell a command from a typo.

    Raises:
        ModuleNotFoundError: a command of COMMANDS has no module (a packaging error, never skipped).
    """
    parser = _Parser(
        prog="llm-diagnose",
        description="Diagnose the bottleneck of an LLM server from measurements.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, summary in COMMANDS.items():
        if full is None or name in full:
            importlib.import_module(f"llm_diagnose.diagnose.commands.{name}").register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The sub-command argparse will pick: the first argument that is not an option (the top
    level's options, --help and --version, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _version() -> str:
    from llm_diagnose.diagnose.tree.evidence import tool_version

    return f"llm-diagnose {tool_version()}"


def _stop_on_term(signum: int, frame: object) -> None:
    # A second TERM while the first unwinds must not cut the cleanup short (stopping a server waits).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt  # unwinds like Ctrl-C: servers the demo started stop, samples stay on disk


def main(argv: list[str] | None = None) -> int:
    # The command line itself (not a caller's): a TERM (kill, docker stop, a CI timeout) is a Ctrl-C.
    if argv is None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_term)
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_of(argv)
    parser = build_parser(full=(command,) if command in COMMANDS else ())
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return int(args.func(args))
    except DiagnoseError as exc:
        print(f"llm-diagnose: error: {escape_controls(str(exc))}", file=sys.stderr)  # it may quote the server
        return exc.exit_code
    except OSError as exc:
        if exc.filename is None:  # not a file problem (those have a name): let it show
            raise
        # A file the command had to read or write and could not (a link refused, a full disk, a
        # folder removed mid-run): bad input or output, in one line.
        print(f"llm-diagnose: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("llm-diagnose: interrupted; samples taken so far are kept on disk", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
