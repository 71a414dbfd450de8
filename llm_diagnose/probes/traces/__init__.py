"""Trace analytics: what a request trace says about prefix reuse, lengths and arrivals.

Entry point: `analyze_trace(path, ...) -> TraceAnalysis`; `trace_evidence(analysis)` gives its figures
under the catalogue's keys. Readers, tokenisation, the
vectorised prefix-cache simulation (and its pure-Python reference), lengths, arrivals and
what the prompt pitfalls are made of live in the modules beside this one. These modules
measure; the findings a trace raises are judged in `llm_diagnose.diagnose.trace_findings`.
"""

from llm_diagnose.probes.traces.analysis import DEFAULT_BLOCK_SIZE, TraceAnalysis, analyze_trace
from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceError, TraceFormatError, TraceLineError
from llm_diagnose.probes.traces.evidence import trace_evidence
from llm_diagnose.probes.traces.readers import FORMATS, detect_format

__all__ = [
    "analyze_trace",
    "trace_evidence",
    "TraceAnalysis",
    "DEFAULT_BLOCK_SIZE",
    "FORMATS",
    "detect_format",
    "TraceError",
    "TraceFormatError",
    "TraceLineError",
    "EmptyTraceError",
]
