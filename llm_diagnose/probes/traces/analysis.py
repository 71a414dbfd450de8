"""One pass over a trace: lengths, arrivals, prefix reuse and what the prompt pitfalls are made of.

`analyze_trace(path)` streams the file once, in batches, so memory stays bounded on traces
of millions of requests: what is kept per request is a few numbers (lengths and times,
about 24 bytes), the prefix cache's distinct blocks (8 bytes each; Mooncake ids: a byte per
id up to the largest), a bounded sample of content windows and a few hundred prompts for the
divergence examples.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np

from llm_diagnose.probes.results import now_iso
from llm_diagnose.probes.traces.arrivals import ArrivalStats, arrival_stats
from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceError, TraceFormatError
from llm_diagnose.probes.traces.hashing import chained_block_hashes, segment_positions
from llm_diagnose.probes.traces.lengths import LengthHistogram, LengthStats, length_stats
from llm_diagnose.probes.traces.pitfalls import (
    DivergenceExample,
    PromptSample,
    SampleIndex,
    SerializationStats,
    SerializationTracker,
    divergence_example,
)
from llm_diagnose.probes.traces.prefix import PrefixAnalyzer, PrefixReuse
from llm_diagnose.probes.traces.readers import (
    FORMATS,
    HASH_ID_BLOCK_TOKENS,
    HashIdBatch,
    detect_format,
    hash_id_records_batch,
    read_hash_id_batches,
    read_trace,
)
from llm_diagnose.probes.traces.records import LineLog, ReadReport, TraceRequest
from llm_diagnose.probes.traces.similarity import SimilarityStats, SimilarityTracker
from llm_diagnose.probes.traces.streaming import Column, prefetched
from llm_diagnose.probes.traces.tokenize import Tokenizer, load_tokenizer

__all__ = [
    "TraceAnalysis",
    "analyze_trace",
    "token_batch",
    "hash_id_batch",
    "full_block_ids",
    "DEFAULT_BLOCK_SIZE",
    "SCHEMA",
]

SCHEMA = "llm-diagnose/trace-analysis"
DEFAULT_BLOCK_SIZE = 16  # vLLM's default on GPU; its CPU backend uses 128
BATCH_REQUESTS = 1 << 16
BATCH_TOKENS = 1 << 22
_SAMPLE_PROMPTS = 256  # prompts kept from the start of the trace for divergence examples
_SAMPLE_DYNAMIC = 32  # and dynamic prompts kept to diff against them
_SAMPLE_CHARS = 16_000
_SAMPLE_TOKENS = 4096
_EXAMPLES = 5


@dataclass(frozen=True)
class TraceAnalysis:
    path: str
    format: str
    content: str  # "hash-ids", "token-ids", "text", "lengths only"
    read: ReadReport
    tokenizer: str | None  # None where no text was tokenised
    tokenizer_exact: bool
    block_size: int | None
    input_tokens: LengthStats | None
    output_tokens: LengthStats | None
    arrivals: ArrivalStats | None
    prefix_reuse: PrefixReuse | None
    similarity: SimilarityStats | None
    serialization: SerializationStats | None
    divergence_examples: tuple[DivergenceExample, ...]  # where sample dynamic prompts diverge, and what varies
    not_measured: dict[str, str]  # section -> why it is missing
    warnings: tuple[str, ...]
    taken_at: str = field(default_factory=now_iso)

    @property
    def requests(self) -> int:
        return self.read.requests

    def to_dict(self) -> dict:
        def d(x):
            return None if x is None else x.to_dict()

        return {
            "schema": SCHEMA,
            "version": 1,
            "path": self.path,
            "format": self.format,
            "content": self.content,
            "requests": self.requests,
            "read": self.read.to_dict(),
            "tokenizer": None if self.tokenizer is None else {"name": self.tokenizer, "exact": self.tokenizer_exact},
            "block_size": self.block_size,
            "input_tokens": d(self.input_tokens),
            "output_tokens": d(self.output_tokens),
            "arrivals": d(self.arrivals),
            "prefix_reuse": d(self.prefix_reuse),
            "dynamic_prefix": d(self.similarity),
            "serialization": d(self.serialization),
            "divergence_examples": [e.to_dict() for e in self.divergence_examples],
            "not_measured": dict(self.not_measured),
            "warnings": list(self.warnings),
            "taken_at": self.taken_at,
        }


# --- the streaming pass ---------------------------------------------------------------------
def batch_cost(r: TraceRequest) -> int:
    """About how much numpy work a request adds to a batch, in tokens."""
    if r.tokens is not None:
        return len(r.tokens)
    if r.hash_ids is not None:
        return len(r.hash_ids) * 8  # one id per block, but several arrays per id
    return len(r.text) // 4 if r.text else 1


def _batches(records: Iterator[TraceRequest]) -> Iterator[list[TraceRequest]]:
    """Batches big enough that numpy's per-call overhead does not show, small enough to bound memory."""
    batch: list[TraceRequest] = []
    cost = 0
    for r in records:
        batch.append(r)
        cost += batch_cost(r)
        if len(batch) >= BATCH_REQUESTS or cost >= BATCH_TOKENS:
            yield batch
            batch, cost = [], 0
    if batch:
        yield batch


