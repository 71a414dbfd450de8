"""The Prometheus-server source: a REAL Prometheus (Debian's 2.42) scraping REAL vLLM CPU servers.

One scenario, set up once for the module: two vLLM servers (the shared default one, prefix
caching on, and one with prefix caching off), a Prometheus on 127.0.0.1 scraping both every
second, and the direct scraper (llm_diagnose.probes.metrics.scraper) watching both over the same time.
The same shared-prefix workload goes to both servers, strictly inside both windows (idle
scrapes before and after), so:

- counters and histograms give the SAME increases both ways: each path sees the idle value
  before and the idle value after the traffic; hit rate, looked-up tokens, preemptions and
  the histogram quantiles must be equal (tolerance: float rounding only);
- per-second rates divide by each path's own window length, which differ by up to one scrape
  interval at each end: tolerance 2 intervals / the window;
- gauges are sampled at different instants by the two scrapers, so a reading can differ by
  the gauge's whole range within one interval: only checked to be measured and in range.

Faults a real Prometheus cannot produce on demand (a malformed answer, its refusal of a too
large query) come from a tiny fake HTTP server; each such test says why.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.fleet import fleet_view
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.metrics import Scraper, passive_evidence
from llm_diagnose.probes.metrics.prometheus_api import (
    EmptySelection,
    MalformedAnswer,
    PrometheusRefused,
    read_fleet,
)
from llm_diagnose.probes.results import Measurement

SCRAPE_INTERVAL_S = 1.0
DIRECT_INTERVAL_S = 0.5
# Counter and histogram increases over the same traffic: equal up to float rounding.
EXACT_KEYS = (
    Q.PREFIX_HIT_RATE,
    Q.PREFIX_QUERIED_TOKENS,
    Q.PREEMPTIONS,
    Q.TTFT_P50,
    Q.E2E_P50,
    Q.OUTPUT_LEN_P50,
    Q.INPUT_LEN_P50,
)
RATE_KEYS = (Q.PROMPT_TOKENS_PER_S, Q.GEN_TOKENS_PER_S, Q.REQUESTS_PER_S)
FACT_KEYS = (Q.ENGINE_NAME, Q.PREFIX_CACHING, Q.BLOCK_SIZE, Q.KV_CAPACITY_TOKENS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus on 127.0.0.1 with a prometheus.yml of our own in `work`; job `self`
    scrapes Prometheus itself (a target without engine series)."""

    def __init__(self, work: Path, jobs: dict[str, list[str]]) -> None:
        self.port = free_port()
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        jobs = {**jobs, "self": [f"127.0.0.1:{self.port}"]}
        scrape = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
            for job, targets in jobs.items()
        )
        (work / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S:g}s\n  scrape_timeout: {SCRAPE_INTERVAL_S:g}s\n"
            f"scrape_configs:\n{scrape}"
        )
        self.log = work / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: `make install` installs Debian's package"
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.work / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"prometheus not ready in 60 s: {self.log.read_text()[-2000:]}")

    def instant(self, query: str) -> list:
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}") as r:
            return json.load(r)["data"]["result"]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def complete(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> None:
    assert url.startswith("http://127.0.0.1:"), "test traffic goes to loopback only"
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        await resp.read()


def wait_until_scraped(prom: Prometheus, instances: list[str], after: float, timeout: float = 30.0) -> None:
    """Until Prometheus holds a sample newer than `after` from every instance."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = {
            r["metric"]["instance"]: float(r["value"][1])
            for r in prom.instant('timestamp(vllm:num_requests_running{job="vllm"})')  # value: the sample's own time
        }
        if all(got.get(i, 0.0) > after for i in instances):
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not scrape {instances} after {after} within {timeout} s")


@pytest.fixture(scope="module")
def scenario(vllm_server_factory, tmp_path_factory):
    """Two replicas, one Prometheus, the direct windows, and the window's [start, end]."""
    cached = vllm_server_factory()  # the shared default server: prefix caching on
    uncached = vllm_server_factory(prefix_caching=False)
    servers = {f"127.0.0.1:{s.port}": s for s in (cached, uncached)}
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), {"vllm": list(servers)})
    prom.start()
    nonce = f"n{time.monotonic_ns()}"  # a prefix no earlier test has cached
    trace = tmp_path_factory.mktemp("trace") / "requests.jsonl"
    try:

        async def both():
            # Prometheus scrapes a new target first after up to an interval (plus its start-up):
            # the window opens once it scrapes both, as it would in a fleet scraped for days.
            await asyncio.to_thread(wait_until_scraped, prom, list(servers), 0.0, 60.0)
            stop = asyncio.Event()
            scrapers = {i: Scraper(s.url + "/metrics", interval_s=DIRECT_INTERVAL_S) for i, s in servers.items()}
            tasks = {i: asyncio.create_task(sc.run(300, stop=stop)) for i, sc in scrapers.items()}
            start = time.time()
            await asyncio.to_thread(wait_until_scraped, prom, list(servers), start + 0.5)  # idle scrapes first
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                prefix = f"{nonce} " + words("p", 300)  # ~1000 tokens: 7 full blocks of 128
                with trace.open("w") as log:  # the fleet's request log, for --trace
                    for s in servers.values():  # the same requests to both replicas
                        for i in range(6):
                            prompt = prefix + f" tail{i} " + words(f"t{i}x", 10)
                            await complete(session, s.url, prompt, 4)
                            log.write(json.dumps({"prompt": prompt, "output_length": 4}) + "\n")
            await asyncio.sleep(0.5)  # the engine records a finished request's stats right after it
            done = time.time()
            await asyncio.to_thread(wait_until_scraped, prom, list(servers), done + 0.5)  # idle scrapes after
            await asyncio.sleep(2 * DIRECT_INTERVAL_S)
            stop.set()
            windows = {i: await t for i, t in tasks.items()}
            return windows, start, time.time()

        direct, start, end = asyncio.run(both())
        cached_instance = f"127.0.0.1:{cached.port}"
        yield {
            "prom": prom,
            "direct": direct,
            "start": start,
            "end": end,
            "cached": cached_instance,
            "uncached": f"127.0.0.1:{uncached.port}",
            "servers": servers,
            "trace": trace,
        }
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def fleet(scenario):
    return asyncio.run(read_fleet(scenario["prom"].url, '{job="vllm"}', scenario["start"], scenario["end"]))


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


