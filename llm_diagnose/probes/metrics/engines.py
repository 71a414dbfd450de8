"""What each engine calls each concept, across versions, and which engine a page came from.

The table is `ENGINE_METRICS[engine][concept] -> candidates`, newest name first; the first
candidate a window actually contains wins (see `Window.resolve`). Sources: the engines' own
code as summarised in shared/notes/engine-metrics.md, sections 3 (vLLM renames) and 7
(cross-engine map). Names are wire sample names (counters with `_total`; histograms by
their base name).

Aggregation over data-parallel ranks (`engine` in vLLM V1, `dp_rank` in SGLang) is part of
the concept: counts and queue lengths add up; usage fractions take the fullest rank, since
that is the one that preempts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llm_diagnose.probes.metrics.exposition import Scrape

__all__ = [
    "Sel",
    "Ratio",
    "Product",
    "HitPair",
    "Candidate",
    "Concept",
    "CONCEPTS",
    "ENGINE_METRICS",
    "ENGINES",
    "EngineGuess",
    "detect_engine",
    "metrics_hint_for",
    "selector_parts",
    "ENGINE_PREFIXES",
]


@dataclass(frozen=True)
class Sel:
    """A sample name, optionally restricted to series carrying some label values."""

    name: str
    where: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        if not self.where:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in self.where) + "}"


@dataclass(frozen=True)
class Ratio:
    """A gauge computed per scrape as num / den (Triton reports KV blocks used and max)."""

    num: Sel
    den: Sel

    def describe(self) -> str:
        return f"{self.num.describe()} / {self.den.describe()}"


@dataclass(frozen=True)
class Product:
    """A gauge computed per scrape as a * b (KV capacity = blocks x tokens per block)."""

    a: Sel
    b: Sel

    def describe(self) -> str:
        return f"{self.a.describe()} * {self.b.describe()}"


@dataclass(frozen=True)
class HitPair:
    """A prefix-cache hit rate from two counters of one generation of names.

    hits / queries when the engine counts lookups, hits / (hits + misses) when it counts
    misses; both counters must come from the same source (mixing a scheduler-side hit count
    with a tokenizer-side prompt count would compare different things).
    """

    hits: Sel
    queries: Sel | None = None
    misses: Sel | None = None
    unit: str = "tokens"

    def describe(self) -> str:
        if self.queries is not None:
            return f"{self.hits.describe()} / {self.queries.describe()}"
        assert self.misses is not None
        return f"{self.hits.describe()} / ({self.hits.describe()} + {self.misses.describe()})"

    @property
    def parts(self) -> tuple[Sel, ...]:
        return (self.hits,) + tuple(p for p in (self.queries, self.misses) if p is not None)


Candidate = Sel | Ratio | Product | HitPair


def selector_parts(candidate: Candidate) -> tuple[Sel, ...]:
    """The plain selectors a candidate reads (all must be on a page for it to apply)."""
    if isinstance(candidate, Sel):
        return (candidate,)
    if isinstance(candidate, Ratio):
        return (candidate.num, candidate.den)
    if isinstance(candidate, Product):
        return (candidate.a, candidate.b)
    return candidate.parts


@dataclass(frozen=True)
class Concept:
    kind: Literal["gauge", "counter", "histogram", "info"]
    aggregate: Literal["sum", "max", "first"]
    description: str


CONCEPTS: dict[str, Concept] = {
    "kv_usage": Concept("gauge", "max", "fraction 0-1 of KV-cache capacity in use"),
    "kv_capacity_tokens": Concept("gauge", "sum", "tokens the KV cache holds (summed over DP ranks)"),
    "running": Concept("gauge", "sum", "requests in the running batch"),
    "waiting": Concept("gauge", "sum", "requests waiting for capacity"),
    "preemptions": Concept("counter", "sum", "preempted (recomputed/retracted) requests"),
    "prefix": Concept("counter", "sum", "prefix-cache hits and lookups (or misses)"),
    "prefix_hit_rate_gauge": Concept("gauge", "max", "engine-computed hit rate (last batch or lifetime)"),
    "prompt_tokens": Concept("counter", "sum", "prompt tokens (cache hits included)"),
    "prompt_tokens_computed": Concept("counter", "sum", "prompt tokens actually computed (cache hits excluded)"),
    "generation_tokens": Concept("counter", "sum", "output tokens"),
    "requests_finished": Concept("counter", "sum", "finished requests"),
    "itl": Concept("histogram", "sum", "inter-token latency, seconds"),
    "ttft": Concept("histogram", "sum", "time to first token, seconds"),
    "e2e": Concept("histogram", "sum", "end-to-end request latency, seconds"),
    "queue_time": Concept("histogram", "sum", "time waiting before scheduling, seconds"),
    "decode_time": Concept("histogram", "sum", "first token to last token, seconds"),
    "prefill_time": Concept("histogram", "sum", "scheduling to first token (queueing excluded), seconds"),
    "inference_time": Concept("histogram", "sum", "scheduling to last token (queueing excluded), seconds"),
    "iteration_tokens": Concept("histogram", "sum", "tokens per engine step, prefill and decode together"),
    "output_length": Concept("histogram", "sum", "output tokens per request"),
    "input_length": Concept("histogram", "sum", "prompt tokens per request"),
    "spec_drafts": Concept("counter", "sum", "speculative verification steps"),
    "spec_draft_tokens": Concept("counter", "sum", "drafted tokens"),
    "spec_accepted_tokens": Concept("counter", "sum", "accepted draft tokens"),
    "spec_acceptance_rate_gauge": Concept("gauge", "max", "engine-computed acceptance rate (last interval)"),
    "spec_acceptance_length_gauge": Concept("gauge", "max", "engine-computed acceptance length (last interval)"),
    "block_size": Concept("gauge", "first", "KV page size in tokens"),
    "weights_gib": Concept("gauge", "sum", "memory taken by weights, GiB"),
    "kv_cache_gib": Concept("gauge", "sum", "memory taken by the KV cache, GiB"),
    "context_len": Concept("gauge", "first", "maximum sequence length"),
    "cache_config_info": Concept("info", "first", "info gauge whose labels carry the cache configuration"),
}

_CAPACITY = (("reason", "capacity"),)

ENGINE_METRICS: dict[str, dict[str, tuple[Candidate, ...]]] = {
    "vllm": {
        # kv_cache_usage_perc from 0.9; gpu_cache_usage_perc in V0 and V1 <= 0.11 (gone in 0.12).
        "kv_usage": (Sel("vllm:kv_cache_usage_perc"), Sel("vllm:gpu_cache_usage_perc")),
        "running": (Sel("vllm:num_requests_running"),),
        # From 0.20 num_requests_waiting also counts deferred requests; the capacity reason is
        # the true queue.
        "waiting": (Sel("vllm:num_requests_waiting_by_reason", _CAPACITY), Sel("vllm:num_requests_waiting")),
        "preemptions": (Sel("vllm:num_preemptions_total"),),
        # prefix_cache_* from 0.9; gpu_prefix_cache_* in V1 0.8.x-0.11 (gone in 0.12).
        "prefix": (
            HitPair(Sel("vllm:prefix_cache_hits_total"), queries=Sel("vllm:prefix_cache_queries_total")),
            HitPair(Sel("vllm:gpu_prefix_cache_hits_total"), queries=Sel("vllm:gpu_prefix_cache_queries_total")),
        ),
        "prefix_hit_rate_gauge": (Sel("vllm:gpu_prefix_cache_hit_rate"),),  # V0: -1 means no queries
        "prompt_tokens": (Sel("vllm:prompt_tokens_total"),),
        "prompt_tokens_computed": (Sel("vllm:prompt_tokens_by_source_total", (("source", "local_compute"),)),),
        "generation_tokens": (Sel("vllm:generation_tokens_total"),),
        "requests_finished": (Sel("vllm:request_success_total"),),
        # inter_token_latency_seconds from 0.10.2; time_per_output_token_seconds until 0.13.
        "itl": (Sel("vllm:inter_token_latency_seconds"), Sel("vllm:time_per_output_token_seconds")),
        "ttft": (Sel("vllm:time_to_first_token_seconds"),),
        "e2e": (Sel("vllm:e2e_request_latency_seconds"),),
        "queue_time": (Sel("vllm:request_queue_time_seconds"),),
        "decode_time": (Sel("vllm:request_decode_time_seconds"),),
        "prefill_time": (Sel("vllm:request_prefill_time_seconds"),),
        "inference_time": (Sel("vllm:request_inference_time_seconds"),),
        # A histogram despite its name (a wire family `..._total_bucket`); from 0.24 it counts only
        # computed prompt tokens (cache hits left out). Its fullest bucket bounds the step budget used.
        "iteration_tokens": (Sel("vllm:iteration_tokens_total"),),
        "output_length": (Sel("vllm:request_generation_tokens"),),
        "input_length": (Sel("vllm:request_prompt_tokens"),),
        "spec_drafts": (Sel("vllm:spec_decode_num_drafts_total"),),
        "spec_draft_tokens": (Sel("vllm:spec_decode_num_draft_tokens_total"),),
        "spec_accepted_tokens": (Sel("vllm:spec_decode_num_accepted_tokens_total"),),
        "spec_acceptance_rate_gauge": (Sel("vllm:spec_decode_draft_acceptance_rate"),),  # V0
        "cache_config_info": (Sel("vllm:cache_config_info"),),
    },
    "sglang": {
        # Current docs show kv_cache_usage_perc; 0.4-0.5.23 have token_usage (used / max_total_num_tokens).
        "kv_usage": (Sel("sglang:kv_cache_usage_perc"), Sel("sglang:token_usage")),
        "kv_capacity_tokens": (Sel("sglang:max_total_num_tokens"),),
        "running": (Sel("sglang:num_running_reqs"),),
        "waiting": (Sel("sglang:num_queue_reqs"),),
        "preemptions": (Sel("sglang:num_retracted_requests_total"),),  # 0.5.x; the gauge cannot be summed
        # Cumulative token counters: the scheduler's realtime_tokens (0.5.x), else the tokenizer's
        # cached / prompt tokens. cache_hit_rate (a gauge) covers only the last prefill batch.
        "prefix": (
            HitPair(
                Sel("sglang:realtime_tokens_total", (("mode", "prefill_cache"),)),
                misses=Sel("sglang:realtime_tokens_total", (("mode", "prefill_compute"),)),
            ),
            HitPair(Sel("sglang:cached_tokens_total"), queries=Sel("sglang:prompt_tokens_total")),
        ),
        "prefix_hit_rate_gauge": (Sel("sglang:cache_hit_rate"),),
        "prompt_tokens": (Sel("sglang:prompt_tokens_total"),),
        "prompt_tokens_computed": (Sel("sglang:realtime_tokens_total", (("mode", "prefill_compute"),)),),
        "generation_tokens": (Sel("sglang:generation_tokens_total"),),
        "requests_finished": (Sel("sglang:num_requests_total"),),
        "itl": (Sel("sglang:inter_token_latency_seconds"), Sel("sglang:time_per_output_token_seconds")),
        "ttft": (Sel("sglang:time_to_first_token_seconds"),),
        "e2e": (Sel("sglang:e2e_request_latency_seconds"),),
        "queue_time": (Sel("sglang:queue_time_seconds"),),
        "output_length": (Sel("sglang:generation_tokens_histogram"),),
        "input_length": (Sel("sglang:prompt_tokens_histogram"),),
        "spec_acceptance_rate_gauge": (Sel("sglang:spec_accept_rate"),),
        "spec_acceptance_length_gauge": (Sel("sglang:spec_accept_length"),),
        "block_size": (Sel("sglang:page_size"),),
        "weights_gib": (Sel("sglang:weight_memory_usage_gb"),),  # GiB: SGLang divides bytes by 1 << 30
        "kv_cache_gib": (Sel("sglang:kv_cache_memory_usage_gb"),),
        "context_len": (Sel("sglang:context_len"),),
    },
    "trtllm": {
        # trtllm-serve (/prometheus/metrics, `trtllm_`; Dynamo re-exports as `trtllm:`), then
        # the Triton backend's nv_trt_llm_* gauges.
        "kv_usage": (
            Sel("trtllm_kv_cache_utilization"),
            Sel("trtllm:kv_cache_utilization"),
            Ratio(
                Sel("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "used"),)),
                Sel("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "max"),)),
            ),
        ),
        "kv_capacity_tokens": (
            Product(Sel("trtllm_kv_cache_max_blocks"), Sel("trtllm_kv_cache_tokens_per_block")),
            Product(
                Sel("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "max"),)),
                Sel("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "tokens_per"),)),
            ),
        ),
        "running": (
            Sel("trtllm_num_requests_running"),
            Sel("trtllm:num_requests_running"),
            Sel("nv_trt_llm_request_metrics", (("request_type", "active"),)),
        ),
        "waiting": (
            Sel("trtllm_num_requests_waiting"),
            Sel("trtllm:num_requests_waiting"),
            Sel("nv_trt_llm_request_metrics", (("request_type", "waiting"),)),
        ),
        # Block-granular: reused / (reused + missed) is the closest TRT-LLM has to a token hit rate.
        "prefix": (
            HitPair(
                Sel("trtllm_kv_cache_reused_blocks_total"),
                misses=Sel("trtllm_kv_cache_missed_blocks_total"),
                unit="blocks",
            ),
        ),
        "prefix_hit_rate_gauge": (Sel("trtllm_kv_cache_hit_rate"), Sel("trtllm:kv_cache_hit_rate")),
        "prompt_tokens": (Sel("trtllm_prompt_tokens_total"), Sel("trtllm:prompt_tokens_total")),
        "generation_tokens": (Sel("trtllm_generation_tokens_total"), Sel("trtllm:generation_tokens_total")),
        "requests_finished": (Sel("trtllm_request_success_total"), Sel("trtllm:request_success_total")),
        "itl": (Sel("trtllm_time_per_output_token_seconds"), Sel("trtllm:time_per_output_token_seconds")),
        "ttft": (Sel("trtllm_time_to_first_token_seconds"), Sel("trtllm:time_to_first_token_seconds")),
        "e2e": (Sel("trtllm_e2e_request_latency_seconds"), Sel("trtllm:e2e_request_latency_seconds")),
        "queue_time": (Sel("trtllm_request_queue_time_seconds"), Sel("trtllm:request_queue_time_seconds")),
        "decode_time": (Sel("trtllm_request_decode_time_seconds"),),
        "spec_draft_tokens": (Sel("trtllm_spec_decode_num_draft_tokens_total"),),
        "spec_accepted_tokens": (Sel("trtllm_spec_decode_num_accepted_tokens_total"),),
        "spec_acceptance_length_gauge": (Sel("trtllm_spec_decode_acceptance_length"),),
        "block_size": (
            Sel("trtllm_kv_cache_tokens_per_block"),
            Sel("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "tokens_per"),)),
        ),
    },
    # llm-diagnose's in-process probe (llm_diagnose.probes.torch_probe): transformers serve, PyTorch servers
    "pytorch": {
        "running": (Sel("llmd_torch:running_requests"),),
        "waiting": (Sel("llmd_torch:waiting_requests"),),
        "kv_usage": (Sel("llmd_torch:kv_usage_fraction"),),
        "kv_capacity_tokens": (Sel("llmd_torch:kv_capacity_tokens"),),
        "requests_finished": (Sel("llmd_torch:requests_finished_total"),),
        "output_length": (Sel("llmd_torch:request_generation_tokens"),),
        "input_length": (Sel("llmd_torch:request_prompt_tokens"),),
        "block_size": (Sel("llmd_torch:kv_block_size_tokens"),),
    },
}
ENGINES = tuple(ENGINE_METRICS)

# Sample-name prefixes that identify an engine on a /metrics page.
_PREFIXES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:",),
    "sglang": ("sglang:",),
    "trtllm": ("trtllm_", "trtllm:", "nv_trt_llm_"),
    "pytorch": ("llmd_torch:",),
}
# Process- and HTTP-level series an engine keeps even with its stats switched off; they
# must not count as engine metrics.
_NOT_ENGINE = ("sglang:process_", "sglang:http_")
ENGINE_PREFIXES = _PREFIXES  # public: the Prometheus-server source selects an engine's series by them


@dataclass(frozen=True)
class EngineGuess:
    """Which engine a page came from, and what its metric names say about the version."""

    engine: str | None  # vllm, sglang, trtllm, or None when no engine series are present
    engine_series: int  # how many engine sample names the page carries
    version_hint: str | None  # e.g. "V1, >=0.20" (from which names exist), None when unknown
    evidence: tuple[str, ...]  # the observations behind the hint, for the report

    @property
    def describe(self) -> str:
        if self.engine is None:
            return "no engine metrics"
        return self.engine + (f" ({self.version_hint})" if self.version_hint else "")


def detect_engine(scrape: Scrape) -> EngineGuess:
    """Engine and version hints from metric prefixes and labels (engine-metrics.md section 3)."""
    counts = dict.fromkeys(_PREFIXES, 0)
    for name in scrape.names():
        if name.startswith(_NOT_ENGINE):
            continue
        for engine, prefixes in _PREFIXES.items():
            if name.startswith(prefixes):
                counts[engine] += 1
    engine = max(counts, key=lambda e: counts[e])
    if counts[engine] == 0:
        return EngineGuess(None, 0, None, ())
    hint, evidence = (None, ()) if engine != "vllm" else _vllm_version_hint(scrape)
    if engine == "trtllm":
        flavour = "Triton backend" if any(n.startswith("nv_trt_llm_") for n in scrape.names()) else "trtllm-serve"
        hint, evidence = flavour, (f"{flavour} metric names",)
    if engine == "sglang":
        hint, evidence = _sglang_version_hint(scrape)
    return EngineGuess(engine, counts[engine], hint, evidence)


def _vllm_version_hint(scrape: Scrape) -> tuple[str | None, tuple[str, ...]]:
    names = scrape.names()
    has = names.__contains__
    evidence: list[str] = []
    v1 = any(
        pair[0] == "engine" for series in scrape.samples.get("vllm:num_requests_running", ()) for pair in series.labels
    )
    if has("vllm:num_requests_swapped"):
        return "V0", ("vllm:num_requests_swapped exists only in the V0 engine",)
    if v1:
        evidence.append("an `engine` label (V1 engine)")
    floor = None
    # Checked newest first: the first marker found sets the lower bound.
    markers = (
        ("vllm:request_num_preemptions", ">=0.29"),
        ("vllm:num_requests_waiting_by_reason", ">=0.20"),
        ("vllm:prompt_tokens_by_source_total", ">=0.17"),
        ("vllm:engine_sleep_state", ">=0.12"),
    )
    for name, bound in markers:
        if has(name):
            floor = bound
            evidence.append(f"{name} ({bound})")
            break
    if floor is None:
        if has("vllm:gpu_cache_usage_perc") and has("vllm:kv_cache_usage_perc"):
            floor = "0.9-0.11"
            evidence.append("both gpu_cache_usage_perc and kv_cache_usage_perc (0.9-0.11)")
        elif has("vllm:gpu_prefix_cache_queries_total") and not has("vllm:prefix_cache_queries_total"):
            floor = "0.8.x"
            evidence.append("gpu_prefix_cache_* without prefix_cache_* (V1 0.8.x)")
    parts = [p for p in ("V1" if v1 else None, floor) if p]
    return (", ".join(parts) or None), tuple(evidence)


def _sglang_version_hint(scrape: Scrape) -> tuple[str | None, tuple[str, ...]]:
    names = scrape.names()
    if "sglang:num_retracted_requests_total" in names or "sglang:kv_used_tokens" in names:
        return ">=0.5", ("0.5.x scheduler metrics (kv_used_tokens / num_retracted_requests_total)",)
    if "sglang:time_per_output_token_seconds" in names and "sglang:inter_token_latency_seconds" not in names:
        return "<=0.4.2", ("time_per_output_token_seconds without inter_token_latency_seconds",)
    return None, ()


def metrics_hint_for(engine: str | None) -> str:
    """What to change on the server so that it exposes engine metrics."""
    return {
        "vllm": "was it started with --disable-log-stats? vLLM drops its engine metrics then; restart without it",
        "sglang": "SGLang serves engine metrics only when started with --enable-metrics",
        "trtllm": (
            "trtllm-serve serves Prometheus text at /prometheus/metrics once perf metrics are on "
            "(return_perf_metrics); the Triton backend serves it on port 8002"
        ),
        "pytorch": "start the server under `llm-diagnose instrument -- CMD ...` (metrics on side port 9478)",
    }.get(
        engine or "",
        "vLLM: do not pass --disable-log-stats; SGLang: pass --enable-metrics; "
        "TensorRT-LLM: enable perf metrics and use /prometheus/metrics",
    )
