"""Peak memory of a long scrape window: today's bounded window beside the one that kept every page.

    python benchmarks/bench_window_memory.py [--hours 24] [--old-hours 1] [--every 3600] [--out FILE]

Replays the real vLLM 0.32.0 page (tests/fixtures/metrics/vllm-0.32.0-cpu-real.txt) as a 1 s
scrape loop would see it, without sleeping: page k has every counter, histogram bucket, count
and sum advanced by k thousandths of its captured value (buckets stay cumulative), and the
running/waiting/KV-usage gauges cycling. Each page is rendered as text and parsed
(`record_from_text`, as the scraper does), so every page costs what a real one costs.

Each variant runs in a child process of its own (peak RSS is per process), which reports its
resident memory every `--every` pages: the peak so far (`ru_maxrss`) and the memory in use now.

- new: what `run` does now: the page is folded into a WindowTally and its line offered to the
  bounded metrics.jsonl (scrape_file.ScrapeFile, in a temporary folder); at the end the Window is
  built and `passive_evidence` computes every figure.
- old: the window as it was before this change (`git show <rev>:llm_diagnose/probes/metrics/window.py`,
  loaded as a module of its own): every parsed record held in a list; at the end the old Window is
  built and asked for a counter, a histogram and a gauge. Its metrics.jsonl held every line: the
  bytes it would have written are counted, not written.

`--churn N` adds N series no earlier page had to every page (`bench_requests_total{request="k-j"}`):
a label with unbounded values, the case where series churn filled memory and disk fastest.

Writes a markdown table to stdout and to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

PAGE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32.0-cpu-real.txt"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
_COUNTING = ("_total", "_count", "_sum", "_bucket")
_CYCLING = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def page_template(text: str) -> tuple[list[str], list[tuple[float, str]], str]:
    """The page cut around its values: (text before each value, [(captured value, how it moves)], the tail)."""
    pieces: list[str] = []
    values: list[tuple[float, str]] = []
    pending: list[str] = []
    for line in text.splitlines(keepends=True):
        m = _SAMPLE.match(line.rstrip("\n"))
        if m is None or line.startswith("#"):
            pending.append(line)
            continue
        name = m.group(1)
        if name.endswith("_created"):
            kind = "fixed"
        elif name.endswith(_COUNTING):
            kind = "counter"
        elif name in _CYCLING:
            kind = name
        else:
            kind = "fixed"
        pending.append(line[: m.start(3)])
        pieces.append("".join(pending))
        values.append((float(m.group(3)), kind))
        pending = [line[m.end(3) :]]
    return pieces, values, "".join(pending)


def render(template: tuple[list[str], list[tuple[float, str]], str], k: int, churn: int = 0) -> str:
    """Page k: counters advanced by k thousandths of their captured value, three gauges cycling;
    with `churn`, that many series no page had before (a request id in a label)."""
    pieces, values, tail = template
    out = []
    for piece, (v, kind) in zip(pieces, values):
        if kind == "counter":
            v = v + v * 0.001 * k
        elif kind == "vllm:num_requests_running":
            v = float(k % 9)
        elif kind == "vllm:num_requests_waiting":
            v = float((k // 7) % 4)
        elif kind == "vllm:kv_cache_usage_perc":
            v = (k % 100) / 100
        out.append(piece)
        out.append(repr(v))
    out.append(tail)
    if churn:
        out.append("# TYPE bench_requests_total counter\n")
        out.extend(f'bench_requests_total{{request="{k}-{j}"}} 1.0\n' for j in range(churn))
    return "".join(out)


def _rss_mb() -> tuple[float, float]:
    """(peak so far, now) resident memory of this process, MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    return peak, now


def _report(pages: int, t0: float, **fields: object) -> None:
    """One JSON line to the parent: pages so far, resident memory (peak so far, now), seconds since t0."""
    peak, now = _rss_mb()
    print(json.dumps({"pages": pages, "peak_mb": peak, "now_mb": now, "seconds": time.perf_counter() - t0, **fields}))
    sys.stdout.flush()


