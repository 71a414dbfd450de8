"""`llm-diagnose report BEFORE AFTER`: one HTML page, verify's judgement and the two diagnoses side by side."""

from __future__ import annotations

import dataclasses
import re
from html import escape
from html.parser import HTMLParser

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.report.html import CSP
from tests import test_report_samples as samples
from tests.test_verify import write_run


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.ids += [v for k, v in attrs if k == "id" and v]


def test_two_runs_give_one_page_with_the_verdict_and_both_diagnoses(tmp_path, capsys):
    before = write_run(tmp_path / "before", prefix_caching=False, hit_rate=0.0, ttft_s=0.20, seed=1)
    after = write_run(tmp_path / "after", prefix_caching=True, hit_rate=0.45, ttft_s=0.12, seed=2)
    out = tmp_path / "pair.html"
    assert main(["report", str(before), str(after), "--out", str(out)]) == 0
    page = out.read_text()
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags and escape(CSP) in page  # self-contained, like the one-run page
    assert {"verify", "side-by-side", "figures-side-by-side", "provenance"} <= set(parsed.ids)
    # verify's own result heads the page: the change, the claims with intervals, the verdict
    assert re.search(r"Did the change deliver\? <span class=\"badge delivered\">delivered</span>", page)
    assert "config.prefix_caching" in page and "latency.ttft_p50_s" in page
    assert page.count('<span class="badge delivered">delivered</span>') >= 3  # the page's verdict and both claims
    # both diagnoses, column by column: prefix caching recommended before, in place after
    verdict_row = page.split("Every technique</h3>")[1].split("</section>")[0]
    left, right = verdict_row.split('<div class="changed">')[1:3]
    assert "prefix-caching" in left and 'badge recommended">recommended' in left
    assert 'badge in-place">in-place' in right
    # each figure of the one-run report appears once per side
    figs_before = [i for i in parsed.ids if i.startswith("before-fig-")]
    figs_after = [i for i in parsed.ids if i.startswith("after-fig-")]
    assert figs_before and [i[len("before-") :] for i in figs_before] == [i[len("after-") :] for i in figs_after]
    assert "wrote" in capsys.readouterr().err


def test_two_runs_in_markdown_or_three_runs_are_one_line_errors(tmp_path, capsys):
    before = write_run(tmp_path / "before", prefix_caching=False, hit_rate=0.0, ttft_s=0.20, seed=1)
    after = write_run(tmp_path / "after", prefix_caching=True, hit_rate=0.45, ttft_s=0.12, seed=2)
    capsys.readouterr()
    assert main(["report", str(before), str(after), "--format", "md"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "llm-diagnose verify BEFORE AFTER" in err
    assert main(["report", str(before), str(after), str(after)]) == ExitCode.USAGE
    assert "got 3 runs" in capsys.readouterr().err


def test_the_pair_page_shows_markup_as_text_and_withholds_prompts(tmp_path):
    # AFTER detects the dynamic-prefix pitfall, whose explanation quotes the probe's note with a
    # prompt in it: verify lists it as a harmful side effect, and the page must withhold it there
    # too, not only in the diagnosis columns.
    hostile = samples.hostile_evidence()
    quiet = {k: v for k, v in hostile.items.items() if k != "prompts.dynamic_prefix_fraction"}
    before = samples.write_run(tmp_path / "before", dataclasses.replace(hostile, items=quiet))
    after = samples.write_run(tmp_path / "after", hostile)
    out = tmp_path / "pair.html"
    assert main(["report", str(before), str(after), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<script" not in page.lower() and escape(samples.XSS) in page
    assert "helpful bot" not in page and "prompt text withheld: sha256" in page
    verify_part = page.split('<section id="verify">')[1].split("</section>")[0]
    assert "pitfall:dynamic-prefix" in verify_part and "prompt text withheld: sha256" in verify_part
    assert main(["report", str(before), str(after), "--out", str(out), "--include-prompts"]) == 0
    assert "helpful bot" in out.read_text()
