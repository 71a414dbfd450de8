"""What a technique promises, as measurable claims: an evidence key, the way it should move, and
the smallest change that counts; and the parts of serving a technique can make worse.

verify judges the claims (llm_diagnose.diagnose.verify.judge); the expect text a recommendation
shows is generated from them (llm_diagnose.diagnose.tree.techniques.expect), so the two cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from llm_diagnose.diagnose.tolerances import TAIL_TOLERANCE, TOLERANCE, TOLERANCES

__all__ = [
    "Direction",
    "Claim",
    "up",
    "down",
    "RELATIVE_MIN_EFFECT",
    "TAIL_MIN_EFFECT",
    "FRACTION_MIN_EFFECT",
    "QUEUE_MIN_EFFECT",
    "PREEMPTION_MIN_EFFECT",
    "Part",
    "ALL_PARTS",
]

# "up"/"down": should move that way by at least min_effect; "not-up": should not rise beyond
# min_effect (pd-disaggregation's "at equal TTFT"); "at-least": should stay at or above `level`
# in the run after the change (speculative decoding's acceptance rate), judged on that run alone.
Direction = Literal["up", "down", "not-up", "at-least"]

# A median, mean or rate must move by the registry's default tolerance to count (10%); a tail
# quantile by its tail one (20%: tails are noisier). The defaults, not what --thresholds sets: a
# claim's minimum effect is part of the technique's record, and its expect text is made from it.
RELATIVE_MIN_EFFECT = TOLERANCES[TOLERANCE].default
TAIL_MIN_EFFECT = TOLERANCES[TAIL_TOLERANCE].default
FRACTION_MIN_EFFECT = 0.05  # a fraction (hit rate, usage, waste) by 5 points, absolute
QUEUE_MIN_EFFECT = 0.5  # mean requests waiting: half a request, absolute (0 on an idle server)
PREEMPTION_MIN_EFFECT = 1.0  # preemptions in the window: one, absolute (0 when healthy)


@dataclass(frozen=True)
class Claim:
    """One promise of a technique: `key` moves in `direction` by at least `min_effect`.

    `relative`: min_effect is a share of the value before (0.10 = 10%); otherwise it is in the
    key's own unit (0.05 of a fraction = 5 points). `level` is the floor of an "at-least" claim.
    `said` is how the expect text words the movement where the bare direction would not do
    ("below saturation"); `towards` names a key the text gives as the target to move towards
    (kv-offload: the hit rate "towards" the prefix potential), not something judged itself.
    """

    key: str
    direction: Direction
    min_effect: float
    relative: bool = True
    level: float | None = None
    said: str = ""
    towards: str = ""

    def describe(self) -> str:
        if self.direction == "at-least":
            return f"{self.key} stays >= {self.level:g}"
        effect = f"{self.min_effect:.0%}" if self.relative else f"{self.min_effect:g}"
        if self.direction == "not-up":
            return f"{self.key} does not rise by more than {effect}"
        return f"{self.key} {self.direction} by at least {effect}"


def up(
    key: str, min_effect: float = RELATIVE_MIN_EFFECT, relative: bool = True, said: str = "", towards: str = ""
) -> Claim:
    return Claim(key, "up", min_effect, relative, said=said, towards=towards)


def down(
    key: str, min_effect: float = RELATIVE_MIN_EFFECT, relative: bool = True, said: str = "", towards: str = ""
) -> Claim:
    return Claim(key, "down", min_effect, relative, said=said, towards=towards)


# The parts of serving a metric can time or count. A metric that got worse after a change is the
# change's doing only where the change can make every part it spans worse; elsewhere it moved
# for another reason (with one run on each side, the likeliest is that two server instances
# differ: seen on vLLM CPU, the engine's own ITL +34% to +48% after prefix caching was turned on,
# while a paired A/B of two live servers on alternating rounds read 2.02 ms off, 1.79 ms on).
Part = Literal["queue", "prefill", "decode", "memory", "cache", "speculation"]
ALL_PARTS: frozenset[Part] = frozenset(get_args(Part))
