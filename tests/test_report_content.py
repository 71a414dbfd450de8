"""Reports without a browser: Markdown through a standard renderer, escaping, prompt redaction,
the JSON report, the figures' key scheme, and the `report` command."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.report import content as report_content
from llm_diagnose.diagnose.report import figures, html, markdown, svg
from llm_diagnose.diagnose.runfolder import RunFolder
from llm_diagnose.diagnose.text.values import format_value
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes.results import Measurement, NotMeasured, Summary
from tests.test_report_samples import FAKE_PROMPT, PROV, XSS, hostile_evidence, rich_evidence, write_run


class _Tables(HTMLParser):
    """Tables of rendered HTML as lists of rows of cell texts (header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def rendered_markdown(text: str) -> _Tables:
    # CommonMark with GFM tables, raw HTML allowed (as GitHub allows some): escaping must hold anyway.
    page = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    parser = _Tables()
    parser.feed(page)
    parser.page = page  # type: ignore[attr-defined]
    return parser


# --- Markdown -----------------------------------------------------------------------------------
def test_markdown_report_renders_as_tables_whose_cells_hold_the_strings_exactly():
    evidence = hostile_evidence()
    d = diagnose(evidence)
    md = rendered_markdown(markdown.render(d, evidence))
    assert len(md.tables) >= 4  # recommendations, pitfalls, path, not measured, provenance
    for table in md.tables:
        widths = {len(row) for row in table}
        assert len(widths) == 1, f"a pipe in the data split a row: {table}"
    # The recommendations table by its header: a sanity table (the hostile evidence's uncatalogued key) may precede it.
    recs = next(t for t in md.tables if t[0][:2] == ["#", "technique"])
    assert [row[1] for row in recs[1:]] == [
        r.technique for r in d.recommendations if r.status in ("recommended", "not-working")
    ]
    assert any("--enable-prefix-caching" in row[5] for row in recs[1:]), "the setting to change is shown"
    provenance = {row[0]: row[1] for row in md.tables[-1][1:]}
    assert provenance["model"] == f"evil|model{XSS}", "markup and pipes survive as text"
    assert provenance["target"] == f"http://127.0.0.1:8000/{XSS}"
    assert "script" not in md.tags, "no tag reaches the rendered page"
    assert FAKE_PROMPT not in md.page and "helpful bot" not in md.page


def test_markdown_cell_and_code_escaping():
    row = "| " + " | ".join([markdown.cell("a|b `c` *d* <i>e</i> [f](g) &amp;"), markdown.code("x|y `z`")]) + " |"
    md = rendered_markdown("| one | two |\n|---|---|\n" + row + "\n")
    assert md.tables == [[["one", "two"], ["a|b `c` *d* <i>e</i> [f](g) &amp;", "x|y `z`"]]]
    assert "i" not in md.tags and "em" not in md.tags and "a" not in md.tags
    assert markdown.cell("") == " " and markdown.text("line\nbreak") == "line break"


# --- HTML source and JSON -----------------------------------------------------------------------
def test_html_source_holds_no_tag_from_the_evidence_and_forbids_scripts():
    evidence = hostile_evidence()
    page = html.render(diagnose(evidence), evidence)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert f'content="{html.CSP}"'.replace("'", "&#x27;") in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "").replace("http://127.0.0.1:8000", ""), (
        "no external resource is referenced"
    )
    assert FAKE_PROMPT not in page and "helpful bot" not in page


def test_prompt_quoted_by_the_diagnosis_is_withheld_in_every_format():
    evidence = hostile_evidence()
    d = diagnose(evidence)
    quoted = [p for p in d.pitfalls if FAKE_PROMPT in p.explanation]
    assert quoted, "the dynamic-prefix pitfall quotes the probe's note, prompt included"
    for text in (html.render(d, evidence), markdown.render(d, evidence), report_content.render(d, evidence)):
        assert "helpful bot" not in text
        assert "prompt text withheld: sha256" in text
    assert "helpful bot" in report_content.render(d, evidence, include_prompts=True)


def test_json_report_carries_the_diagnosis_and_the_provenance():
    evidence = rich_evidence()
    d = diagnose(evidence)
    doc = json.loads(report_content.render(d, evidence))
    assert doc["schema"] == "llm-diagnose/report"
    assert Diagnosis.from_dict(doc["diagnosis"]) == d
    assert [r["technique"] for r in doc["recommendations"]] == ["prefix-caching", "chunked-prefill", "kv-offload"]
    labels = dict(doc["provenance"])
    assert labels["engine"] == "vllm 0.32.0" and labels["model"] == "tiny-llama"
    assert labels["GPU"].startswith("GPU0 NVIDIA H100") and labels["tool version"] == "0.1.0"
    assert labels["window"].startswith("60.0 s of scrapes")
    q2 = next(q for q in doc["questions"] if q["question"] == "Q2")
    assert q2["comparisons"][0]["threshold"] == "q2.min_reuse_fraction"
    assert q2["evidence"][0] == {
        "key": "prefix.potential_fraction",
        "value": "62.0%",
        "how": "hand-built from test",
        "note": "",
        "warnings": [],
    }


