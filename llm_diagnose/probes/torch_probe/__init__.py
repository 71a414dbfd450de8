"""The PyTorch probe: measure a serving process from inside it, expose Prometheus metrics.

Two ways in:

- import API, in the server's code::

      from llm_diagnose.probes import torch_probe
      torch_probe.start(port=9478)           # side port, 127.0.0.1 unless host= says otherwise
      model = torch_probe.instrument(model)  # forward timings, KV accounting, generate requests

- launcher, without touching the server::

      llm-diagnose instrument [--port 9478] [--host 127.0.0.1] -- python server.py ...

  which starts the command with this package's `sitecustomize` on PYTHONPATH: the metrics
  server starts at interpreter start-up and every transformers model loaded with
  `from_pretrained` is instrumented, continuous batching included (`autopatch`).

The side port serves http://127.0.0.1:9478/metrics, a Prometheus page like any engine's
(names: `llm_diagnose.probes.torch_probe.metrics`); `llm_diagnose.probes.torch_probe.evidence.evidence_from_window`
turns a window of its scrapes (`llm_diagnose.probes.metrics.window.Window`) into evidence keys.
torch is only touched through the instrumented model.
"""

from __future__ import annotations

from llm_diagnose.probes.torch_probe.metrics import METRICS, PREFIX
from llm_diagnose.probes.torch_probe.process import DEFAULT_HOST, DEFAULT_PORT, get_probe, instrument, start
from llm_diagnose.probes.torch_probe.recorder import TorchProbe, classify_step

__all__ = [
    "TorchProbe",
    "DEFAULT_PORT",
    "DEFAULT_HOST",
    "start",
    "instrument",
    "get_probe",
    "METRICS",
    "PREFIX",
    "classify_step",
]
