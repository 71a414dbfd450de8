"""`settled_scrape` waits for the engine's counters to stop moving, not the serving process's own."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from llm_diagnose.probes.experiments.common import SETTLE_TRIES, settled_scrape
from llm_diagnose.probes.metrics.window import record_from_text

PAGE = (Path(__file__).parent / "fixtures" / "metrics" / "vllm-0.32.0-cpu-real.txt").read_text()


def _reader(pages: list[str]):
    calls = []

    async def read():
        text = pages[min(len(calls), len(pages) - 1)]
        calls.append(time.monotonic())
        return record_from_text(time.time(), time.monotonic(), text, None, 0.001, "test")

    return read, calls


def _busy(page: str, i: int) -> str:
    """The same page with the serving process's own counters moved, as other clients' scrapes move them."""
    return page.replace("process_cpu_seconds_total 11.45", f"process_cpu_seconds_total {11.45 + i * 0.02:.2f}")


def test_the_process_own_counters_moving_do_not_keep_a_page_from_settling():
    # CI: four diagnosers scraped one vLLM; its CPU seconds moved between every two reads, so each
    # settled scrape ran to its limit and an experiment's time went by before its first request.
    assert "process_cpu_seconds_total 11.45" in PAGE
    read, calls = _reader([_busy(PAGE, i) for i in range(SETTLE_TRIES + 2)])
    record = asyncio.run(settled_scrape(read))
    assert record is not None and record.ok
    assert len(calls) == 2  # the engine's counters were equal at once


def test_engine_counters_moving_are_waited_for():
    moved = PAGE.replace("vllm:num_preemptions_total{", "vllm:num_preemptions_total_x{")
    assert moved != PAGE
    read, calls = _reader([PAGE, moved, moved])
    record = asyncio.run(settled_scrape(read))
    assert record is not None and len(calls) == 3  # changed once, then equal twice
