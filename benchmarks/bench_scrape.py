"""Benchmark the live-attach probe against a real vLLM server.

Two questions:
1. What does one scrape cost? GET /metrics on an idle server, and parsing the page, timed
   separately and together (median and spread over `--scrapes` repetitions).
2. Does a 1-second scrape loop slow the server down? The same short closed-loop workload
   runs without (A) and with (B) a 1 s scrape loop beside it, in pairs (A B B A ...), so slow
   drift hits both arms alike. The scraper is one process for the whole benchmark (as
   llm-diagnose would be), alive in both arms and scraping only in B: an earlier version
   started a fresh interpreter for each B run, and its start-up CPU landed in B's timed
   window. The answer is the median of the per-pair relative differences with a bootstrap
   95% interval: the overhead is within the noise when the interval holds 0, and the
   interval's width is what this machine can resolve.

3. What does parsing one page cost, llm-diagnose's parser against prometheus_client's? Both
   run side by side on the same page in one process, interleaved, so load on the machine hits
   both alike: prometheus_client's `text_string_to_metric_families` (the samples only), and
   `parse_exposition` (the whole Scrape) warm (its label cache filled by the previous page, as
   in a scrape loop) and cold (caches emptied before every parse). With a live server the
   same comparison runs on every scraped page as well.

Usage (starts its own tiny-model vLLM CPU server unless --url is given):
    python benchmarks/bench_scrape.py [--url http://127.0.0.1:8000] [--pairs 4] [--json out.json]
Parsers only, on a stored page (no server; default the real vLLM 0.32.0 capture):
    python benchmarks/bench_scrape.py --parse-only [--page FILE] [--repeats 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llm_diagnose.probes.http import get_text, make_session  # noqa: E402
from llm_diagnose.probes.metrics import (
    exposition,  # noqa: E402
    parse_exposition,  # noqa: E402
)

DEFAULT_PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics" / "vllm-0.32.0-cpu-real.txt"

# One process for the whole benchmark: SIGUSR1 starts a 1 s scrape loop, SIGUSR2 stops it.
# It prints "ready" once imported, and "on"/"off" once each signal has taken effect.
SCRAPER_CODE = """
import asyncio, signal, sys
from llm_diagnose.probes.metrics import scrape_window

async def main():
    loop, state = asyncio.get_running_loop(), {}
    def on():
        state["stop"] = asyncio.Event()
        state["task"] = loop.create_task(scrape_window(sys.argv[1], 3600.0, interval_s=1.0, stop=state["stop"]))
        print("on", flush=True)
    def off():
        state["stop"].set()
        print("off", flush=True)
    loop.add_signal_handler(signal.SIGUSR1, on)
    loop.add_signal_handler(signal.SIGUSR2, off)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def quantiles(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "q1": q[0], "q3": q[2], "min": s[0], "max": s[-1], "n": len(s)}


def prometheus_client_parse(text: str) -> int:
    """prometheus_client's parser, every sample materialised (what parse_exposition used to run)."""
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def parse_cold(text: str) -> object:
    exposition._label_cache.clear()
    exposition._name_cache.clear()
    return parse_exposition(text)


PARSERS = {
    "prometheus_client": prometheus_client_parse,
    "parse_exposition (warm)": parse_exposition,
    "parse_exposition (cold)": parse_cold,
}


def time_parsers(text: str, repeats: int) -> dict[str, dict[str, float]]:
    """Each parser `repeats` times on `text`, interleaved (one of each per round), in ms."""
    fast = exposition.fast_samples(text)  # raises NotFastPath if the page would not take the fast path
    assert len(fast) == prometheus_client_parse(text), "the fast path lost samples"
    times: dict[str, list[float]] = {name: [] for name in PARSERS}
    parse_exposition(text)  # fill the label cache, as the scrape before would have
    for _ in range(repeats):
        for name, fn in PARSERS.items():
            t0 = time.perf_counter()
            fn(text)
            times[name].append((time.perf_counter() - t0) * 1e3)
        parse_exposition(text)  # the cold run emptied the cache: warm it again for the next round
    return {name: quantiles(v) for name, v in times.items()}