@pytest.mark.real_engine
class TestSameEvidenceBothWays:
    def test_both_replicas_are_read(self, scenario, fleet):
        assert set(fleet.windows) == set(scenario["servers"])
        for instance, window in fleet.windows.items():
            # Idle before, traffic, idle after; how many more depends on how starved the 2 cores are.
            times = [r.t_wall for r in window.ok_records]
            assert len(times) >= 3 and times == sorted(times)
            assert scenario["start"] <= times[0] and times[-1] <= scenario["end"]
            assert window.source.endswith(f'{{instance="{instance}"}}')

    def test_counters_and_histograms_match_exactly(self, scenario, fleet):
        for instance in scenario["servers"]:
            direct = passive_evidence(scenario["direct"][instance])
            via = passive_evidence(fleet.windows[instance])
            for key in EXACT_KEYS:
                d, p = direct[key], via[key]
                assert type(d) is type(p), (instance, key, d, p)
                if isinstance(d, Measurement):
                    assert close(d.value, p.value), (instance, key, d.value, p.value)
            for key in FACT_KEYS:
                assert direct[key].value == via[key].value, (instance, key)
        cached = passive_evidence(fleet.windows[scenario["cached"]])
        # The traffic really was there: 5 of 6 requests reuse 7 of ~8 blocks.
        assert cached[Q.PREFIX_HIT_RATE].value > 0.6 and cached[Q.PREFIX_QUERIED_TOKENS].value > 4000

    def test_rates_differ_only_by_the_window_length(self, scenario, fleet):
        for instance in scenario["servers"]:
            direct = passive_evidence(scenario["direct"][instance])
            via = passive_evidence(fleet.windows[instance])
            d_len, p_len = direct[Q.LIVE_WINDOW_S].value, via[Q.LIVE_WINDOW_S].value
            # Each end of Prometheus's window lies within one scrape interval of the direct one's;
            # a third interval absorbs a scrape delayed on the 2 busy cores.
            assert abs(d_len - p_len) <= 3 * SCRAPE_INTERVAL_S, (instance, d_len, p_len)
            for key in RATE_KEYS:
                d, p = direct[key].value, via[key].value
                assert d > 0 and close(d * d_len, p * p_len), (instance, key, d, p)  # the same increase

    def test_gauges_are_measured_in_range(self, scenario, fleet):
        for instance in scenario["servers"]:
            via = passive_evidence(fleet.windows[instance])
            for key in (Q.KV_USAGE_P95, Q.KV_USAGE_MEAN):
                assert isinstance(via[key], Measurement) and 0.0 <= via[key].value <= 1.0
            assert isinstance(via[Q.RUNNING_MAX], Measurement) and via[Q.RUNNING_MAX].value >= 0

    def test_query_range_gives_the_same_increases(self, scenario, fleet):
        stepped = asyncio.run(
            read_fleet(
                scenario["prom"].url, '{job="vllm"}', scenario["start"], scenario["end"], step_s=SCRAPE_INTERVAL_S
            )
        )
        for instance in scenario["servers"]:
            raw, step = passive_evidence(fleet.windows[instance]), passive_evidence(stepped.windows[instance])
            assert close(raw[Q.PREFIX_QUERIED_TOKENS].value, step[Q.PREFIX_QUERIED_TOKENS].value)


