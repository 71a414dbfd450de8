"""The performance gate: compare a current run with a baseline, fail on a regression beyond the noise.

`rules` (which quantities, which way is better, what change is tolerated; the TOML file),
`judge` (each rule's outcome, the failure ceiling, the diagnosis rules, `compare`), `result`
(the value types, the exit code), `render` (text, JSON, JUnit). The comparison of one metric is
the comparison core's (`llm_diagnose.diagnose.compare`), shared with verify.
"""

from llm_diagnose.diagnose.gate.judge import compare
from llm_diagnose.diagnose.gate.render import render_json, render_junit, render_text
from llm_diagnose.diagnose.gate.result import GateResult, RunData
from llm_diagnose.diagnose.gate.rules import GateRules, GateRulesError, load_rules

__all__ = [
    "compare",
    "RunData",
    "GateResult",
    "GateRules",
    "GateRulesError",
    "load_rules",
    "render_text",
    "render_junit",
    "render_json",
]
