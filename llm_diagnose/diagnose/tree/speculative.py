"""Speculative decoding: does it pay where it runs, and would it help where it does not?

Whether drafts pay is judged by the tokens each verify step yields against what the drafts
cost (Leviathan et al., ICML'23: speedup ~ tokens per step / (1 + c x k), c the cost of one
drafted token against a target step, by method class), not by the per-token acceptance rate
alone: eight n-gram drafts with a quarter accepted still double the tokens per step. ITL
measured with it on against off overrules both.

Whether it would help depends on where decode sits: memory-bound at a small batch (the
verify step is nearly free), compute-bound at a large one (drafts compete for compute).
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.controlled import preferred
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.schemes import spec_method_class
from llm_diagnose.diagnose.tree.signals import roofline_at
from llm_diagnose.probes import quantities as Q

__all__ = ["acceptance", "decode_regime", "regime_and_basis"]


def acceptance(r: Reading) -> tuple[bool | None, str, bool]:
    """(too low to pay, why, measured side by side). None: not measured."""
    speedup = r.num(Q.SPEC_ITL_SPEEDUP)
    if speedup is not None:
        slower = r.compare(Q.SPEC_ITL_SPEEDUP, speedup, "<", "q5.min_itl_speedup")
        return (
            slower,
            (
                f"with it on, tokens arrive {speedup:.2f}x as fast as with it off (measured side by side)"
                + (": it slows decode" if slower else "")
            ),
            True,
        )
    # The experiment's figures where it measured them, else the engine's; each compared under its own key.
    rate_key = preferred(r.evidence, Q.SPEC_ACCEPTANCE_RATE)
    length_key = preferred(r.evidence, Q.SPEC_ACCEPTANCE_LENGTH)
    rate, length = r.num(rate_key), r.num(length_key)
    if length == 1.0 and rate is None and rate_key in r.evidence.items:
        # vLLM reports a length of 1 and an undefined rate (0/0) when nothing was drafted.
        return None, "nothing was drafted in the window (acceptance rate undefined, 1.0 token per step)", False
    k = r.num(Q.NUM_SPECULATIVE_TOKENS)
    if length is None and rate is not None and k is not None:
        length = 1.0 + rate * k  # accepted drafts per step plus the bonus token
    if k is None and rate and length is not None and rate > 0:
        k = (length - 1.0) / rate  # drafts per step, from the two counters' ratio
    if length is not None and k is not None and k > 0:
        method = r.text(Q.SPEC_METHOD)
        kind = spec_method_class(method) or "model"
        cost = r.thresholds[f"q5.draft_cost_{kind}"]
        regime, regime_why, measured = regime_and_basis(r, "q5.compute_bound_batch")
        if regime == "compute" and not measured:
            # At k+1 plain steps per verify step no acceptance pays, so judging by batch size alone
            # would always say "low": only ITL measured with it off settles a large batch.
            return (
                None,
                (
                    f"{regime_why}; whether {k:.0f} drafted token(s) per step ({length:.2f} tokens per "
                    "verify step) pay there needs ITL measured with speculative decoding off beside it on "
                    "(spec.itl_speedup), or the decode roofline (--active)"
                ),
                False,
            )
        # Memory-bound, a verify step of k+1 tokens costs about one plain step; compute-bound,
        # it costs about k+1 of them (every drafted token is computed for every sequence).
        step = (k + 1.0) if regime == "compute" else 1.0
        gain = length / (step + cost * k)
        where = (
            f"; {regime_why}, so each verify step costs about {k + 1:.0f} plain steps" if regime == "compute" else ""
        )
        low = r.compare("spec.tokens_per_step_over_cost", gain, "<", "q5.min_spec_gain")
        shown = f"{rate:.0%} of drafted tokens accepted, " if rate is not None else ""
        return (
            low,
            (
                f"{shown}{length:.2f} tokens per verify step from {k:.0f} drafted "
                f"({method or 'method not seen, priced as a draft model'}): about {gain:.2f}x the tokens per "
                f"unit of step time{where}"
                + (", so each verify step costs more than the drafts save" if low else ", so the drafts pay off")
            ),
            False,
        )
    if rate is None and length is None:
        return None, "its acceptance counters were not measured", False
    low = False
    if rate is not None:
        low = r.compare(rate_key, rate, "<", "q5.min_acceptance_rate") or low
    if length is not None:
        low = r.compare(length_key, length, "<", "q5.min_acceptance_length") or low
    shown = f"{rate:.0%} of drafted tokens accepted" if rate is not None else f"{length:.2f} tokens per step"
    return (
        low,
        (
            f"{shown} (drafts per step not seen, judged by the fixed q5.min_acceptance_* lines): "
            + ("each verify step costs more than the drafts save" if low else "drafts pay off")
        ),
        False,
    )


def decode_regime(r: Reading, large: str = "q5.compute_bound_batch") -> tuple[str | None, str]:
    """'memory' (small batch: drafts are nearly free), 'compute' (large batch: drafts cost
    compute), or None, with the reason; the measured roofline position outranks the batch
    size, which is compared with the threshold named `large`."""
    regime, why, _ = regime_and_basis(r, large)
    return regime, why


def regime_and_basis(r: Reading, large: str = "q5.compute_bound_batch") -> tuple[str | None, str, bool]:
    """`decode_regime`, and whether the regime was measured (the roofline) rather than guessed
    from the batch size."""
    batch = r.num(Q.RUNNING_MEAN)
    key = Q.RUNNING_MEAN
    if batch is None:
        batch = r.num(Q.CONCURRENCY_MEAN)
        key = Q.CONCURRENCY_MEAN
    bound, at = roofline_at(r, batch)
    if bound is not None:
        return bound, f"the decode roofline at batch {at} is {bound}-bound (running batch {batch:.0f})", True
    if batch is None:
        return None, "the running batch was not measured", False
    big = r.compare(key, batch, ">=", large)
    return (
        ("compute" if big else "memory"),
        (
            f"the running batch is {batch:.0f} sequences, "
            + ("large enough for decode to be compute-bound" if big else "small enough for decode to be memory-bound")
        ),
        False,
    )
