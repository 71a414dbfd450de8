"""Live attach: the HTTP chokepoint, discovery, the scrape loop, NVML, and a real vLLM server.

Three kinds of target appear here, and each test says which it uses:
- a REAL vLLM CPU server (fixtures `vllm_server` / `vllm_server_factory`, or a VllmServer the
  test starts and stops itself): marked `real_engine`;
- a closed loopback port (nothing listening: a real "unreachable");
- a tiny FAKE HTTP server on 127.0.0.1, only for faults a real server cannot produce on
  demand (a malformed page, a counter reset, an HTML page, an auth wall, SGLang's
  /get_server_info on a machine where SGLang cannot run). Each such test says why it is fake.
NVML is exercised through a FAKE pynvml module, because this machine has no GPU or driver.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web

from llm_diagnose.diagnose.demo.vllm_server import VllmServer, cpu_dtype, dtype_bytes, group_members
from llm_diagnose.probes.discovery import discover
from llm_diagnose.probes.http import (
    HTTPStatusError,
    InvalidTargetURL,
    MalformedMetrics,
    MetricsUnavailable,
    NotAnLLMServer,
    TargetUnreachable,
    api_key_from_env,
    get_text,
    make_session,
    normalize_base_url,
    redact_headers,
    redact_url,
)
from llm_diagnose.probes.metrics import ENGINE_METRICS, Scraper, Window, passive_evidence, scrape_window
from llm_diagnose.probes.metrics.window import record_from_text
from llm_diagnose.probes.nvml import Nvml, UnknownGpu, memory_evidence, read_gpu_memory, select_devices
from llm_diagnose.probes.results import Measurement, NotMeasured
from tests.virtual_clock import VirtualClock

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
VLLM_PAGE = (FIXTURES / "vllm-0.32.0-cpu-real.txt").read_text()
SGLANG_PAGE = (FIXTURES / "sglang-0.5.23-cpu-real.txt").read_text()


def run(coro):
    return asyncio.run(coro)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


# --- the HTTP chokepoint -------------------------------------------------------------------------
class TestHttp:
    def test_api_key_from_env_order(self):
        assert api_key_from_env({"LLM_DIAGNOSE_API_KEY": "a", "OPENAI_API_KEY": "b"}) == "a"
        assert api_key_from_env({"OPENAI_API_KEY": "b"}) == "b"
        assert api_key_from_env({"LLM_DIAGNOSE_API_KEY": "  ", "OPENAI_API_KEY": ""}) is None

    def test_redaction(self):
        assert (
            redact_url("http://user:pw@host:8000/metrics?api_key=s3cret&x=1")
            == "http://***@host:8000/metrics?api_key=***&x=1"
        )
        assert redact_headers({"Authorization": "Bearer s3cret", "Accept": "*/*"}) == {
            "Authorization": "Bearer ***",
            "Accept": "*/*",
        }

    def test_normalize(self):
        assert normalize_base_url("localhost:8000/") == "http://localhost:8000"
        with pytest.raises(InvalidTargetURL):
            normalize_base_url("ftp://host")
        with pytest.raises(InvalidTargetURL):
            normalize_base_url("http://host:port")

    def test_unreachable_port(self):
        # Real: a loopback port with nothing listening.
        url = f"http://127.0.0.1:{closed_port()}"
        with pytest.raises(TargetUnreachable) as info:
            run(discover(url))
        assert f"is the server running at {url}?" in str(info.value)
        with pytest.raises(TargetUnreachable):
            run(scrape_window(url + "/metrics", 1.0, interval_s=0.5))

    def test_key_is_sent_but_never_shown(self, monkeypatch):
        monkeypatch.setenv("LLM_DIAGNOSE_API_KEY", "sk-secret-123")

        async def main():
            session = make_session()
            try:
                assert session.headers["Authorization"] == "Bearer sk-secret-123"
                with pytest.raises(TargetUnreachable) as info:
                    await get_text(session, f"http://127.0.0.1:{closed_port()}/x?token=sk-secret-123")
                assert "sk-secret-123" not in str(info.value) and "sk-secret-123" not in (info.value.url or "")
                with pytest.raises(InvalidTargetURL) as info2:  # Basic credentials beside the Bearer key
                    await get_text(session, f"http://u:sk-secret-123@127.0.0.1:{closed_port()}/x")
                assert "sk-secret-123" not in str(info2.value)
            finally:
                await session.close()

        run(main())


# --- a fake HTTP server, for faults a real one cannot produce on demand ---------------------
class FakeServer:
    """Serves scripted answers on 127.0.0.1: `routes[path]` is a list of (status, body, type)
    consumed one per request (the last one repeats)."""

    def __init__(self, routes: dict[str, list[tuple[int, str, str]]], require_key: str | None = None) -> None:
        self.routes = {p: list(a) for p, a in routes.items()}
        self.require_key = require_key
        self.seen_auth: list[str | None] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen_auth.append(request.headers.get("Authorization"))
        if self.require_key and request.headers.get("Authorization") != f"Bearer {self.require_key}":
            return web.Response(status=401, text='{"error": "unauthorized"}', content_type="application/json")
        answers = self.routes.get(request.path)
        if not answers:
            return web.Response(status=404, text='{"detail": "Not Found"}', content_type="application/json")
        status, body, ctype = answers.pop(0) if len(answers) > 1 else answers[0]
        return web.Response(status=status, text=body, content_type=ctype)

    async def __aenter__(self) -> FakeServer:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


TEXT = "text/plain"
MODELS = json.dumps(
    {"object": "list", "data": [{"id": "tiny-llama", "owned_by": "vllm", "root": "/m", "max_model_len": 2048}]}
)


def vllm_counter_page(prompt: float, created: float = 1.7962168917478826e9) -> str:
    """The real 0.32 page with its prompt-token counter (and its _created stamp) replaced."""
    return VLLM_PAGE.replace(
        'vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 13843.0',
        f'vllm:prompt_tokens_total{{engine="0",model_name="tiny-llama"}} {prompt}',
    ).replace(
        'vllm:prompt_tokens_created{engine="0",model_name="tiny-llama"} 1.7962168917478826e+09',
        f'vllm:prompt_tokens_created{{engine="0",model_name="tiny-llama"}} {created}',
    )


class TestFaultsWithFakeServer:
    def test_malformed_page_mid_window_is_kept(self, tmp_path):
        # Fake because a real vLLM never sends a truncated page on demand.
        pages = [
            (200, vllm_counter_page(100), TEXT),
            (200, vllm_counter_page(200), TEXT),
            (200, VLLM_PAGE[:5000] + "\nvllm:oops{engine=", TEXT),
            (200, vllm_counter_page(400), TEXT),
        ]

        async def main():
            async with FakeServer({"/metrics": pages}) as fake:
                clock = VirtualClock()
                scraper = Scraper(
                    fake.url + "/metrics", interval_s=0.2, run_dir=tmp_path, clock=clock, sleep=clock.sleep
                )
                return await scraper.run(0.6)

        w = run(main())
        assert [r.ok for r in w.records] == [True, True, False, True]
        assert "malformed /metrics text" in w.records[2].error and "line" in w.records[2].error
        lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert len(lines) == 4 and "vllm:oops" in lines[2]["text"] and lines[2]["error"]
        ev = passive_evidence(w)
        assert ev["throughput.prompt_tokens_per_s"].summary is not None  # computed across the bad page
        assert Window.from_jsonl(tmp_path).counter(ENGINE_METRICS["vllm"]["prompt_tokens"][0]).total == 300

    def test_counter_reset_between_scrapes(self):
        # Fake because restarting a real server between two scrapes takes 30 s here.
        pages = [
            (200, vllm_counter_page(1000), TEXT),
            (200, vllm_counter_page(1500), TEXT),
            (200, vllm_counter_page(200, created=1.8e9), TEXT),
        ]

        async def main():
            async with FakeServer({"/metrics": pages}) as fake:
                clock = VirtualClock()
                return await Scraper(fake.url + "/metrics", interval_s=0.2, clock=clock, sleep=clock.sleep).run(0.4)

        ev = passive_evidence(run(main()))
        r = ev["throughput.prompt_tokens_per_s"]
        assert r.note.startswith("700 over")  # +500, then +200 after the reset
        assert any("counter reset" in w for w in r.warnings)

    def test_html_page_is_not_an_llm_server(self):
        # Fake: a web server that is not an engine (the classic wrong-port mistake).
        html = (200, (FIXTURES / "broken-html.txt").read_text(), "text/html")

        async def main():
            async with FakeServer({"/": [html], "/metrics": [html]}) as fake:
                with pytest.raises(NotAnLLMServer, match="not an LLM serving engine"):
                    await discover(fake.url)
                with pytest.raises(NotAnLLMServer, match="HTML page, not Prometheus metrics"):
                    await scrape_window(fake.url + "/metrics", 0.2)

        run(main())

    def test_llm_server_without_metrics(self, tmp_path):
        # Fake stands in for a server whose /metrics is missing (the real --disable-log-stats
        # case is tested against vLLM below).
        async def main():
            async with FakeServer({"/v1/models": [(200, MODELS, "application/json")]}) as fake:
                with pytest.raises(MetricsUnavailable) as info:
                    await discover(fake.url)
                assert "--disable-log-stats" in str(info.value)
                with pytest.raises(MetricsUnavailable, match="404"):
                    await scrape_window(fake.url + "/metrics", 0.2, run_dir=tmp_path)

        run(main())
        assert "error" in json.loads((tmp_path / "metrics.jsonl").read_text())  # the failed try is on disk

    def test_malformed_first_page_raises_with_line(self):
        async def main():
            async with FakeServer({"/metrics": [(200, (FIXTURES / "broken-bad-value.txt").read_text(), TEXT)]}) as f:
                with pytest.raises(MalformedMetrics) as info:
                    await scrape_window(f.url + "/metrics", 0.2)
                return info.value

        err = run(main())
        assert err.line_number == 4 and "lots" in str(err)

    def test_auth_wall_names_the_variable(self, monkeypatch):
        # Fake because the test servers run without --api-key.
        monkeypatch.delenv("LLM_DIAGNOSE_API_KEY", raising=False)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)

        async def main(with_key: bool):
            routes = {
                "/v1/models": [(200, MODELS, "application/json")],
                "/metrics": [(200, VLLM_PAGE, TEXT)],
                "/version": [(200, '{"version": "0.32.0"}', "application/json")],
            }
            async with FakeServer(routes, require_key="k-123") as fake:
                if with_key:
                    monkeypatch.setenv("OPENAI_API_KEY", "k-123")
                    d = await discover(fake.url)
                    assert set(fake.seen_auth) == {"Bearer k-123"}
                    return d
                with pytest.raises(HTTPStatusError) as info:
                    await discover(fake.url)
                assert info.value.status == 401 and "LLM_DIAGNOSE_API_KEY" in str(info.value)

        run(main(False))
        assert run(main(True)).engine == "vllm"

    def test_vllm_dev_mode_server_info(self):
        # Fake because the test servers do not run with VLLM_SERVER_DEV_MODE=1; the answer has
        # the shape of vllm/entrypoints/serve/dev/server_info/api_router.py (0.32) with
        # ?config_format=json, cut down to the fields discovery reads.
        config = {
            "model_config": {"quantization": "awq", "max_model_len": 2048},
            "cache_config": {"enable_prefix_caching": True, "cache_dtype": "auto"},
            "parallel_config": {"tensor_parallel_size": 4},
            "scheduler_config": {"max_num_seqs": 256, "enable_chunked_prefill": True},
            "speculative_config": None,
        }
        routes = {
            "/v1/models": [(200, MODELS, "application/json")],
            "/metrics": [(200, VLLM_PAGE, TEXT)],
            "/version": [(200, '{"version": "0.32.0"}', "application/json")],
            "/server_info": [
                (200, json.dumps({"vllm_config": config, "vllm_env": {"VLLM_X": "1"}}), "application/json")
            ],
        }

        async def main():
            async with FakeServer(routes) as fake:
                return await discover(fake.url)

        d = run(main())
        assert d.facts["config.tensor_parallel_size"].value == 4
        assert d.facts["config.max_num_seqs"].value == 256
        assert d.facts["config.weight_quantization"].value == "awq"
        assert d.facts["config.chunked_prefill"].value is True
        assert d.facts["config.spec_decode"].value is False
        assert "vllm_env" not in d.server_args  # the environment is not kept

    def test_sglang_discovery(self):
        # Fake because SGLang cannot run on these machines (see shared/notes/vllm-cpu.md); the
        # /metrics page is the real SGLang 0.5.23 capture, /get_server_info is hand-written in
        # the shape of its ServerArgs dump.
        info = {
            "model_path": "/models/tiny",
            "served_model_name": "tiny-llama",
            "tp_size": 2,
            "dp_size": 1,
            "max_running_requests": 128,
            "chunked_prefill_size": 8192,
            "disable_radix_cache": False,
            "quantization": "fp8",
            "kv_cache_dtype": "auto",
            "page_size": 1,
            "mem_fraction_static": 0.88,
            "speculative_algorithm": None,
            "disaggregation_mode": "null",
            "enable_hierarchical_cache": False,
            "version": "0.5.23",
            "internal_states": [{"effective_max_running_requests_per_dp": 128}],
        }
        models = json.dumps({"data": [{"id": "tiny-llama", "owned_by": "sglang", "max_model_len": 2048}]})
        routes = {
            "/v1/models": [(200, models, "application/json")],
            "/metrics": [(200, SGLANG_PAGE, TEXT)],
            "/get_server_info": [(200, json.dumps(info), "application/json")],
        }

        async def main():
            async with FakeServer(routes) as fake:
                d = await discover(fake.url)
                w = await scrape_window(d.metrics_url, 0.2, interval_s=0.2)
                return d, passive_evidence(w, d)

        d, ev = run(main())
        assert d.engine == "sglang" and d.version == "0.5.23"  # from /get_server_info: SGLang has no /version
        assert ev["config.tensor_parallel_size"].value == 2 and ev["config.max_num_seqs"].value == 128
        assert ev["config.chunked_prefill"].value is True and ev["config.prefix_caching"].value is True
        assert ev["config.weight_quantization"].value == "fp8" and ev["config.spec_decode"].value is False
        assert ev["kv.capacity_tokens"].value == 8192.0


# --- NVML through a fake pynvml --------------------------------------------------------------
class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(
    *,
    init_error: int | None = None,
    memory_supported: bool = True,
    processes: list | dict | None | str = "default",
    count: int = 2,
    used_gib: float = 60,
) -> SimpleNamespace:
    """A stand-in for the pynvml module: FAKE, because this machine has no NVIDIA GPU or driver.

    It mimics the calls llm_diagnose.probes.nvml makes and raises NVMLError-like errors with NVML's codes.
    `count` GPUs of 80 GiB, `used_gib` used on each; `processes`: the one list every GPU reports, or
    {index: list} per GPU (an empty list: the driver answers and lists none, as in a container
    without the host's PID namespace), None for the query refused.
    """
    gib = 1 << 30

    def init():
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def memory(handle):
        if not memory_supported:
            raise FakeNVMLError(3)  # NOT_SUPPORTED (unified-memory parts)
        used = int(used_gib * gib)
        return SimpleNamespace(total=80 * gib, used=used, free=80 * gib - used)

    def procs(handle):
        if processes is None:
            raise FakeNVMLError(4)  # NO_PERMISSION (containers)
        if processes == "default":
            return [SimpleNamespace(pid=4242, usedGpuMemory=58 * gib)] if handle == 0 else []
        if isinstance(processes, dict):
            return processes.get(handle, [])
        return processes

    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_ERROR_NO_PERMISSION=4,
        NVML_ERROR_FUNCTION_NOT_FOUND=13,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=procs,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
    )


class TestNvml:
    def test_this_machine_has_no_gpu(self):
        ev = memory_evidence()  # the real pynvml, on a machine without a driver: no crash
        for r in ev.values():
            assert isinstance(r, NotMeasured) and r.reason.startswith("no NVIDIA driver/GPU on this machine")
            assert "GPU host" in r.hint

    def test_devices_and_processes(self):
        reading = read_gpu_memory(fake_pynvml())
        assert len(reading.devices) == 2 and reading.devices[0].processes[0].pid == 4242
        ev = memory_evidence(reading)
        gib = 1 << 30
        # Only GPU0 runs a compute process, so only it counts as the engine's.
        assert ev["memory.device_total_bytes"].value == 80 * gib
        assert ev["memory.device_free_fraction"].value == pytest.approx(0.25)
        assert ev["memory.processes_used_bytes"].value == 58 * gib
        assert "pid 4242" in ev["memory.processes_used_bytes"].note
        assert isinstance(ev["memory.weights_fraction"], NotMeasured)

    def test_weights_share_from_engine_evidence(self):
        page = record_from_text(1.0, 1.0, SGLANG_PAGE, None, 0.01, "sglang")
        sglang = passive_evidence(Window("sglang", (page,)))  # reports weight_memory_usage_gb
        ev = memory_evidence(read_gpu_memory(fake_pynvml()), engine=sglang)
        assert ev["memory.weights_fraction"].value == pytest.approx(0.002117156982421875 / 80)

    def test_process_query_not_permitted_is_quiet(self):
        ev = memory_evidence(read_gpu_memory(fake_pynvml(processes=None)))
        assert isinstance(ev["memory.device_total_bytes"], Measurement)  # both devices, since none is visible
        assert ev["memory.device_total_bytes"].value == 160 * (1 << 30)
        assert "per-process" in ev["memory.processes_used_bytes"].reason

    def test_unified_memory_not_supported(self):
        ev = memory_evidence(read_gpu_memory(fake_pynvml(memory_supported=False, processes=[])))
        assert isinstance(ev["memory.device_total_bytes"], NotMeasured)

    @pytest.mark.parametrize("code, words", [(12, "libnvidia-ml"), (9, "kernel driver")])
    def test_no_driver(self, code, words):
        reading = read_gpu_memory(fake_pynvml(init_error=code))
        assert words in reading.reason
        assert all(isinstance(r, NotMeasured) for r in memory_evidence(reading).values())

    def test_bindings_not_installed(self):
        def importer(name):
            raise ImportError("No module named 'pynvml'")

        reading = Nvml(importer=importer).read()
        assert "not installed" in reading.reason and "nvidia-ml-py" in reading.hint

    # --- which GPUs are the server's (issue 26, item 5) -----------------------------------------
    def test_gpus_by_index_and_by_uuid_read_only_those(self):
        reading = read_gpu_memory(fake_pynvml(count=4, processes=[]))
        for gpus in ((1, 3), ("GPU-1", "gpu-3"), (3, "GPU-1")):  # indices, UUIDs (any case), mixed
            ev = memory_evidence(reading, gpus=gpus)
            assert ev["memory.device_total_bytes"].value == 2 * 80 * (1 << 30), gpus  # two of the four
            assert ev["memory.gpu_selection"].value == "asked"
            assert "GPUs [1, 3] (as --gpus asked)" in ev["memory.device_total_bytes"].note
            assert "GPU0" not in ev["memory.device_total_bytes"].provenance.source

    def test_an_unknown_gpu_is_refused_naming_the_ones_the_node_has(self):
        reading = read_gpu_memory(fake_pynvml(count=2))
        for gpus in ((0, 7), ("GPU-9",)):
            with pytest.raises(UnknownGpu) as info:
                select_devices(reading, gpus)
            assert str(info.value).startswith(f"no GPU {gpus[-1]} on this node: it has GPU0 (GPU-0), GPU1 (GPU-1)")

    def test_memory_used_with_no_process_listed_says_the_processes_are_hidden(self):
        # The driver answers the process query but lists nothing (its PID namespace is not this
        # container's), while 60 GiB are in use: not "no compute process".
        ev = memory_evidence(read_gpu_memory(fake_pynvml(count=4, processes=[])))
        hole = ev["memory.processes_used_bytes"]
        assert isinstance(hole, NotMeasured) and hole.reason.startswith("processes hidden (PID namespace)")
        assert "GPU3: 60.00 GiB used" in hole.reason and "--pid=host" in hole.hint
        # A GPU that holds only the driver's reservation has no process: that is what it says then.
        idle = memory_evidence(read_gpu_memory(fake_pynvml(count=1, processes=[], used_gib=0.4)))
        assert idle["memory.processes_used_bytes"].reason == "no compute process runs on these devices"

    def test_falling_back_to_every_gpu_of_the_node_says_so_and_suggests_gpus(self, tmp_path):
        from llm_diagnose.diagnose.collect import RunPlan, finish_run, gpu_selection_line

        ev = memory_evidence(read_gpu_memory(fake_pynvml(count=8, processes=[])))
        assert ev["memory.gpu_selection"].value == "node"
        assert ev["memory.device_total_bytes"].value == 8 * 80 * (1 << 30)
        note = ev["memory.device_total_bytes"].note
        assert note.startswith("every GPU of the node (8): no compute process is visible") and "--gpus" in note
        line = gpu_selection_line(ev)
        assert line.startswith("GPU MEMORY READ ON every GPU of the node (8)") and "--gpus" in line
        result = finish_run(RunPlan(url="http://127.0.0.1:9", out_dir=tmp_path), dict(ev))
        assert (tmp_path / "summary.txt").read_text().startswith(line)
        assert result.evidence.fact("memory.gpu_selection") == "node"
        # One GPU, or --gpus, or GPUs chosen by their processes: nothing to say.
        assert not gpu_selection_line(memory_evidence(read_gpu_memory(fake_pynvml(count=1, processes=[]))))
        assert not gpu_selection_line(memory_evidence(read_gpu_memory(fake_pynvml(count=8, processes=[])), gpus=(0,)))
        assert not gpu_selection_line(memory_evidence(read_gpu_memory(fake_pynvml())))

    def test_the_servers_own_processes_pick_its_gpus_from_other_tenants(self):
        gib = 1 << 30
        per_gpu = {
            0: [SimpleNamespace(pid=100, usedGpuMemory=50 * gib)],  # the server
            2: [SimpleNamespace(pid=900, usedGpuMemory=30 * gib)],  # another tenant (host PID namespace)
        }
        reading = read_gpu_memory(fake_pynvml(count=4, processes=per_gpu))
        ours = memory_evidence(reading, server_pids={100, 101})
        assert ours["memory.gpu_selection"].value == "server"
        assert ours["memory.processes_used_bytes"].value == 50 * gib
        assert "pids [100]" in ours["memory.device_total_bytes"].note
        # Without the server's pids every GPU that runs a process counts, and the note says what that risks.
        anyone = memory_evidence(reading)
        assert anyone["memory.gpu_selection"].value == "processes"
        assert anyone["memory.processes_used_bytes"].value == 80 * gib
        assert "another tenant's GPU" in anyone["memory.device_total_bytes"].note


# --- a real vLLM server ----------------------------------------------------------------------
async def complete(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, stream: bool = False
) -> dict:
    """The tiny loopback client the tests need: one /v1/completions request."""
    assert url.startswith("http://127.0.0.1:"), "test traffic goes to loopback only"
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        if not stream:
            return await resp.json()
        async for _ in resp.content:
            pass
        return {}


async def scrape_during(
    url: str,
    traffic: Callable[[aiohttp.ClientSession], object],
    *,
    interval_s: float = 0.25,
    run_dir: Path | None = None,
) -> Window:
    """Scrape while `traffic` runs, then one last scrape once it is done."""
    stop = asyncio.Event()
    scraper = Scraper(url + "/metrics", interval_s=interval_s, run_dir=run_dir)
    task = asyncio.create_task(scraper.run(120, stop=stop))
    # A new connection for every request: CI, twice, 3 of round 2's 8 requests went out on
    # connections round 1 had used and read "Server disconnected" with nothing in the server's log
    # (with aiohttp's 15 s keep-alive and with the product's 4 s alike). The product's load client
    # sends such a request again (counted against the budget: StreamingClient.resent_stale); this
    # plain helper does not, so it does not reuse connections.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await traffic(session)  # type: ignore[misc]
    await asyncio.sleep(0.3)  # the engine records a finished request's stats right after it
    stop.set()
    return await task


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


@pytest.mark.real_engine
def test_disable_log_stats_gives_metrics_unavailable(tiny_model_dir, tmp_path):
    # First of the real-engine tests: its server is up only for these few seconds.
    with VllmServer(tiny_model_dir, tmp_path, extra_args=("--disable-log-stats",)) as server:
        with pytest.raises(MetricsUnavailable) as info:
            run(discover(server.url))
        assert "--disable-log-stats" in str(info.value)
        with pytest.raises(MetricsUnavailable):
            run(scrape_window(server.url + "/metrics", 0.2))


@pytest.fixture(scope="module")
def pressure_server(tiny_model_dir, tmp_path_factory):
    """A vLLM server of this module's own: 16 blocks of 128 tokens = a 2048-token KV cache.

    Prefix caching is off, so the same server answers the --no-enable-prefix-caching check,
    and the last test of the module stops it mid-window (one server start instead of three).
    """
    server = VllmServer(
        tiny_model_dir,
        tmp_path_factory.mktemp("vllm-pressure"),
        max_model_len=1024,
        prefix_caching=False,
        extra_args=("--num-gpu-blocks-override", "16", "--max-num-seqs", "16"),
    )
    with server:
        yield server


@pytest.mark.real_engine
class TestRealVllm:
    def test_config_matches_flags(self, vllm_server):
        async def main():
            d = await discover(vllm_server.url)
            w = await scrape_window(d.metrics_url, 0.5, interval_s=0.5)
            return d, passive_evidence(w, d)

        d, ev = run(main())
        assert d.engine == "vllm" and d.version == "0.32.0"
        assert ev["engine.model"].value == "tiny-llama"  # --served-model-name
        assert ev["engine.max_model_len"].value == 2048  # --max-model-len
        assert ev["config.prefix_caching"].value is True  # --enable-prefix-caching
        assert ev["config.block_size"].value == 128  # the CPU backend's block size
        # VLLM_CPU_KVCACHE_SPACE=1 GiB; the tiny model stores 2 layers x (K, V) x 4 heads x 32
        # x 2 bytes (bf16; 4 in float32 on CPUs without native bf16) = 1 KiB (2 KiB) per token.
        assert ev["memory.kv_cache_bytes"].value == 1 << 30
        assert ev["kv.capacity_tokens"].value == (1 << 30) // (512 * dtype_bytes(cpu_dtype()))
        assert isinstance(ev["config.max_num_seqs"], NotMeasured) and ev["config.max_num_seqs"].hint
        assert ev["engine.name"].note.startswith("vllm (V1, >=0.29)")

    def test_shared_prefix_raises_hit_rate(self, vllm_server):
        nonce = f"n{time.monotonic_ns()}"  # a prefix no earlier test can have cached

        async def distinct(session):
            for i in range(6):  # no two prompts share a full 128-token block
                await complete(session, vllm_server.url, f"{nonce}u{i} " + words(f"d{i}x", 180), 4)

        async def shared(session):
            prefix = f"{nonce}s " + words("p", 300)  # ~1000 tokens: 7 full blocks of 128
            for i in range(8):
                await complete(session, vllm_server.url, prefix + f" tail{i} " + words(f"t{i}x", 10), 4)

        cold = passive_evidence(run(scrape_during(vllm_server.url, distinct)))
        warm = passive_evidence(run(scrape_during(vllm_server.url, shared)))
        assert cold["prefix.hit_rate"].value < 0.1
        assert warm["prefix.hit_rate"].value > 0.6  # 7 of 8 requests reuse ~7 blocks of ~8
        assert warm["prefix.hit_rate"].value > cold["prefix.hit_rate"].value + 0.5
        assert warm["prefix.queried_tokens"].value > 3000

    def test_kv_pressure_shows_preemptions(self, pressure_server, tmp_path):
        async def traffic(session):
            # Two rounds of 8 concurrent requests of ~580 prompt tokens; vLLM caps max_tokens at
            # max_model_len - prompt (~440 here), ignore_eos makes them run to it. Two rounds
            # so that the starved scraper (see below) still lands a few scrapes under pressure.
            for r in range(2):
                await asyncio.gather(
                    *(
                        complete(session, pressure_server.url, f"k{r}.{i} " + words(f"w{i}x", 130), 600)
                        for i in range(8)
                    )
                )

        w = run(scrape_during(pressure_server.url, traffic, run_dir=tmp_path))
        ev = passive_evidence(w)
        assert ev["kv.capacity_tokens"].value == 16 * 128
        assert ev["kv.preemptions"].value >= 1
        # Full while requests wait. "Full" is block-granular: 15 usable blocks (one is vLLM's null
        # block), and a waiting ~580-token prompt needs 5 of them, so the cache refuses it from
        # 11/15 used on (CI read 11/15 and 12/15 under load, never idle in between). Asserted on
        # the readings, not on p95: on 2 shared cores the busy CPU engine starves every other
        # process (a 50 ms sleep measured 4 s late), so a window holds only a handful of scrapes.
        usage = ev["kv.usage_p95"].samples
        assert max(usage) >= 11 / 15 - 1e-9 and ev["kv.usage_p95"].value >= ev["kv.usage_mean"].value
        assert max(ev["queue.waiting_mean"].samples) > 0
        assert isinstance(ev["batch.running_cap_estimate"], NotMeasured)  # KV-bound, not capped
        assert (tmp_path / "metrics.jsonl").read_text().count("\n") == len(w.records)

    def test_prefix_caching_off(self, pressure_server):
        # The harness puts the flags it was given last, after its own.
        tail = ["--no-enable-prefix-caching", "--num-gpu-blocks-override", "16", "--max-num-seqs", "16"]
        assert pressure_server.args[-5:] == tail
        ev = passive_evidence(run(scrape_window(pressure_server.url + "/metrics", 0.3, interval_s=0.3)))
        assert ev["config.prefix_caching"].value is False
        assert ev["config.prefix_caching"].note == "enable_prefix_caching=False"


@pytest.mark.real_engine
def test_server_stopped_mid_window(pressure_server, tmp_path):
    # Last in the module: it stops the module's server (stop() is idempotent for the teardown).
    # The harness's stop() ends the whole process group, not just the API server it started.
    assert len(group_members(pressure_server.pid)) >= 3  # API server, EngineCore, Worker
    stopper = threading.Timer(2.0, pressure_server.stop)  # stop() blocks; run it beside the loop
    stopper.start()
    try:
        w = run(scrape_window(pressure_server.url + "/metrics", 30.0, interval_s=0.25, run_dir=tmp_path))
    finally:
        stopper.join()
    assert group_members(pressure_server.pid) == []
    assert w.stopped_early and "failed 3 scrapes in a row" in w.stopped_early
    assert len(w.ok_records) >= 2 and [r.ok for r in w.records[-3:]] == [False] * 3
    assert w.duration_s < 20  # it stopped early instead of waiting out the 30 s
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(w.records)  # every sample kept on disk
    ev = passive_evidence(Window.from_jsonl(tmp_path))  # a partial diagnosis, from disk alone
    assert isinstance(ev["throughput.prompt_tokens_per_s"], Measurement)
    assert ev["config.prefix_caching"].value is False
    ev = passive_evidence(w)
    assert ev["live.window_complete"].value is False
    assert any("partial window" in x for x in ev["kv.usage_p95"].warnings)
