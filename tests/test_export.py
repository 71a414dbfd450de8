"""Run folders as tables: `runfolder.requests_frame` / `scrapes_frame` and `llm-diagnose export`.

On a REAL run folder: tests/fixtures/runs/vllm-0.32.0-cpu-decode was recorded by tests/test_q5_live.py
(`llm-diagnose run --active --experiments decode` on vLLM 0.32.0, CPU, the tiny Llama), whole except
metrics.jsonl, cut to three of its 45 pages (the first, the 22nd and the last) to keep the repository small.
Every expectation is read independently from the files (json, the exposition parser), not from the frames.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.runfolder import RunFolder, requests_frame, scrapes_frame
from llm_diagnose.diagnose.runfolder.frames import REQUEST_COLUMNS, SCRAPE_COLUMNS
from llm_diagnose.probes.metrics.exposition import parse_exposition
from tests.test_cli_fuzz import assert_answered, run_cli

RUN = Path(__file__).parent / "fixtures" / "runs" / "vllm-0.32.0-cpu-decode"
ROOT = Path(__file__).resolve().parents[1]


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (RUN / name).read_text().splitlines() if line.strip()]


def _same(value: object, on_disk: object) -> bool:
    """A frame's cell against the file's value: a missing value is NaN/None in the frame, null on disk."""
    return bool(pd.isna(value)) if on_disk is None else value == on_disk


def test_the_requests_frame_is_one_row_per_recorded_request_as_the_file_says():
    on_disk = _lines("requests.jsonl")
    frame = requests_frame(RUN)
    assert list(frame.columns) == list(REQUEST_COLUMNS)
    assert list(frame.request_id) == [d["request_id"] for d in on_disk] and len(frame) == 44
    for (_, row), d in zip(frame.iterrows(), on_disk):
        for column in ("ttft_s", "tokens_out", "status", "fault", "finish_reason", "t_end_s"):
            assert _same(row[column], d[column]), (d["request_id"], column)
        assert list(row.gaps_s) == d["gaps_s"]
        assert _same(row.http_response_headers_s, d["http"].get("response_headers_s"))
        assert row.completed == (d["fault"] is None and d["finish_reason"] is not None)
    assert frame.attrs["skipped_lines"] == 0
    # the real run's batch-1 decode: its requests stream 64 tokens each
    decode = frame[frame.phase == "batch-1"]
    assert len(decode) > 0 and set(decode.tokens_out) == {64}


def test_the_scrapes_frame_holds_every_sample_of_every_page():
    pages = _lines("metrics.jsonl")
    frame = scrapes_frame(RunFolder.open(RUN))
    assert list(frame.columns) == list(SCRAPE_COLUMNS)
    assert sorted(set(frame.line)) == [1, 2, 3] and frame.error.isna().all()
    for number, page in enumerate(pages, start=1):
        scrape = parse_exposition(page["text"])
        rows = frame[(frame.line == number) & (frame.name == "vllm:prompt_tokens_total")]
        assert rows.value.sum() == scrape.value("vllm:prompt_tokens_total")
        assert (frame[frame.line == number].t_wall == page["t_wall"]).all()
    last = frame[(frame.line == 3) & (frame.name == "vllm:prompt_tokens_total")].value.sum()
    first = frame[(frame.line == 1) & (frame.name == "vllm:prompt_tokens_total")].value.sum()
    assert last > first  # the run sent prompts between its first and last page


def test_export_writes_csv_that_reads_back_as_the_frames(tmp_path):
    code, _, err = run_cli(["export", str(RUN), "--out", str(tmp_path / "t")])
    assert code == ExitCode.OK, err
    requests = pd.read_csv(tmp_path / "t" / "requests.csv")
    assert list(requests.request_id) == [d["request_id"] for d in _lines("requests.jsonl")]
    assert [json.loads(g) for g in requests.gaps_s] == [d["gaps_s"] for d in _lines("requests.jsonl")]
    scrapes = pd.read_csv(tmp_path / "t" / "scrapes.csv")
    assert len(scrapes) == len(scrapes_frame(RUN)) and set(scrapes.line) == {1, 2, 3}
    assert "wrote" in err and "44 rows from requests.jsonl" in err


def test_export_writes_parquet_that_reads_back_as_the_frames(tmp_path):
    code, _, err = run_cli(["export", str(RUN), "--format", "parquet", "--out", str(tmp_path)])
    assert code == ExitCode.OK, err
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert [list(g) for g in requests.gaps_s] == [d["gaps_s"] for d in _lines("requests.jsonl")]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "scrapes.parquet"), scrapes_frame(RUN), check_dtype=False)


def test_export_writes_into_the_run_folder_by_default(tmp_path):
    run = shutil.copytree(RUN, tmp_path / "run")
    code, _, err = run_cli(["export", str(run / "evidence.json")])  # a file of the folder names it too
    assert code == ExitCode.OK, err
    assert (run / "requests.csv").is_file() and (run / "scrapes.csv").is_file()


def test_damaged_lines_are_skipped_counted_and_said(tmp_path):
    run = shutil.copytree(RUN, tmp_path / "run")
    with (run / "requests.jsonl").open("a") as f:
        f.write('{"experiment": "decode", "request_id": "cut-by-a-ki')  # a run killed mid-write
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"t_wall": 1, "t_mono"\n')
    assert requests_frame(run).attrs["skipped_lines"] == 1 and len(requests_frame(run)) == 44
    assert scrapes_frame(run).attrs["skipped_lines"] == 1
    code, _, err = run_cli(["export", str(run), "--out", str(tmp_path / "t")])
    assert code == ExitCode.OK, err
    assert "1 unreadable line(s) of requests.jsonl skipped" in err
    assert "1 unreadable line(s) of metrics.jsonl skipped" in err


def test_a_line_of_another_schema_refuses_the_folder(tmp_path):
    run = shutil.copytree(RUN, tmp_path / "run")
    with (run / "requests.jsonl").open("a") as f:
        f.write('{"request_id": "x", "t_send": "not a time"}\n')
    code, _, err = run_cli(["export", str(run), "--out", str(tmp_path / "t")])
    assert_answered(code, err, {ExitCode.USAGE})
    assert "line 45 is not a request record" in err and not (tmp_path / "t").exists()


def test_a_folder_with_nothing_to_export_is_one_line_exit_2(tmp_path):
    shutil.copy(RUN / "evidence.json", tmp_path / "evidence.json")
    code, _, err = run_cli(["export", str(tmp_path)])
    assert_answered(code, err, {ExitCode.USAGE})
    assert "nothing to export" in err
    code, _, err = run_cli(["export", str(tmp_path / "missing")])
    assert_answered(code, err, {ExitCode.USAGE})


def test_an_out_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    code, _, err = run_cli(["export", str(RUN), "--out", str(tmp_path / "link")])
    assert_answered(code, err, {ExitCode.USAGE})
    assert not list((tmp_path / "elsewhere").iterdir())


_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed: importing it raises ImportError
import llm_diagnose.diagnose.runfolder  # the package imports without pandas
from llm_diagnose.diagnose.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("missing", "fmt", "named"), [("pandas,pyarrow", "csv", "pandas"), ("pyarrow", "parquet", "pyarrow")]
)
def test_without_the_analysis_extra_export_says_what_to_install(tmp_path, missing, fmt, named):
    argv = ["export", str(RUN), "--format", fmt, "--out", str(tmp_path / "t")]
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT, missing, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert_answered(proc.returncode, proc.stderr, {ExitCode.USAGE})
    assert f"{named} is not installed" in proc.stderr and "llm-diagnose[analysis]" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_csv_needs_no_pyarrow(tmp_path):
    argv = ["export", str(RUN), "--out", str(tmp_path / "t")]
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT, "pyarrow", *argv], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert (tmp_path / "t" / "requests.csv").is_file()


def test_other_commands_do_not_import_pandas():
    code = "import sys; from llm_diagnose.diagnose import runfolder, collect; print('pandas' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
