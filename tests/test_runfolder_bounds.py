"""The run-folder reader's bounds: every JSON-lines file of a run folder (requests, events, metrics,
inputs) is read through one reader (llm_diagnose.probes.runfiles.read_json_lines), which refuses a
link or a file that is not plain (a FIFO, /dev/zero through a link) in one line, exit 2; caps the
length of a line (skipped and counted, never held whole); and treats a byte that is not UTF-8 the
same wherever it is in a line (key or value): the line is skipped and counted, the rest is read.
`--out` that is a symbolic link (to a folder) is refused too.

No server is started: the folders are built from hand-made evidence and recorded /metrics pages.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.errors import ExitCode, UsageError
from llm_diagnose.diagnose.runfolder import EVENTS, METRICS, REQUESTS, RunFolder, RunFolderError, prepare_out_dir
from llm_diagnose.probes import runfiles
from llm_diagnose.probes.bounded_lines import bounded_lines
from llm_diagnose.probes.load.records import INPUTS_FILE, read_records
from llm_diagnose.probes.load.replay_inputs import ReplayError, read_replay_source
from llm_diagnose.probes.metrics.window import Window
from llm_diagnose.probes.runfiles import UnsafePathError, read_json_lines
from tests.test_report_samples import rich_evidence, write_run
from tests.test_safety_files import PAGE_A, PAGE_B, scrape_file

GOOD = {"request_id": "r-after", "t_send": 1.0, "ttft_s": 0.1, "finish_reason": "length", "tokens_out": 1}


def _error_line(err: str) -> str:
    """The one error line (an interrupted run's folder adds a note line before it)."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("llm-diagnose: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of one command."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def _counts(run: RunFolder) -> dict[str, tuple[int, int, int]]:
    return {r.name: (r.kept, r.skipped, r.too_long) for r in run.lines}


# --- links and special files --------------------------------------------------------------------
def test_requests_linked_to_dev_zero_is_one_line_exit_2_in_gate_verify_and_report(tmp_path, capsys):
    base = write_run(tmp_path / "base", rich_evidence())
    cur = write_run(tmp_path / "cur", rich_evidence())
    (cur / REQUESTS).unlink()
    (cur / REQUESTS).symlink_to("/dev/zero")
    for argv in (
        ["gate", "--baseline", str(base), "--current", str(cur)],
        ["verify", str(base), str(cur)],
        ["report", str(cur)],
    ):
        code, _, err = _cli(capsys, *argv)
        assert code == ExitCode.USAGE == 2, argv
        line = _error_line(err)
        assert str(cur / REQUESTS) in line and "symbolic link" in line, line


@pytest.mark.parametrize("name", ["evidence.json", METRICS])
def test_decide_refuses_the_file_it_reads_linked_to_dev_zero(tmp_path, capsys, name):
    # decide reads evidence.json, or metrics.jsonl where a run was interrupted before writing it
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / name).symlink_to("/dev/zero")
    code, _, err = _cli(capsys, "decide", str(folder))
    assert code == 2 and str(folder / name) in _error_line(err) and "symbolic link" in _error_line(err)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    base = write_run(tmp_path / "base", rich_evidence())
    cur = write_run(tmp_path / "cur", rich_evidence())
    (cur / EVENTS).unlink()
    os.mkfifo(cur / EVENTS)  # opened for reading without O_NONBLOCK, this would block until a writer came
    code, _, err = _cli(capsys, "gate", "--baseline", str(base), "--current", str(cur))
    assert code == 2 and "is a FIFO" in _error_line(err) and str(cur / EVENTS) in _error_line(err)
    with pytest.raises(RunFolderError, match="FIFO"):
        RunFolder.load(cur)


def test_a_device_and_a_dangling_link_are_refused_not_taken_for_absent(tmp_path):
    folder = write_run(tmp_path / "run", rich_evidence())
    (folder / REQUESTS).unlink()
    (folder / REQUESTS).symlink_to(tmp_path / "gone.jsonl")  # dangling: before, the folder read as passive
    with pytest.raises(RunFolderError, match="symbolic link"):
        RunFolder.load(folder)
    with pytest.raises(UnsafePathError, match="character device"):
        next(read_json_lines("/dev/zero"))
    with pytest.raises(UnsafePathError, match="folder"):
        read_json_lines(tmp_path)


