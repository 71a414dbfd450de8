"""Benchmark the live-attach probe against a real vLLM server.

Two questions:
1. What does one scrape cost? GET /metrics on an idle server, and parsing the page, timed
   separately and together (median and spread over `--scrapes` repetitions).
2. Does a 1-second scrape loop slow the server down? The same closed-loop workload runs
   with and without a scraper beside it (in its own process, as llm-diagnose would be),
   alternating A B B A ... so slow drift hits both arms equally; the difference of the
   medians is compared with the run-to-run spread of each arm.

Usage (starts its own tiny-model vLLM CPU server unless --url is given):
    python benchmarks/bench_scrape.py [--url http://127.0.0.1:8000] [--pairs 4] [--json out.json]
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

from probes.http import get_text, make_session  # noqa: E402
from probes.metrics import parse_exposition  # noqa: E402

SCRAPER_CODE = """
import asyncio, sys
from probes.metrics import scrape_window
asyncio.run(scrape_window(sys.argv[1], 3600.0, interval_s=1.0))
"""


def quantiles(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "q1": q[0], "q3": q[2], "min": s[0], "max": s[-1], "n": len(s)}


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (clock ticks -> seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def time_scrapes(url: str, n: int, server_pid: int | None) -> dict[str, dict[str, float]]:
    get_ms, parse_ms, total_ms, sizes = [], [], [], []
    async with make_session() as session:
        await get_text(session, url + "/metrics")  # warm the connection
        cpu0 = cpu_seconds(server_pid) if server_pid else None
        for _ in range(n):
            t0 = time.perf_counter()
            answer = await get_text(session, url + "/metrics")
            t1 = time.perf_counter()
            parse_exposition(answer.text)
            t2 = time.perf_counter()
            get_ms.append((t1 - t0) * 1e3)
            parse_ms.append((t2 - t1) * 1e3)
            total_ms.append((t2 - t0) * 1e3)
            sizes.append(len(answer.text))
            await asyncio.sleep(0.05)
        # CPU the API server spent per scrape (rendering the page), idle otherwise: a cost
        # that other processes on the machine cannot blur, unlike wall-clock throughput.
        cpu = (cpu_seconds(server_pid) - cpu0) * 1e3 / n if server_pid and cpu0 is not None else None
    out = {"get_ms": quantiles(get_ms), "parse_ms": quantiles(parse_ms), "total_ms": quantiles(total_ms),
           "page_bytes": quantiles([float(s) for s in sizes])}
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
            body = {"model": model, "prompt": f"bench {i} " + " ".join(f"w{j}" for j in range(60)),
                    "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
            async with session.post(url + "/v1/completions", json=body) as resp:
                resp.raise_for_status()
                tokens += (await resp.json())["usage"]["completion_tokens"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return tokens / (time.perf_counter() - t0)


def run_arm(url: str, model: str, with_scraper: bool, args: argparse.Namespace) -> float:
    scraper = None
    if with_scraper:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER_CODE, url + "/metrics"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)  # interpreter start and first scrape happen before the timed workload
    try:
        return asyncio.run(workload(url, model, args.requests, args.concurrency, args.max_tokens))
    finally:
        if scraper is not None:
            scraper.send_signal(signal.SIGTERM)
            scraper.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an already running vLLM server (default: start a tiny-model one)")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=4, help="A/B pairs of the throughput workload")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    server = None
    url = args.url
    if url is None:
        from diagnose.demo.tiny_model import make_tiny_model
        from diagnose.demo.vllm_server import VllmServer
        work = Path(tempfile.mkdtemp(prefix="bench-scrape-"))
        server = VllmServer(make_tiny_model(work / "model"), work)
        server.start()
        print(f"vLLM ready after {server.wait_ready():.0f} s at {server.url}", file=sys.stderr)
        url = server.url
    try:
        asyncio.run(workload(url, args.model, 8, 4, 16))  # warm-up: first requests compile/allocate
        scrape = asyncio.run(time_scrapes(url, args.scrapes, server.pid if server is not None else None))
        load_before = os.getloadavg()
        order = []
        for i in range(args.pairs):
            order += [False, True] if i % 2 == 0 else [True, False]  # A B B A A B ...
        results: dict[str, list[float]] = {"without": [], "with": []}
        for with_scraper in order:
            tps = run_arm(url, args.model, with_scraper, args)
            results["with" if with_scraper else "without"].append(tps)
            print(f"  {'with' if with_scraper else 'without':7s} scraper: {tps:8.1f} tok/s", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()

    a, b = quantiles(results["without"]), quantiles(results["with"])
    diff = (b["median"] - a["median"]) / a["median"]
    spread = max((a["max"] - a["min"]) / a["median"], (b["max"] - b["min"]) / b["median"])
    figures = {"scrape": scrape, "throughput_tok_s": {"without_scraper": results["without"],
                                                        "with_scraper": results["with"],
                                                        "without": a, "with": b},
               "median_difference": diff, "largest_arm_range": spread, "within_noise": abs(diff) <= spread,
               "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]], "cpus": os.cpu_count(),
               "workload": {"requests": args.requests, "concurrency": args.concurrency,
                            "max_tokens": args.max_tokens, "pairs": args.pairs}}
    t = scrape["total_ms"]
    print(f"scrape+parse one page ({scrape['page_bytes']['median']:.0f} bytes): median {t['median']:.2f} ms "
          f"(IQR {t['q1']:.2f}-{t['q3']:.2f}; GET {scrape['get_ms']['median']:.2f}, "
          f"parse {scrape['parse_ms']['median']:.2f}) over {t['n']} scrapes")
    if "server_cpu_ms_per_scrape" in scrape:
        cpu = scrape["server_cpu_ms_per_scrape"]["mean"]
        print(f"API-server CPU per scrape: {cpu:.1f} ms (a 1 s loop costs the server {cpu / 10:.1f}% of one core)")
    print(f"throughput without scraper: median {a['median']:.1f} tok/s (range {a['min']:.1f}-{a['max']:.1f})")
    print(f"throughput with 1 s scraper: median {b['median']:.1f} tok/s (range {b['min']:.1f}-{b['max']:.1f})")
    print(f"difference of medians {diff * 100:+.1f}% vs largest within-arm range {spread * 100:.1f}%: "
          f"{'within' if abs(diff) <= spread else 'OUTSIDE'} the noise")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
