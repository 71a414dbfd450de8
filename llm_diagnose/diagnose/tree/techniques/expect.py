"""The expect text of a recommendation ("prefix.hit_rate up, latency.ttft_p50_s down"), generated
from the technique's claims so the text shown and the claims verify judges cannot drift apart.

Consecutive claims worded alike share one phrase ("A and B down"); phrases are joined by ", ";
a "not-up" claim reads "at equal KEY" and an "at-least" claim "while KEY stays >= LEVEL", both
after the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_diagnose.diagnose.tree.techniques.claim import Claim

__all__ = ["expect_text"]


def _phrase(c: Claim) -> str:
    said = c.said or c.direction
    return f"{said} towards {c.towards}" if c.towards else said


def expect_text(claims: Sequence[Claim]) -> str:
    groups: list[tuple[str, list[str]]] = []
    tail = ""
    for c in claims:
        if c.direction == "at-least":
            tail += f" while {c.key} stays >= {c.level:g}"
        elif c.direction == "not-up":
            tail += f" at equal {c.key}"
        elif groups and groups[-1][0] == _phrase(c):
            groups[-1][1].append(c.key)
        else:
            groups.append((_phrase(c), [c.key]))
    return ", ".join(f"{' and '.join(keys)} {phrase}" for phrase, keys in groups) + tail
