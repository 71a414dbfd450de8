"""The timing core's CPU timer beside torch.utils.benchmark.Timer and timeit, in one run.

    python benchmarks/bench_timer.py [--budget 0.5] [--rounds 3] [--out FILE]

Two questions, same workloads for all three timers, interleaved round by round so machine
noise hits them alike:

1. overhead: what each reports for a no-op callable (the per-call cost of the Python loop and
   call that any timer of a callable pays; lower is not "more accurate", it is the floor);
2. error: each timer's median against a busy-wait of known length (20 us, 200 us, 2 ms). A
   busy-wait cannot end early, and preemption only lengthens it, so the error is the timer's
   own bias plus the machine's noise, reported as the median and the worst of the rounds.

Each timer gets the same wall budget: `CpuTimer.measure(budget_s=B)`,
`torch...Timer.blocked_autorange(min_run_time=B)`, `timeit.Timer.repeat` with autorange's
number and as many repeats as fit in B. torch is optional (its column is skipped without it).
A last table gives the PyTorch probe's own bookkeeping per forward (its two hooks, with a
dynamic and a static KV cache of 512 tokens) beside a tiny model's CPU decode step, so the
cost of instrumenting a server is a measured figure too (needs torch and transformers).

Writes markdown to stdout and to --out. GPU comparisons: benchmarks/gpu_check.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from llm_diagnose.probes.results import Measurement  # noqa: E402
from llm_diagnose.probes.timing import CpuTimer  # noqa: E402
from tests.busy_wait import busy_wait  # noqa: E402

WORKLOADS_S = (20e-6, 200e-6, 2e-3)


spin = busy_wait  # the known workload (tests/busy_wait.py)


def noop() -> None:
    return None


def with_llmd(fn: Callable[[], None], budget: float) -> tuple[float, float, int]:
    m = CpuTimer(why="benchmark").measure(fn, budget_s=budget)
    return m.value, m.summary.ci_high - m.summary.ci_low if m.summary else 0.0, m.n


def with_torch(fn: Callable[[], None], budget: float) -> tuple[float, float, int]:
    from torch.utils.benchmark import Timer

    m = Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=budget)
    return m.median, m.iqr, len(m.times)


def with_timeit(fn: Callable[[], None], budget: float) -> tuple[float, float, int]:
    t = timeit.Timer(fn)
    number, total = t.autorange()  # number of calls per repeat that last >= 0.2 s
    repeats = max(3, int(budget / max(total, 1e-9)))
    per_call = sorted(x / number for x in t.repeat(repeat=repeats, number=number))
    return statistics.median(per_call), per_call[-1] - per_call[0], repeats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=0.5, help="wall seconds per measurement (default 0.5)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per cell (default 3)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)

    timers: dict[str, Callable[[Callable[[], None], float], tuple[float, float, int]]] = {
        "llm-diagnose CpuTimer": with_llmd,
        "timeit (autorange + repeat)": with_timeit,
    }
    try:
        import torch  # noqa: F401

        timers = {
            "llm-diagnose CpuTimer": with_llmd,
            "torch.utils.benchmark.Timer": with_torch,
            "timeit (autorange + repeat)": with_timeit,
        }
    except ImportError:
        print("torch not installed: its column is skipped", file=sys.stderr)

    cells: dict[tuple[str, str], list[tuple[float, float, int, float]]] = {}
    workloads = [("no-op (overhead)", None, noop)] + [(f"spin {s * 1e6:g} us", s, spin(s)) for s in WORKLOADS_S]
    for _ in range(args.rounds):
        for label, _true, fn in workloads:
            for name, run in timers.items():
                t0 = time.perf_counter()
                median, spread, n = run(fn, args.budget)
                cells.setdefault((label, name), []).append((median, spread, n, time.perf_counter() - t0))

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"CPU timers, {platform.machine()}, {os.cpu_count()} CPUs, load average {load}, Python "
        f"{platform.python_version()}, budget {args.budget} s per measurement, {args.rounds} rounds "
        "(median of rounds; worst round in brackets)",
        "",
        "| workload | timer | reported per call | error vs known | samples | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for label, true, _fn in workloads:
        for name in timers:
            runs = cells[(label, name)]
            medians = [r[0] for r in runs]
            med = statistics.median(medians)
            if true is None:
                err = "-"
            else:
                errors = [(m - true) / true for m in medians]
                worst = max(errors, key=abs)
                err = f"{statistics.median(errors):+.2%} ({worst:+.2%})"
            samples = statistics.median(r[2] for r in runs)
            wall = statistics.median(r[3] for r in runs)
            lines.append(f"| {label} | {name} | {_fmt(med)} | {err} | {samples:.0f} | {wall:.2f} |")
    lines += probe_overhead(args.budget)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


def probe_overhead(budget: float) -> list[str]:
    """The probe's hooks per forward, timed with the CPU timer, beside a tiny model's decode step."""
    try:
        import torch
        from transformers import DynamicCache, StaticCache

        from llm_diagnose.probes.microbench.steps import StepBench, build_causal_lm
        from llm_diagnose.probes.torch_probe import TorchProbe
    except ImportError as exc:
        return ["", f"probe overhead: skipped ({exc})"]
    model = build_causal_lm("tiny")
    probe = TorchProbe(process_metrics=False)
    timer = CpuTimer(why="benchmark")
    rows = [
        "",
        "PyTorch probe bookkeeping per forward (pre + post hook), CPU:",
        "",
        "| what | median | 95% CI |",
        "|---|---|---|",
    ]
    ids = torch.ones(1, 512, dtype=torch.long)
    for name, cache in (
        ("dynamic KV cache, 512 tokens", DynamicCache(config=model.config)),
        ("static KV cache, 512 of 1024 slots", StaticCache(config=model.config, max_cache_len=1024)),
    ):
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        kwargs = {"input_ids": ids[:, :1], "past_key_values": cache}

        def hooks(kwargs: dict = kwargs) -> None:
            probe._pre_forward(model, (), kwargs)
            probe._post_forward(model, (), kwargs, None)

        rows.append(f"| probe hooks, {name} | {_median_ci(timer.measure(hooks, budget_s=budget))} |")
    step = StepBench(model, timer=timer, budget_s=budget).decode(1, 512)
    rows.append(f"| tiny model decode step, batch 1, context 512 (for scale) | {_median_ci(step)} |")
    return rows


def _median_ci(m: Measurement) -> str:
    ci = f"{_fmt(m.summary.ci_low)}-{_fmt(m.summary.ci_high)}" if m.summary is not None else "-"
    return f"{_fmt(m.value)} | {ci}"


def _fmt(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.1f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.3f} ms"


if __name__ == "__main__":
    sys.exit(main())
