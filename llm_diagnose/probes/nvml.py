"""GPU memory headroom through NVML: the single chokepoint for every NVML call.

Modelled on nvitop's `nvmlQuery`: NVML is initialised lazily, once. A missing package,
library or driver is loud: every memory key becomes NotMeasured with the reason and where
to run instead. A function a device does not support (`NotSupported`, `FunctionNotFound`,
`NoPermission`: per-process memory inside some containers, memory info on unified-memory
parts) is quiet and yields None for that reading only.

The `pynvml` module (from the nvidia-ml-py package) is imported only when first needed and
can be injected (`Nvml(module=...)`), which is how the tests run without a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from llm_diagnose.probes.quantities import (
    DEVICE_FREE_FRACTION,
    DEVICE_TOTAL_BYTES,
    DEVICE_USED_BYTES,
    GPU_SELECTION,
    KV_CACHE_BYTES,
    PROCESSES_USED_BYTES,
    WEIGHTS_BYTES,
    WEIGHTS_FRACTION,
)
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result, now_iso

__all__ = [
    "ProcessMemory",
    "DeviceMemory",
    "GpuMemoryReading",
    "NvmlUnavailable",
    "Nvml",
    "read_gpu_memory",
    "memory_evidence",
    "GpuSelector",
    "DeviceSelection",
    "UnknownGpu",
    "select_devices",
    "check_gpus",
    "NVML_KEYS",
    "NO_GPU_HINT",
    "HIDDEN_PROCESS_BYTES",
]

NVML_KEYS = (
    DEVICE_TOTAL_BYTES,
    DEVICE_USED_BYTES,
    DEVICE_FREE_FRACTION,
    PROCESSES_USED_BYTES,
    WEIGHTS_FRACTION,
    GPU_SELECTION,
)
NO_GPU_HINT = "run llm-diagnose on the GPU host, or in the sidecar described in docs/containers.md"
GIB = 1 << 30
# A device with no process on it still shows the driver's own reservation as used (a few hundred
# MiB on A100/H100 through the v1 memory query). Above 1 GiB used with no process listed, some
# process holds the memory that this container cannot see: it is in another PID namespace.
HIDDEN_PROCESS_BYTES = GIB
PID_HINT = "run the sidecar in the host's PID namespace (docker --pid=host, Kubernetes hostPID: true)"
GPUS_HINT = "give --gpus with the server's GPUs (indices or UUIDs, as `nvidia-smi -L` lists them)"

# A GPU named on the command line: its NVML index (nvidia-smi's order, not CUDA_VISIBLE_DEVICES')
# or its UUID (GPU-...).
GpuSelector = int | str

# NVML return codes (nvml.h); read from the module when it has them, so a fake can differ.
_QUIET_CODES = {"NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_NO_PERMISSION": 4, "NVML_ERROR_FUNCTION_NOT_FOUND": 13}
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong (per-process memory under WDDM/containers)


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    used_bytes: int | None  # None: the driver does not say (containers without the host PID namespace)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory, in bytes; None where the driver does not report a figure."""

    index: int
    name: str
    uuid: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    processes: tuple[ProcessMemory, ...]
    processes_visible: bool  # False: the per-process query is unsupported or not permitted


@dataclass(frozen=True)
class GpuMemoryReading:
    devices: tuple[DeviceMemory, ...]
    driver_version: str | None
    taken_at: str