@pytest.mark.parametrize(
    "value,unit,shown",
    [
        (80 * (1 << 30), "bytes", "80.00 GiB"),
        (3 * (1 << 20), "bytes", "3.00 MiB"),
        (0.0123, "s", "12.3 ms"),
        (2.5, "s", "2.5 s"),
        (4e-5, "s", "40 µs"),
        (0.625, "fraction", "62.5%"),
        (4096, "tokens", "4,096 tokens"),
        (12, "count", "12"),
        (900.4, "1/s", "900/s"),
        (1.234, "ratio", "1.23"),
    ],
)
def test_values_are_shown_in_their_units(value, unit, shown):
    assert format_value(value, unit) == shown


# --- figures ------------------------------------------------------------------------------------
def _ev(items: dict) -> Evidence:
    return Evidence(Target(url="test://figures"), items, created_at="x", tool="t", host="h")


def test_each_figure_reads_its_documented_keys(tmp_path):
    run_dir = write_run(tmp_path / "run", rich_evidence())
    figs = {f.id: f for f in figures.figures(rich_evidence(), RunFolder.load(run_dir))}
    assert all(f.drawn for f in figs.values())
    assert "40 completed requests" in figs["output-lengths"].caption
    assert "4 prefill events" in figs["itl-over-time"].caption
    assert "1 unreadable line(s)" in figs["itl-over-time"].caption
    assert "5 capacities" in figs["prefix-reuse"].caption and "7 batch sizes" in figs["decode-vs-batch"].caption
    assert "weights: 16.00 GiB (20%)" in figs["memory"].svg and "free: 8.00 GiB (10%)" in figs["memory"].svg
    # Without the run folder the output lengths come from the Measurement's samples.
    assert "300 samples of outputs.length_p50" in figures.figures(rich_evidence())[0].caption


def test_figures_fall_back_or_say_why_not():
    summary = Summary.from_samples([10, 20, 30, 40, 400])
    ev = _ev(
        {
            "outputs.length_p50": Measurement(30.0, "tokens", PROV, summary=summary),
            "memory.device_total_bytes": NotMeasured("no NVIDIA driver on this machine", "run on the GPU host"),
            "kv.capacity_tokens": Measurement(4096.0, "tokens", PROV),
            "prefix.lru_fraction_at_capacity": Measurement(0.3, "fraction", PROV),
        }
    )
    figs = {f.id: f for f in figures.figures(ev)}
    assert figs["output-lengths"].drawn and "summary only" in figs["output-lengths"].caption
    assert figs["memory"].missing == "memory.device_total_bytes: no NVIDIA driver on this machine (run on the GPU host)"
    assert figs["prefix-reuse"].drawn and "0 capacities" in figs["prefix-reuse"].caption
    assert "decode.step_latency_b{N}_s" in figs["decode-vs-batch"].missing
    assert "no run folder" in figs["itl-over-time"].missing


def test_memory_beyond_the_device_is_drawn_to_scale_and_said():
    gib = float(1 << 30)
    ev = _ev(
        {
            "memory.device_total_bytes": Measurement(24 * gib, "bytes", PROV),
            "memory.weights_bytes": Measurement(30 * gib, "bytes", PROV),
        }
    )
    fig = figures.memory_breakdown(ev)
    assert fig.drawn and "more than the device holds" in fig.caption and "free: 0.00 GiB" in fig.svg


def test_nice_ticks_are_round_and_cover_the_range():
    assert svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(0, 97) == [0, 20, 40, 60, 80]
    assert svg.nice_ticks(3, 3) == [3]


# --- the command --------------------------------------------------------------------------------
def test_report_command_writes_each_format(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", rich_evidence())
    assert main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(run_dir / "diagnosis.json"), "--out", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("## llm-diagnose: ")
    capsys.readouterr()
    assert main(["report", str(run_dir / "evidence.json"), "--format", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["schema"] == "llm-diagnose/report" and out.err == ""


def test_report_command_diagnoses_evidence_alone_and_says_so(tmp_path, capsys):
    (tmp_path / "evidence.json").write_text(rich_evidence().to_json())
    assert main(["report", str(tmp_path), "--format", "md"]) == 0
    out = capsys.readouterr()
    assert "Bottleneck:" in out.out and "no diagnosis.json beside" in out.err


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "nope", "does not exist"),
        (lambda p: (p / "x.json").write_text('{"schema": "other"}') and p / "x.json", "field 'schema' is 'other'"),
        (lambda p: (p / "y.json").write_text("{") and p / "y.json", "not JSON"),
        (lambda p: p, "neither evidence.json nor diagnosis.json"),
    ],
)
def test_report_command_rejects_bad_input_with_exit_2(tmp_path, capsys, make, message):
    assert main(["report", str(make(tmp_path))]) == 2
    assert message in capsys.readouterr().err


def test_report_command_refuses_an_out_folder_that_does_not_exist(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", rich_evidence(), with_requests=False)
    assert main(["report", str(run_dir), "--out", str(tmp_path / "no" / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
