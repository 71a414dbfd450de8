"""A window of any length fits in a fixed memory, and says what it thinned (issue 22, items 4 and 12).

Windows are built from pages rendered with known values (tests/test_metrics_parse.vllm_page and
the real vLLM capture), with the bounds of window_tally.py lowered so that a few dozen pages cross
them: each test computes its expected figure by hand, or from the same pages with the bounds as
they are (nothing thinned). The raw file's bound (scrape_file.py) is tested on the file itself.
Item 12 uses a fake /metrics server that stops answering after a few pages: a real engine cannot
be made to hang on demand.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import pytest
from aiohttp import web

from llm_diagnose.diagnose.collect import RunPlan, run_target
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.http import make_session
from llm_diagnose.probes.metrics import ENGINE_METRICS, Window, passive_evidence, scrape_window, window_tally
from llm_diagnose.probes.metrics import scrape_file as scrape_file_module
from llm_diagnose.probes.metrics.engines import Sel
from llm_diagnose.probes.metrics.passive.context import reset_warning
from llm_diagnose.probes.metrics.scrape_file import ScrapeFile
from llm_diagnose.probes.metrics.window import DEFAULT_MIN_COVERAGE, ScrapeRecord, record_from_text
from tests.test_metrics_parse import vllm_page

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
VLLM_PAGE = (FIXTURES / "vllm-0.32.0-cpu-real.txt").read_text()
PROMPT = ENGINE_METRICS["vllm"]["prompt_tokens"][0]
ITL = ENGINE_METRICS["vllm"]["itl"][0]
KV = ENGINE_METRICS["vllm"]["kv_usage"][0]


def record(i: int, text: str) -> ScrapeRecord:
    return record_from_text(1.7e9 + i, 100.0 + i, text, None, 0.001, "test")


def window(texts: list[str]) -> Window:
    return Window("test", tuple(record(i, t) for i, t in enumerate(texts)))


def with_kv(text: str, usage: float) -> str:
    return re.sub(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) \S+", lambda m: f"{m.group(1)} {usage}", text, flags=re.M)


def pages_with_a_restart(n: int) -> list[str]:
    """n pages: prompt tokens +7 a page, ITL buckets growing; the server restarts at page n // 2."""
    out = []
    for i in range(n):
        restarted = i >= n // 2
        prompt = 7 * (i - n // 2) + 3 if restarted else 1000 + 7 * i
        base = i - n // 2 if restarted else 50 + i
        itl = (base, 2 * base, 3 * base, 3 * base)
        out.append(vllm_page(prompt=prompt, itl=itl, itl_sum=0.01 * base, created=1.8e9 if restarted else 1.7e9))
    return out


# --- item 4: counters and histograms, as the pages arrive --------------------------------------------
def test_merged_intervals_keep_every_total(monkeypatch):
    pages = pages_with_a_restart(37)
    full = window(pages)  # 36 intervals: under the default bound, nothing merged
    monkeypatch.setattr(window_tally, "MAX_INTERVALS", 4)
    merged = window(pages)
    a, b = full.counter(PROMPT), merged.counter(PROMPT)
    # By hand: +7 over 17 intervals before the restart, 3 after it (from zero), +7 over 18 after that.
    assert a.total == 7 * 17 + 3 + 7 * 18 and a.resets == 1 and len(a.intervals) == 36
    assert b.total == a.total and b.resets == a.resets
    assert 2 <= len(b.intervals) <= 4
    assert b.intervals[0].t_start == 100.0 and b.intervals[-1].t_end == 136.0
    assert all(x.t_end == y.t_start for x, y in zip(b.intervals, b.intervals[1:]))  # contiguous
    assert math.fsum(i.increase for i in b.intervals) == b.total
    ha, hb = full.histogram(ITL), merged.histogram(ITL)
    assert (hb.count, hb.buckets, hb.resets) == (ha.count, ha.buckets, ha.resets)
    assert hb.sum == pytest.approx(ha.sum, rel=1e-12)
    assert sum(c for _, _, c, _ in hb.intervals) == ha.count
    assert "rates per 16 scrape intervals" in merged.describe()


def test_a_long_window_keeps_a_bounded_number_of_intervals(monkeypatch):
    monkeypatch.setattr(window_tally, "MAX_INTERVALS", 8)
    w = window([vllm_page(prompt=10 * i) for i in range(200)])
    inc = w.counter(PROMPT)
    assert inc.total == 10 * 199 and len(inc.intervals) <= 8
    assert inc.rate == pytest.approx(10.0)  # tokens per second over the 199 s


# --- item 4: gauges from an even sample of whole pages ---------------------------------------------
def test_gauges_are_read_from_an_even_sample_of_pages(monkeypatch):
    monkeypatch.setattr(window_tally, "MAX_KEPT_PAGES", 8)
    usages = [round(0.01 * i, 2) for i in range(40)]
    w = window([with_kv(vllm_page(prompt=i), u) for i, u in enumerate(usages)])
    kept = w.ok_records
    assert w.n_ok == 40 and w.n_scrapes == 40 and len(kept) <= 9
    times = [r.t_mono - 100.0 for r in kept]
    assert times[0] == 0 and times[-1] == 39  # the first and the latest always
    strides = {b - a for a, b in zip(times[:-1], times[1:-1])}
    assert len(strides) == 1 and next(iter(strides)) in (8, 16)  # evenly spaced between
    assert list(w.gauge(KV, "max").values) == [usages[int(t)] for t in times]
    assert w.latest(KV, "max") == usages[-1]
    assert f"gauges read from {len(kept)} of the 40 good pages" in w.describe()
    assert w.counter(PROMPT).total == 39  # counters still see every page


def test_pages_with_many_series_are_thinned_sooner(monkeypatch):
    page = record(0, VLLM_PAGE).scrape
    assert page is not None
    n_samples = sum(len(v) for v in page.samples.values())
    monkeypatch.setattr(window_tally, "MAX_KEPT_READINGS", 5 * n_samples)
    w = window([VLLM_PAGE] * 30)
    assert len(w.ok_records) <= 6 and w.n_ok == 30
    assert "MAX_KEPT_PAGES" in w.describe()


# --- item 4: series churn ------------------------------------------------------------------------------
def test_series_churn_is_capped_counted_and_said(monkeypatch):
    stable = window([vllm_page(prompt=0)]).tally
    assert stable is not None and stable._tracked < 60
    monkeypatch.setattr(window_tally, "MAX_TRACKED_SERIES", 60)
    pages = [
        vllm_page(prompt=5 * i) + "".join(f'churn_total{{request="{i}-{j}"}} 1\n' for j in range(10)) for i in range(20)
    ]
    w = window(pages)
    assert w.tally is not None and w.tally._tracked == 60
    assert w.counter(PROMPT).total == 5 * 19 and w.counter(PROMPT).untracked == 0  # tracked from the first page
    churn = w.counter(Sel("churn_total"))
    tracked_churn = len(w.tally._counters["churn_total"])
    assert churn.untracked == 20 * 10 - tracked_churn > 0  # one reading per series: every other one left out
    assert "MAX_TRACKED_SERIES" in reset_warning(churn)
    assert "MAX_TRACKED_SERIES" in w.describe() and "churn_total" in w.describe()


# --- item 4: failures, bad samples, restarts -------------------------------------------------------------
def test_failures_bad_samples_and_restarts_are_counted_past_what_is_kept(monkeypatch):
    monkeypatch.setattr(window_tally, "MAX_KEPT_FAILURES", 4)
    monkeypatch.setattr(window_tally, "MAX_KEPT_BAD_SAMPLES", 3)
    monkeypatch.setattr(window_tally, "MAX_KEPT_RESTARTS", 2)
    records = []
    for i in range(30):
        # Every page: one infinite gauge (a bad sample); every other page the counter goes down (a restart).
        text = vllm_page(prompt=100 if i % 2 == 0 else 50) + "odd_gauge +Inf\n"
        records.append(record(2 * i, text))
        records.append(ScrapeRecord(1.7e9 + 2 * i + 1, 101.0 + 2 * i, None, f"refused {i}"))
    w = Window("test", tuple(records))
    assert w.n_scrapes == 60 and w.n_ok == 30
    assert [r.error for r in w.failed_records] == ["refused 0", "refused 1", "refused 28", "refused 29"]
    assert w.records[-1].error == "refused 29"  # the latest attempt is kept, in order
    assert w.bad_sample_count == 30 and len(w.bad_samples()) == 3
    assert w.describe_bad_samples().startswith("30 bad samples on 30 of 30 pages")
    assert w.tally is not None and w.tally.restart_count == 15 and len(w.restarts) == 2
    assert w.restarts == (1.7e9 + 2, 1.7e9 + 6)


# --- item 4: the raw file --------------------------------------------------------------------------------
def _line(seq: int, text: str = "x" * 80) -> str:
    return json.dumps({"t_wall": 1.7e9 + seq, "t_mono": 100.0 + seq, "seq": seq, "text": text})


def _seqs(path: Path) -> list[int]:
    return [json.loads(x)["seq"] for x in path.read_text().splitlines()]


def test_the_raw_file_keeps_its_first_line_and_an_even_sample_within_its_bound(tmp_path):
    path = tmp_path / "metrics.jsonl"
    cap = 20 * (len(_line(0)) + 1)  # room for 20 lines
    f = ScrapeFile(path, max_bytes=cap)
    for seq in range(203):
        f.write(_line(seq))
        assert path.stat().st_size <= cap  # never past the bound, between any two scrapes
    f.close()
    seqs = _seqs(path)
    assert f.stride >= 8 and seqs[0] == 0 and seqs[-1] == 202  # the first, and the last once closed
    body = seqs[:-1]
    assert body == [s for s in range(203) if s % f.stride == 0]  # one in `stride`, in order
    assert len(seqs) <= 21


def test_an_earlier_runs_lines_are_kept_as_they_were(tmp_path):
    path = tmp_path / "metrics.jsonl"
    earlier = b'{"t_wall": 1.0, "t_mono": 1.0, "text": "caf\xc3\xa9"}\n'
    path.write_bytes(earlier)
    f = ScrapeFile(path, max_bytes=10 * (len(_line(0)) + 1))
    for seq in range(50):
        f.write(_line(seq))
    f.close()
    data = path.read_bytes()
    assert data.startswith(earlier) and f.stride > 1
    assert _seqs_after(data[len(earlier) :])[0] == 0


def _seqs_after(data: bytes) -> list[int]:
    return [json.loads(x)["seq"] for x in data.decode().splitlines()]


def test_a_failed_rewrite_keeps_the_file_and_says_so(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    f = ScrapeFile(path, max_bytes=5 * (len(_line(0)) + 1))

    def disk_full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(scrape_file_module, "write_atomic", disk_full)
    for seq in range(12):
        f.write(_line(seq))
    f.close()
    assert _seqs(path) == [0, 1, 2, 3, 4]  # as it was when the rewrite failed; nothing after
    assert f.problem is not None and "No space left" in f.problem and "not written" in f.problem


def test_a_thinned_raw_file_gives_the_same_counters(tmp_path):
    pages = [vllm_page(prompt=3 * i, itl=(i, 2 * i, 3 * i, 3 * i), itl_sum=0.01 * i) for i in range(60)]
    path = tmp_path / "metrics.jsonl"
    line = json.dumps({"t_wall": 1.7e9, "t_mono": 100.0, "url": "test", "text": pages[-1]})
    f = ScrapeFile(path, max_bytes=12 * (len(line) + 1))
    for i, text in enumerate(pages):
        f.write(json.dumps({"t_wall": 1.7e9 + i, "t_mono": 100.0 + i, "url": "test", "text": text}))
    f.close()
    read = Window.from_jsonl(tmp_path)
    full = window(pages)
    assert f.stride > 1 and read.n_ok < 60
    assert read.counter(PROMPT).total == full.counter(PROMPT).total == 3 * 59
    assert read.histogram(ITL).buckets == full.histogram(ITL).buckets
    assert read.duration_s == full.duration_s == 59.0


# --- item 12: coverage ---------------------------------------------------------------------------------------
def test_coverage_below_the_share_makes_the_window_incomplete():
    pages = tuple(record(i, vllm_page(prompt=10 * i)) for i in range(3))
    short = Window("test", pages, 8.0, planned_scrapes=9, answered_scrapes=3)
    assert short.coverage == pytest.approx(1 / 3) and short.stopped_early is None
    assert short.incomplete is not None and "only 3 of 9 planned scrapes" in short.incomplete
    assert Window("test", pages, 8.0, planned_scrapes=10, answered_scrapes=8).incomplete is None  # 0.8 is enough
    assert Window("test", pages, planned_scrapes=10, answered_scrapes=8, min_coverage=0.9).incomplete is not None
    assert Thresholds()["evidence.min_window_coverage"] == DEFAULT_MIN_COVERAGE
    ev = passive_evidence(short)
    assert ev["live.window_complete"].value is False and "only 3 of 9" in ev["live.window_complete"].note
    assert any("partial window: only 3 of 9" in x for x in ev["throughput.prompt_tokens_per_s"].warnings)


MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-llama", "owned_by": "vllm", "max_model_len": 2048}]})


PRESSURE = [(FIXTURES / f"vllm-0.32.0-cpu-kv-pressure-real-{x}.txt").read_text() for x in "ab"]


class HangingMetrics:
    """127.0.0.1: /v1/models, and a /metrics that answers with `pages` (real vLLM captures) and then
    never again.

    Fake because a real engine cannot be made to hang its /metrics on demand; it is what item 12
    saw (a /metrics that stopped answering near the end of the window)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = list(pages)
        self.served = 0
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.served >= len(self.pages):
            await self._release.wait()  # hangs until the test ends (the client times out first)
        self.served += 1
        return web.Response(text=self.pages[min(self.served, len(self.pages)) - 1], content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        return web.Response(text=MODELS, content_type="application/json")

    async def __aenter__(self) -> HangingMetrics:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        assert self._runner is not None
        await self._runner.cleanup()


def test_a_metrics_endpoint_that_hangs_near_the_end_leaves_an_incomplete_window():
    async def main() -> Window:
        async with HangingMetrics(PRESSURE + PRESSURE[1:]) as fake, make_session(timeout_s=1.5) as session:
            # 9 planned scrapes, 0.25 s apart; the 4th hangs past the window's end (1.5 s timeout).
            return await scrape_window(fake.url + "/metrics", 2.0, interval_s=0.25, session=session)

    w = asyncio.run(main())
    assert w.n_ok == 3 and w.planned_scrapes == 9
    assert w.stopped_early is None  # one failure: the rule of three failures in a row never fired
    assert w.coverage is not None and w.coverage < DEFAULT_MIN_COVERAGE
    assert w.incomplete is not None and "planned scrapes" in w.incomplete
    assert passive_evidence(w)["live.window_complete"].value is False
    # The tree trusts what such a window measured less. The same pages 20 s apart (a window long
    # enough that its length alone does not cap the confidence), with and without the shortfall:
    pages = tuple(ScrapeRecord(1.7e9 + 20 * i, 100.0 + 20 * i, r.scrape) for i, r in enumerate(w.ok_records))
    plan = {"planned_scrapes": w.planned_scrapes, "answered_scrapes": w.answered_scrapes}
    short = diagnose(Evidence(Target(url="t"), passive_evidence(Window(w.source, pages, 40.0, **plan))))
    full = diagnose(Evidence(Target(url="t"), passive_evidence(Window(w.source, pages, 40.0))))
    confidence = {a.question: a.confidence for a in full.answers}
    lowered = {a.question: a.confidence for a in short.answers}
    assert all(lowered[q] <= confidence[q] for q in confidence)
    assert any(lowered[q] < confidence[q] for q in confidence)


def test_run_says_partial_when_most_scrapes_went_unanswered(tmp_path):
    async def serve() -> None:
        # 1 page for discovery, 3 for the window, then /metrics hangs (the run's 5 s timeout ends it).
        async with HangingMetrics(PRESSURE[:1] + PRESSURE + PRESSURE[1:]) as fake:
            plan = RunPlan(url=fake.url, out_dir=tmp_path / "run", duration_s=2.0, interval_s=0.25)
            result = await asyncio.to_thread(run_target, plan)
            assert "planned scrapes" in result.partial
            assert result.evidence.fact("live.window_complete") is False
            summary = (tmp_path / "run" / "summary.txt").read_text()
            assert summary.startswith("PARTIAL RUN: only ")

    asyncio.run(serve())
