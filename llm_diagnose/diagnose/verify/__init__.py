"""Verify a change between two runs: identify the adopted technique from the configuration diff,
judge each of its claims with the gate's comparison, report side effects; refuse a verdict when
the two runs did not carry the same workload.

`claims` (what each technique promises), `result` (the value types), `judge` (the pure
functions), `bracket` (AFTER judged against two runs of BEFORE's configuration: A/B/A), `render`
(text, JSON, JUnit, Markdown).
"""

from llm_diagnose.diagnose.verify.bracket import verify_bracketed
from llm_diagnose.diagnose.verify.claims import CLAIMS, Claim
from llm_diagnose.diagnose.verify.judge import RunSide, verify
from llm_diagnose.diagnose.verify.result import VerifyResult

__all__ = ["CLAIMS", "Claim", "RunSide", "verify", "verify_bracketed", "VerifyResult"]
