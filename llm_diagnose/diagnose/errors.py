"""Errors the CLI turns into one-line messages and documented exit codes.

Library code raises these; `llm_diagnose.diagnose.cli` prints `llm-diagnose: error: <message>` and exits
with the code. Each message says what is wrong and what to do about it.
"""

from __future__ import annotations

__all__ = ["ExitCode", "DiagnoseError", "UsageError", "TargetError"]


class ExitCode:
    OK = 0  # done (for `gate`: no regression)
    REGRESSION = 1  # `gate`: a regression beyond the noise was found
    USAGE = 2  # bad usage or bad input (flags, evidence, trace, thresholds file)
    TARGET = 3  # the target could not be reached, or is not an LLM server
    PARTIAL = 4  # ran, but the target failed mid-run: a partial result was written
    INCONCLUSIVE = 5  # `gate`: the runs are too noisy to decide (with --fail-on-inconclusive)
    INTERRUPTED = 130  # Ctrl-C: what was measured so far is kept


class DiagnoseError(Exception):
    exit_code = ExitCode.USAGE


class UsageError(DiagnoseError):
    """Bad flags or unreadable input."""

    exit_code = ExitCode.USAGE


class TargetError(DiagnoseError):
    """The server is unreachable, is not an LLM server, or exposes no metrics."""

    exit_code = ExitCode.TARGET