class _Columns(NamedTuple):
    """A batch of TraceRequests transposed (`_Columns(*zip(*batch))`): per field, its values in order."""

    line: tuple[int, ...]
    timestamp_s: tuple[float | None, ...]
    end_s: tuple[float | None, ...]
    input_tokens: tuple[int | None, ...]
    output_tokens: tuple[int | None, ...]
    tokens: tuple[Sequence[int] | np.ndarray | None, ...]
    hash_ids: tuple[Sequence[int] | None, ...]
    text: tuple[str | None, ...]
    output_text: tuple[str | None, ...]
    payloads: tuple[tuple[tuple[str, Any], ...], ...]


def _floats(values: tuple) -> list | tuple:
    """Times as floats, None as NaN (a C-speed pass when nothing is missing)."""
    return values if None not in values else [math.nan if v is None else v for v in values]


def _as_tokens(ids) -> np.ndarray:
    if isinstance(ids, np.ndarray):
        return ids  # the readers' uint32 (or, for ids beyond 2^32, uint64) arrays
    try:
        return np.asarray(ids, dtype=np.uint32)
    except OverflowError:  # vocabularies beyond 2^32 do not exist, but ids from elsewhere might
        return np.asarray(ids, dtype=np.uint64)


def token_batch(arrays: Sequence[np.ndarray], block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts as (their full blocks' tokens laid end to end, full blocks each, lengths)."""
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    blocks = lengths // block_size
    if not blocks.any():
        return np.empty(0, dtype=np.uint32), blocks, lengths
    tokens = np.concatenate([a[: b * block_size] for a, b in zip(arrays, blocks.tolist())])
    return tokens, blocks, lengths


def hash_id_batch(id_lists: Sequence[Sequence[int]], input_lengths: Sequence[int | None]):
    """Mooncake prompts given as lists (json's): see `full_block_ids`."""
    n = len(id_lists)
    counts = np.fromiter(map(len, id_lists), dtype=np.int64, count=n)
    ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.uint64, count=int(counts.sum()))
    stated = np.fromiter((-1 if x is None else x for x in input_lengths), dtype=np.int64, count=n)
    return full_block_ids(ids, counts, stated)


def full_block_ids(ids: np.ndarray, counts: np.ndarray, stated: np.ndarray):
    """Mooncake prompts as (their full blocks' ids laid end to end, full blocks each, prompt tokens).

    `ids`: each prompt's block ids, prompts end to end; `counts`: ids per prompt; `stated`: the
    prompt lengths the trace states (-1 where it does not). A prompt's last id stands for a
    partial block unless its length fills it: only full blocks are matched by a prefix cache.
    """
    counts = np.asarray(counts, dtype=np.int64)
    stated = np.asarray(stated, dtype=np.int64)
    known = stated >= 0
    if known.all():  # (the usual case: every line states its length)
        blocks, tokens = np.minimum(counts, stated // HASH_ID_BLOCK_TOKENS), stated
    else:
        blocks = np.where(known, np.minimum(counts, stated // HASH_ID_BLOCK_TOKENS), counts)
        tokens = np.where(known, stated, counts * HASH_ID_BLOCK_TOKENS)
    if not np.array_equal(blocks, counts):
        partial = counts - blocks
        keep = np.ones(len(ids), dtype=bool)
        ends = np.cumsum(counts)
        if partial.max() == 1:  # the usual case: one partial last block, dropped per request
            keep[ends[partial == 1] - 1] = False
        else:
            _, local = segment_positions(counts)
            keep = local < np.repeat(blocks, counts)
        ids = ids[keep]
    return ids, blocks, tokens


class _Pass:
    def __init__(
        self, path: str, block_size: int | None, capacity: int | None, tokenizer_path: str | None, show_text: bool
    ) -> None:
        self.path = path
        self.block_size_arg = block_size
        self.capacity = capacity
        self.tokenizer_path = tokenizer_path
        self.show_text = show_text
        self.tokenizer: Tokenizer | None = None
        self.content: str | None = None  # fixed by the first request with a prompt
        self.block_size: int | None = None
        self.prefix: PrefixAnalyzer | None = None
        self.similarity: SimilarityTracker | None = None
        self.serialization = SerializationTracker()
        self.starts = Column(np.float64)
        self.ends: Column | None = None
        self.inputs, self.outputs = LengthHistogram(), LengthHistogram()
        self.input_sources: set[str] = set()
        self.output_sources: set[str] = set()
        self.no_prompt = 0
        self.samples: list[PromptSample] = []  # the first prompts of the trace
        self.dynamic_samples: list[tuple[int, PromptSample]] = []  # (samples before it, prompt)
        self._seen_prompts = 0

    def _start_content(self, kind: str) -> None:
        self.content = kind
        if kind == "hash-ids":
            if self.block_size_arg not in (None, HASH_ID_BLOCK_TOKENS):
                raise TraceError(
                    f"this trace's hash_ids stand for {HASH_ID_BLOCK_TOKENS}-token blocks: "
                    f"--block-size {self.block_size_arg} cannot apply (leave it out)",
                    path=self.path,
                )
            self.block_size = HASH_ID_BLOCK_TOKENS
            self.prefix = PrefixAnalyzer(self.block_size, self.capacity, small_ids=True)
        else:
            self.block_size = self.block_size_arg or DEFAULT_BLOCK_SIZE
            self.prefix = PrefixAnalyzer(self.block_size, self.capacity)
            self.similarity = SimilarityTracker(self.block_size)

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_path)
        return self.tokenizer

    def add(self, batch: list[TraceRequest]) -> None:
        if self.content is None:
            first = next(
                (r for r in batch if r.hash_ids is not None or r.tokens is not None or r.text is not None), None
            )
            if first is not None:
                self._start_content(
                    "hash-ids" if first.hash_ids is not None else "token-ids" if first.tokens is not None else "text"
                )
        if self.content == "hash-ids":  # (Mooncake records: the column path does it all)
            with_ids = [r for r in batch if r.hash_ids is not None]
            self.no_prompt += len(batch) - len(with_ids)
            if with_ids:
                self.add_hash_ids(hash_id_records_batch(with_ids))
            return
        # One transposition (in C) instead of a Python loop per field and request.
        cols = _Columns(*zip(*batch))
        self.starts.extend(_floats(cols.timestamp_s))
        if self.ends is None and cols.end_s.count(None) < len(batch):
            self.ends = Column(np.float64)  # most traces have no completion times: no column for them
            self.ends.extend([math.nan] * (len(self.starts) - len(batch)))
        if self.ends is not None:
            self.ends.extend(_floats(cols.end_s))
        texts = [(i, x) for i, (t, x) in enumerate(zip(cols.tokens, cols.text)) if t is None and x is not None]
        encoded = dict(zip((i for i, _ in texts), self._tok().encode_batch([x for _, x in texts]))) if texts else {}
        if self.content is not None:
            self._add_tokens(batch, encoded)
        self._add_lengths(batch, cols, encoded)
        if self.content in ("text", "token-ids"):
            for payloads in cols.payloads:
                self.serialization.add(payloads)

    def _add_lengths(self, batch: list[TraceRequest], cols: _Columns, encoded: dict[int, np.ndarray]) -> None:
        if None not in cols.input_tokens and None not in cols.output_tokens:  # lengths-only traces, Mooncake
            self.input_sources.add("trace")
            self.output_sources.add("trace")
            self.inputs.add(cols.input_tokens)
            self.outputs.add(cols.output_tokens)
            return
        inputs, outputs = [], []
        counted_in = counted_out = 0
        for i, r in enumerate(batch):
            if r.input_tokens is not None:
                inputs.append(r.input_tokens)
            elif r.tokens is not None:
                inputs.append(len(r.tokens))
            elif i in encoded:
                inputs.append(len(encoded[i]))
                counted_in += 1
            if r.output_tokens is not None:
                outputs.append(r.output_tokens)
            elif r.output_text is not None:
                outputs.append(self._tok().count(r.output_text))
                counted_out += 1
        # The trace states a length, or holds the ids; only text needs counting.
        if len(inputs) > counted_in:
            self.input_sources.add("trace")
        if counted_in:
            self.input_sources.add(self._tok().name)
        if len(outputs) > counted_out:
            self.output_sources.add("trace")
        if counted_out:
            self.output_sources.add(self._tok().name)
        self.inputs.add(inputs)
        self.outputs.add(outputs)

    def add_hash_ids(self, batch: HashIdBatch) -> None:
        """A batch of a hash-id (Mooncake) trace, as columns: no object per request."""
        if self.content is None:
            self._start_content("hash-ids")
        assert self.prefix is not None  # _start_content set it up
        self.starts.extend(batch.timestamp_s)
        for lengths, histogram, sources in (
            (batch.input_tokens, self.inputs, self.input_sources),
            (batch.output_tokens, self.outputs, self.output_sources),
        ):
            stated = lengths[lengths >= 0]
            if len(stated):
                histogram.add(stated)
                sources.add("trace")
        self.prefix.add(*full_block_ids(batch.hash_ids, batch.counts, batch.input_tokens))

    def _add_tokens(self, batch: list[TraceRequest], encoded: dict[int, np.ndarray]) -> None:
        B, prefix, similarity = self.block_size, self.prefix, self.similarity
        # A batch of prompts comes after _start_content set these up for prompts.
        assert B is not None and prefix is not None and similarity is not None
        arrays: list[np.ndarray] = []
        texts: list[str | None] = []
        for i, r in enumerate(batch):
            if r.tokens is not None:
                arrays.append(_as_tokens(r.tokens))
                texts.append(None)
            elif i in encoded:
                arrays.append(encoded[i])
                texts.append(r.text)
            else:
                self.no_prompt += 1
        if not arrays:
            return
        tokens, blocks, lengths = token_batch(arrays, B)
        hits = prefix.add(chained_block_hashes(tokens, blocks, B), blocks, lengths)
        dynamic = similarity.add(tokens, blocks * B, hits.hit_blocks)
        for j in range(min(len(arrays), max(0, _SAMPLE_PROMPTS - len(self.samples)))):
            self.samples.append(self._sample(arrays[j], texts[j]))  # the start of the trace
        for j in np.flatnonzero(dynamic)[: max(0, _SAMPLE_DYNAMIC - len(self.dynamic_samples))].tolist():
            # Diffed later against the samples kept before it (its earlier neighbours).
            before = min(len(self.samples), self._seen_prompts + j)
            self.dynamic_samples.append((before, self._sample(arrays[j], texts[j])))
        self._seen_prompts += len(arrays)

    @staticmethod
    def _sample(tokens: np.ndarray, text: str | None) -> PromptSample:
        return PromptSample(tokens[:_SAMPLE_TOKENS].copy(), None if text is None else text[:_SAMPLE_CHARS])

    def examples(self) -> list:
        if not self.dynamic_samples:
            return []
        index = SampleIndex(self.samples)
        out = []
        for before, prompt in self.dynamic_samples:
            count = self._tok().count if prompt.text is not None else len
            ex = divergence_example(prompt, index, before, count, show_text=self.show_text)
            if ex is not None:
                out.append(ex)
            if len(out) >= _EXAMPLES:
                break
        return out


def _source(sources: set[str]) -> str:
    return " and ".join(sorted(sources)) if sources else ""


def analyze_trace(
    path,
    *,
    fmt: str = "auto",
    block_size: int | None = None,
    kv_capacity_tokens: int | None = None,
    tokenizer: str | None = None,
    strict: bool = False,
    show_text: bool = False,
    assumed_tpot_s: float | None = None,
) -> TraceAnalysis:
    """Analyse a request trace in one streaming pass.

    :param fmt: one of FORMATS, or "auto" to detect it from the first lines.
    :param block_size: prefix-cache block size in tokens (default 16; Mooncake ids fix 512).
    :param kv_capacity_tokens: simulate an LRU prefix cache of this many tokens too.
    :param tokenizer: a model directory (its tokenizer.json) to count text tokens exactly.
    :param strict: fail on the first unreadable line instead of skipping and counting it.
    :param show_text: include short snippets of what varies in the dynamic-prefix finding.
    :param assumed_tpot_s: time per output token, to estimate concurrency from arrivals alone.
    :raises TraceError: (and subclasses) naming the file and line.
    """
    path = str(path)
    if fmt == "auto":
        fmt = detect_format(path)
    elif fmt not in FORMATS:
        raise TraceFormatError(f"unknown format {fmt!r}; expected auto or one of {', '.join(FORMATS)}", path=path)
    for name, value in (("block size", block_size), ("KV capacity", kv_capacity_tokens)):
        if value is not None and value < 1:
            raise TraceError(f"the {name} must be a positive number of tokens, got {value}")
    log = LineLog(path, strict)
    run = _Pass(path, block_size, kv_capacity_tokens, tokenizer, show_text)
    if fmt == "mooncake":  # columns parsed a chunk at a time, no object per request
        _feed(read_hash_id_batches(path, log), run.add_hash_ids)
    else:
        _feed(_batches(read_trace(path, fmt, log)), run.add)
    read = log.report()
    if read.requests == 0:
        first = f"; line {read.first_errors[0][0]}: {read.first_errors[0][1]}" if read.first_errors else ""
        raise EmptyTraceError(f"no readable request ({read.skipped} lines skipped{first})", path=path)
    return _finish(run, path, fmt, read, assumed_tpot_s)


_Batch = TypeVar("_Batch")


def _feed(batches: Iterator[_Batch], add: Callable[[_Batch], None]) -> None:
    if len(os.sched_getaffinity(0)) > 1:
        batches = prefetched(batches)  # parse the next batch while numpy analyses this one
    for batch in batches:
        add(batch)


def _finish(run: _Pass, path: str, fmt: str, read: ReadReport, assumed_tpot_s: float | None) -> TraceAnalysis:
    warnings: list[str] = []
    not_measured: dict[str, str] = {}
    if read.skipped:
        warnings.append(
            f"{read.skipped} unreadable lines skipped (first at line {read.first_errors[0][0]}: "
            f"{read.first_errors[0][1]}); --strict makes them errors"
        )
    tok = run.tokenizer
    if tok is not None and not tok.exact:
        warnings.append(f"text token counts come from the {tok.name}; pass --tokenizer DIR for exact counts")
    if run.tokenizer_path and tok is None:
        warnings.append("--tokenizer was not needed: the trace has no text to tokenise")

    inputs = length_stats(run.inputs, _source(run.input_sources))
    outputs = length_stats(run.outputs, _source(run.output_sources))
    if outputs is None:
        not_measured["output_tokens"] = "the trace gives no output lengths (no usage, response or output_length)"
    if inputs is None:
        not_measured["input_tokens"] = "the trace gives no prompt lengths"

    starts = run.starts.array()
    ends = None if run.ends is None else run.ends.array()
    timed = np.isfinite(starts)
    arrivals = None
    if timed.sum() >= 2:
        if not timed.all():  # (a copy only where some requests have no time)
            starts, ends = starts[timed], None if ends is None else ends[timed]
        arrivals = arrival_stats(
            starts, ends, mean_output_tokens=outputs.mean if outputs else None, assumed_tpot_s=assumed_tpot_s
        )
        if arrivals is not None and arrivals.out_of_order:
            warnings.append(f"{arrivals.out_of_order} requests arrive before the line above them; arrivals were sorted")
        if not timed.all():
            warnings.append(f"{len(timed) - int(timed.sum())} requests have no timestamp and are left out of arrivals")
    else:
        not_measured["arrivals"] = "the trace has fewer than two timestamps"

    prefix = run.prefix.result() if run.prefix is not None else None
    similarity = run.similarity.result() if run.similarity is not None else None
    serialization = run.serialization.result() if run.content in ("text", "token-ids") else None
    if prefix is None:
        not_measured["prefix_reuse"] = "the trace carries lengths only, no prompts, token ids or hash ids"
    elif not prefix.groups_exact:
        warnings.append(
            "more distinct prefix groups than counters kept: the smaller top groups' counts are lower bounds"
        )
    if similarity is None:
        not_measured["dynamic_prefix"] = (
            "the trace carries chained block ids, not prompt content: similar content "
            "behind a divergence cannot be seen"
            if run.content == "hash-ids"
            else not_measured.get("prefix_reuse", "")
        )
    if serialization is None:
        not_measured["serialization"] = "the trace carries no prompt text or JSON payloads"
    elif not serialization.complete:
        warnings.append("too many distinct JSON payloads to remember: later new ones were not checked for key order")
    if run.no_prompt:
        warnings.append(f"{run.no_prompt} requests have no prompt and are left out of prefix reuse")

    return TraceAnalysis(
        path=path,
        format=fmt,
        content=run.content or "lengths only",
        read=read,
        tokenizer=None if tok is None else tok.name,
        tokenizer_exact=bool(tok and tok.exact),
        block_size=run.block_size,
        input_tokens=inputs,
        output_tokens=outputs,
        arrivals=arrivals,
        prefix_reuse=prefix,
        similarity=similarity,
        serialization=serialization,
        divergence_examples=tuple(run.examples()) if similarity is not None else (),
        not_measured=not_measured,
        warnings=tuple(warnings),
    )
