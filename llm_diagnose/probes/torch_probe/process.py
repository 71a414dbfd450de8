"""The process's one probe: created on first use, served on a side port, hooked into models."""

from __future__ import annotations

import threading
from typing import Any

from llm_diagnose.probes.torch_probe.recorder import TorchProbe

__all__ = ["DEFAULT_PORT", "DEFAULT_HOST", "get_probe", "start", "instrument"]

DEFAULT_PORT = 9478
DEFAULT_HOST = "127.0.0.1"  # a metrics page says what runs where: not for the network unless asked

_lock = threading.Lock()
_probe: TorchProbe | None = None


def get_probe() -> TorchProbe:
    """The process's probe (created on first use, without a server)."""
    global _probe
    with _lock:
        if _probe is None:
            _probe = TorchProbe()
        return _probe


def start(port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, *, autopatch: bool = True) -> TorchProbe:
    """Serve the process's probe on host:port and (by default) instrument transformers models as they load."""
    probe = get_probe()
    if probe.server is None:
        probe.serve(port, host)
    if autopatch:
        from llm_diagnose.probes.torch_probe.autopatch import install

        install(probe)
    return probe


def instrument(model: Any, probe: TorchProbe | None = None) -> Any:
    """Hook `model` into `probe` (the process's probe by default); returns the model."""
    return (probe or get_probe()).instrument(model)
