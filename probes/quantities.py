"""The catalogue of evidence keys: what each probe may produce and the tree may read.

Each key names the statistic it holds (`kv.usage_p95`, not `kv.usage`), so hand-built
evidence and measured evidence mean the same thing. Units are spelled out. Probes and the
decision tree both import these constants; a key that is not here can still travel in
evidence (newer tools, other probes), the tree just does not read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Quantity", "CATALOGUE", "describe"]


@dataclass(frozen=True)
class Quantity:
    key: str
    unit: str  # "fraction", "s", "bytes", "tokens", "1/s", "count", "ratio", "bool", "str"
    description: str
    kind: str = "measurement"  # or "fact"


CATALOGUE: dict[str, Quantity] = {}


def _q(key: str, unit: str, description: str, kind: str = "measurement") -> str:
    CATALOGUE[key] = Quantity(key, unit, description, kind)
    return key


# --- engine identity and configuration (facts) ---------------------------------------
ENGINE_NAME = _q("engine.name", "str", "serving engine: vllm, sglang, trtllm, transformers, pytorch", "fact")
ENGINE_VERSION = _q("engine.version", "str", "engine version string", "fact")
ENGINE_MODEL = _q("engine.model", "str", "served model name / path", "fact")
MAX_MODEL_LEN = _q("engine.max_model_len", "tokens", "maximum sequence length the server accepts", "fact")
PREFIX_CACHING = _q("config.prefix_caching", "bool", "automatic prefix caching enabled", "fact")
CHUNKED_PREFILL = _q("config.chunked_prefill", "bool", "chunked prefill enabled", "fact")
CONTINUOUS_BATCHING = _q("config.continuous_batching", "bool", "engine batches requests at iteration level", "fact")
PAGED_KV = _q("config.paged_kv", "bool", "KV cache allocated in blocks (PagedAttention-style)", "fact")
SPEC_DECODE = _q("config.spec_decode", "bool", "speculative decoding configured", "fact")
KV_OFFLOAD = _q("config.kv_offload", "bool", "KV cache offload to CPU/disk/remote configured", "fact")
PD_DISAGGREGATION = _q("config.pd_disaggregation", "bool", "prefill and decode run on separate instances", "fact")
WEIGHT_QUANTIZATION = _q("config.weight_quantization", "str", "weight quantization method, 'none' when known to be none", "fact")
KV_CACHE_DTYPE = _q("config.kv_cache_dtype", "str", "KV cache dtype ('auto' means the model dtype)", "fact")
BLOCK_SIZE = _q("config.block_size", "tokens", "KV block (page) size", "fact")
MAX_NUM_SEQS = _q("config.max_num_seqs", "count", "scheduler's cap on concurrent sequences", "fact")
TENSOR_PARALLEL = _q("config.tensor_parallel_size", "count", "tensor-parallel degree", "fact")
GPU_MEMORY_UTILIZATION = _q("config.gpu_memory_utilization", "fraction", "share of device memory the engine may take", "fact")
INTERACTIVE = _q("workload.interactive", "bool", "someone waits for the responses (False: offline/batch)", "fact")

# --- memory (Q1) -----------------------------------------------------------------------
DEVICE_TOTAL_BYTES = _q("memory.device_total_bytes", "bytes", "accelerator memory, summed over devices used")
DEVICE_USED_BYTES = _q("memory.device_used_bytes", "bytes", "accelerator memory in use")
DEVICE_FREE_FRACTION = _q("memory.device_free_fraction", "fraction", "free accelerator memory / total")
WEIGHTS_BYTES = _q("memory.weights_bytes", "bytes", "memory taken by model weights")
WEIGHTS_FRACTION = _q("memory.weights_fraction", "fraction", "weights / accelerator memory of one device (>1: does not fit)")
KV_CACHE_BYTES = _q("memory.kv_cache_bytes", "bytes", "memory reserved for the KV cache")

# --- KV cache and scheduling (Q1, Q4) ----------------------------------------------------
KV_CAPACITY_TOKENS = _q("kv.capacity_tokens", "tokens", "tokens the KV cache can hold")
KV_USAGE_P95 = _q("kv.usage_p95", "fraction", "95th percentile of KV-cache usage over the window")
KV_USAGE_MEAN = _q("kv.usage_mean", "fraction", "mean KV-cache usage over the window")
PREEMPTIONS = _q("kv.preemptions", "count", "preemptions (recompute or swap) in the window")
PREEMPTION_RATE = _q("kv.preemptions_per_s", "1/s", "preemptions per second over the window")
KV_WASTE_FRACTION = _q("kv.waste_fraction", "fraction", "allocated KV tokens not holding a token (fragmentation and reservation)")
RUNNING_MEAN = _q("batch.running_mean", "count", "mean number of requests in the running batch")
RUNNING_MAX = _q("batch.running_max", "count", "largest running batch seen")
WAITING_MEAN = _q("queue.waiting_mean", "count", "mean number of requests waiting for capacity")
QUEUE_TIME_P50 = _q("latency.queue_p50_s", "s", "median time a request waited before scheduling")

# --- prefix reuse (Q2, kv-offload, prompt pitfalls) --------------------------------------
PREFIX_HIT_RATE = _q("prefix.hit_rate", "fraction", "prefix-cache hits / queries (tokens) over the window")
PREFIX_QUERIED_TOKENS = _q("prefix.queried_tokens", "tokens", "prompt tokens looked up in the prefix cache in the window")
PREFIX_POTENTIAL = _q("prefix.potential_fraction", "fraction", "prompt tokens an unlimited exact-prefix cache could serve (full blocks)")
PREFIX_AT_CAPACITY = _q("prefix.lru_fraction_at_capacity", "fraction", "prompt tokens an LRU cache of the server's KV capacity would serve")
DYNAMIC_PREFIX_FRACTION = _q("prompts.dynamic_prefix_fraction", "fraction", "prompt tokens similar to others but unusable by an exact-prefix cache")
UNSTABLE_SERIALIZATION_FRACTION = _q("prompts.unstable_serialization_fraction", "fraction", "requests whose JSON payload key order differs from an earlier equal payload")
PREFIX_WARM_AT_START = _q("prefix.hit_rate_first_requests", "fraction", "hit rate of the first requests of a benchmark (a cold cache gives ~0)")

# --- lengths and concurrency (Q3) --------------------------------------------------------
OUTPUT_LEN_CV = _q("outputs.length_cv", "ratio", "coefficient of variation of output lengths")
OUTPUT_LEN_P50 = _q("outputs.length_p50", "tokens", "median output length")
OUTPUT_LEN_P99 = _q("outputs.length_p99", "tokens", "99th percentile output length")
INPUT_LEN_P50 = _q("inputs.length_p50", "tokens", "median prompt length")
CONCURRENCY_MEAN = _q("load.concurrency_mean", "count", "mean requests in flight (running + waiting)")
SHORT_WAIT_FOR_LONG = _q("batching.short_request_slowdown", "ratio", "latency of short requests beside long ones / alone")

# --- latency (Q5) ------------------------------------------------------------------------
ITL_P50 = _q("decode.itl_p50_s", "s", "median inter-token latency")
ITL_P99 = _q("decode.itl_p99_s", "s", "99th percentile inter-token latency")
DECODE_TIME_SHARE = _q("decode.time_share", "fraction", "share of request latency spent decoding")
TTFT_P50 = _q("latency.ttft_p50_s", "s", "median time to first token")
TTFT_P99 = _q("latency.ttft_p99_s", "s", "99th percentile time to first token")
E2E_P50 = _q("latency.e2e_p50_s", "s", "median end-to-end request latency")
SPEC_ACCEPTANCE_RATE = _q("spec.acceptance_rate", "fraction", "accepted draft tokens / drafted tokens")
SPEC_ACCEPTANCE_LENGTH = _q("spec.mean_acceptance_length", "tokens", "tokens emitted per verification step, bonus token included")

# --- prefill/decode interference (Q6) ----------------------------------------------------
ITL_INFLATION = _q("interference.itl_inflation", "ratio", "inter-token latency during prefills / without (active experiment)")
PROMPT_ITL_CORRELATION = _q("interference.prompt_itl_correlation", "ratio", "rank correlation of prompt-token rate and ITL across scrape intervals (passive)")
KV_TRANSFER_TTFT_SHARE = _q("pd.kv_transfer_ttft_share", "fraction", "share of time to first token spent moving KV between prefill and decode")

# --- throughput ----------------------------------------------------------------------------
GEN_TOKENS_PER_S = _q("throughput.generation_tokens_per_s", "1/s", "output tokens per second over the window")
PROMPT_TOKENS_PER_S = _q("throughput.prompt_tokens_per_s", "1/s", "prompt tokens per second over the window")
REQUESTS_PER_S = _q("throughput.requests_per_s", "1/s", "finished requests per second over the window")


def describe(key: str) -> Quantity | None:
    return CATALOGUE.get(key)
