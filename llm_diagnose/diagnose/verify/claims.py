"""What each technique promises, as measurable claims, and which discovered settings say it was adopted.

`CLAIMS` turns a technique's `expect` text (llm_diagnose.diagnose.tree.techniques) into typed
claims: an evidence key, the way it should move, and the smallest change that counts. Keys the
text names only as a target to move towards (kv-offload: the hit rate "towards" the prefix
potential) are `REFERENCES`, not claims. tests/test_verify_claims.py holds the keys named in each
`expect` text equal to its claims' keys plus its references, so the two cannot drift apart.

`ADOPTION` names, per technique, the `config.*` facts whose change says the technique was
turned on or re-tuned: verify identifies the adopted techniques from the configuration diff,
not from what the user says was done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from llm_diagnose.probes import quantities as Q

__all__ = [
    "Direction",
    "Claim",
    "CLAIMS",
    "REFERENCES",
    "ADOPTION",
    "SWITCHES",
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

# "up"/"down": should move that way by at least min_effect; "not-up": should not rise beyond
# min_effect (pd-disaggregation's "at equal TTFT"); "at-least": should stay at or above `level`
# in the run after the change (speculative decoding's acceptance rate), judged on that run alone.
Direction = Literal["up", "down", "not-up", "at-least"]

RELATIVE_MIN_EFFECT = 0.10  # a median, mean or rate must move by 10% to count (the gate's default tolerance)
TAIL_MIN_EFFECT = 0.20  # a tail quantile by 20% (the gate's tail tolerance: tails are noisier)
FRACTION_MIN_EFFECT = 0.05  # a fraction (hit rate, usage, waste) by 5 points, absolute
QUEUE_MIN_EFFECT = 0.5  # mean requests waiting: half a request, absolute (0 on an idle server)
PREEMPTION_MIN_EFFECT = 1.0  # preemptions in the window: one, absolute (0 when healthy)
SPEC_ACCEPTANCE_FLOOR = 0.5  # the expect text's "stays >= 0.5"


@dataclass(frozen=True)
class Claim:
    """One promise of a technique: `key` moves in `direction` by at least `min_effect`.

    `relative`: min_effect is a share of the value before (0.10 = 10%); otherwise it is in the
    key's own unit (0.05 of a fraction = 5 points). `level` is the floor of an "at-least" claim.
    """

    key: str
    direction: Direction
    min_effect: float
    relative: bool = True
    level: float | None = None

    def describe(self) -> str:
        if self.direction == "at-least":
            return f"{self.key} stays >= {self.level:g}"
        effect = f"{self.min_effect:.0%}" if self.relative else f"{self.min_effect:g}"
        if self.direction == "not-up":
            return f"{self.key} does not rise by more than {effect}"
        return f"{self.key} {self.direction} by at least {effect}"


def _up(key: str, min_effect: float = RELATIVE_MIN_EFFECT, relative: bool = True) -> Claim:
    return Claim(key, "up", min_effect, relative)


def _down(key: str, min_effect: float = RELATIVE_MIN_EFFECT, relative: bool = True) -> Claim:
    return Claim(key, "down", min_effect, relative)


CLAIMS: dict[str, tuple[Claim, ...]] = {
    "quantization": (
        _up(Q.KV_CAPACITY_TOKENS),
        _down(Q.PREEMPTIONS, PREEMPTION_MIN_EFFECT, relative=False),
        _down(Q.WAITING_MEAN, QUEUE_MIN_EFFECT, relative=False),
    ),
    "parallelism": (_down(Q.WEIGHTS_FRACTION, FRACTION_MIN_EFFECT, relative=False),),
    "scale-out": (
        _down(Q.WAITING_MEAN, QUEUE_MIN_EFFECT, relative=False),
        _down(Q.PREEMPTIONS, PREEMPTION_MIN_EFFECT, relative=False),
        _down(Q.KV_USAGE_P95, FRACTION_MIN_EFFECT, relative=False),
    ),
    "prefix-caching": (
        _up(Q.PREFIX_HIT_RATE, FRACTION_MIN_EFFECT, relative=False),
        _down(Q.TTFT_P50),
    ),
    "continuous-batching": (_down(Q.SHORT_WAIT_FOR_LONG), _up(Q.GEN_TOKENS_PER_S)),
    "paged-attention": (_down(Q.KV_WASTE_FRACTION, FRACTION_MIN_EFFECT, relative=False), _up(Q.RUNNING_MEAN)),
    "speculative-decoding": (
        _down(Q.ITL_P50),
        Claim(Q.SPEC_ACCEPTANCE_RATE, "at-least", 0.0, relative=False, level=SPEC_ACCEPTANCE_FLOOR),
    ),
    "chunked-prefill": (_down(Q.ITL_INFLATION), _down(Q.ITL_P99, TAIL_MIN_EFFECT)),
    "pd-disaggregation": (_down(Q.ITL_P99, TAIL_MIN_EFFECT), Claim(Q.TTFT_P50, "not-up", RELATIVE_MIN_EFFECT)),
    "kv-offload": (_up(Q.PREFIX_HIT_RATE, FRACTION_MIN_EFFECT, relative=False),),
    "offline-batch": (_up(Q.GEN_TOKENS_PER_S),),
}

# The claim through which a technique acts: when it did not move (or moved the wrong way), the
# technique's other claims cannot be credited to it, whatever they did. Prefix caching that served
# no more tokens from its cache cannot have cut TTFT (seen on vLLM CPU: hit rate 0% -> 0%, TTFT
# -82%, the run before being the first traffic of a server started seconds earlier; with both
# servers warmed up first, the same pair measured +12% [-75%, +52%]).
MECHANISMS: dict[str, str] = {
    "prefix-caching": Q.PREFIX_HIT_RATE,
    "paged-attention": Q.KV_WASTE_FRACTION,
}

# The parts of serving a metric can time or count. A metric that got worse after a change is the
# change's doing only where the change can make every part it spans worse; elsewhere it moved
# for another reason (with one run on each side, the likeliest is that two server instances
# differ: seen on vLLM CPU, the engine's own ITL +34% to +48% after prefix caching was turned on,
# while a paired A/B of two live servers on alternating rounds read 2.02 ms off, 1.79 ms on).
Part = Literal["queue", "prefill", "decode", "memory", "cache", "speculation"]
ALL_PARTS: frozenset[Part] = frozenset(get_args(Part))

# What a technique's mechanism can make worse, with why not the rest; a technique not named can
# make anything worse (quantization, batching, parallelism, speculation act on every step).
CAN_WORSEN: dict[str, tuple[frozenset[Part], str]] = {
    "prefix-caching": (
        frozenset({"queue", "prefill", "memory", "cache"}),
        # Its work is at admission (a lookup) and when a block fills (one hash per block of tokens,
        # microseconds against a step of milliseconds). A batch that grew because prefills ended
        # sooner decodes more slowly per token, but that is more throughput, shown on its own rows.
        "a decode step of the same batch reads the same KV whether its prefix was computed or served from the cache",
    ),
}


def can_worsen(technique: str) -> frozenset[Part]:
    """The parts of serving `technique` can make worse ("" or unknown: all of them)."""
    return CAN_WORSEN[technique][0] if technique in CAN_WORSEN else ALL_PARTS


# Keys an expect text names as a target, not as something that should move by itself.
REFERENCES: dict[str, tuple[str, ...]] = {"kv-offload": (Q.PREFIX_POTENTIAL,)}

# On/off facts: off or absent before and on after means the technique was turned on.
SWITCHES: dict[str, str] = {
    Q.PREFIX_CACHING: "prefix-caching",
    Q.CHUNKED_PREFILL: "chunked-prefill",
    Q.CONTINUOUS_BATCHING: "continuous-batching",
    Q.PAGED_KV: "paged-attention",
    Q.SPEC_DECODE: "speculative-decoding",
    Q.KV_OFFLOAD: "kv-offload",
    Q.PD_DISAGGREGATION: "pd-disaggregation",
}

# Every configuration fact verify shows, with the technique a change of it belongs to ("" for
# none: shown in the table, attributed to no technique). A switch's technique is adopted when it
# goes from off or absent to on; a setting's when its known value changes.
ADOPTION: dict[str, str] = {
    **SWITCHES,
    Q.WEIGHT_QUANTIZATION: "quantization",
    Q.KV_CACHE_DTYPE: "quantization",
    Q.BLOCK_SIZE: "paged-attention",
    Q.MAX_NUM_SEQS: "scale-out",
    Q.MAX_NUM_BATCHED_TOKENS: "chunked-prefill",
    Q.TENSOR_PARALLEL: "parallelism",
    Q.PIPELINE_PARALLEL: "parallelism",
    Q.NUM_SPECULATIVE_TOKENS: "speculative-decoding",
    Q.SPEC_METHOD: "speculative-decoding",
    Q.GPU_MEMORY_UTILIZATION: "",
    Q.MAX_MODEL_LEN: "",
    Q.ENGINE_VERSION: "",
    Q.ENGINE_MODEL: "",
    Q.DEVICE_COUNT: "",
}


def claims_for(technique: str) -> tuple[Claim, ...]:
    return CLAIMS.get(technique, ())
