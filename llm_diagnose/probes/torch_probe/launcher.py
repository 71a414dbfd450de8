"""Run a command with the PyTorch probe loaded at interpreter start-up (tracing-launcher style).

Like `opentelemetry-instrument` and `ddtrace-run`: the command's environment gets this
package's `bootstrap/` folder first on PYTHONPATH (its `sitecustomize` starts the probe) plus
the side-port settings, and the command replaces the launcher's process (`exec`), so signals,
exit codes and the process id are the server's own.

Limits: interpreters started with -I or -S skip sitecustomize (nothing is instrumented);
a multi-process server is instrumented in its first Python process only (the port is claimed
once); call `llm_diagnose.probes.torch_probe.start()` in the worker that runs the model in that case.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

__all__ = ["ENV_PORT", "ENV_HOST", "ENV_ROOT", "bootstrap_dir", "package_root", "instrumented_env", "exec_instrumented"]

ENV_PORT = "LLMD_TORCH_PROBE_PORT"
ENV_HOST = "LLMD_TORCH_PROBE_HOST"
ENV_ROOT = "LLMD_TORCH_PROBE_ROOT"


def bootstrap_dir() -> Path:
    return Path(__file__).resolve().parent / "bootstrap"


def package_root() -> Path:
    """The folder holding the `llm_diagnose` package (so the child can import it without an install)."""
    return Path(__file__).resolve().parents[3]


def instrumented_env(port: int, host: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    path = [str(bootstrap_dir())] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(path)
    out[ENV_PORT] = str(int(port))
    out[ENV_HOST] = host
    out[ENV_ROOT] = str(package_root())
    return out


def exec_instrumented(command: Sequence[str], port: int, host: str) -> NoReturn:
    """Replace this process with `command`, instrumented. Raises OSError if it cannot be run."""
    os.execvpe(command[0], list(command), instrumented_env(port, host))