@pytest.mark.real_engine
class TestFleetView:
    def test_the_divergent_replicas_show(self, scenario, fleet):
        evidence = {i: Evidence(Target(url=w.source, label=i), passive_evidence(w)) for i, w in fleet.windows.items()}
        view = fleet_view(evidence)
        cached, uncached = scenario["cached"], scenario["uncached"]
        differs = {c.key: c for c in view.config_differences}
        assert differs[Q.PREFIX_CACHING].values == {cached: True, uncached: False}
        hit = next(d for d in view.divergences if d.key == Q.PREFIX_HIT_RATE)
        assert hit.comparison.holds and hit.high == (cached,) and hit.low == (uncached,)
        assert hit.values[uncached] == 0.0  # caching off: nothing served from cache
        assert Q.PREFIX_CACHING in hit.explained_by
        assert view.routing.status == "unknown" and uncached in view.routing.reason

    def test_cli_writes_fleet_and_replicas(self, scenario, tmp_path, capsys):
        out = tmp_path / "fleet"
        rc = main(
            [
                "fleet",
                "--prometheus",
                scenario["prom"].url,
                "--selector",
                '{job="vllm"}',
                "--start",
                f"{scenario['start']:.3f}",
                "--end",
                f"{scenario['end']:.3f}",
                "--out",
                str(out),
                "--trace",
                str(scenario["trace"]),
            ]
        )
        printed = capsys.readouterr().out
        assert rc == 0
        document = json.loads((out / "fleet.json").read_text())
        assert set(document["replicas"]) == set(scenario["servers"])
        assert Q.PREFIX_HIT_RATE in document["view"]["diverging"]
        # The trace shares its ~1000-token prefix across 12 requests, but one replica caches
        # nothing: routing is not judged while a replica has prefix caching off.
        assert document["trace"][Q.PREFIX_AT_CAPACITY]["value"] > 0.5
        assert document["view"]["routing"]["status"] == "unknown"
        assert scenario["uncached"] in document["view"]["routing"]["reason"]
        assert "configuration differs: config.prefix_caching" in printed
        for info in document["replicas"].values():
            folder = out / info["folder"]
            assert main(["decide", str(folder), "--json"]) == 0  # each replica re-diagnoses offline
            decided = json.loads(capsys.readouterr().out)
            assert decided["bottleneck"] == info["bottleneck"]
        assert (out / "summary.txt").read_text().startswith("fleet: 2 replicas")


