"""The catalogue of evidence keys: what each probe may produce and the tree may read.

Each key names the statistic it holds (`kv.usage_p95`, not `kv.usage`), so hand-built
evidence and measured evidence mean the same thing. Units are spelled out. Probes and the
decision tree both import these constants; a key that is not here can still travel in
evidence (newer tools, other probes), the tree just does not read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Quantity",
    "CATALOGUE",
    "describe",
    "CLIENT_STARVED_WARNING",
    "ENGINE_HIT_RATE_WARNING",
    "OTHER_TRAFFIC_WARNING",
]

# The first words of the warning a live measurement carries when the client was starved of CPU
# while it was taken (its timestamps are then the client's, not the server's): the tree gives
# no verdict from such a measurement. Probes write it, the tree reads it: one spelling.
CLIENT_STARVED_WARNING = "client starved:"
# The first words of the warning a prefix-cache hit rate carries where it is the engine's own
# figure (a gauge the engine computes over the traffic it last counted), not hits over lookups in
# the window: the tree never reads such a figure as this workload's. Probes write it, the tree reads it.
ENGINE_HIT_RATE_WARNING = "engine-computed gauge, not a windowed token ratio"
# The first words of the warning an active experiment's figures carry where other clients'
# requests were in flight on the server while it ran: the tree trusts such a figure less (its
# confidence drops a level). Probes write it, the tree reads it.
OTHER_TRAFFIC_WARNING = "beside other traffic:"


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
TARGET_KIND = _q(
    "target.kind",
    "str",
    "what the run attached to where it is not an engine with metrics of its own (a plain OpenAI-compatible "
    "server, measured from the client only); its note says what would measure the engine's side",
    "fact",
)
ENGINE_MODEL = _q("engine.model", "str", "served model name / path", "fact")
MAX_MODEL_LEN = _q("engine.max_model_len", "tokens", "maximum sequence length the server accepts", "fact")
PREFIX_CACHING = _q("config.prefix_caching", "bool", "automatic prefix caching enabled", "fact")
CHUNKED_PREFILL = _q("config.chunked_prefill", "bool", "chunked prefill enabled", "fact")
CONTINUOUS_BATCHING = _q("config.continuous_batching", "bool", "engine batches requests at iteration level", "fact")
PAGED_KV = _q("config.paged_kv", "bool", "KV cache allocated in blocks (PagedAttention-style)", "fact")
SPEC_DECODE = _q("config.spec_decode", "bool", "speculative decoding configured", "fact")
KV_OFFLOAD = _q("config.kv_offload", "bool", "KV cache offload to CPU/disk/remote configured", "fact")
PD_DISAGGREGATION = _q("config.pd_disaggregation", "bool", "prefill and decode run on separate instances", "fact")
WEIGHT_QUANTIZATION = _q(
    "config.weight_quantization", "str", "weight quantization method, 'none' when known to be none", "fact"
)
KV_CACHE_DTYPE = _q("config.kv_cache_dtype", "str", "KV cache dtype ('auto' means the model dtype)", "fact")
BLOCK_SIZE = _q("config.block_size", "tokens", "KV block (page) size", "fact")
MAX_NUM_SEQS = _q("config.max_num_seqs", "count", "scheduler's cap on concurrent sequences", "fact")
TENSOR_PARALLEL = _q("config.tensor_parallel_size", "count", "tensor-parallel degree", "fact")
PIPELINE_PARALLEL = _q("config.pipeline_parallel_size", "count", "pipeline-parallel degree", "fact")
NUM_SPECULATIVE_TOKENS = _q("config.num_speculative_tokens", "count", "drafted tokens per verify step", "fact")
SPEC_METHOD = _q(
    "config.spec_method", "str", "speculative method: ngram, suffix, eagle, eagle3, mtp, medusa, draft_model", "fact"
)
MAX_NUM_BATCHED_TOKENS = _q(
    "config.max_num_batched_tokens",
    "tokens",
    "token budget per step, the prefill chunk (SGLang: chunked_prefill_size)",
    "fact",
)
GPU_MEMORY_UTILIZATION = _q(
    "config.gpu_memory_utilization", "fraction", "share of device memory the engine may take", "fact"
)
INTERACTIVE = _q("workload.interactive", "bool", "someone waits for the responses (False: offline/batch)", "fact")

# --- memory (Q1) -----------------------------------------------------------------------
DEVICE_TOTAL_BYTES = _q("memory.device_total_bytes", "bytes", "accelerator memory, summed over devices used")
DEVICE_USED_BYTES = _q("memory.device_used_bytes", "bytes", "accelerator memory in use")
DEVICE_FREE_FRACTION = _q("memory.device_free_fraction", "fraction", "free accelerator memory / total")
WEIGHTS_BYTES = _q("memory.weights_bytes", "bytes", "memory taken by model weights")
WEIGHTS_FRACTION = _q(
    "memory.weights_fraction", "fraction", "weights / accelerator memory of one device (>1: does not fit)"
)
DEVICE_COUNT = _q("memory.device_count", "count", "devices serving this instance")
KV_CACHE_BYTES = _q("memory.kv_cache_bytes", "bytes", "memory reserved for the KV cache")

# --- KV cache and scheduling (Q1, Q4) ----------------------------------------------------
KV_CAPACITY_TOKENS = _q("kv.capacity_tokens", "tokens", "tokens the KV cache can hold")
KV_MAX_CONCURRENCY = _q(
    "kv.max_concurrency",
    "requests",
    "the engine's own maximum concurrency figure (vLLM: requests of max_model_len tokens the KV cache holds)",
)
KV_USAGE_P95 = _q("kv.usage_p95", "fraction", "95th percentile of KV-cache usage over the window")
KV_USAGE_MEAN = _q("kv.usage_mean", "fraction", "mean KV-cache usage over the window")
PREEMPTIONS = _q("kv.preemptions", "count", "preemptions (recompute or swap) in the window")
PREEMPTION_RATE = _q("kv.preemptions_per_s", "1/s", "preemptions per second over the window")
KV_WASTE_FRACTION = _q(
    "kv.waste_fraction", "fraction", "allocated KV tokens not holding a token (fragmentation and reservation)"
)
RUNNING_MEAN = _q("batch.running_mean", "count", "mean number of requests in the running batch")
RUNNING_MAX = _q("batch.running_max", "count", "largest running batch seen")
STEP_TOKENS_MAX = _q(
    "batch.step_tokens_max",
    "tokens",
    "tokens in the fullest engine step over the window, prefill and decode together (the upper edge of its "
    "bucket): how much of the step budget (max_num_batched_tokens) steps actually use",
)
WAITING_MEAN = _q("queue.waiting_mean", "count", "mean number of requests waiting for capacity")
QUEUE_TIME_P50 = _q("latency.queue_p50_s", "s", "median time a request waited before scheduling")

# --- prefix reuse (Q2, kv-offload, prompt pitfalls) --------------------------------------
PREFIX_HIT_RATE = _q("prefix.hit_rate", "fraction", "prefix-cache hits / queries (tokens) over the window")
PREFIX_QUERIED_TOKENS = _q(
    "prefix.queried_tokens", "tokens", "prompt tokens looked up in the prefix cache in the window"
)
PREFIX_POTENTIAL = _q(
    "prefix.potential_fraction", "fraction", "prompt tokens an unlimited exact-prefix cache could serve (full blocks)"
)
PREFIX_AT_CAPACITY = _q(
    "prefix.lru_fraction_at_capacity", "fraction", "prompt tokens an LRU cache of the server's KV capacity would serve"
)
DYNAMIC_PREFIX_FRACTION = _q(
    "prompts.dynamic_prefix_fraction",
    "fraction",
    "prompt tokens similar to others but unusable by an exact-prefix cache",
)
UNSTABLE_SERIALIZATION_FRACTION = _q(
    "prompts.unstable_serialization_fraction",
    "fraction",
    "requests whose JSON payload key order differs from an earlier equal payload",
)
PREFIX_WARM_AT_START = _q(
    "prefix.hit_rate_first_requests",
    "fraction",
    "hit rate of the first requests of a benchmark (a cold cache gives ~0)",
)

# --- lengths and concurrency (Q3) --------------------------------------------------------
OUTPUT_LEN_CV = _q("outputs.length_cv", "ratio", "coefficient of variation of output lengths")
OUTPUT_LEN_P50 = _q("outputs.length_p50", "tokens", "median output length")
OUTPUT_LEN_P99 = _q("outputs.length_p99", "tokens", "99th percentile output length")
INPUT_LEN_P50 = _q("inputs.length_p50", "tokens", "median prompt length")
CONCURRENCY_MEAN = _q("load.concurrency_mean", "count", "mean requests in flight (running + waiting)")
SHORT_WAIT_FOR_LONG = _q(
    "batching.short_request_slowdown", "ratio", "latency of short requests beside long ones / alone"
)

# --- latency (Q5) ------------------------------------------------------------------------
ITL_P50 = _q("decode.itl_p50_s", "s", "median inter-token latency")
ITL_P99 = _q("decode.itl_p99_s", "s", "99th percentile inter-token latency")
DECODE_TIME_SHARE = _q("decode.time_share", "fraction", "share of request latency spent decoding")
TTFT_P50 = _q("latency.ttft_p50_s", "s", "median time to first token")
TTFT_P99 = _q("latency.ttft_p99_s", "s", "99th percentile time to first token")
E2E_P50 = _q("latency.e2e_p50_s", "s", "median end-to-end request latency")
PREFILL_TIME_P50 = _q(
    "latency.prefill_time_p50_s",
    "s",
    "median time from a request's scheduling to its first token: the engine's prefill, queueing excluded",
)
INFERENCE_TIME_P50 = _q(
    "latency.inference_time_p50_s",
    "s",
    "median time from a request's scheduling to its last token: the engine's running time, queueing excluded",
)
SPEC_ACCEPTANCE_RATE = _q("spec.acceptance_rate", "fraction", "accepted draft tokens / drafted tokens")
SPEC_ITL_SPEEDUP = _q(
    "spec.itl_speedup", "ratio", "ITL with speculative decoding off / on, measured side by side (>1: it helps)"
)
SPEC_ACCEPTANCE_LENGTH = _q(
    "spec.mean_acceptance_length", "tokens", "tokens emitted per verification step, bonus token included"
)

# --- prefill/decode interference (Q6) ----------------------------------------------------
ITL_INFLATION = _q(
    "interference.itl_inflation", "ratio", "inter-token latency during prefills / without (active experiment)"
)
PROMPT_ITL_CORRELATION = _q(
    "interference.prompt_itl_correlation",
    "ratio",
    "rank correlation of prompt-token rate and ITL across scrape intervals (passive)",
)
KV_TRANSFER_TTFT_SHARE = _q(
    "pd.kv_transfer_ttft_share", "fraction", "share of time to first token spent moving KV between prefill and decode"
)

# --- throughput ----------------------------------------------------------------------------
GEN_TOKENS_PER_S = _q("throughput.generation_tokens_per_s", "1/s", "output tokens per second over the window")
PROMPT_TOKENS_PER_S = _q("throughput.prompt_tokens_per_s", "1/s", "prompt tokens per second over the window")
REQUESTS_PER_S = _q("throughput.requests_per_s", "1/s", "finished requests per second over the window")


def describe(key: str) -> Quantity | None:
    return CATALOGUE.get(key)


# --- live attach ---------------------------------------------------------------------------
PROCESSES_USED_BYTES = _q(
    "memory.processes_used_bytes",
    "bytes",
    "accelerator memory used by compute processes (NVML, where the driver reports it)",
)
GPU_SELECTION = _q(
    "memory.gpu_selection",
    "str",
    "which GPUs NVML's memory keys were read on: asked (--gpus), server (those running the server's processes), "
    "processes (those running any compute process: other tenants' too), node (every GPU of the node: no process "
    "visible to pick from), only (the node's one GPU); the note names them",
    "fact",
)
RUNNING_CAP_ESTIMATE = _q(
    "batch.running_cap_estimate",
    "count",
    "plateau of the running batch while requests waited and KV had room (a lower bound on max_num_seqs)",
)
LIVE_WINDOW_S = _q("live.window_s", "s", "length of the /metrics observation window (first to last good scrape)")
LIVE_WINDOW_COMPLETE = _q(
    "live.window_complete", "bool", "the scrape window ran as planned (False: the server stopped answering)", "fact"
)
BAD_SAMPLES = _q(
    "live.bad_samples",
    "count",
    "samples left out of the window as impossible: infinite, NaN or negative counts, values beyond 2^53, "
    "duplicate series, negative usage or queue readings",
)

# --- trace analytics ---
TRACE_REQUESTS = _q("trace.requests", "count", "requests read from the trace (skipped lines not counted)")
INPUT_LEN_P99 = _q("inputs.length_p99", "tokens", "99th percentile prompt length")
OUTPUT_TOP1_SHARE = _q(
    "outputs.top1pct_token_share", "fraction", "share of all output tokens in the longest 1% of requests"
)
ARRIVAL_RATE_MEAN = _q("arrivals.rate_mean_per_s", "1/s", "mean arrival rate over the trace's span")
ARRIVAL_DISPERSION = _q(
    "arrivals.dispersion_index",
    "ratio",
    "variance / mean of arrivals per bin, bins no finer than the timestamp tick (Poisson: 1)",
)
INTERARRIVAL_CV = _q(
    "arrivals.interarrival_cv",
    "ratio",
    "coefficient of variation of inter-arrival gaps (only where the tick is under a tenth of the mean gap)",
)
TIMESTAMP_RESOLUTION = _q("arrivals.timestamp_resolution_s", "s", "detected clock tick of the trace's timestamps")

# --- timing core and PyTorch probe -----------------------------------------------------
# Machine ceilings and step microbenchmarks (llm_diagnose.probes.microbench).
MEMCPY_BYTES_PER_S = _q(
    "machine.memcpy_bytes_per_s", "bytes/s", "measured device memory-copy bandwidth, bytes read + written per second"
)
MATMUL_FLOPS_PER_S = _q(
    "machine.matmul_flops_per_s", "flop/s", "measured dense square matmul rate at the model's dtype"
)
MIXED_STEP_RATIO = _q(
    "interference.mixed_step_ratio",
    "ratio",
    "microbenchmark: a step of decodes plus a prefill chunk / the decodes alone (packed proxy)",
)
MICROBENCH_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # batch sizes registered below; other sizes still travel
MICROBENCH_PROMPTS = (128, 256, 512, 1024, 2048, 4096)


def decode_step_latency_key(batch: int) -> str:
    return f"decode.step_latency_b{int(batch)}_s"


def decode_floor_key(batch: int) -> str:
    return f"decode.roofline_floor_b{int(batch)}_s"


def decode_bound_key(batch: int) -> str:
    return f"decode.bound_b{int(batch)}"


def prefill_latency_key(prompt_len: int) -> str:
    return f"prefill.latency_p{int(prompt_len)}_s"


def prefill_floor_key(prompt_len: int) -> str:
    return f"prefill.roofline_floor_p{int(prompt_len)}_s"


def decode_eager_step_latency_key(batch: int) -> str:
    return f"decode.eager_step_latency_b{int(batch)}_s"


# What the microbenchmark writes, and nothing else does: when its evidence is joined with a run's
# (`decide RUN MICROBENCH`, `run --microbench`), these keys come from the microbenchmark.
MICROBENCH_PREFIXES = (
    "machine.",
    "microbench.",
    "decode.step_latency_b",
    "decode.eager_step_latency_b",
    "decode.roofline_floor_b",
    "decode.bound_b",
    "prefill.latency_p",
    "prefill.roofline_floor_p",
    "interference.mixed_step_ratio",
)


def is_microbench_key(key: str) -> bool:
    return key.startswith(MICROBENCH_PREFIXES)


MICROBENCH_CONTEXT = _q(
    "microbench.context_tokens", "tokens", "context (cached tokens per sequence) of the decode steps reported", "fact"
)
MICROBENCH_MODEL = _q(
    "microbench.model",
    "str",
    "what the microbenchmark timed: the config or weights it built the model from, its dtype, and any shard or "
    "layer extrapolation",
    "fact",
)


for _n in MICROBENCH_BATCHES:
    _q(
        decode_step_latency_key(_n),
        "s",
        f"median latency of one decode step at batch {_n} (microbenchmark; context in the note)",
    )
    _q(decode_floor_key(_n), "s", "roofline floor of that step: max(bytes / memcpy rate, FLOPs / matmul rate)")
    _q(decode_bound_key(_n), "str", f"which ceiling sets the decode floor at batch {_n}: 'memory' or 'compute'", "fact")
    _q(
        decode_eager_step_latency_key(_n),
        "s",
        f"median latency of one decode step at batch {_n} launched eagerly, host clock around each call with the "
        "device synchronized: per-kernel dispatch included (microbenchmark)",
    )
for _n in MICROBENCH_PROMPTS:
    _q(prefill_latency_key(_n), "s", f"median latency of a {_n}-token prefill (microbenchmark)")
    _q(prefill_floor_key(_n), "s", f"roofline floor of a {_n}-token prefill")
# The in-process PyTorch probe (llm_diagnose.probes.torch_probe), read from its llmd_torch: metrics.
FORWARD_DECODE_P50 = _q(
    "forward.decode_step_p50_s", "s", "median model forward time of decode-only steps (in-process probe)"
)
FORWARD_PREFILL_P50 = _q(
    "forward.prefill_step_p50_s", "s", "median model forward time of prefill-only steps (in-process probe)"
)
FORWARD_MIXED_P50 = _q(
    "forward.mixed_step_p50_s", "s", "median model forward time of steps mixing decodes and prefill tokens"
)
FORWARD_STEPS = _q("forward.steps", "count", "model forward passes in the window")
FORWARD_BUSY_FRACTION = _q(
    "forward.busy_fraction", "fraction", "share of the window the model spent in forward passes (1: never idle)"
)
KV_ALLOCATED_TOKENS_MEAN = _q(
    "kv.allocated_tokens_mean", "tokens", "KV token slots allocated to live sequences, mean over forward steps"
)
KV_USED_TOKENS_MEAN = _q("kv.used_tokens_mean", "tokens", "KV token slots holding a token, mean over forward steps")
ALLOCATOR_ALLOCATED_BYTES = _q(
    "memory.allocator_allocated_bytes", "bytes", "bytes in live tensors (CUDA caching allocator)"
)
ALLOCATOR_RESERVED_BYTES = _q(
    "memory.allocator_reserved_bytes", "bytes", "bytes the CUDA caching allocator holds from the driver"
)
ALLOCATOR_FRAGMENTATION = _q(
    "memory.allocator_fragmentation", "fraction", "reserved but not allocated / reserved (CUDA caching allocator)"
)

# --- active probing ---
# llm_diagnose.probes.experiments: a streaming client sends known requests; ITL_INFLATION and
# SHORT_WAIT_FOR_LONG above are also produced there.
# The decode and speculative-decoding experiments' own figures, kept apart from what the engine
# served over all traffic (ITL_P50/ITL_P99 and SPEC_ACCEPTANCE_* from the passive window): a
# failed experiment must not erase the engine's figures, nor a few controlled streams stand in
# for every token the server served (issue 26, item 1). The tree reads the controlled figure
# where there is one (llm_diagnose.diagnose.tree.controlled).
DECODE_BATCH1_ITL_P50 = _q(
    "decode.batch1_itl_p50_s",
    "s",
    "median inter-token gap of one stream with nothing else of this run in flight, timed by the client "
    "(active decode experiment)",
)
DECODE_BATCH1_ITL_P99 = _q(
    "decode.batch1_itl_p99_s",
    "s",
    "99th percentile inter-token gap of one stream with nothing else of this run in flight (active decode experiment)",
)
SPEC_ACTIVE_ACCEPTANCE_RATE = _q(
    "spec.active_acceptance_rate",
    "fraction",
    "accepted draft tokens / drafted tokens over the speculative-decoding experiment (engine counters around it)",
)
SPEC_ACTIVE_ACCEPTANCE_LENGTH = _q(
    "spec.active_acceptance_length",
    "tokens",
    "tokens per verify step over the speculative-decoding experiment (engine counters around it, else tokens "
    "per streamed event)",
)
DECODE_ITL_AT_CONCURRENCY = _q(
    "decode.itl_p50_at_max_concurrency_s",
    "s",
    "median inter-token gap with the most concurrent streams the decode experiment ran (count in the note)",
)
DECODE_ITL_GROWTH = _q(
    "decode.itl_growth_with_concurrency",
    "ratio",
    "mean inter-token gap at the highest tested concurrency / at batch 1 "
    "(active; means, since bursty delivery drives medians to 0)",
)
DECODE_ITL_JUMP = _q(
    "decode.itl_superlinear_jump",
    "ratio",
    "steepest rise of the mean inter-token gap between two neighbouring concurrency levels of the decode "
    "experiment, over the rise in streams (1: as a fully compute-bound step; above: more than batching explains)",
)
DECODE_SERVER_ITL_MEAN = _q(
    "decode.server_itl_mean_s",
    "s",
    "the engine's own mean inter-token latency over the batch-1 decode phase (histogram delta)",
)
DECODE_CLIENT_SERVER_ITL_RATIO = _q(
    "decode.client_server_itl_ratio",
    "ratio",
    "client-measured mean gap / the engine's mean ITL over the same requests (1: they agree)",
)
INTERFERENCE_BASELINE_ITL_P50 = _q(
    "interference.itl_baseline_p50_s", "s", "median gap of steady decode streams with no prefill running (active)"
)
INTERFERENCE_DURING_ITL_P50 = _q(
    "interference.itl_during_prefill_p50_s",
    "s",
    "median gap of steady decode streams overlapping an injected prefill (active)",
)
INTERFERENCE_STALL_MAX = _q(
    "interference.stall_max_s", "s", "longest decode gap inside a prefill window minus the baseline median (active)"
)
INTERFERENCE_STALL_GROWTH = _q(
    "interference.stall_growth_ratio",
    "ratio",
    "prefill stall at the longer injected prompt / at the shorter "
    "(~1: bounded by chunking; about the prompts' length ratio: unbounded)",
)
BATCHING_SHORT_ALONE_E2E = _q(
    "batching.short_request_alone_e2e_s", "s", "latency of the short probe request with nothing else in flight (active)"
)
PREFIX_ACTIVE_REPEATED_HIT_RATE = _q(
    "prefix.active_repeated_hit_rate",
    "fraction",
    "prefix-cache hit rate of repeats of a prefix this run put in the cache (the cache works)",
)
PREFIX_ACTIVE_SALTED_HIT_RATE = _q(
    "prefix.active_salted_hit_rate", "fraction", "prefix-cache hit rate of prompts salted at their start (should be ~0)"
)
PREFIX_ACTIVE_TTFT_SPEEDUP = _q(
    "prefix.active_ttft_speedup", "ratio", "median TTFT of salted prompts / of prompts with a cached prefix"
)
SPEC_TOKENS_PER_S = _q(
    "spec.tokens_per_s", "1/s", "decode tokens per second of one stream in the speculative-decoding experiment"
)
SPEC_TOKENS_PER_EVENT = _q(
    "spec.tokens_per_event",
    "tokens",
    "output tokens per streamed event (>1: steps emit several tokens, e.g. accepted drafts)",
)
CLIENT_LOOP_LAG_P99 = _q(
    "client.loop_lag_p99_s", "s", "99th percentile event-loop lag of the load client (it delays every timestamp)"
)
CLIENT_CPU_CORES = _q(
    "client.cpu_cores", "cores", "CPU the load client process used, in cores (1: a saturated asyncio client)"
)
CLIENT_EVENT_OVERHEAD = _q("client.per_event_overhead_s", "s", "client time spent parsing one streamed token event")
CLIENT_HOST_BUSY = _q(
    "client.host_cpu_busy_fraction",
    "fraction",
    "busy fraction of the host's CPUs during active probing (server on the same host)",
)
CLIENT_HOST_OTHER_CORES = _q(
    "client.host_other_cores",
    "cores",
    "CPU used on the server's host by processes other than the server and the load client, steal included "
    "(they take CPU from the server: latencies move with it)",
)
CLIENT_SERVER_TTFT_RATIO = _q(
    "client.server_ttft_ratio",
    "ratio",
    "client's mean time to first token / the engine's histogram mean over the same experiments (1: they agree)",
)
CLIENT_SERVER_ITL_RATIO = _q(
    "client.server_itl_ratio",
    "ratio",
    "client's mean inter-token gap / the engine's histogram mean over the same experiments (1: they agree)",
)
CLIENT_SERVER_E2E_RATIO = _q(
    "client.server_e2e_ratio",
    "ratio",
    "client's mean end-to-end latency / the engine's histogram mean over the same experiments (1: they agree)",
)
CALIBRATION_ITL = _q(
    "active.calibration_itl_s",
    "s",
    "mean inter-token gap of the one calibration request the active experiments were sized from (batch 1)",
)
CALIBRATION_PREFILL_PER_TOKEN = _q(
    "active.calibration_prefill_s_per_token",
    "s",
    "(time to first token - one step) / prompt tokens of the calibration request: prefill time per prompt "
    "token, an upper bound (the request's fixed cost is in it)",
)
ACTIVE_NOTES = _q(
    "active.notes",
    "str",
    "what the active run noted about itself: experiments repeated because the client was starved, figures "
    "kept without a verdict, optional request fields the server rejected",
    "fact",
)
REPLAY_SEND_LATENESS_P50 = _q(
    "replay.send_lateness_p50_s",
    "s",
    "median of how late a replay sent each request after its recorded offset (the most punctual one taken as on time)",
)
ACTIVE_REQUESTS_SENT = _q("active.requests_sent", "count", "requests the active experiments sent")
SERVER_REQUESTS_AT_START = _q(
    "active.server_requests_at_start",
    "count",
    "requests running or waiting on the server (its own gauges, read 3 times over 1 s) just before the active run "
    "sent anything: other clients' requests, since none of the run's was in flight yet; at least 1 where no read "
    "showed one but the engine generated tokens between the later reads (the note says so)",
)
ACTIVE_FAILED_FRACTION = _q(
    "active.failed_request_fraction",
    "fraction",
    "share of active requests that ended in a server-side fault (429, 5xx, cut, timeout, refused)",
)
