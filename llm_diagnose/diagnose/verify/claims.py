"""verify's view of the technique records (llm_diagnose.diagnose.tree.techniques): what each
technique promises, which discovered settings say it was adopted, what it can make worse.

Every table here is read from the records; none is kept by hand except the configuration facts
verify shows that belong to no technique (`UNATTRIBUTED`). verify identifies the adopted
techniques from the configuration diff, not from what the user says was done.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.catalogue import CATALOGUE, TECHNIQUES
from llm_diagnose.diagnose.tree.techniques.claim import (
    ALL_PARTS,
    FRACTION_MIN_EFFECT,
    RELATIVE_MIN_EFFECT,
    TAIL_MIN_EFFECT,
    Claim,
    Direction,
    Part,
)
from llm_diagnose.probes import quantities as Q

__all__ = [
    "Direction",
    "Claim",
    "CLAIMS",
    "REFERENCES",
    "ADOPTION",
    "SWITCHES",
    "UNATTRIBUTED",
    "RELATIVE_MIN_EFFECT",
    "TAIL_MIN_EFFECT",
    "FRACTION_MIN_EFFECT",
    "claims_for",
    "MECHANISMS",
    "Part",
    "ALL_PARTS",
    "CAN_WORSEN",
    "can_worsen",
]

CLAIMS: dict[str, tuple[Claim, ...]] = {t.id: t.claims for t in TECHNIQUES}
# Keys an expect text names as a target, not as something that should move by itself.
REFERENCES: dict[str, tuple[str, ...]] = {t.id: t.references for t in TECHNIQUES if t.references}
# The claim through which a technique acts: when it did not move (or moved the wrong way), the
# technique's other claims cannot be credited to it, whatever they did.
MECHANISMS: dict[str, str] = {t.id: t.mechanism for t in TECHNIQUES if t.mechanism}
# What a technique's mechanism can make worse, with why not the rest; a technique not named can
# make anything worse (quantization, batching, parallelism, speculation act on every step).
CAN_WORSEN: dict[str, tuple[frozenset[Part], str]] = {
    t.id: (t.worsens, t.worsens_why) for t in TECHNIQUES if t.worsens != ALL_PARTS
}

# On/off facts: off or absent before and on after means the technique was turned on.
SWITCHES: dict[str, str] = {t.switch: t.id for t in TECHNIQUES if t.switch}
# Configuration facts verify shows that belong to no technique: a change of one is shown in the
# table and attributed to none.
UNATTRIBUTED = (Q.GPU_MEMORY_UTILIZATION, Q.MAX_MODEL_LEN, Q.ENGINE_VERSION, Q.ENGINE_MODEL, Q.DEVICE_COUNT)
# Every configuration fact verify shows, with the technique a change of it belongs to ("" for
# none): the switches, then the settings that tune a technique, then the unattributed. A switch's
# technique is adopted when it goes from off or absent to on; a setting's when its known value changes.
ADOPTION: dict[str, str] = {
    **SWITCHES,
    **{key: t.id for t in TECHNIQUES for key in t.tuned_by},
    **dict.fromkeys(UNATTRIBUTED, ""),
}


def claims_for(technique: str) -> tuple[Claim, ...]:
    t = CATALOGUE.get(technique)
    return t.claims if t is not None else ()


def can_worsen(technique: str) -> frozenset[Part]:
    """The parts of serving `technique` can make worse ("" or unknown: all of them)."""
    t = CATALOGUE.get(technique)
    return t.worsens if t is not None else ALL_PARTS