def test_the_lenient_readers_refuse_a_link_too(tmp_path):
    folder = write_run(tmp_path / "run", rich_evidence())
    plain = tmp_path / "plain.jsonl"
    (folder / REQUESTS).rename(plain)
    (folder / REQUESTS).symlink_to(plain)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        read_records(folder)
    part = scrape_file(tmp_path / "part", [PAGE_A, PAGE_B])
    (part / METRICS).rename(tmp_path / "m.jsonl")
    (part / METRICS).symlink_to(tmp_path / "m.jsonl")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        Window.from_jsonl(part)


def test_replay_refuses_a_linked_run_file_in_one_line(tmp_path):
    rows = [
        {"request_id": "a", "t_offset_s": 0.0, "path": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 2}}
    ]
    real = tmp_path / "real.jsonl"
    real.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    run.mkdir()
    (run / INPUTS_FILE).symlink_to(real)
    with pytest.raises(ReplayError, match="symbolic link") as exc:
        read_replay_source(run)
    assert "\n" not in str(exc.value) and str(run / INPUTS_FILE) in str(exc.value)
    assert read_replay_source(real).count == 1  # the file itself replays


# --- the line cap ---------------------------------------------------------------------------------
def test_the_cap_keeps_a_line_of_exactly_the_cap_and_skips_one_byte_more(tmp_path):
    path = tmp_path / "lines"
    exact = b"a" * 100 + b"\n"  # 100 bytes and its newline
    path.write_bytes(exact + b"b" * 101 + b"\n" + b"c\n" + b"d" * 101)  # the last: over the cap, no newline
    with open(path, "rb") as f:
        assert list(bounded_lines(f, 100)) == [(1, exact), (2, None), (3, b"c\n"), (4, None)]


def test_an_oversize_line_is_skipped_counted_and_named_and_the_rest_is_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runfiles, "MAX_LINE_BYTES", 4096)
    folder = write_run(tmp_path / "run", rich_evidence())  # its requests.jsonl ends with a line cut by a kill
    long_record = json.dumps({**GOOD, "request_id": "long", "tag": "x" * 10_000}).encode()
    _append(folder / REQUESTS, b"\n" + long_record + b"\n" + json.dumps(GOOD).encode() + b"\n")
    run = RunFolder.load(folder)
    assert _counts(run)[REQUESTS] == (41, 2, 1)  # the 40, and the good record after the long one
    assert "long" not in {r.request_id for r in run.requests} and "r-after" in {r.request_id for r in run.requests}
    note = f"2 unreadable line(s) of {REQUESTS} skipped (41 read; 1 longer than the 4,096 bytes line limit)"
    assert note in run.skipped_notes()
    assert main(["report", str(folder), "--format", "md"]) == 0
    assert note in capsys.readouterr().out


def test_a_40_mb_line_is_read_past_in_pieces_not_held(tmp_path, monkeypatch):
    """tracemalloc's peak while loading a folder with one ~40 MB line stays near the (patched) cap:
    what reading costs does not grow with the line. (Before the cap, the line was held whole and
    decoded: a peak of about twice its size.)"""
    monkeypatch.setattr(runfiles, "MAX_LINE_BYTES", 1 << 20)
    folder = write_run(tmp_path / "run", rich_evidence())
    line_bytes = 40 << 20
    with open(folder / REQUESTS, "a", encoding="utf-8") as fh:
        fh.write('\n{"request_id": "huge", "t_send": 1.0, "tag": "' + "x" * line_bytes + '"}\n')
        fh.write(json.dumps(GOOD) + "\n")
    RunFolder.load(folder)  # imports and caches first: the measurement is of reading only
    tracemalloc.start()
    try:
        run = RunFolder.load(folder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _counts(run)[REQUESTS] == (41, 2, 1)
    assert peak < line_bytes / 8, f"peak {peak / (1 << 20):.1f} MiB while reading a 40 MiB line"


def test_an_oversize_line_of_metrics_and_of_inputs_is_skipped_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(runfiles, "MAX_LINE_BYTES", 4096)
    part = scrape_file(tmp_path / "part", [])  # an interrupted run: scrapes, no evidence.json
    with open(part / METRICS, "a", encoding="utf-8") as fh:
        for i, page in enumerate(["# a page too long to read\n" * 400, "x 1\n", "x 2\n"]):
            fh.write(json.dumps({"t_wall": 1e9 + i, "t_mono": 100.0 + i, "url": "http://h/metrics", "text": page}))
            fh.write("\n")
    window = Window.from_jsonl(part)
    assert len(window.records) == 2 and len(window.notes) == 1 and "MAX_LINE_BYTES" in window.notes[0]
    assert _counts(RunFolder.load(part))[METRICS] == (2, 1, 0)  # shown where the folder's skipped lines are
    rows = [
        {"request_id": "a", "t_offset_s": 0.0, "path": "/v1/completions", "body": {"prompt": "x" * 5000}},
        {"request_id": "b", "t_offset_s": 0.5, "path": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 2}},
    ]
    inputs = tmp_path / INPUTS_FILE
    inputs.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))  # the first line names the format
    source = read_replay_source(inputs)
    assert [r.request_id for r in source.requests] == ["b"]
    assert len(source.skipped) == 1 and source.skipped[0].startswith("line 2: longer than 4096 bytes")


