"""Trace analytics: what a request trace says about prefix reuse, lengths and arrivals.

Entry point: `analyze_trace(path, ...) -> TraceAnalysis`. Readers, tokenisation, the
vectorised prefix-cache simulation (and its pure-Python reference), lengths, arrivals and
the prompt pitfalls live in the modules beside this one.
"""

from llm_diagnose.probes.traces.analysis import DEFAULT_BLOCK_SIZE, TraceAnalysis, analyze_trace
from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceError, TraceFormatError, TraceLineError
from llm_diagnose.probes.traces.pitfalls import DYNAMIC_PREFIX, KV_OFFLOAD, UNSTABLE_SERIALIZATION, Finding
from llm_diagnose.probes.traces.readers import FORMATS, detect_format

__all__ = [
    "analyze_trace",
    "TraceAnalysis",
    "DEFAULT_BLOCK_SIZE",
    "FORMATS",
    "detect_format",
    "Finding",
    "TraceError",
    "TraceFormatError",
    "TraceLineError",
    "EmptyTraceError",
    "DYNAMIC_PREFIX",
    "UNSTABLE_SERIALIZATION",
    "KV_OFFLOAD",
]