def child_new(pages: int, every: int, churn: int) -> None:
    from llm_diagnose.probes.metrics import passive_evidence
    from llm_diagnose.probes.metrics.scrape_file import ScrapeFile
    from llm_diagnose.probes.metrics.window import Window, record_from_text
    from llm_diagnose.probes.metrics.window_tally import WindowTally

    template = page_template(PAGE.read_text())
    render(template, 0)
    t0 = time.perf_counter()
    _report(0, t0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        file = ScrapeFile(path)
        tally = WindowTally()
        for k in range(pages):
            text = render(template, k, churn)
            record = record_from_text(1.8e9 + k, 1000.0 + k, text, None, 0.005, "bench")
            tally.add(record)
            file.write(json.dumps({"t_wall": record.t_wall, "t_mono": record.t_mono, "url": "bench", "text": text}))
            if (k + 1) % every == 0:
                _report(k + 1, t0)
        file.close()
        size = path.stat().st_size
        t1 = time.perf_counter()
        window = Window("bench", planned_duration_s=float(pages - 1), tally=tally)
        evidence = passive_evidence(window)
        figures_s = time.perf_counter() - t1
        rate = evidence["throughput.prompt_tokens_per_s"]
        _report(
            pages,
            t0,
            final=True,
            file_bytes=size,
            file_lines=file.written,
            file_stride=file.stride,
            figures_s=figures_s,
            kept_pages=len(window.ok_records),
            prompt_tokens_per_s=getattr(rate, "value", None),
            describe=window.describe(),
        )


def child_old(pages: int, every: int, rev: str, churn: int) -> None:
    source = subprocess.run(
        ["git", "show", f"{rev}:llm_diagnose/probes/metrics/window.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        module_path = Path(tmp) / "old_window.py"
        module_path.write_text(source)
        spec = importlib.util.spec_from_file_location("old_window", module_path)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        sys.modules["old_window"] = old  # dataclasses look their module up there
        spec.loader.exec_module(old)
    from llm_diagnose.probes.metrics.engines import ENGINE_METRICS

    template = page_template(PAGE.read_text())
    render(template, 0)
    t0 = time.perf_counter()
    _report(0, t0)
    records, file_bytes = [], 0
    for k in range(pages):
        text = render(template, k, churn)
        records.append(old.record_from_text(1.8e9 + k, 1000.0 + k, text, None, 0.005, "bench"))
        file_bytes += len(json.dumps({"t_wall": 1.8e9 + k, "t_mono": 1000.0 + k, "url": "bench", "text": text})) + 1
        if (k + 1) % every == 0:
            _report(k + 1, t0)
    t1 = time.perf_counter()
    window = old.Window("bench", tuple(records), float(pages - 1))
    names = ENGINE_METRICS["vllm"]
    rate = window.counter(names["prompt_tokens"][0]).rate
    window.histogram(names["itl"][0])
    window.gauge(names["kv_usage"][0], "max")
    figures_s = time.perf_counter() - t1
    _report(
        pages,
        t0,
        final=True,
        file_bytes=file_bytes,
        file_lines=pages,
        file_stride=1,
        figures_s=figures_s,
        kept_pages=len(records),
        prompt_tokens_per_s=rate,
    )


def run_child(variant: str, pages: int, every: int, rev: str, churn: int) -> list[dict]:
    cmd = [sys.executable, __file__, "--child", variant, "--pages", str(pages), "--every", str(every), "--rev", rev]
    cmd += ["--churn", str(churn)]
    rows = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            row = json.loads(line)
            rows.append(row)
            print(f"  {variant}: {row['pages']:>6} pages, peak {row['peak_mb']:.0f} MiB", file=sys.stderr, flush=True)
    if proc.returncode:
        raise SystemExit(f"the {variant} child failed (exit {proc.returncode})")
    return rows


def table(new: list[dict], old: list[dict]) -> str:
    base_new, base_old = new[0]["peak_mb"], old[0]["peak_mb"] if old else 0.0
    by_pages = {r["pages"]: r for r in old if not r.get("final")}
    lines = [
        "| scraped (1 s pages) | old: peak RSS | old: growth | new: peak RSS | new: growth | new: s per 1,000 pages |",
        "|---|---|---|---|---|---|",
    ]
    for r in new:
        if r["pages"] == 0 or r.get("final"):
            continue
        o = by_pages.get(r["pages"])
        old_cells = f"{o['peak_mb']:.0f} MiB | +{o['peak_mb'] - base_old:.0f} MiB" if o else "not run | "
        pace = 1000 * r["seconds"] / r["pages"]
        lines.append(
            f"| {r['pages']:,} ({r['pages'] / 3600:g} h) | {old_cells} | {r['peak_mb']:.0f} MiB | "
            f"+{r['peak_mb'] - base_new:.0f} MiB | {pace:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0, help="hours of 1 s scrapes for the new window")
    ap.add_argument("--old-hours", type=float, default=1.0, help="hours of 1 s scrapes for the old window")
    ap.add_argument("--every", type=int, default=3600, help="report memory every this many pages")
    ap.add_argument("--rev", default="HEAD", help="git revision whose window.py is the old one")
    ap.add_argument("--churn", type=int, default=0, help="series no page had before, added to every page")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=("new", "old"), help=argparse.SUPPRESS)
    ap.add_argument("--pages", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "new":
        return child_new(args.pages, args.every, args.churn)
    if args.child == "old":
        return child_old(args.pages, args.every, args.rev, args.churn)
    old = run_child("old", int(args.old_hours * 3600), args.every, args.rev, args.churn) if args.old_hours > 0 else []
    new = run_child("new", int(args.hours * 3600), args.every, args.rev, args.churn)
    fn, fo = new[-1], (old[-1] if old else None)
    text = [
        f"Peak resident memory while replaying the real vLLM page at 1 s, without sleeping; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs ({platform.machine()}). Baseline (interpreter, "
        f"imports, page template) before the first page: old {old[0]['peak_mb']:.0f} MiB, "
        f"new {new[0]['peak_mb']:.0f} MiB."
        if old
        else "",
        "",
        table(new, old),
        "",
        f"new, end of {fn['pages']:,} pages: figures (Window + passive_evidence) in {fn['figures_s']:.2f} s, peak "
        f"{fn['peak_mb']:.0f} MiB; {fn['kept_pages']} pages kept for gauges; metrics.jsonl "
        f"{fn['file_bytes'] / (1 << 20):.0f} MiB ({fn['file_lines']:,} lines, one attempt in {fn['file_stride']}); "
        f"prompt tokens/s {fn['prompt_tokens_per_s']}; window: {fn['describe']}",
    ]
    if fo is not None:
        text.append(
            f"old, end of {fo['pages']:,} pages: figures in {fo['figures_s']:.2f} s, peak {fo['peak_mb']:.0f} MiB; "
            f"metrics.jsonl {fo['file_bytes'] / (1 << 20):.0f} MiB ({fo['file_lines']:,} lines); "
            f"prompt tokens/s {fo['prompt_tokens_per_s']}"
        )
    out = "\n".join(text) + "\n"
    sys.stdout.write(out)
    if args.out:
        args.out.write_text(out)


if __name__ == "__main__":
    main()