# --- bytes that are not UTF-8 -----------------------------------------------------------------------
def test_a_non_utf8_byte_in_a_key_or_a_value_skips_its_line_and_counts_it(tmp_path, capsys):
    base = write_run(tmp_path / "base", rich_evidence())
    folder = write_run(tmp_path / "run", rich_evidence())
    in_key = b'{"request_\xffid": "r-key", "t_send": 1.0}'  # before: replaced, then refused the folder (no request_id)
    in_value = b'{"request_id": "r-val\xff", "t_send": 1.0}'  # before: read as "r-val\ufffd", silently
    _append(folder / REQUESTS, b"\n" + in_key + b"\n" + in_value + b"\n" + json.dumps(GOOD).encode() + b"\n")
    run = RunFolder.load(folder)
    ids = {r.request_id for r in run.requests}
    assert _counts(run)[REQUESTS] == (41, 3, 0) and "r-after" in ids
    assert not any(i.startswith(("r-key", "r-val")) for i in ids)
    code, out, _ = _cli(capsys, "gate", "--baseline", str(base), "--current", str(folder))
    assert code in (0, 1)
    assert f"skipped lines: current: 3 unreadable line(s) of {REQUESTS} skipped (41 read)" in out
    lines = list(read_json_lines(folder / REQUESTS))
    assert [ln.why for ln in lines if ln.obj is None][-2:] == ["not UTF-8 text", "not UTF-8 text"]


def test_a_non_utf8_byte_in_metrics_and_inputs_is_counted_the_same_way(tmp_path):
    part = scrape_file(tmp_path / "part", [PAGE_A, PAGE_B])
    _append(part / METRICS, b'{"t_wall": 1.0, "t_mono": 1.0, "text": "x\xff 1\\n"}\n')
    window = Window.from_jsonl(part)
    assert len(window.records) == 2 and window.notes == (
        "metrics.jsonl line 3 is not a scrape record (not UTF-8 text); skipped",
    )
    rows = [b'{"request_id": "a", "t_offset_s": 0.0, "path": "/v1/completions", "body": {"prompt": "h\xffi"}}']
    rows.append(b'{"request_id": "b", "t_offset_s": 0.5, "path": "/v1/completions", "body": {"prompt": "hi"}}')
    inputs = tmp_path / INPUTS_FILE
    inputs.write_bytes(b"\n".join(reversed(rows)) + b"\n")
    source = read_replay_source(inputs)
    assert [r.request_id for r in source.requests] == ["b"] and source.skipped == ("line 2: not UTF-8 text",)


# --- --out ----------------------------------------------------------------------------------------
def test_out_that_is_a_symlink_to_a_folder_is_refused_in_one_line(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(UsageError, match="symbolic link"):
        prepare_out_dir(link)
    # port 9 (discard) on loopback: never contacted, --out is checked first
    code, _, err = _cli(capsys, "run", "--url", "http://127.0.0.1:9", "--out", str(link), "--duration", "1")
    assert code == 2 and "--out" in _error_line(err) and "symbolic link" in _error_line(err)
    assert list(real.iterdir()) == []  # nothing was written through it
    assert prepare_out_dir(real) == real  # the folder itself is fine
