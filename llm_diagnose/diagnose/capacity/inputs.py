"""What a plan is built from: the engine's limits and parallelism from the evidence, the model
fitted on part of a run's records and checked on the rest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llm_diagnose.diagnose.capacity.fit import fit_step_model
from llm_diagnose.diagnose.capacity.model import StepModel, group_name
from llm_diagnose.diagnose.capacity.simulate import EngineLimits
from llm_diagnose.diagnose.capacity.validate import ModelValidation, validate_model
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.records import RequestRecord

__all__ = [
    "limits_from_evidence",
    "tensor_parallel_from_evidence",
    "reuse_from_evidence",
    "FittedModel",
    "fit_and_validate",
    "split_groups",
    "DEFAULT_MAX_BATCHED_TOKENS",
    "DEFAULT_MAX_NUM_SEQS",
]

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default
DEFAULT_MAX_BATCHED_TOKENS = 2048  # vLLM's default token budget per step with chunked prefill (online serving)
DEFAULT_BLOCK_SIZE = 16


def _number(evidence: Evidence, key: str) -> float | None:
    m = evidence.measurement(key)
    if m is not None:
        return m.value
    v = evidence.fact(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def limits_from_evidence(
    evidence: Evidence, *, max_batched_tokens: int | None = None, prefix_caching: bool | None = None
) -> EngineLimits:
    """The scheduler limits the evidence states, each default named in `source`."""
    said, assumed = [], []

    def take(key: str, default: float | None, label: str) -> float | None:
        v = _number(evidence, key)
        if v is None:
            if default is not None:
                assumed.append(f"{label} {default:g} (default)")
            else:
                assumed.append(f"{label} unbounded ({key} not measured)")
            return default
        said.append(f"{label} {int(v):,}" if float(v).is_integer() else f"{label} {v:g}")
        return v

    seqs = take(Q.MAX_NUM_SEQS, DEFAULT_MAX_NUM_SEQS, "max_num_seqs")
    kv = take(Q.KV_CAPACITY_TOKENS, None, "KV capacity tokens")
    block = take(Q.BLOCK_SIZE, DEFAULT_BLOCK_SIZE, "block size")
    if max_batched_tokens is None:
        # The server's config where the evidence has it (the engine's ceiling reads it), else vLLM's default.
        stated = take(Q.MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_BATCHED_TOKENS, "max_num_batched_tokens")
        max_batched_tokens = int(stated or DEFAULT_MAX_BATCHED_TOKENS)
    else:
        said.append(f"max_num_batched_tokens {max_batched_tokens} (given)")
    caching = evidence.fact(Q.PREFIX_CACHING) if prefix_caching is None else prefix_caching
    if caching is None:
        assumed.append("prefix caching off (config.prefix_caching not known)")
    source = "; ".join(
        x
        for x in (
            "from the evidence: " + ", ".join(said) if said else "",
            "assumed: " + ", ".join(assumed) if assumed else "",
        )
        if x
    )
    return EngineLimits(
        int(seqs or DEFAULT_MAX_NUM_SEQS),
        int(max_batched_tokens),
        None if kv is None else int(kv),
        int(block or DEFAULT_BLOCK_SIZE),
        bool(caching),
        source,
    )


def tensor_parallel_from_evidence(evidence: Evidence) -> tuple[int, str]:
    tp = _number(evidence, Q.TENSOR_PARALLEL)
    if tp is not None and tp >= 1:
        return int(tp), f"config.tensor_parallel_size = {int(tp)}"
    return 1, "config.tensor_parallel_size not measured: 1 GPU per replica assumed"


def reuse_from_evidence(evidence: Evidence) -> tuple[float | None, str]:
    """The prompt-token share a prefix cache would serve: the trace's LRU-at-capacity, else its unlimited one."""
    for key in (Q.PREFIX_AT_CAPACITY, Q.PREFIX_POTENTIAL):
        m = evidence.measurement(key)
        if m is not None:
            return m.value, key
    return None, ""


@dataclass(frozen=True)
class FittedModel:
    model: StepModel
    validation: ModelValidation
    fitted_on: int  # requests
    held_back: int


def split_groups(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """Records by the batch they were sent in (experiment, phase, and the request id without its
    index: one trial of a search, one level of a ramp), in the order sent; a single batch is
    split into its first two thirds and its last third."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: r.t_send):
        groups.setdefault(group_name(r), []).append(r)
    if len(groups) == 1:
        ((name, rs),) = groups.items()
        cut = (2 * len(rs)) // 3
        return {f"{name} (first two thirds)": rs[:cut], f"{name} (last third)": rs[cut:]}
    return groups


def fit_and_validate(
    records: Sequence[RequestRecord],
    limits: EngineLimits,
    *,
    blocks_of: Callable[[RequestRecord], tuple] | None = None,
    source: str = "requests.jsonl",
) -> FittedModel:
    """Measure the error of a model fitted on alternate groups (the 1st, 3rd, ...) on the others
    (held back); then refit on every group for the model the plan uses.

    The refit matters: alternate levels of a ramp can leave the one past the knee out of the
    half that is fitted (seen: a model fitted without it predicted the SLO met at any rate, and
    the server broke it at the bracket's low end). The error stated is that of the half-data
    model, so it is, if anything, pessimistic for the refitted one.

    Raises:
        ModelError: too few requests in the fitted groups.
    """
    groups = split_groups(records)
    names = list(groups)
    fit_on = [r for n in names[0::2] for r in groups[n]]
    held = {n: groups[n] for n in names[1::2]}
    half = fit_step_model(fit_on, limits, blocks_of=blocks_of, source=source)
    validation = validate_model(half, limits, held, blocks_of=blocks_of)
    everything = [r for rs in groups.values() for r in rs]
    model = fit_step_model(everything, limits, blocks_of=blocks_of, source=source) if held else half
    return FittedModel(model, validation, len(fit_on), sum(len(v) for v in held.values()))
