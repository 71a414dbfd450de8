"""The warnings the tree acts on, typed: a code beside the prose people read.

A measurement's warnings are text for people. The few that change a verdict carry a code
(`CodedWarning`, a str with `.code`): the tree reads `Measurement.codes`, never the wording, so a
rephrased warning cannot switch a rule off (issue 23, item 5). The prose keeps the first words
quantities.py names (CLIENT_STARVED_WARNING, ...) so a person sees the same text as before.

Evidence files written before the codes existed hold plain strings; `legacy_coded` gives them
their code back from those same first words, when a file is read and nowhere else.
"""

from __future__ import annotations

import re
from enum import StrEnum

from llm_diagnose.probes import quantities as Q

__all__ = ["WarningCode", "CodedWarning", "coded", "legacy_coded"]


class WarningCode(StrEnum):
    # A client-timed figure taken while the client lacked CPU: its timestamps are its own; no verdict.
    CLIENT_STARVED = "client-starved"
    # A counter went down inside the window (a restart, or several servers behind one address).
    COUNTER_RESET = "counter-reset"
    # A prefix-cache hit rate that is the engine's own gauge over traffic it last counted.
    ENGINE_GAUGE = "engine-gauge"
    # An active experiment run while other clients' requests were in flight on the server.
    OTHER_TRAFFIC = "other-traffic"


class CodedWarning(str):
    """A warning's text, carrying the code the tree reads."""

    code: WarningCode

    def __new__(cls, code: WarningCode, text: str) -> CodedWarning:
        obj = super().__new__(cls, text)
        obj.code = WarningCode(code)
        return obj

    def __reduce__(self) -> tuple:  # copies and pickles keep the code
        return (CodedWarning, (self.code, str(self)))


def coded(code: WarningCode, text: str) -> CodedWarning:
    return CodedWarning(code, text)


_LEGACY: tuple[tuple[WarningCode, re.Pattern[str]], ...] = (
    (WarningCode.CLIENT_STARVED, re.compile(re.escape(Q.CLIENT_STARVED_WARNING))),
    (WarningCode.ENGINE_GAUGE, re.compile(re.escape(Q.ENGINE_HIT_RATE_WARNING))),
    (WarningCode.OTHER_TRAFFIC, re.compile(re.escape(Q.OTHER_TRAFFIC_WARNING))),
    (WarningCode.COUNTER_RESET, re.compile(r"\d+ counter reset\(s\) in the window")),
    # The decode experiment's verdict on the client/engine ITL ratio (probes/experiments/decode.py).
    (WarningCode.CLIENT_STARVED, re.compile(r"the client was starved \(event-loop lag")),
)


def legacy_coded(text: str) -> str:
    """A warning read from a file written before the codes: coded where its first words say which."""
    for code, pattern in _LEGACY:
        if pattern.match(text):
            return CodedWarning(code, text)
    return text
