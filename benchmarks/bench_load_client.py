"""Benchmark: the load client against vLLM's own benchmark client, on one fast local server.

    .venv/bin/python benchmarks/bench_load_client.py [--quick] [--json OUT.json]

One run starts a fast SSE server (this file, `serve`, a separate process on 127.0.0.1) that
answers /v1/completions as fast as it can, or at a fixed gap per token, and writes each
token's send time (time.perf_counter_ns, CLOCK_MONOTONIC: the same clock in every process
of the host) into the token text. Then, for each scenario, it runs each client in its own
fresh process (`client ours` / `client vllm`), alternating, `--repeats` times:

- ours: llm_diagnose.probes.load.StreamingClient.send;
- vllm: vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions (the
  request function of `vllm bench serve`), with the session settings `vllm bench serve` uses.

Both are driven by the same harness (a semaphore holding `concurrency` requests in flight,
plain asyncio as `vllm bench serve` uses), so the only difference is the client itself.
Reported per client: sustained tokens/s (tokens received / wall time), the client process's
CPU seconds per 1,000 tokens, and the timing error (the client's timestamp of a token minus
the server's send time of that token: p50, p99, max), which is what an inter-token latency
measured by that client is off by.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name, concurrency, requests, tokens per request, gap between tokens (ms; 0 = as fast as possible)
SCENARIOS = [
    ("flood-256x256", 256, 512, 256, 0.0),
    ("paced-1000x100@20ms", 1000, 1000, 100, 20.0),
    ("paced-64x200@5ms", 64, 128, 200, 5.0),
]
QUICK = [
    ("flood-64x128", 64, 128, 128, 0.0),
    ("paced-200x50@20ms", 200, 200, 50, 20.0),
]


# --- the fast server ------------------------------------------------------------------------------
def serve(port_file: str) -> None:
    """A minimal HTTP/1.1 keep-alive SSE server: cheap enough that the clients are the bottleneck."""
    try:
        import uvloop  # the server is not what is measured: give it the fastest loop there is

        uvloop.install()
    except ImportError:
        pass
    clock_ns = time.perf_counter_ns
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: keep-alive\r\n\r\n"
    )
    prefix = b'data: {"id":"b","object":"text_completion","choices":[{"index":0,"text":"'
    usage_tpl = (
        b'data: {"id":"b","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d,'
        b'"total_tokens":%d}}\n\ndata: [DONE]\n\n'
    )

    def chunk(payload: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = json.loads(await reader.readexactly(length))
                n = int(body.get("max_tokens", 16))
                gap = float(body.get("x_gap_ms", 0.0)) / 1000.0
                writer.write(head)
                t_next = time.perf_counter()
                for i in range(n):
                    if gap:
                        t_next += gap
                        delay = t_next - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    finish = b'"length"' if i == n - 1 else b"null"
                    writer.write(chunk(prefix + b"%d," % clock_ns() + b'","finish_reason":' + finish + b"}]}\n\n"))
                    if not gap and i % 32 == 31:
                        await writer.drain()
                writer.write(chunk(usage_tpl % (n, n + 8)) + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096, limit=1 << 20)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- the two clients, one harness --------------------------------------------------------------
def _errors(arrivals: list[float], text: str) -> list[float]:
    sent = [int(x) / 1e9 for x in text.split(",") if x]
    return [a - s for a, s in zip(arrivals, sent)] if len(sent) == len(arrivals) else []


async def _harness(send, concurrency: int, n: int) -> list[tuple[bool, int, list[float]]]:  # type: ignore[no-untyped-def]
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int):  # type: ignore[no-untyped-def]
        async with sem:
            return await send(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def _run_ours(url: str, concurrency: int, n: int, tokens: int, gap_ms: float):  # type: ignore[no-untyped-def]
    from llm_diagnose.probes.load import RequestSpec, StreamingClient

    async with StreamingClient(url, "bench", max_streams=max(concurrency, 1024), keep_text=True) as client:

        async def send(i: int):  # type: ignore[no-untyped-def]
            spec = RequestSpec(f"r{i}", "hello", tokens, extra_body=(("x_gap_ms", gap_ms),))
            r = await client.send(spec)
            arrivals = list(r.absolute_event_times())
            return r.completed, len(arrivals), _errors(arrivals, client.texts.pop(spec.request_id, ""))

        return await _harness(send, concurrency, n)


async def _run_vllm(url: str, concurrency: int, n: int, tokens: int, gap_ms: float):  # type: ignore[no-untyped-def]
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    # The session `vllm bench serve` makes (vllm/benchmarks/serve.py).
    connector = aiohttp.TCPConnector(
        limit=concurrency,
        limit_per_host=concurrency,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
    )
    async with aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    ) as session:

        async def send(i: int):  # type: ignore[no-untyped-def]
            inp = RequestFuncInput(
                prompt="hello",
                api_url=url + "/v1/completions",
                prompt_len=8,
                output_len=tokens,
                model="bench",
                ignore_eos=True,
                extra_body={"x_gap_ms": gap_ms},
            )
            out = await async_request_openai_completions(inp, session)
            arrivals = []
            if out.success:
                t = out.start_time + out.ttft
                arrivals.append(t)
                for gap in out.itl:
                    t += gap
                    arrivals.append(t)
            return out.success, len(arrivals), _errors(arrivals, out.generated_text)

        return await _harness(send, concurrency, n)


def client(which: str, url: str, concurrency: int, n: int, tokens: int, gap_ms: float) -> None:
    run = _run_ours if which == "ours" else _run_vllm
    # Import costs stay out of the timing.
    if which == "vllm":
        import vllm.benchmarks.lib.endpoint_request_func  # noqa: F401
    else:
        import llm_diagnose.probes.load  # noqa: F401
    cpu0, t0 = time.process_time(), time.perf_counter()
    results = asyncio.run(run(url, concurrency, n, tokens, gap_ms))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    received = sum(k for _, k, _ in results)
    errors = sorted(e for _, _, errs in results for e in errs)

    def q(p: float) -> float:
        return errors[min(len(errors) - 1, int(p * (len(errors) - 1)))] if errors else float("nan")

    print(
        json.dumps(
            {
                "client": which,
                "ok": sum(ok for ok, _, _ in results),
                "requests": n,
                "tokens": received,
                "wall_s": wall,
                "tokens_per_s": received / wall,
                "cpu_s": cpu,
                "cpu_ms_per_1k_tokens": 1e6 * cpu / max(1, received),
                "timed_tokens": len(errors),
                "error_p50_ms": q(0.5) * 1e3,
                "error_p99_ms": q(0.99) * 1e3,
                "error_max_ms": errors[-1] * 1e3 if errors else float("nan"),
            }
        )
    )


# --- orchestration -------------------------------------------------------------------------------------
def _start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port_file = tmp / "port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "serve", str(port_file)], start_new_session=True)
    deadline = time.monotonic() + 20
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the benchmark server did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


def _client_run(which: str, url: str, scenario: tuple) -> dict:  # type: ignore[type-arg]
    _, concurrency, n, tokens, gap = scenario
    out = subprocess.run(
        [sys.executable, __file__, "client", which, url, str(concurrency), str(n), str(tokens), str(gap)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{which} client failed: {out.stderr[-800:]}")
    return json.loads(lines[-1])


def _median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller scenarios (about a minute)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per client and scenario (alternating)")
    parser.add_argument("--json", type=Path, help="write all runs here")
    args = parser.parse_args(argv)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-load-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    server, url = _start_server(tmp)
    report: dict = {"host_cpus": os.cpu_count(), "python": sys.version.split()[0], "scenarios": {}}
    try:
        for scenario in QUICK if args.quick else SCENARIOS:
            runs: dict[str, list[dict]] = {"ours": [], "vllm": []}
            for _ in range(args.repeats):
                for which in ("ours", "vllm"):
                    runs[which].append(_client_run(which, url, scenario))
            report["scenarios"][scenario[0]] = runs
            print(
                f"\n{scenario[0]}: {scenario[1]} concurrent, {scenario[2]} requests x {scenario[3]} tokens, "
                f"gap {scenario[4]:g} ms (median of {args.repeats} runs)"
            )
            print(
                f"  {'client':<6} {'ok':>9} {'tokens/s':>10} {'CPU ms/1k tok':>14} {'err p50 ms':>11} "
                f"{'err p99 ms':>11} {'err max ms':>11}"
            )
            for which, rs in runs.items():
                print(
                    f"  {which:<6} {min(r['ok'] for r in rs):>4}/{rs[0]['requests']:<4} "
                    f"{_median_of(rs, 'tokens_per_s'):>10.0f} {_median_of(rs, 'cpu_ms_per_1k_tokens'):>14.1f} "
                    f"{_median_of(rs, 'error_p50_ms'):>11.2f} {_median_of(rs, 'error_p99_ms'):>11.2f} "
                    f"{_median_of(rs, 'error_max_ms'):>11.1f}"
                )
    finally:
        server.terminate()
        server.wait(10)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        w, u, c, n, t, g = sys.argv[2:8]
        client(w, u, int(c), int(n), int(t), float(g))
    else:
        sys.exit(main())
