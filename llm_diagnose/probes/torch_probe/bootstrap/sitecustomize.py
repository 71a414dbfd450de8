"""Start the llm-diagnose PyTorch probe in a process launched by `llm-diagnose instrument`.

Python imports `sitecustomize` at start-up from the first PYTHONPATH entry that has one; the
launcher puts this folder first. The probe starts only where LLMD_TORCH_PROBE_PORT is set,
and the variable is removed once read, so the server's own child processes (which inherit
PYTHONPATH) do not compete for the port. Any other sitecustomize further down the path is
then run as well, so instrumenting a process never hides its own start-up customisation.
Nothing here may raise: a broken probe must not stop the server.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _start_probe() -> None:
    port = os.environ.pop("LLMD_TORCH_PROBE_PORT", None)
    host = os.environ.pop("LLMD_TORCH_PROBE_HOST", "127.0.0.1")
    root = os.environ.pop("LLMD_TORCH_PROBE_ROOT", "")
    if port is None:
        return
    if root and root not in sys.path:
        sys.path.append(root)  # appended: the server's own packages keep precedence
    try:
        from llm_diagnose.probes import torch_probe

        probe = torch_probe.start(int(port), host)
        bound_host, bound_port = probe.address or (host, int(port))
        print(
            f"llm-diagnose instrument: probe metrics on http://{bound_host}:{bound_port}/metrics (pid {os.getpid()})",
            file=sys.stderr,
            flush=True,
        )
    except Exception as exc:  # noqa: BLE001
        print(
            f"llm-diagnose instrument: the probe did not start ({type(exc).__name__}: {exc}); "
            "the command runs uninstrumented",
            file=sys.stderr,
            flush=True,
        )


def _run_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the same leniency site.py gives a failing sitecustomize
        print(f"llm-diagnose instrument: error in {spec.origin}: {type(exc).__name__}: {exc}", file=sys.stderr)


_start_probe()
_run_next_sitecustomize()
