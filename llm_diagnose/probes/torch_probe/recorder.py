"""The in-process recorder: forward hooks, KV accounting, allocator statistics, a metrics registry.

`TorchProbe.instrument(model)` adds a forward pre-hook and a forward hook to the model (the
top-level module only, so a forward costs two Python calls, not one per submodule) and wraps
its `generate`. Each forward is timed, classified by phase from host-side shapes (no device
read), counted, and its KV cache accounted (`llm_diagnose.probes.torch_probe.kv`). Continuous batching is
accounted per scheduler step instead (`paged_step`, entered by `autopatch` around transformers'
batch-processor step), because only the scheduler knows how many tokens each request's blocks
hold, and because a step replayed from a CUDA graph runs no forward hook.

Timing: on CPU, perf_counter around the forward (CPU ops are synchronous). On CUDA, an event
pair on the current stream, read back without blocking on a later step, so the probe never
adds a synchronize to the server's step.

Everything lands in a private prometheus_client registry: event data in Counter/Histogram/
Gauge objects (thread-safe), state read at scrape time (probe_info, weights, CUDA allocator)
by a collector. Metric names: `llm_diagnose.probes.torch_probe.metrics`.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from llm_diagnose.probes.torch_probe import metrics as M
from llm_diagnose.probes.torch_probe.kv import KvSnapshot, kv_from_hf_cache, kv_from_paged

__all__ = ["TorchProbe", "classify_step"]

_MARK = "_llmd_torch_probe"  # attribute set on instrumented models (idempotence)


def _base(wire_name: str) -> str:
    return wire_name[: -len("_total")] if wire_name.endswith("_total") else wire_name


def _doc(wire_name: str) -> str:
    return M.METRICS[wire_name].meaning


def _capturing(ref: Any) -> bool:
    """True while a CUDA graph is being captured: that call is recorded, not run, so it is not a step."""
    if not getattr(ref, "is_cuda", False):
        return False
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


_noted: set[str] = set()


def _note_once(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        print(f"llm-diagnose probe: {message}", file=sys.stderr, flush=True)


def classify_step(n_sequences: int, n_tokens: int) -> str:
    """decode: one token per sequence; prefill: one sequence (or a dense batch) of several; else mixed."""
    if n_tokens <= n_sequences:
        return "decode"
    if n_sequences <= 1:
        return "prefill"
    return "mixed"


@dataclass
class _Open:
    phase: str
    sequences: int
    tokens: int
    start: Any  # perf_counter seconds, or a CUDA event


class TorchProbe:
    """Records model forwards into a Prometheus registry; `serve()` exposes it on a side port."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process_metrics: bool = True) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.forward_seconds = Histogram(
            M.FORWARD_SECONDS, _doc(M.FORWARD_SECONDS), ["phase"], buckets=M.FORWARD_SECONDS_BUCKETS, registry=r
        )
        self.forward_tokens = Counter(_base(M.FORWARD_TOKENS), _doc(M.FORWARD_TOKENS), ["phase"], registry=r)
        self.batch_sequences = Histogram(
            M.BATCH_SEQUENCES, _doc(M.BATCH_SEQUENCES), buckets=M.BATCH_BUCKETS, registry=r
        )
        self.kv_allocated_steps = Counter(_base(M.KV_ALLOCATED_STEPS), _doc(M.KV_ALLOCATED_STEPS), registry=r)
        self.kv_used_steps = Counter(_base(M.KV_USED_STEPS), _doc(M.KV_USED_STEPS), registry=r)
        self.kv_steps = Counter(_base(M.KV_STEPS), _doc(M.KV_STEPS), registry=r)
        self.kv_allocated = Gauge(M.KV_ALLOCATED, _doc(M.KV_ALLOCATED), registry=r)
        self.kv_used = Gauge(M.KV_USED, _doc(M.KV_USED), registry=r)
        self.kv_layers = Gauge(M.KV_LAYERS, _doc(M.KV_LAYERS), registry=r)
        self.kv_bytes = Gauge(M.KV_BYTES, _doc(M.KV_BYTES), registry=r)
        self.running = Gauge(M.RUNNING, _doc(M.RUNNING), registry=r)
        self.requests_finished = Counter(_base(M.REQUESTS_FINISHED), _doc(M.REQUESTS_FINISHED), registry=r)
        self.request_generation_tokens = Histogram(
            M.REQUEST_GENERATION_TOKENS, _doc(M.REQUEST_GENERATION_TOKENS), buckets=M.TOKEN_BUCKETS, registry=r
        )
        self.request_prompt_tokens = Histogram(
            M.REQUEST_PROMPT_TOKENS, _doc(M.REQUEST_PROMPT_TOKENS), buckets=M.TOKEN_BUCKETS, registry=r
        )
        # Continuous-batching-only series are created on first use, so a page without them
        # says "not a paged engine" rather than showing zeros that look like measurements.
        self._paged: dict[str, Any] = {}
        self._paged_lock = threading.Lock()
        r.register(_StateCollector(self))
        if process_metrics:
            ProcessCollector(registry=r)  # process_resident_memory_bytes: the CPU-side memory figure
        self.kv_layout = "unknown"
        self.continuous_batching: bool | None = None
        self._models: list[weakref.ReferenceType] = []
        self._local = threading.local()
        self._pending_cuda: deque[tuple[Any, Any, str]] = deque()
        self._cb_seen: dict[str, Any] = {}  # request id -> state, until the request leaves the scheduler
        self._cb_offsets: dict[str, int] = {}  # request id -> tokens written, at the previous step
        self.server: Any = None
        self.address: tuple[str, int] | None = None

    # --- attaching ------------------------------------------------------------------------
    def instrument(self, model: Any) -> Any:
        """Hook `model` (a torch.nn.Module, typically a transformers causal LM); returns it."""
        if getattr(model, _MARK, None) is self:
            return model
        model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        model.register_forward_hook(self._post_forward, with_kwargs=True)
        generate = getattr(model, "generate", None)
        if callable(generate):
            model.generate = self._wrap_generate(generate, model)
        setattr(model, _MARK, self)
        self._models.append(weakref.ref(model))
        return model

    def models(self) -> list[Any]:
        return [m for m in (ref() for ref in self._models) if m is not None]

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[str, int]:
        """Expose the registry at http://host:port/metrics (a daemon thread); returns the bound address."""
        from prometheus_client import start_http_server

        if self.server is not None:
            raise RuntimeError(f"the probe already serves on {self.address}")
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.server = server
        self.address = (host, int(server.server_port))
        return self.address

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def exposition(self) -> str:
        """The metrics page as text (what a scrape of the side port returns)."""
        return generate_latest(self.registry).decode("utf-8")

    # --- forward hooks ----------------------------------------------------------------------
    def _stack(self) -> list[_Open]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _pre_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        ref = kwargs.get("input_ids")
        if ref is None:
            ref = args[0] if args and hasattr(args[0], "shape") else kwargs.get("inputs_embeds")
        paged = kwargs.get("cache")
        if paged is not None and hasattr(paged, "cache_allocators"):
            # Continuous batching: the step wrapper (paged_step) times and counts the whole step,
            # which also covers steps replayed from a CUDA graph, where no forward hook runs.
            self.kv_layout, self.continuous_batching = "paged", True
            ref = None
        if ref is None or getattr(ref, "ndim", 0) < 2 or _capturing(ref):
            self._stack().append(_Open("", 0, 0, None))  # not recorded; keeps the stack balanced
            return
        sequences, tokens = int(ref.shape[0]), int(ref.shape[0]) * int(ref.shape[1])
        self._stack().append(_Open(classify_step(sequences, tokens), sequences, tokens, self._now(ref)))

    def _post_forward(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        stack = self._stack()
        if not stack:
            return
        opened = stack.pop()
        if not opened.phase:
            return
        self._finish_timing(opened)
        self._count_step(opened.phase, opened.sequences, opened.tokens)
        self.running.set(opened.sequences)
        cache = kwargs.get("past_key_values")
        if cache is None:
            cache = getattr(output, "past_key_values", None)
        snap = kv_from_hf_cache(cache) if cache is not None else None
        if snap is not None:
            self._record_kv(snap)
        if getattr(self._local, "generate_depth", 0) > 0:
            self.continuous_batching = False  # plain generate: the batch is fixed until every row ends

    def _count_step(self, phase: str, sequences: int, tokens: int) -> None:
        self.forward_tokens.labels(phase).inc(tokens)
        self.batch_sequences.observe(sequences)

    def _now(self, ref: Any) -> Any:
        if getattr(ref, "is_cuda", False):
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _finish_timing(self, opened: _Open) -> None:
        if isinstance(opened.start, float):
            self.forward_seconds.labels(opened.phase).observe(time.perf_counter() - opened.start)
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending_cuda.append((opened.start, end, opened.phase))
        # Read back only the steps the device has finished: never wait for the device here.
        while self._pending_cuda and self._pending_cuda[0][1].query():
            start, stop, phase = self._pending_cuda.popleft()
            self.forward_seconds.labels(phase).observe(start.elapsed_time(stop) / 1e3)

    # --- KV, batches, requests ----------------------------------------------------------------
    def _record_kv(self, snap: KvSnapshot) -> None:
        self.kv_layout = snap.layout
        self.kv_steps.inc()
        self.kv_allocated_steps.inc(snap.allocated_tokens)
        self.kv_used_steps.inc(snap.used_tokens)
        self.kv_allocated.set(snap.allocated_tokens)
        self.kv_used.set(snap.used_tokens)
        self.kv_layers.set(snap.layers)
        self.kv_bytes.set(snap.nbytes)

    def _paged_metric(self, cls: type, wire_name: str) -> Any:
        with self._paged_lock:
            if wire_name not in self._paged:
                self._paged[wire_name] = cls(_base(wire_name), _doc(wire_name), registry=self.registry)
            return self._paged[wire_name]

    @contextmanager
    def paged_step(self, processor: Any) -> Iterator[None]:
        """Account one continuous-batching step around its execution (see autopatch).

        Entered after the scheduler prepared the batch: each request's position already
        includes this step's tokens, so the step's query tokens per request are the advance
        since the previous step, all host-side. The step is timed on the host: in transformers'
        synchronous mode it ends by copying the sampled tokens back, so host time is device
        time; with async batching it is the step cadence.
        """
        try:
            phase, sequences, tokens = self._enter_paged_step(processor)
        except Exception as exc:  # noqa: BLE001 - accounting must never break a step
            _note_once(f"continuous-batching accounting failed: {type(exc).__name__}: {exc}")
            phase = ""
        t0 = time.perf_counter()
        yield
        if phase:
            self.forward_seconds.labels(phase).observe(time.perf_counter() - t0)
            self._count_step(phase, sequences, tokens)

    def _enter_paged_step(self, processor: Any) -> tuple[str, int, int]:
        scheduler = getattr(processor, "scheduler", None)
        snap = kv_from_paged(getattr(processor, "cache", None), scheduler)
        if snap is None:
            return "", 0, 0
        self.continuous_batching, self.kv_layout = True, "paged"
        self._record_kv(snap)
        if snap.capacity_tokens:
            self._paged_metric(Gauge, M.KV_CAPACITY).set(snap.capacity_tokens)
            self._paged_metric(Gauge, M.KV_USAGE).set(snap.allocated_tokens / snap.layers / snap.capacity_tokens)
        if snap.block_size is not None:
            self._paged_metric(Gauge, M.KV_BLOCK_SIZE).set(snap.block_size)
        active = dict(getattr(scheduler, "active_requests", {}) or {})
        waiting = len(getattr(scheduler, "waiting_requests", {}) or {})
        self.running.set(len(active))
        self._paged_metric(Gauge, M.WAITING).set(waiting)
        self._paged_metric(Counter, M.WAITING_STEPS).inc(waiting)
        sequences = tokens = 0
        for rid, state in active.items():
            position = int(getattr(state, "position_offset", 0))
            advance = position - self._cb_offsets.get(rid, 0)
            self._cb_offsets[rid] = position
            if advance > 0:
                sequences += 1
                tokens += advance
        self._cb_seen.update(active)
        return (classify_step(sequences, tokens), sequences, tokens) if sequences else ("", 0, 0)

    def record_paged_update(self, processor: Any) -> None:
        """Count the requests a continuous-batching update finished (called after update_batch)."""
        active = getattr(getattr(processor, "scheduler", None), "active_requests", {}) or {}
        for rid in [rid for rid in self._cb_seen if rid not in active]:
            state = self._cb_seen.pop(rid)
            self._cb_offsets.pop(rid, None)
            if getattr(getattr(state, "status", None), "name", "") == "FINISHED":
                prompt = getattr(state, "_true_initial_tokens", 0) or len(getattr(state, "initial_tokens", ()))
                self._record_request(prompt, len(getattr(state, "generated_tokens", ())))

    def _record_request(self, prompt_tokens: int, generated_tokens: int) -> None:
        self.requests_finished.inc()
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generated_tokens)

    def _wrap_generate(self, generate: Any, model: Any) -> Any:
        probe = self
        model_ref = weakref.ref(model)  # the wrapper lives on the model: no reference cycle through it

        @functools.wraps(generate)
        def instrumented_generate(*args: Any, **kwargs: Any) -> Any:
            probe._local.generate_depth = getattr(probe._local, "generate_depth", 0) + 1
            try:
                out = generate(*args, **kwargs)
            finally:
                probe._local.generate_depth -= 1
            probe._record_generate(args, kwargs, out, getattr(model_ref(), "generation_config", None))
            return out

        return instrumented_generate

    def _record_generate(self, args: tuple, kwargs: dict, out: Any, default_config: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args and hasattr(args[0], "shape") else None)
        sequences = getattr(out, "sequences", out)
        if ids is None or not hasattr(sequences, "shape") or getattr(ids, "ndim", 0) != 2:
            return
        prompt_len = int(ids.shape[1])
        new = sequences[:, prompt_len:]
        config = kwargs.get("generation_config") or default_config
        pad = kwargs.get("pad_token_id", getattr(config, "pad_token_id", None))
        # Rows that ended early are filled with pad_token_id up to the longest row: not output.
        lengths = (new != pad).sum(dim=1).tolist() if pad is not None else [int(new.shape[1])] * int(new.shape[0])
        mask = kwargs.get("attention_mask")
        prompts = mask.sum(dim=1).tolist() if mask is not None else [prompt_len] * int(new.shape[0])
        for p, n in zip(prompts, lengths, strict=True):
            self._record_request(int(p), int(n))

    # --- scrape-time state --------------------------------------------------------------------
    def info_labels(self) -> dict[str, str]:
        models = self.models()
        first = models[0] if models else None
        engine, version = "pytorch", ""
        transformers = sys.modules.get("transformers")
        if first is not None and transformers is not None:
            pretrained = getattr(transformers, "PreTrainedModel", None)
            if pretrained is not None and isinstance(first, pretrained):
                engine, version = "transformers", str(getattr(transformers, "__version__", ""))
        torch = sys.modules.get("torch")
        device = ""
        if first is not None:
            try:
                device = str(next(first.parameters()).device)
            except StopIteration:
                device = ""
        name = ""
        if first is not None:
            config_name = getattr(getattr(first, "config", None), "_name_or_path", "")
            name = str(getattr(first, "name_or_path", "") or config_name or type(first).__name__)
        cb = {None: "unknown", True: "true", False: "false"}[self.continuous_batching]
        return {
            "engine": engine,
            "engine_version": version,
            "torch_version": str(getattr(torch, "__version__", "")),
            "device": device,
            "model": name,
            "kv_layout": self.kv_layout,
            "continuous_batching": cb,
        }


