"""The probe's Prometheus metric names: one table, read by the recorder, the evidence and the docs.

All names carry the `llmd_torch:` prefix (colon-separated like `vllm:` and `sglang:`), so an
engine-detecting scraper can tell the page apart. Counters are listed by their wire name
(with `_total`); histograms by their base name (`_bucket`, `_count`, `_sum` on the wire).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PREFIX",
    "MetricDoc",
    "METRICS",
    "FORWARD_SECONDS_BUCKETS",
    "BATCH_BUCKETS",
    "TOKEN_BUCKETS",
]

PREFIX = "llmd_torch:"


@dataclass(frozen=True)
class MetricDoc:
    name: str  # wire name (counters with _total)
    kind: str  # counter, gauge, histogram, info
    labels: tuple[str, ...]
    meaning: str


def _m(name: str, kind: str, meaning: str, labels: tuple[str, ...] = ()) -> str:
    METRICS[PREFIX + name] = MetricDoc(PREFIX + name, kind, labels, meaning)
    return PREFIX + name


METRICS: dict[str, MetricDoc] = {}

PROBE_INFO = _m(
    "probe_info",
    "info",
    "1, with labels: engine (transformers or pytorch), engine_version, torch_version, device, model, "
    "kv_layout (dynamic, static, paged or unknown), continuous_batching (true, false or unknown)",
    ("engine", "engine_version", "torch_version", "device", "model", "kv_layout", "continuous_batching"),
)
FORWARD_SECONDS = _m(
    "forward_seconds",
    "histogram",
    "time per model step: generate's forward (CUDA events on GPU, perf_counter on CPU), or a "
    "continuous-batching scheduler step (host clock); phase: decode (one token per sequence), "
    "prefill (one sequence, several tokens; or all rows of a dense batch), mixed (several "
    "sequences, more tokens than sequences)",
    ("phase",),
)
FORWARD_TOKENS = _m("forward_tokens_total", "counter", "new (query) tokens processed by forward passes", ("phase",))
BATCH_SEQUENCES = _m("batch_sequences", "histogram", "sequences in each forward pass (_sum / _count: mean batch)")
KV_ALLOCATED_STEPS = _m(
    "kv_allocated_token_steps_total",
    "counter",
    "sum over forward steps of KV token slots (x layers) allocated to live sequences",
)
KV_USED_STEPS = _m(
    "kv_used_token_steps_total",
    "counter",
    "sum over forward steps of KV token slots (x layers) holding a token; "
    "1 - used/allocated over a window = the share lost to reservation and fragmentation",
)
KV_STEPS = _m("kv_accounted_steps_total", "counter", "forward steps whose KV cache was accounted")
KV_ALLOCATED = _m("kv_allocated_tokens", "gauge", "KV token slots (x layers) allocated at the last step")
KV_USED = _m("kv_used_tokens", "gauge", "KV token slots (x layers) holding a token at the last step")
KV_LAYERS = _m("kv_layers", "gauge", "layers summed into the kv_*_tokens figures (divide to get tokens)")
KV_CAPACITY = _m("kv_capacity_tokens", "gauge", "tokens the paged KV pool holds (continuous batching only)")
KV_USAGE = _m(
    "kv_usage_fraction",
    "gauge",
    "share of the paged KV pool held by requests at the last step, 0-1 (continuous batching only)",
)
KV_BLOCK_SIZE = _m("kv_block_size_tokens", "gauge", "tokens per KV block (continuous batching only)")
KV_BYTES = _m("kv_cache_bytes", "gauge", "bytes of KV-cache tensors at the last step (the whole pool when paged)")
WEIGHTS_BYTES = _m("weights_bytes", "gauge", "bytes of the instrumented models' parameters")
RUNNING = _m(
    "running_requests",
    "gauge",
    "requests in the running batch at the last step (continuous batching: the scheduler's active "
    "requests; generate: the rows of the batch)",
)
WAITING = _m("waiting_requests", "gauge", "requests waiting for the scheduler (continuous batching only)")
WAITING_STEPS = _m(
    "waiting_request_steps_total",
    "counter",
    "sum over steps of waiting requests (continuous batching only; / steps = mean queue)",
)
REQUESTS_FINISHED = _m(
    "requests_finished_total",
    "counter",
    "requests finished (generate: rows of each finished call; continuous batching: requests that left the scheduler)",
)
REQUEST_GENERATION_TOKENS = _m("request_generation_tokens", "histogram", "output tokens per finished request")
REQUEST_PROMPT_TOKENS = _m("request_prompt_tokens", "histogram", "prompt tokens per finished request")
_DEV = ("device",)
ALLOC_ALLOCATED = _m("allocator_allocated_bytes", "gauge", "CUDA caching allocator: bytes in live tensors", _DEV)
ALLOC_RESERVED = _m("allocator_reserved_bytes", "gauge", "CUDA caching allocator: bytes held from the driver", _DEV)
ALLOC_INACTIVE_SPLIT = _m(
    "allocator_inactive_split_bytes",
    "gauge",
    "CUDA caching allocator: bytes in split blocks no tensor uses (fragmentation)",
    _DEV,
)
ALLOC_RETRIES = _m(
    "allocator_alloc_retries_total",
    "counter",
    "CUDA caching allocator: allocations that had to free cached blocks and retry",
    _DEV,
)
ALLOC_OOMS = _m("allocator_ooms_total", "counter", "CUDA caching allocator: out-of-memory errors", _DEV)
DEVICE_TOTAL = _m("device_memory_total_bytes", "gauge", "total memory of the CUDA device the model is on", _DEV)

# 50 us to 30 s: a tiny model's CPU decode step (~1 ms) to a long prefill of a large one.
FORWARD_SECONDS_BUCKETS = (
    5e-5,
    1e-4,
    2e-4,
    5e-4,
    1e-3,
    2e-3,
    3e-3,
    5e-3,
    7.5e-3,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
# Every batch size up to 8 exactly (the window's largest batch is then exact where it matters).
BATCH_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
TOKEN_BUCKETS = (
    1,
    2,
    4,
    8,
    16,
    32,
    48,
    64,
    96,
    128,
    192,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    4096,
    8192,
    16384,
    32768,
)
