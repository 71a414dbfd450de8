"""The command line: a thin layer over the library.

Every sub-command lives in `llm_diagnose/diagnose/commands/<name>.py` with `register(subparsers)`, which
adds its parser and sets `func`. `func(args) -> int` returns the exit code; library errors
(`llm_diagnose.diagnose.errors`) become one line on stderr and their documented exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llm_diagnose.diagnose.errors import DiagnoseError, ExitCode

COMMANDS = ("decide", "run", "demo", "trace", "report", "gate", "instrument", "microbench", "fleet", "plan")

EPILOG = """exit codes: 0 done; 1 gate found a regression; 2 bad usage or input;
3 target unreachable or not an LLM server; 4 partial run (results kept);
5 gate inconclusive (with --fail-on-inconclusive); 130 interrupted (results kept)"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, the usage hint, exit 2 (argparse's own code)
        self.print_usage(sys.stderr)
        self.exit(
            ExitCode.USAGE, f"llm-diagnose: error: {message} (see 'llm-diagnose {self.prog.split()[-1]} --help')\n"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="llm-diagnose",
        description="Diagnose the bottleneck of an LLM server from measurements.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"llm_diagnose.diagnose.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"llm_diagnose.diagnose.commands.{name}":
                raise
            continue  # a command not built yet is simply absent from --help
        module.register(sub)
    return parser


def _version() -> str:
    from llm_diagnose.diagnose.tree.evidence import tool_version

    return f"llm-diagnose {tool_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return int(args.func(args))
    except DiagnoseError as exc:
        print(f"llm-diagnose: error: {exc}", file=sys.stderr)
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