def print_parsers(figures: dict[str, dict[str, float]], page_bytes: int, where: str) -> None:
    base = figures["prometheus_client"]["median"]
    print(
        f"parse one page ({page_bytes:,} bytes, {where}), median over {figures['prometheus_client']['n']} runs each, "
        "side by side:"
    )
    for name, q in figures.items():
        print(
            f"  {name:26s} median {q['median']:7.2f} ms (IQR {q['q1']:.2f}-{q['q3']:.2f}, min {q['min']:.2f})"
            f"  {base / q['median']:5.1f}x"
        )


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (clock ticks -> seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def time_scrapes(url: str, n: int, server_pid: int | None) -> dict[str, dict[str, float]]:
    get_ms, parse_ms, total_ms, sizes, pc_ms = [], [], [], [], []
    async with make_session() as session:
        await get_text(session, url + "/metrics")  # warm the connection
        cpu0 = cpu_seconds(server_pid) if server_pid else None
        for _ in range(n):
            t0 = time.perf_counter()
            answer = await get_text(session, url + "/metrics")
            t1 = time.perf_counter()
            parse_exposition(answer.text)
            t2 = time.perf_counter()
            prometheus_client_parse(answer.text)  # the same page, side by side
            pc_ms.append((time.perf_counter() - t2) * 1e3)
            get_ms.append((t1 - t0) * 1e3)
            parse_ms.append((t2 - t1) * 1e3)
            total_ms.append((t2 - t0) * 1e3)
            sizes.append(len(answer.text))
            await asyncio.sleep(0.05)
        # CPU the API server spent per scrape (rendering the page), idle otherwise: a cost
        # that other processes on the machine cannot blur, unlike wall-clock throughput.
        cpu = (cpu_seconds(server_pid) - cpu0) * 1e3 / n if server_pid and cpu0 is not None else None
    out = {
        "get_ms": quantiles(get_ms),
        "parse_ms": quantiles(parse_ms),
        "total_ms": quantiles(total_ms),
        "prometheus_client_parse_ms": quantiles(pc_ms),
        "page_bytes": quantiles([float(s) for s in sizes]),
    }
    out["parsers_on_last_page"] = time_parsers(answer.text, 100)
    if cpu is not None:
        out["server_cpu_ms_per_scrape"] = {"mean": cpu, "n": n}
    return out


async def workload(url: str, model: str, requests: int, concurrency: int, max_tokens: int) -> float:
    """Closed loop: `concurrency` workers send `requests` completions; output tokens per second."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    tokens = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while not queue.empty():
            i = queue.get_nowait()
            body = {
                "model": model,
                "prompt": f"bench {i} " + " ".join(f"w{j}" for j in range(60)),
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
            }
            async with session.post(url + "/v1/completions", json=body) as resp:
                resp.raise_for_status()
                tokens += (await resp.json())["usage"]["completion_tokens"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return tokens / (time.perf_counter() - t0)


class Scraper:
    """The scraper child process (see SCRAPER_CODE)."""

    def __init__(self, url: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SCRAPER_CODE, url + "/metrics"],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._expect("ready")

    def _expect(self, word: str) -> None:
        line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if line != word:
            raise RuntimeError(f"scraper process said {line!r}, expected {word!r}")

    def switch(self, on: bool) -> None:
        self.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        self._expect("on" if on else "off")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_arm(url: str, model: str, scraper: Scraper, scraping: bool, args: argparse.Namespace) -> float:
    if scraping:
        scraper.switch(True)
        time.sleep(0.2)  # the first scrape is under way before the timed workload
    try:
        return asyncio.run(workload(url, model, args.requests, args.concurrency, args.max_tokens))
    finally:
        if scraping:
            scraper.switch(False)


def paired_change(pairs: list[tuple[float, float]], resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Median of the per-pair relative changes (with / without - 1), and its bootstrap 95% interval."""
    import numpy as np

    changes = np.array([b / a - 1 for a, b in pairs])
    rng = np.random.default_rng(seed)
    boot = np.sort(np.median(changes[rng.integers(0, len(changes), (resamples, len(changes)))], axis=1))
    return float(np.median(changes)), float(boot[int(0.025 * resamples)]), float(boot[int(0.975 * resamples) - 1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an already running vLLM server (default: start a tiny-model one)")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=20, help="A/B pairs of the throughput workload")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--parse-only", action="store_true", help="time the parsers on --page only (no server)")
    ap.add_argument("--page", type=Path, default=DEFAULT_PAGE, help="the page for --parse-only")
    ap.add_argument("--repeats", type=int, default=300, help="parses per parser with --parse-only")
    args = ap.parse_args()
    if args.parse_only:
        text = args.page.read_text()
        figures = time_parsers(text, args.repeats)
        print_parsers(figures, len(text.encode()), args.page.name)
        print(f"load average (1 min) {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        if args.json:
            args.json.write_text(
                json.dumps({"parsers": figures, "page": str(args.page), "page_bytes": len(text.encode())}, indent=2)
            )
        return 0

    server = None
    url = args.url
    if url is None:
        from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model
        from llm_diagnose.diagnose.demo.vllm_server import VllmServer

        work = Path(tempfile.mkdtemp(prefix="bench-scrape-"))
        server = VllmServer(make_tiny_model(work / "model"), work)
        server.start()
        print(f"vLLM ready after {server.wait_ready():.0f} s at {server.url}", file=sys.stderr)
        url = server.url
    try:
        asyncio.run(workload(url, args.model, 8, 4, 16))  # warm-up: first requests compile/allocate
        scrape = asyncio.run(time_scrapes(url, args.scrapes, server.pid if server is not None else None))
        load_before = os.getloadavg()
        results: dict[str, list[float]] = {"without": [], "with": []}
        pairs: list[tuple[float, float]] = []
        scraper = Scraper(url)
        try:
            for i in range(args.pairs):  # --pairs 0: the scrape and parse figures only
                tps = {}
                for scraping in (False, True) if i % 2 == 0 else (True, False):  # A B, then B A, ...
                    tps[scraping] = run_arm(url, args.model, scraper, scraping, args)
                    results["with" if scraping else "without"].append(tps[scraping])
                pairs.append((tps[False], tps[True]))
                print(f"  pair {i + 1}: without {tps[False]:8.1f}, with {tps[True]:8.1f} tok/s", file=sys.stderr)
        finally:
            scraper.close()
    finally:
        if server is not None:
            server.stop()

    t = scrape["total_ms"]
    print(
        f"scrape+parse one page ({scrape['page_bytes']['median']:.0f} bytes): median {t['median']:.2f} ms "
        f"(IQR {t['q1']:.2f}-{t['q3']:.2f}; GET {scrape['get_ms']['median']:.2f}, "
        f"parse {scrape['parse_ms']['median']:.2f}; prometheus_client's parser on the same pages "
        f"{scrape['prometheus_client_parse_ms']['median']:.2f}) over {t['n']} scrapes"
    )
    print_parsers(scrape["parsers_on_last_page"], int(scrape["page_bytes"]["median"]), "the last scraped page")
    if not pairs:
        if args.json:
            args.json.write_text(json.dumps({"scrape": scrape}, indent=2))
        return 0
    a, b = quantiles(results["without"]), quantiles(results["with"])
    diff, lo, hi = paired_change(pairs)
    figures = {
        "scrape": scrape,
        "throughput_tok_s": {
            "without_scraper": results["without"],
            "with_scraper": results["with"],
            "without": a,
            "with": b,
        },
        "paired_change": {"median": diff, "ci95": [lo, hi]},
        "within_noise": lo <= 0 <= hi,
        "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "workload": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "pairs": args.pairs,
        },
    }
    if "server_cpu_ms_per_scrape" in scrape:
        cpu = scrape["server_cpu_ms_per_scrape"]["mean"]
        print(f"API-server CPU per scrape: {cpu:.1f} ms (a 1 s loop costs the server {cpu / 10:.1f}% of one core)")
    print(f"throughput without scraper: median {a['median']:.1f} tok/s (range {a['min']:.1f}-{a['max']:.1f})")
    print(f"throughput with 1 s scraper: median {b['median']:.1f} tok/s (range {b['min']:.1f}-{b['max']:.1f})")
    print(
        f"throughput change with the scraper, median of {len(pairs)} pairs: {diff * 100:+.1f}% "
        f"(95% interval {lo * 100:+.1f}% to {hi * 100:+.1f}%): "
        f"{'within' if lo <= 0 <= hi else 'OUTSIDE'} the noise"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