@dataclass(frozen=True)
class NvmlUnavailable:
    """Why NVML could not be used on this machine (not an error: the evidence says so)."""

    reason: str
    hint: str = NO_GPU_HINT


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """Lazy NVML session; every call goes through `query`."""

    def __init__(
        self, module: ModuleType | Any | None = None, importer: Callable[[str], Any] = importlib.import_module
    ) -> None:
        self._module = module
        self._importer = importer
        self._state: NvmlUnavailable | bool | None = None  # None: not tried; True: initialised

    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _constant(self, name: str, default: int) -> int:
        return int(getattr(self._module, name, default))

    def init(self) -> NvmlUnavailable | None:
        """Load pynvml and initialise NVML once; the reason it is unusable, or None."""
        if self._state is True:
            return None
        if isinstance(self._state, NvmlUnavailable):
            return self._state
        if self._module is None:
            try:
                self._module = self._importer("pynvml")
            except ImportError as exc:
                self._state = NvmlUnavailable(
                    f"no NVIDIA driver/GPU on this machine: the NVML bindings are not installed ({exc})",
                    "pip install nvidia-ml-py on the GPU host, then " + NO_GPU_HINT,
                )
                return self._state
        nvml_error = getattr(self._module, "NVMLError", None)
        try:
            self._module.nvmlInit()
        except Exception as exc:  # pynvml.NVMLError, or OSError from ctypes on odd systems
            if nvml_error is not None and not isinstance(exc, nvml_error) and not isinstance(exc, OSError):
                raise
            code = self._code(exc)
            known = {
                self._constant("NVML_ERROR_LIBRARY_NOT_FOUND", 12): "the NVML library (libnvidia-ml.so) was not found",
                self._constant("NVML_ERROR_DRIVER_NOT_LOADED", 9): "the NVIDIA kernel driver is not loaded",
                self._constant("NVML_ERROR_NO_PERMISSION", 4): "this user may not open the NVIDIA devices",
            }
            fallback = f"NVML failed to initialise ({_text(exc) or type(exc).__name__})"
            what = fallback if code is None else known.get(code, fallback)
            self._state = NvmlUnavailable(f"no NVIDIA driver/GPU on this machine: {what}")
            return self._state
        self._state = True
        return None

    def query(self, func: str, *args: Any, default: Any = None) -> Any:
        """Call `pynvml.<func>(*args)`; quiet default for unsupported features.

        Other NVML errors (a GPU fallen off the bus) propagate: they are not "unsupported".
        """
        fn = getattr(self._module, func, None)
        if fn is None:
            return default  # older bindings without this function
        nvml_error = getattr(self._module, "NVMLError", Exception)
        try:
            return fn(*args)
        except nvml_error as exc:
            quiet = {self._constant(k, v) for k, v in _QUIET_CODES.items()}
            if self._code(exc) in quiet:
                return default
            raise

    def shutdown(self) -> None:
        if self._state is True and self._module is not None:  # initialised, so the module is loaded
            try:
                self._module.nvmlShutdown()
            finally:
                self._state = None

    def read(self) -> GpuMemoryReading | NvmlUnavailable:
        """Memory of every device, with per-process use where the driver allows."""
        unavailable = self.init()
        if unavailable is not None:
            return unavailable
        count = self.query("nvmlDeviceGetCount", default=0) or 0
        if count == 0:
            return NvmlUnavailable("no NVIDIA driver/GPU on this machine: the driver reports 0 devices")
        devices = []
        for index in range(count):
            handle = self.query("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            mem = self.query("nvmlDeviceGetMemoryInfo", handle)
            procs_raw = self.query("nvmlDeviceGetComputeRunningProcesses", handle)
            processes = tuple(
                ProcessMemory(
                    int(p.pid),
                    None if getattr(p, "usedGpuMemory", None) in (None, _NOT_AVAILABLE) else int(p.usedGpuMemory),
                )
                for p in (procs_raw or ())
            )
            devices.append(
                DeviceMemory(
                    index=index,
                    name=_text(self.query("nvmlDeviceGetName", handle, default="unknown GPU")),
                    uuid=None if (u := self.query("nvmlDeviceGetUUID", handle)) is None else _text(u),
                    total_bytes=None if mem is None else int(mem.total),
                    used_bytes=None if mem is None else int(mem.used),
                    free_bytes=None if mem is None else int(mem.free),
                    processes=processes,
                    processes_visible=procs_raw is not None,
                )
            )
        driver = self.query("nvmlSystemGetDriverVersion")
        return GpuMemoryReading(tuple(devices), None if driver is None else _text(driver), now_iso())


def read_gpu_memory(module: ModuleType | Any | None = None) -> GpuMemoryReading | NvmlUnavailable:
    """One reading of every device's memory (initialises and shuts NVML down)."""
    nvml = Nvml(module)
    try:
        return nvml.read()
    finally:
        nvml.shutdown()


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


class UnknownGpu(ValueError):
    """A GPU asked for (--gpus) that this node does not have; the message lists the ones it has."""


@dataclass(frozen=True)
class DeviceSelection:
    """The devices whose memory is the server's, and on what basis they were chosen.

    `basis`: "asked" (--gpus), "server" (they run the server's own processes), "processes" (they run
    some compute process, whose ever it is), "node" (every GPU of a node of several: no process is
    visible to choose by), "only" (the node's one GPU). `note` says which and why, in words.
    """

    devices: tuple[DeviceMemory, ...]
    basis: str
    note: str


def _name(d: DeviceMemory) -> str:
    return f"GPU{d.index}" + (f" ({d.uuid})" if d.uuid else "")


def _inventory(devices: Sequence[DeviceMemory], limit: int = 8) -> str:
    shown = ", ".join(_name(d) for d in devices[:limit])
    more = f" and {len(devices) - limit} more" if len(devices) > limit else ""
    return (shown + more) or "no GPU"


def _matches(d: DeviceMemory, selector: GpuSelector) -> bool:
    if isinstance(selector, int):
        return d.index == selector
    return d.uuid is not None and d.uuid.lower() == selector.lower()


def select_devices(
    reading: GpuMemoryReading, gpus: Sequence[GpuSelector] | None = None, server_pids: Collection[int] = ()
) -> DeviceSelection:
    """The server's devices: those asked for (`gpus`), else those running its processes
    (`server_pids`: the processes listening on its port and their children, where this host
    shows them), else those running any compute process, else every GPU of the node.

    Raises:
        UnknownGpu: a GPU in `gpus` that the node does not have (the message lists those it has).
    """
    devices = reading.devices
    if gpus:
        unknown = [str(g) for g in gpus if not any(_matches(d, g) for d in devices)]
        if unknown:
            raise UnknownGpu(
                f"no GPU {', '.join(unknown)} on this node: it has {_inventory(devices)} "
                "(give indices or UUIDs as `nvidia-smi -L` lists them)"
            )
        chosen = tuple(d for d in devices if any(_matches(d, g) for g in gpus))
        return DeviceSelection(chosen, "asked", f"GPUs {[d.index for d in chosen]} (as --gpus asked)")
    pids = set(server_pids)
    ours = tuple(d for d in devices if any(p.pid in pids for p in d.processes))
    if ours:
        mine = sorted({p.pid for d in ours for p in d.processes if p.pid in pids})
        return DeviceSelection(
            ours, "server", f"GPUs {[d.index for d in ours]} (those running the server's processes, pids {mine})"
        )
    busy = tuple(d for d in devices if d.processes)
    if busy:
        return DeviceSelection(
            busy,
            "processes",
            f"GPUs {[d.index for d in busy]} (those running compute processes: another tenant's GPU among them "
            f"would be counted as the server's; {GPUS_HINT})",
        )
    if len(devices) == 1:
        return DeviceSelection(devices, "only", f"GPU{devices[0].index} (the node's only GPU)")
    return DeviceSelection(
        devices,
        "node",
        f"every GPU of the node ({len(devices)}): no compute process is visible to tell the server's GPUs "
        f"from other tenants'; {GPUS_HINT}",
    )


def check_gpus(gpus: Sequence[GpuSelector], module: ModuleType | Any | None = None) -> NvmlUnavailable | None:
    """Check `gpus` against this node's GPUs before anything else is done: UnknownGpu if it lacks
    one; why they could not be checked (no driver: the memory keys will say so), or None."""
    reading = read_gpu_memory(module)
    if isinstance(reading, NvmlUnavailable):
        return reading
    select_devices(reading, gpus)
    return None


def _hidden(d: DeviceMemory) -> bool:
    """Memory in use with no process listed, where the driver does list processes: they are hidden."""
    return d.processes_visible and not d.processes and (d.used_bytes or 0) > HIDDEN_PROCESS_BYTES


def memory_evidence(
    reading: GpuMemoryReading | NvmlUnavailable | None = None,
    *,
    engine: Mapping[str, Result] | None = None,
    gpus: Sequence[GpuSelector] | None = None,
    server_pids: Collection[int] = (),
) -> dict[str, Result]:
    """The memory keys of the evidence from one NVML reading (taken now when not given).

    `engine` is the evidence from the engine's own metrics (`passive_evidence`): its
    memory.weights_bytes, where exposed, gives the weights' share of one device. The devices
    summed are `select_devices(reading, gpus, server_pids)`'s; memory.gpu_selection says which.
    """
    if reading is None:
        reading = read_gpu_memory()
    if isinstance(reading, NvmlUnavailable):
        hole = NotMeasured(reading.reason, reading.hint, Provenance("nvml", "local NVML"))
        return dict.fromkeys(NVML_KEYS, hole)
    try:
        selection = select_devices(reading, gpus, server_pids)
    except UnknownGpu as exc:  # checked before the run (check_gpus): a GPU gone since
        hole = NotMeasured(str(exc), GPUS_HINT, Provenance("nvml", "local NVML", taken_at=reading.taken_at))
        return dict.fromkeys(NVML_KEYS, hole)

    devices = selection.devices
    which = selection.note
    source = ", ".join(f"GPU{d.index} {d.name}" for d in devices) or "no device"
    prov = Provenance("nvml", source, taken_at=reading.taken_at)
    out: dict[str, Result] = {GPU_SELECTION: Fact(selection.basis, prov, note=which)}

    # (device, total bytes, used bytes) where the driver reports both
    with_memory = [
        (d, d.total_bytes, d.used_bytes) for d in devices if d.total_bytes is not None and d.used_bytes is not None
    ]
    if not with_memory:
        hole = NotMeasured(
            "NVML reports no memory figures for these devices (unified memory, or unsupported)",
            "on Grace-Hopper/unified-memory parts, read the engine's own memory metrics",
            prov,
        )
        for key in (DEVICE_TOTAL_BYTES, DEVICE_USED_BYTES, DEVICE_FREE_FRACTION):
            out[key] = hole
    else:
        total = sum(t for _, t, _ in with_memory)
        used = sum(u for _, _, u in with_memory)
        free = sum(d.free_bytes if d.free_bytes is not None else t - u for d, t, u in with_memory)
        per_device = "; ".join(f"GPU{d.index}: {_gib(u)} used of {_gib(t)}" for d, t, u in with_memory)
        note = f"{which}; {per_device}" + (f"; driver {reading.driver_version}" if reading.driver_version else "")
        out[DEVICE_TOTAL_BYTES] = Measurement(float(total), "bytes", prov, note=note)
        out[DEVICE_USED_BYTES] = Measurement(float(used), "bytes", prov, note=note)
        out[DEVICE_FREE_FRACTION] = Measurement(free / total if total else 0.0, "fraction", prov, note=note)

    out[PROCESSES_USED_BYTES] = _processes_used(devices, prov)
    out[WEIGHTS_FRACTION] = _weights_fraction(engine or {}, [t for _, t, _ in with_memory], prov)
    return out


def _processes_used(devices: Sequence[DeviceMemory], prov: Provenance) -> Result:
    """The memory of the compute processes on `devices`, or why it is not known."""
    visible = [d for d in devices if d.processes_visible]
    procs = [p for d in visible for p in d.processes]
    sized = [(p.pid, p.used_bytes) for p in procs if p.used_bytes is not None]
    if not visible:
        return NotMeasured(
            "the driver does not report per-process memory here (unsupported or not permitted)",
            "run with the host PID namespace (docker --pid=host) or as a user allowed to query processes",
            prov,
        )
    hidden = [d for d in visible if _hidden(d)]
    if hidden:
        # Inside a container the driver lists only the processes of its own PID namespace.
        used = "; ".join(f"GPU{d.index}: {_gib(d.used_bytes or 0)} used" for d in hidden)
        return NotMeasured(
            f"processes hidden (PID namespace): NVML reports memory in use but lists no process on {used}; "
            "this container does not see the processes that hold it",
            PID_HINT,
            prov,
        )
    if not procs:
        return NotMeasured("no compute process runs on these devices", "run llm-diagnose beside the engine", prov)
    if len(sized) < len(procs):
        return NotMeasured(
            "the driver lists the processes but not their memory (typical inside containers)",
            "run llm-diagnose beside the engine with --pid=host",
            prov,
        )
    listing = ", ".join(f"pid {pid}: {_gib(n)}" for pid, n in sized)
    return Measurement(float(sum(n for _, n in sized)), "bytes", prov, note=listing)


def _weights_fraction(engine: Mapping[str, Result], device_totals: list[int], prov: Provenance) -> Result:
    """The engine's weights over one device's total memory (`device_totals`: bytes per device)."""
    weights = engine.get(WEIGHTS_BYTES)
    if not device_totals:
        return NotMeasured("NVML reports no device memory to compare the weights with", NO_GPU_HINT, prov)
    if not isinstance(weights, Measurement):
        reason = weights.reason if isinstance(weights, NotMeasured) else "the engine does not expose its weights' size"
        kv = engine.get(KV_CACHE_BYTES)
        extra = f" (it does expose the KV cache: {_gib(kv.value)})" if isinstance(kv, Measurement) else ""
        return NotMeasured(
            f"weights share not derivable: {reason}{extra}",
            "the engine log states the load size (vLLM: 'Model loading took X GiB')",
            prov,
        )
    one_device = min(device_totals)
    return Measurement(
        weights.value / one_device,
        "fraction",
        prov,
        note=f"engine-reported weights {_gib(weights.value)} / {_gib(one_device)} on one device "
        "(the smallest in use); with tensor parallelism each device holds a share",
    )