@pytest.mark.real_engine
class TestBadInputWithRealPrometheus:
    def cli(self, prom_url: str, tmp_path: Path, *extra: str) -> int:
        return main(["fleet", "--prometheus", prom_url, "--since", "1m", "--out", str(tmp_path / "o"), *extra])

    def test_selector_without_series(self, scenario, tmp_path, capsys):
        with pytest.raises(EmptySelection):
            asyncio.run(read_fleet(scenario["prom"].url, '{job="nope"}', time.time() - 60, time.time()))
        assert self.cli(scenario["prom"].url, tmp_path, "--selector", '{job="nope"}') == 3
        assert "check the selector" in capsys.readouterr().err

    def test_targets_without_engine_series_are_named(self, scenario):
        with pytest.raises(EmptySelection) as info:
            asyncio.run(read_fleet(scenario["prom"].url, '{job="self"}', scenario["start"], scenario["end"]))
        assert f"127.0.0.1:{scenario['prom'].port}" in str(info.value)

    def test_bad_selector_is_refused_by_prometheus(self, scenario, tmp_path, capsys):
        with pytest.raises(PrometheusRefused) as info:
            asyncio.run(read_fleet(scenario["prom"].url, "{job=}", time.time() - 60, time.time()))
        assert info.value.error_type == "bad_data"
        assert self.cli(scenario["prom"].url, tmp_path, "--selector", "{job=}") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--selector" in err

    def test_a_vllm_server_is_not_prometheus(self, scenario, tmp_path, capsys):
        vllm_url = next(iter(scenario["servers"].values())).url
        assert self.cli(vllm_url, tmp_path) == 3
        err = capsys.readouterr().err
        assert "HTTP 404" in err and "Prometheus server" in err

    def test_unreachable(self, tmp_path, capsys):
        assert self.cli(f"http://127.0.0.1:{free_port()}", tmp_path) == 3
        assert "Prometheus: cannot connect" in capsys.readouterr().err


class FakeApi:
    """A fake /api/v1/query: only for answers a real Prometheus does not give on demand."""

    def __init__(self, status: int, body: str, content_type: str = "application/json") -> None:
        self.status, self.body, self.content_type = status, body, content_type

    async def __aenter__(self) -> FakeApi:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        return web.Response(status=self.status, text=self.body, content_type=self.content_type)

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def fake_read(status: int, body: str, content_type: str = "application/json"):
    async def go():
        async with FakeApi(status, body, content_type) as api:
            return await read_fleet(api.url, '{job="vllm"}', time.time() - 60, time.time())

    return asyncio.run(go())


class TestMalformedAnswers:
    def test_wrong_shape_names_the_field(self):
        # Fake: a proxy or another API answering JSON on the same path; Prometheus never does this.
        with pytest.raises(MalformedAnswer, match="resultType 'vector'"):
            fake_read(200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}))
        with pytest.raises(MalformedAnswer, match=r"values\[0\]"):
            fake_read(
                200,
                json.dumps(
                    {
                        "status": "success",
                        "data": {
                            "resultType": "matrix",
                            "result": [{"metric": {"__name__": "vllm:num_requests_running"}, "values": [[1, "x"]]}],
                        },
                    }
                ),
            )
        with pytest.raises(MalformedAnswer, match="no 'status'"):
            fake_read(200, "[1, 2]")

    def test_too_large_query_says_what_to_do(self, tmp_path, capsys):
        # Fake: making a real Prometheus exceed --query.max-samples needs a large TSDB; its
        # answer is this documented error document with HTTP 422.
        body = json.dumps(
            {
                "status": "error",
                "errorType": "execution",
                "error": "query processing would load too many samples into memory in query execution",
            }
        )

        async def go():
            async with FakeApi(422, body) as api:
                return await asyncio.to_thread(
                    main, ["fleet", "--prometheus", api.url, "--since", "1h", "--out", str(tmp_path / "o")]
                )

        assert asyncio.run(go()) == 3
        err = capsys.readouterr().err
        assert "too many samples" in err and "--step" in err

    def test_html_page_is_not_prometheus(self, tmp_path, capsys):
        # Fake: an HTML login page answering 200 on any path (a real proxy would do this).
        async def go():
            async with FakeApi(200, "<html><body>login</body></html>", "text/html") as api:
                return await asyncio.to_thread(
                    main, ["fleet", "--prometheus", api.url, "--since", "1m", "--out", str(tmp_path / "o")]
                )

        assert asyncio.run(go()) == 3
        assert "did not answer with JSON" in capsys.readouterr().err
