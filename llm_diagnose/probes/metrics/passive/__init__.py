"""Passive evidence: what a window of /metrics scrapes says, one producer per evidence family.

`evidence.passive_evidence(window)` orchestrates them: `window_facts` (the window itself),
`config` (settings the page shows), `latency`, `kv_batch`, `prefix`, `spec`, `interference` and
`workload`; `context` is what they share (the window, the engine's names, the warnings every
counter figure carries). This module only re-exports.
"""

from llm_diagnose.probes.metrics.passive.evidence import PASSIVE_KEYS, passive_evidence

__all__ = ["PASSIVE_KEYS", "passive_evidence"]