class _StateCollector:
    """Scrape-time figures: probe_info, weights, and (on CUDA) the caching allocator's statistics."""

    def __init__(self, probe: TorchProbe) -> None:
        self.probe = probe

    def describe(self) -> Iterable[Any]:
        return []  # figures appear only once known; nothing to pre-declare

    def collect(self) -> Iterable[Any]:
        probe = self.probe
        labels = probe.info_labels()
        info = GaugeMetricFamily(M.PROBE_INFO, _doc(M.PROBE_INFO), labels=list(labels))
        info.add_metric(list(labels.values()), 1.0)
        yield info
        models = probe.models()
        if models:
            weights = GaugeMetricFamily(M.WEIGHTS_BYTES, _doc(M.WEIGHTS_BYTES))
            weights.add_metric([], float(sum(p.numel() * p.element_size() for m in models for p in m.parameters())))
            yield weights
        yield from _cuda_allocator_families(models)


def _cuda_allocator_families(models: list[Any]) -> Iterable[Any]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return  # CPU: PyTorch keeps no reserved pool there; process_resident_memory_bytes covers the process
    devices = sorted({p.device for m in models for p in m.parameters() if p.is_cuda}, key=str)
    if not devices:
        return
    gauges = {
        name: GaugeMetricFamily(name, _doc(name), labels=["device"])
        for name in (M.ALLOC_ALLOCATED, M.ALLOC_RESERVED, M.ALLOC_INACTIVE_SPLIT, M.DEVICE_TOTAL)
    }
    counters = {
        name: CounterMetricFamily(_base(name), _doc(name), labels=["device"])
        for name in (M.ALLOC_RETRIES, M.ALLOC_OOMS)
    }
    for dev in devices:
        stats = torch.cuda.memory_stats(dev)
        d = [str(dev)]
        gauges[M.ALLOC_ALLOCATED].add_metric(d, float(stats.get("allocated_bytes.all.current", 0)))
        gauges[M.ALLOC_RESERVED].add_metric(d, float(stats.get("reserved_bytes.all.current", 0)))
        gauges[M.ALLOC_INACTIVE_SPLIT].add_metric(d, float(stats.get("inactive_split_bytes.all.current", 0)))
        gauges[M.DEVICE_TOTAL].add_metric(d, float(torch.cuda.get_device_properties(dev).total_memory))
        counters[M.ALLOC_RETRIES].add_metric(d, float(stats.get("num_alloc_retries", 0)))
        counters[M.ALLOC_OOMS].add_metric(d, float(stats.get("num_ooms", 0)))
    yield from gauges.values()
    yield from counters.values()
