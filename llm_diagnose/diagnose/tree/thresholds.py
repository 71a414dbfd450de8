"""Named thresholds of the decision tree, with documented defaults and TOML overrides.

Every comparison the tree makes is against one of these names, and the diagnosis records
the name, the limit and the value, so a reader can see why an answer came out as it did.
Override any of them from a TOML file, either flat or as tables:

    [thresholds]
    "q2.min_reuse_fraction" = 0.2

    [thresholds.q5]
    max_itl_p50_s = 0.03

The same file may hold the workload's service-level objectives as an `[slo]` table
(`llm_diagnose.diagnose.tree.slo`); Q5 then judges decode latency against the ITL objective and uses the
q5.max_itl_* thresholds only when no ITL objective is declared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llm_diagnose.diagnose.toml_file import flatten, read_toml

__all__ = ["Threshold", "DEFAULTS", "UNIT_RANGES", "Thresholds", "ThresholdsError"]


class ThresholdsError(ValueError):
    pass


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    unit: str
    meaning: str
    source: str  # where the default comes from


_ALL: list[Threshold] = [
    # Q1: does the model fit with room to spare?
    Threshold(
        "q1.device_limit",
        1.0,
        "fraction",
        "weights above this share of one device's memory do not fit it at all",
        "physical: the weights must fit on the device that serves them",
    ),
    Threshold(
        "q1.max_weights_fraction",
        0.80,
        "fraction",
        "weights above this share of one device's memory leave too little for the KV cache",
        "vLLM reserves gpu_memory_utilization=0.9 of a device by default; weights above 0.8 leave "
        "under a tenth of the device for KV cache and activations",
    ),
    Threshold(
        "q1.min_kv_headroom",
        0.10,
        "fraction",
        "the engine's memory share (config.gpu_memory_utilization) minus the per-device weights below "
        "which too little is left for the KV cache",
        "vLLM pre-allocates gpu_memory_utilization of the device and gives the KV cache what weights and "
        "activations leave (docs.vllm.ai configuration/optimization, 'Preemption'); 0.9 - 0.8 = the "
        "q1.max_weights_fraction line at the default utilisation",
    ),
    Threshold(
        "q1.min_kv_requests",
        4.0,
        "requests",
        "KV capacity in this workload's typical requests (kv.capacity_tokens / (inputs.length_p50 + "
        "outputs.length_p50), or the engine's kv.max_concurrency) below which the cache is too small",
        "vLLM logs 'Maximum concurrency for N tokens per request' at start and refuses to start below 1; "
        "under a handful of concurrent requests each decode step reads all weights for too few sequences "
        "to batch (Kwon et al., SOSP'23, sec. 2.3)",
    ),
    Threshold(
        "q1.low_gpu_memory_utilization",
        0.85,
        "fraction",
        "config.gpu_memory_utilization below which a small KV cache is first a setting to raise",
        "vLLM's default is 0.9 (vllm serve --help); preemption advice starts with 'Increase "
        "gpu_memory_utilization' (docs.vllm.ai configuration/optimization)",
    ),
    Threshold(
        "q1.kv_saturation",
        0.90,
        "fraction",
        "KV-cache usage (p95 over the window) at or above which the cache is full",
        "vLLM counts cached-but-free prefix blocks as free, so usage near 1 means live sequences fill it",
    ),
    Threshold(
        "q1.kv_near_saturation",
        0.80,
        "fraction",
        "KV usage p95 at or above which preemptions count as the cache running full",
        "vLLM preempts only when a step cannot get a KV block (docs.vllm.ai configuration/optimization, "
        "'Preemption'); a p95 over scrapes seconds apart misses the short peaks that trigger it",
    ),
    Threshold(
        "q1.min_engine_requests",
        1.0,
        "requests",
        "the engine's own KV figure (requests of max_model_len it holds at once) below which the deployment "
        "does not fit as configured, whatever the load",
        "a request of max_model_len tokens must fit the cache to be served at all: vLLM logs 'Maximum "
        "concurrency for N tokens per request: Xx' and refuses to start below 1 on recent versions",
    ),
    Threshold(
        "q1.batch_at_cap",
        0.95,
        "fraction",
        "running batch (mean over the window) at or above this share of the engine's cap on concurrent "
        "sequences (max_num_seqs, max_running_requests, max_batch_size): the cap binds",
        "a batch held at its cap while requests wait is the scheduler's limit, not memory's; 5% below "
        "allows for the scrapes between a finished request and the next admitted one",
    ),
    Threshold(
        "q1.min_waiting",
        0.5,
        "requests",
        "mean waiting requests at or above which a full KV cache is turning requests away",
        "half a request on average: the queue is non-empty for a sizeable part of the window",
    ),
    Threshold(
        "q1.large_batch",
        32.0,
        "requests",
        "running batch at or above which decode turns compute-bound and weight-only quantization stops paying",
        "roofline: weight-only int4/int8 kernels dequantize per token; past ~32 sequences the GEMM is no "
        "longer bandwidth-bound on H100-class GPUs (vLLM/TRT-LLM quantization guides)",
    ),
    # load: did the server see enough demand to confirm capacity?
    Threshold(
        "load.min_concurrency",
        2.0,
        "requests",
        "mean requests in flight (or running) below which, with nothing waiting, the server was near idle",
        "as q3.min_concurrency: with under two requests at once no batch forms, so capacity is untested",
    ),
    Threshold(
        "load.min_tokens_per_s",
        1.0,
        "1/s",
        "generated tokens per second below which the window saw no real traffic",
        "one token a second is less than one slow stream (q5.max_itl_p50_s gives 20 tokens/s)",
    ),
    # Q2: do requests share prompt prefixes?
    Threshold(
        "q2.min_reuse_fraction",
        0.10,
        "fraction",
        "share of prompt tokens an exact-prefix cache can serve at or above which prefix caching pays",
        "vLLM V1 turns prefix caching on by default because its overhead is under 1% even at 0% hits; "
        "10% saved prefill is a clear gain",
    ),
    Threshold(
        "q2.working_ratio",
        0.50,
        "ratio",
        "live hit rate below this share of the workload's potential reuse means the cache is not working",
        "half the achievable reuse: below it eviction or prompt layout wastes most of the gain",
    ),
    Threshold(
        "q2.dead_hit_rate",
        0.02,
        "fraction",
        "live hit rate at or below which prefix caching is effectively not hitting",
        "'near zero': under one block in fifty",
    ),
    Threshold(
        "q2.active_repeat_min_hit",
        0.50,
        "fraction",
        "hit rate of repeats of a prefix the active experiment just put in the cache at or above which the "
        "cache keeps and matches it",
        "a repeat hits every full block of its prefix: the experiment's prompts span several blocks (1024 "
        "tokens: 8 of vLLM CPU's 128, 64 of a GPU's 16), so a working cache hits well over half, a broken one ~0",
    ),
    Threshold(
        "q2.dynamic_prefix_fraction",
        0.20,
        "fraction",
        "share of prompt tokens similar to others but unusable by an exact-prefix cache",
        "a fifth of the prompt tokens lost to a varying lead is worth a prompt change",
    ),
    Threshold(
        "q2.dynamic_prefix_critical",
        0.30,
        "fraction",
        "share of prompt tokens behind a varying lead at or above which `llm-diagnose trace` calls the "
        "dynamic-prefix finding critical rather than a warning (severity only: whether it is raised is "
        "q2.dynamic_prefix_fraction's, or q2.dynamic_miss_share's)",
        "the trace analysis's long-standing line: almost a third of the prefill recomputed for a prompt-layout fault",
    ),
    Threshold(
        "q2.dynamic_miss_share",
        0.50,
        "fraction",
        "share of the prefix cache's misses (1 - prefix.potential_fraction) caused by a varying prompt "
        "head at or above which the head is the pitfall, whatever its share of all tokens",
        "when the rest of the prompt is already reused, a small varying head can be most of what is "
        "still re-prefilled (issue 13, item 8); half the misses is the main cause",
    ),
    Threshold(
        "q2.dynamic_min_fraction",
        0.05,
        "fraction",
        "share of all prompt tokens a varying head must reach before its share of misses counts",
        "under 5% of prompt tokens is too little prefill to be worth a prompt change",
    ),
    Threshold(
        "q2.unstable_serialization_fraction",
        0.05,
        "fraction",
        "share of requests whose JSON key order changed against an equal earlier payload",
        "one request in twenty: a systematic serializer issue, not noise",
    ),
    Threshold(
        "q2.warm_cache_hit_rate",
        0.10,
        "fraction",
        "hit rate of a benchmark's first requests at or above which the cache was warm before it started",
        "a cold cache cannot hit on a request's first sight (vllm-project/vllm#52884, #54227)",
    ),
    Threshold(
        "q2.hit_above_potential",
        0.10,
        "fraction",
        "live hit rate above the workload's own potential by this much means state from earlier runs",
        "the workload cannot share more than it contains; 0.1 absorbs block rounding",
    ),
    # Q3: very different output lengths, concurrently?
    Threshold(
        "q3.min_output_cv",
        0.50,
        "ratio",
        "coefficient of variation of output lengths at or above which lengths are 'very different'",
        "published traces show CVs of 0.7 to above 2 (trace-formats.md); fixed-length jobs are near 0",
    ),
    Threshold(
        "q3.min_concurrency",
        2.0,
        "requests",
        "mean requests in flight at or above which requests arrive concurrently",
        "two requests at once is the least where one can wait for another",
    ),
    Threshold(
        "q3.max_short_slowdown",
        2.0,
        "ratio",
        "a short request beside long ones slower than this factor means it waits for them",
        "static batching holds a short request until the longest in its batch ends (Orca, OSDI'22)",
    ),
    # Q4: does KV fragmentation cap the batch?
    Threshold(
        "q4.max_kv_waste",
        0.30,
        "fraction",
        "share of allocated KV memory not holding tokens at or above which fragmentation caps the batch",
        "PagedAttention (Kwon et al., SOSP'23) measured 20-38% of KV memory used by tokens in static "
        "allocators; paged allocation wastes under 4%",
    ),
    Threshold(
        "q4.low_kv_usage",
        0.50,
        "fraction",
        "KV usage (p95) below which memory is left over",
        "half the cache idle while requests wait means something other than memory caps the batch",
    ),
    Threshold(
        "q4.min_waiting",
        1.0,
        "requests",
        "mean waiting requests at or above which the batch should have grown",
        "at least one request waiting on average",
    ),
    # Q5: is per-token decode latency the main complaint?
    Threshold(
        "q5.max_itl_p50_s",
        0.050,
        "s",
        "median inter-token latency above which decode speed is the complaint",
        "50 ms/token (20 tokens/s) is the usual interactive TPOT target (DistServe, Splitwise)",
    ),
    Threshold(
        "q5.max_itl_p99_s",
        0.200,
        "s",
        "p99 inter-token latency above which stalls are visible to readers",
        "200 ms is faster than reading speed (~5 tokens/s) but a visible stutter",
    ),
    Threshold(
        "q5.min_decode_share",
        0.50,
        "fraction",
        "share of request latency spent decoding at or above which decode is the main cost",
        "more than half of the latency",
    ),
    Threshold(
        "q5.min_acceptance_rate",
        0.50,
        "fraction",
        "draft-token acceptance below which speculative decoding likely slows decode",
        "with k=3-5 drafts, under half accepted leaves fewer than ~2.5 tokens per verify step, "
        "near the break-even of drafting plus verification (vLLM spec-decode docs)",
    ),
    Threshold(
        "q5.min_acceptance_length",
        1.5,
        "tokens",
        "tokens per verification step (bonus included) below which spec decoding does not pay",
        "a verify step costs at least one plain step; 1.5 tokens per step barely covers the draft cost",
    ),
    Threshold(
        "q5.draft_cost_ngram",
        0.02,
        "ratio",
        "cost of one drafted token / one target decode step for n-gram and suffix proposers",
        "they look drafts up in the prompt on the CPU, no forward pass (vLLM docs, features/"
        "speculative_decoding n_gram); what remains is the wider verify step",
    ),
    Threshold(
        "q5.draft_cost_head",
        0.08,
        "ratio",
        "cost of one drafted token / one target decode step for EAGLE, EAGLE-3, MTP and Medusa heads",
        "the draft is about one decoder layer on the target's hidden states (Li et al., EAGLE, ICML'24), "
        "a few percent of a 32-80 layer model, plus launch overhead",
    ),
    Threshold(
        "q5.draft_cost_model",
        0.20,
        "ratio",
        "cost of one drafted token / one target decode step for a separate draft model (also when the "
        "method is not known)",
        "Leviathan et al. (ICML'23) measure c = 0.02-0.2; a 1B draft for an 8B target is memory-bound "
        "like it, so it costs about its share of the bytes plus kernel launches",
    ),
    Threshold(
        "q5.min_spec_gain",
        1.1,
        "ratio",
        "accepted tokens per verify step / (1 + draft cost x num_speculative_tokens) below which "
        "speculative decoding does not pay",
        "Leviathan et al. (ICML'23), expected walltime improvement; a verify step of k+1 tokens also costs "
        "more than a plain step, so break-even needs a margin over 1",
    ),
    Threshold(
        "q5.min_itl_speedup",
        1.05,
        "ratio",
        "ITL with speculative decoding off / on below which it does not pay (measured side by side)",
        "below 1 it slows decode; up to 5% faster is within run-to-run ITL noise and does not pay for the "
        "draft's compute and memory: a measured result overrules acceptance counters",
    ),
    Threshold(
        "q5.compute_bound_batch",
        128.0,
        "requests",
        "running batch at or above which decode counts as compute-bound for speculative decoding when no "
        "roofline position was measured",
        "vLLM docs: speculative decoding is for 'medium-to-low QPS, memory-bound workloads'; verifying k "
        "drafts multiplies the tokens per step by k+1, so past ~128 sequences the step is compute-bound "
        "and speedups turn into slowdowns (Speculative Decoding: Performance or Illusion?, arXiv 2601.11580; "
        "vllm-project/vllm#19254)",
    ),
    # Q5: where the served time per token goes (llm_diagnose.diagnose.tree.time_per_token)
    Threshold(
        "q5.step_close_ratio",
        1.5,
        "ratio",
        "served inter-token gap / the hardware's decode step (graph-replayed step, else its roofline floor) at "
        "or below which the served time is close to the step: only a faster or rarer step helps",
        "Amdahl: at 1.5x the step is two thirds of each token's time, so halving the steps per token (vLLM "
        "#16035 measured 1.89-2.08 tokens per EAGLE verify step) speeds tokens up 1.5x; further out the "
        "overhead above the step caps what any step-side technique can win",
    ),
    Threshold(
        "q5.step_far_ratio",
        3.0,
        "ratio",
        "served inter-token gap / the hardware's decode step at or above which the served time is far above the "
        "step: the overhead, not the step, is the complaint",
        "at 3x the step is a third of each token's time: a free step would speed tokens up 1.5x at most and a "
        "2x faster one 1.2x; two thirds of the time is dispatch and the server's own work (issue 25: slow "
        "tokens at a small batch came from guided decoding, detokenization, LoRA, --enforce-eager, a Python "
        "sampler, many times the step)",
    ),
    Threshold(
        "q5.sharp_itl_growth",
        10.0,
        "ratio",
        "mean gap at the decode experiment's highest concurrency / at batch 1 (decode.itl_growth_with_concurrency) "
        "at or above which the growth is a pathology or contention, not batching",
        "the decode experiment runs at most 8 concurrent streams (levels 2, 4, 8); a step grows at worst "
        "linearly with its sequences (fully compute-bound), so 10x is more than batching explains: a kernel "
        "off its fast path at batch > 1, a scheduler stall, or contention outside the step (the API server's "
        "CPU, a lock)",
    ),
    Threshold(
        "q5.engine_confirms",
        0.8,
        "ratio",
        "the engine's own mean ITL over the decode experiment's batch-1 phase / the client's median gap at or "
        "above which a starved client's 'tokens are slow' is the server's (decode.server_itl_mean_s)",
        "a starved client only stretches the gaps it sees; where the engine's histogram over the same tokens "
        "reads within the client-vs-server agreement band (25%) of them, the slowness was there before the client",
    ),
    Threshold(
        "q5.sharp_itl_jump",
        2.5,
        "ratio",
        "steepest rise of the mean gap between two neighbouring concurrency levels of the decode experiment, over "
        "the rise in streams (decode.itl_superlinear_jump), at or above which the growth is a pathology or "
        "contention, not batching",
        "a step grows at worst linearly with its sequences (fully compute-bound: 1 here), so a rise 2.5x steeper "
        "than the streams is more than batching explains; real pathologies jump 10-100x from one stream to two "
        "(issue 25), 5-50 on this scale",
    ),
    Threshold(
        "q5.step_batch_ratio",
        2.0,
        "ratio",
        "largest factor between the batch the served gap was taken at and the batch the step was measured at "
        "for the two to be compared",
        "a decode step reads the same weights at every batch and one KV cache per sequence: within 2x of the "
        "batch a memory-bound step changes by the extra sequences' KV only; further apart it may be another "
        "regime, so the step is measured again at the run's batch (microbench --run RUN)",
    ),
    Threshold(
        "q5.min_delivery_ratio",
        1.25,
        "ratio",
        "client's mean gap / the engine's own mean ITL (decode.client_server_itl_ratio) at or above which the "
        "path from the engine to the client (detokenizing and streaming in the API server, proxies) is named as "
        "a part of the served time",
        "the decode experiment's agreement band is 25% (+1 ms): within it client and engine see the same gaps "
        "(llm_diagnose.probes.experiments.decode.AGREEMENT_TOLERANCE)",
    ),
    Threshold(
        "q5.stall_tail_ratio",
        3.0,
        "ratio",
        "p99 / median inter-token gap at or above which the tail is stalls, not step-to-step variation",
        "a decode step at a fixed batch varies by a few percent; a p99 three times the median is stalls (a "
        "prefill in the step, preemption, a host hiccup), which Q6's interference experiment attributes",
    ),
    # Q6: do prefill and decode contend?
    Threshold(
        "q6.min_itl_inflation",
        1.5,
        "ratio",
        "ITL during prefills / ITL without, at or above which prefill stalls decode",
        "a 50% slowdown of streams whenever a prompt arrives",
    ),
    Threshold(
        "q6.disagg_inflation",
        2.0,
        "ratio",
        "inflation that remains with chunked prefill on, at or above which disaggregation is worth it",
        "chunked prefill bounds the stall to one chunk; doubling is left only at high prefill load "
        "(DistServe, OSDI'24)",
    ),
    Threshold(
        "q6.min_correlation",
        0.5,
        "ratio",
        "rank correlation of prompt-token rate and ITL across scrapes at or above which they contend",
        "a strong monotone relation (Spearman 0.5); passive and so of lower confidence",
    ),
    Threshold(
        "q6.min_chunk_tokens",
        512.0,
        "tokens",
        "prefill chunk (config.max_num_batched_tokens / SGLang chunked_prefill_size) at or below which "
        "tuning the chunk is exhausted",
        "vLLM's chunked-prefill benchmark found 512 the best ITL on A100 (vllm-project/vllm#4580); smaller "
        "chunks turn the step memory-bound and cut throughput",
    ),
    Threshold(
        "q6.disagg_min_devices",
        8.0,
        "devices",
        "devices of the deployment at or above which separate prefill and decode pools can pay",
        "llm-d's P/D guide deploys 4 prefill replicas (TP=1) and a TP=5 decode replica; below a node the "
        "pools are too small to balance and KV transfer plus routing cost more than they save",
    ),
    Threshold(
        "q6.disagg_min_prompt_ratio",
        10.0,
        "ratio",
        "prompt tokens / output tokens (rates, else median lengths) at or above which prefill load "
        "justifies disaggregation",
        "llm-d P/D disaggregation guide: 'long context workloads (10:1 ISL:OSL) and medium-to-large "
        "models'; vLLM docs: disaggregated prefill does not improve throughput",
    ),
    Threshold(
        "parallel.max_tp_devices",
        8.0,
        "devices",
        "TP x PP at or below which the devices fit one node, where tensor parallelism is the layout for latency "
        "and pipeline parallelism only adds each stage's time to every token",
        "an HGX/DGX node links 8 GPUs by NVLink; vLLM's distributed-serving guide sets TP to the GPUs per node "
        "and PP to the number of nodes, and its maintainers recommend TP only on a single node "
        "(vllm-project/vllm#6826)",
    ),
    Threshold(
        "pd.max_kv_transfer_share",
        0.30,
        "fraction",
        "share of TTFT spent moving KV at or above which disaggregation costs more than it saves",
        "a third of TTFT in transfer erases the prefill isolation gain at small scale",
    ),
    # KV offload
    Threshold(
        "kv_offload.min_gap",
        0.10,
        "fraction",
        "reuse an unlimited cache would get minus reuse at the server's capacity",
        "ten points of prompt tokens re-prefilled only because the cache is too small",
    ),
    # fleet view (llm-diagnose fleet): replicas of one deployment compared with each other
    Threshold(
        "fleet.max_hit_rate_spread",
        0.20,
        "fraction",
        "prefix-cache hit rates of replicas further apart than this diverge",
        "replicas behind one load balancer see the same request mix; over a window of thousands of "
        "looked-up tokens their hit rates agree to a few points, so 20 points is a different cache, "
        "configuration or traffic, not noise",
    ),
    Threshold(
        "fleet.max_kv_usage_spread",
        0.25,
        "fraction",
        "KV-cache usage (p95) of replicas further apart than this diverges",
        "a quarter of the cache: one replica near q1.kv_saturation while another sits near q4.low_kv_usage",
    ),
    Threshold(
        "fleet.max_waiting_spread",
        1.0,
        "requests",
        "mean waiting requests of replicas further apart than this diverge",
        "one request queued on average on one replica and none on another (q4.min_waiting): the "
        "balancer sends work where it waits",
    ),
    Threshold(
        "fleet.min_preemptions",
        1.0,
        "count",
        "a replica with at least this many preemptions in the window while another has none diverges",
        "a preemption means that replica ran out of KV blocks; equal replicas under equal load do so together",
    ),
    Threshold(
        "fleet.max_load_ratio",
        1.5,
        "ratio",
        "prompt tokens per second of the busiest replica / the least busy above which load is imbalanced",
        "round-robin and least-request balancers keep replicas within tens of percent of each other; half "
        "again as much prefill work is an imbalance that explains KV and queue divergence",
    ),
    Threshold(
        "fleet.routing_ratio",
        0.50,
        "ratio",
        "fleet hit rate below this share of the trace's reuse means shared prefixes land on different replicas",
        "as q2.working_ratio: half the reuse one cache would get on the same requests is lost; with "
        "prefix-blind routing over N replicas a prefix shared by k requests is computed up to min(k, N) "
        "times instead of once",
    ),
    # evidence quality
    Threshold(
        "sanity.estimate_tolerance",
        0.05,
        "fraction",
        "how far two estimates of disjoint shares (content windows against cache blocks) may overshoot 1 "
        "together before the sum is flagged as impossible",
        "llm_diagnose.probes.traces.similarity estimates the dynamic share from content windows and the potential from "
        "whole blocks; the block where prompts diverge is counted by neither, so a few points of overlap "
        "are estimation, not contradiction",
    ),
    Threshold(
        "sanity.max_weights_fraction",
        100.0,
        "ratio",
        "the most memory.weights_fraction (all weights / one device's memory) may be before it is flagged "
        "as impossible rather than 'does not fit one device'",
        "a 2 T-parameter model in BF16 (4 TB) over one 40 GB device is 100x; no served model is larger, so "
        "more is a unit or parsing error",
    ),
    Threshold(
        "evidence.min_samples",
        3.0,
        "samples",
        "fewer observations than this lower an answer's confidence",
        "three scrapes give one delta and a spread",
    ),
    Threshold(
        "evidence.min_live_samples",
        3.0,
        "samples",
        "a live (client-timed) measurement needs this many samples on each side for an interval; "
        "with fewer, its verdict is inconclusive",
        "no verdict from a single probe: on a shared host one scheduling stall doubles a 80 ms probe "
        "(issue 14: a short-vs-long verdict once rested on one 'alone' probe)",
    ),
    Threshold(
        "evidence.min_window_s",
        30.0,
        "s",
        "a live window shorter than this lowers the confidence of what it measured",
        "vLLM logs its stats every 10 s and Prometheus scrapes every 15-30 s: under 30 s is one or two "
        "readings of a changing server",
    ),
    Threshold(
        "evidence.min_window_coverage",
        0.80,
        "fraction",
        "share of a live window's planned /metrics scrapes that a good page must answer (a failed scrape, "
        "and the ticks that pass while it hangs, are unanswered); below it live.window_complete is false, "
        "the run is partial (exit 4) and what the window measured is capped by confidence.short_window",
        "a fifth of the window unseen is a window cut short: a /metrics that hung answered 3 of 9 scrapes "
        "and the run called its window complete (issue 22, item 12); `run` reads it when the window ends",
    ),
    # confidence rules: how much an answer's basis supports it (0..1), and the caps that lower it
    Threshold(
        "confidence.physical",
        0.95,
        "confidence",
        "an answer from sizes alone (weights against device memory)",
        "a byte count against a byte count: only a wrong device or model can make it wrong",
    ),
    Threshold(
        "confidence.direct",
        0.90,
        "confidence",
        "an answer from a measurement of exactly what the question asks (an active experiment, a trace)",
        "the quantity itself, measured; short of 1 for sampling and workload drift",
    ),
    Threshold(
        "confidence.declared",
        1.0,
        "confidence",
        "an answer from what the user declared (--offline, an SLO)",
        "the user's word on their own workload is not evidence to weigh",
    ),
    Threshold(
        "confidence.counters",
        0.80,
        "confidence",
        "an answer from live counters and gauges over a loaded window",
        "the engine's own counters, but a proxy for the question and only for this window's traffic",
    ),
    Threshold(
        "confidence.proxy",
        0.60,
        "confidence",
        "an answer from one of several signals it needs, or from a weaker proxy",
        "half the evidence: right more often than not",
    ),
    Threshold(
        "confidence.config",
        0.70,
        "confidence",
        "an answer from the configuration alone (e.g. paged KV by design)",
        "the setting says what should happen, not what did",
    ),
    Threshold(
        "confidence.passive",
        0.50,
        "confidence",
        "ceiling for an answer from a passive correlation across scrapes",
        "correlation over a window is not an experiment: other load changes move both (issue 14)",
    ),
    Threshold(
        "confidence.ambiguous",
        0.50,
        "confidence",
        "ceiling when the measurement's interval includes 'no effect'",
        "the 95% interval straddles the line: a coin flip on which side",
    ),
    Threshold(
        "confidence.thin_samples",
        0.60,
        "confidence",
        "ceiling when a measurement has fewer than evidence.min_samples observations",
        "as evidence.min_samples",
    ),
    Threshold(
        "confidence.warnings",
        0.75,
        "confidence",
        "ceiling when a measurement carries warnings (counter resets, clipped histograms)",
        "the value may be off by what the warning says",
    ),
    Threshold(
        "confidence.counter_reset",
        0.45,
        "confidence",
        "ceiling when a counter reset inside the window (llm_diagnose.probes.metrics.passive warns 'counter reset(s)')",
        "a restart, or several servers behind one scraped address (prometheus/prometheus#3860): the deltas "
        "mix processes, so what they measure belongs to no one server",
    ),
    Threshold(
        "evidence.max_median_spread",
        0.50,
        "ratio",
        "width of a measurement's 95% median interval / the median above which its readings disagree",
        "readings that swing by more than half their median over one window (e.g. two replicas read "
        "alternately) do not describe one steady state",
    ),
    Threshold(
        "confidence.spread",
        0.50,
        "confidence",
        "ceiling when a measurement's readings disagree (evidence.max_median_spread)",
        "as evidence.max_median_spread: the median of two states describes neither",
    ),
    Threshold(
        "confidence.short_window",
        0.60,
        "confidence",
        "ceiling when a live window was shorter than evidence.min_window_s, or cut short",
        "as evidence.min_window_s",
    ),
    Threshold(
        "confidence.idle",
        0.30,
        "confidence",
        "ceiling for a capacity answer from a server that saw no load",
        "a server that saw no demand cannot confirm it handles demand (issue 13, item 1)",
    ),
    Threshold(
        "confidence.load_unknown",
        0.60,
        "confidence",
        "ceiling for a 'fits' answer when the load the server saw was not measured",
        "room to spare was seen, but not whether anything tried to use it",
    ),
    Threshold(
        "confidence.unseen_setting",
        0.80,
        "factor",
        "multiplier when a setting the answer depends on was not seen (TP/PP, the draft method)",
        "a default was assumed where the engine may run another value",
    ),
    Threshold(
        "confidence.disagreement",
        0.70,
        "factor",
        "multiplier when two signals for the same answer disagree",
        "the stronger signal decides, but the other one is a reason for doubt",
    ),
    Threshold(
        "confidence.headline_min",
        0.50,
        "confidence",
        "answers at or below this confidence do not count as measured when the headline decides between "
        "'no bottleneck found' and 'nothing was measured'",
        "'no bottleneck found' is a claim about the server: it needs at least one answer more likely right "
        "than not (issue 13, item 5)",
    ),
    Threshold(
        "confidence.other_traffic",
        0.60,
        "confidence",
        "ceiling for an answer that read an active experiment's figure taken while other clients' requests were "
        "in flight on the server (the probes' warning Q.OTHER_TRAFFIC_WARNING)",
        "a controlled experiment beside someone else's load measures theirs too (the batch-1 decode baseline is "
        "their batch plus one, an injected prefill lands among their prefills): as confidence.proxy, right more "
        "often than not, and still above confidence.headline_min so a finding can lead (issue 26, item 3)",
    ),
    Threshold(
        "confidence.sanity",
        0.40,
        "confidence",
        "ceiling for an answer that read (or needed) evidence the sanity checks flag as impossible",
        "impossible input means a broken probe or file: nothing computed from it is trustworthy",
    ),
]

DEFAULTS: dict[str, Threshold] = {t.name: t for t in _ALL}

# What a threshold of each unit may be set to: a share, a confidence or a confidence multiplier
# lies in [0, 1]; every other unit (seconds, requests, tokens, ratios, counts) is an amount, at
# least 0. Always finite: a NaN limit fails every comparison, so it would silently switch a
# check off (issue 22: a NaN tolerance turned a +97% regression into "inconclusive").
UNIT_RANGES: dict[str, tuple[float, float]] = {"fraction": (0.0, 1.0), "confidence": (0.0, 1.0), "factor": (0.0, 1.0)}
AMOUNT_RANGE = (0.0, math.inf)


def _check_value(name: str, value: object, source: str) -> float:
    """A threshold's value from a file, checked for type and its unit's range.

    Raises:
        ThresholdsError: naming the file and the threshold, with the range it accepts.
    """
    unit = DEFAULTS[name].unit
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ThresholdsError(f"{source}: threshold {name!r} must be a number, got {value!r}")
    low, high = UNIT_RANGES.get(unit, AMOUNT_RANGE)
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        what = f"between {low:g} and {high:g} (a {unit})" if math.isfinite(high) else f"at least {low:g} ({unit})"
        raise ThresholdsError(f"{source}: threshold {name!r} must be a finite number {what}, got {value!r}")
    return number


@dataclass(frozen=True)
class Thresholds:
    values: Mapping[str, float] = field(default_factory=lambda: {n: t.default for n, t in DEFAULTS.items()})
    overridden: frozenset[str] = frozenset()
    source: str = "defaults"

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    @classmethod
    def from_mapping(cls, overrides: Mapping, source: str = "mapping") -> Thresholds:
        """Overrides as `{"thresholds": {...}}` (a TOML file) or bare. A file may also hold an
        `[slo]` table (read by `llm_diagnose.diagnose.tree.slo`) and a `[tolerances]` table (read by
        `llm_diagnose.diagnose.tolerances`); any other top-level name must be a threshold."""
        if "thresholds" in overrides or "slo" in overrides or "tolerances" in overrides:
            table = overrides.get("thresholds", {})
            if not isinstance(table, Mapping):
                raise ThresholdsError(f"{source}: thresholds must be a table ([thresholds])")
            rest = {k: v for k, v in overrides.items() if k not in ("thresholds", "slo", "tolerances")}
            flat = {**flatten(rest), **flatten(table)}
        else:
            flat = flatten(overrides)
        values = {n: t.default for n, t in DEFAULTS.items()}
        for name, value in flat.items():
            if name not in DEFAULTS:
                raise ThresholdsError(
                    f"{source}: unknown threshold {name!r} (a file holds [thresholds], [slo] and [tolerances]); "
                    f"known: {', '.join(sorted(DEFAULTS))}"
                )
            values[name] = _check_value(name, value, source)
        return cls(values=values, overridden=frozenset(flat), source=source)

    @classmethod
    def from_toml(cls, path: str | Path) -> Thresholds:
        return cls.from_mapping(read_toml(path, "thresholds file", ThresholdsError), source=str(path))
