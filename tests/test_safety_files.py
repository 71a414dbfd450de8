"""Hostile or unlucky files: links in the run folder, traces that used to crash the readers,
undecodable per-request files, impossible evidence, unusable --out paths, interrupted runs.

No server is started: run folders are built from recorded /metrics pages of a real vLLM 0.32
(tests/fixtures/metrics) and hand-built evidence, which is all these paths read.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.collect import RunPlan, finish_run, window_restarts
from llm_diagnose.diagnose.runfolder import evidence_from_scrapes
from llm_diagnose.diagnose.tree.evidence import INVALID_PREFIX, Evidence, EvidenceError
from llm_diagnose.probes.load.records import JsonlWriter
from llm_diagnose.probes.metrics.window import Window
from llm_diagnose.probes.results import Measurement, NotMeasured
from llm_diagnose.probes.runfiles import UnsafePathError, open_append, write_atomic
from llm_diagnose.probes.traces import TraceError, analyze_trace, readers
from llm_diagnose.probes.traces.records import LineLog
from tests.test_report_samples import rich_evidence, write_run

FIXTURES = Path(__file__).parent / "fixtures"
PAGE_A = (FIXTURES / "metrics" / "vllm-0.32.0-cpu-kv-pressure-real-a.txt").read_text()
PAGE_B = (FIXTURES / "metrics" / "vllm-0.32.0-cpu-kv-pressure-real-b.txt").read_text()  # later: counters higher
MOONCAKE_LINE = json.dumps({"timestamp": 5, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]})


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("usage:")]
    assert len(lines) == 1 and lines[0].startswith("llm-diagnose: error:"), err
    assert "Traceback" not in err
    return lines[0]


def scrape_file(run_dir: Path, pages: list[str], interval_s: float = 1.0) -> Path:
    """metrics.jsonl as the scraper writes it, one recorded page per scrape."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for i, page in enumerate(pages):
            fh.write(
                json.dumps(
                    {
                        "t_wall": 1_780_000_000.0 + i * interval_s,
                        "t_mono": 100.0 + i * interval_s,
                        "elapsed_s": 0.01,
                        "url": "http://127.0.0.1:8000/metrics",
                        "text": page,
                    }
                )
                + "\n"
            )
    return run_dir


# --- 4: the run folder does not follow links ---------------------------------------------------
def test_appending_refuses_a_symlink_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_append(run / "metrics.jsonl")
    (run / "requests.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        JsonlWriter(run / "requests.jsonl")
    assert victim.read_text() == "precious\n"


def test_appending_refuses_a_hard_link_and_a_fifo(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.link(victim, tmp_path / "metrics.jsonl")
    with pytest.raises(UnsafePathError, match="hard link"):
        open_append(tmp_path / "metrics.jsonl")
    os.mkfifo(tmp_path / "events.jsonl")
    with pytest.raises(UnsafePathError, match="not a plain file"):
        open_append(tmp_path / "events.jsonl")
    assert victim.read_text() == "precious\n"


def test_appending_to_an_own_file_keeps_what_is_there(tmp_path):
    with open_append(tmp_path / "m.jsonl") as fh:
        fh.write("one\n")
    with open_append(tmp_path / "m.jsonl") as fh:
        fh.write("two\n")
    assert (tmp_path / "m.jsonl").read_text() == "one\ntwo\n"


def test_atomic_write_ignores_a_link_at_the_old_temporary_name_and_refuses_one_at_the_target(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "evidence.json.tmp").symlink_to(victim)  # where the temporary file used to be
    write_atomic(tmp_path / "evidence.json", "{}\n")
    assert (tmp_path / "evidence.json").read_text() == "{}\n" and not (tmp_path / "evidence.json").is_symlink()
    assert victim.read_text() == "precious\n"
    (tmp_path / "summary.txt").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_atomic(tmp_path / "summary.txt", "x")
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "evidence.json",
        "evidence.json.tmp",
        "summary.txt",
        "victim.txt",
    ]  # no temporary file left behind


def test_run_refuses_a_link_in_its_folder_before_touching_the_target(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    # port 9 (discard) on loopback: never contacted, the folder is checked first
    code, _, err = run_cli(capsys, "run", "--url", "http://127.0.0.1:9", "--out", str(run), "--duration", "1")
    assert code == 2 and "symbolic link" in one_error_line(err)
    assert victim.read_text() == "precious\n"


# --- 9: --out problems -------------------------------------------------------------------------
def test_run_out_that_is_a_file_is_one_line_exit_2(tmp_path, capsys):
    existing = tmp_path / "a-file"
    existing.write_text("x")
    code, _, err = run_cli(capsys, "run", "--url", "http://127.0.0.1:9", "--out", str(existing), "--duration", "1")
    assert code == 2 and "is an existing file" in one_error_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_run_out_unwritable_is_one_line_exit_2(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, _, err = run_cli(
        capsys, "run", "--url", "http://127.0.0.1:9", "--out", str(locked / "run"), "--duration", "1"
    )
    assert code == 2 and "cannot create the folder" in one_error_line(err)


def test_out_in_a_folder_that_is_a_file_is_one_line_exit_2(tmp_path, capsys):
    # (what an unwritable path looks like to root, too: the folder cannot exist)
    (tmp_path / "plain").write_text("x")
    code, _, err = run_cli(
        capsys, "run", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "plain" / "run"), "--duration", "1"
    )
    assert code == 2 and "cannot create the folder" in one_error_line(err)
    run = write_run(tmp_path / "r", rich_evidence(), with_requests=False)
    code, _, err = run_cli(capsys, "report", str(run), "--out", str(tmp_path / "plain" / "r.html"))
    assert code == 2 and "does not exist" in one_error_line(err)
    code, _, err = run_cli(capsys, "report", str(run), "--out", str(tmp_path))
    assert code == 2 and "is a folder" in one_error_line(err)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--url", "http://127.0.0.1:9", "--out", ""],
        ["report", "RUN", "--out", ""],
        ["gate", "--baseline", "RUN", "--current", "RUN", "--junit", ""],
    ],
)
def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch, argv):
    run = write_run(tmp_path / "r", rich_evidence(), with_requests=False)
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(SystemExit) as exc:
        main([str(run) if a == "RUN" else a for a in argv])
    assert exc.value.code == 2
    assert "an empty path" in capsys.readouterr().err
    assert list(here.iterdir()) == []


def test_report_out_refuses_a_link_and_overwrites_its_own_file(tmp_path, capsys):
    run = write_run(tmp_path / "r", rich_evidence(), with_requests=False)
    victim = tmp_path / "victim.html"
    victim.write_text("precious")
    (tmp_path / "report.html").symlink_to(victim)
    code, _, err = run_cli(capsys, "report", str(run), "--out", str(tmp_path / "report.html"))
    assert code == 2 and "symbolic link" in one_error_line(err)
    assert victim.read_text() == "precious"
    code, _, _ = run_cli(capsys, "report", str(run), "--out", str(tmp_path / "mine.md"))
    code, _, _ = run_cli(capsys, "report", str(run), "--out", str(tmp_path / "mine.md"))
    assert code == 0 and (tmp_path / "mine.md").read_text().startswith("#")


# --- 5: traces that crashed ----------------------------------------------------------------------
def _read(path: Path, fmt: str | None = None) -> tuple[list, LineLog]:
    log = LineLog(str(path), strict=False)
    return list(readers.read_trace(str(path), fmt or readers.detect_format(str(path)), log)), log


def test_a_deeply_nested_line_is_skipped_and_counted(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    for fmt, good, bad in [
        ("mooncake", MOONCAKE_LINE, '{"hash_ids": ' + deep + "}"),
        (
            "openai",
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
            '{"model": "m", "messages": [{"role": "user", "content": ' + deep + "}]}",
        ),
        ("prompts", '{"prompt": "hello"}', '{"prompt": ' + deep + "}"),
    ]:
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text(f"{bad}\n{good}\n{bad}\n{good}\n")
        records, log = _read(path)
        assert len(records) == 2 and log.skipped == 2, fmt
        assert "nested too deeply" in log.first_errors[0][1] and log.first_errors[0][0] == 1
        # and the analysis (Mooncake through the column reader) says the same
        analysis = analyze_trace(path, fmt="auto")
        assert analysis.read.requests == 2 and analysis.read.skipped == 2, fmt


def test_a_truncated_gz_gives_what_was_read_and_counts_the_rest(tmp_path):
    whole = gzip.compress(("\n".join([MOONCAKE_LINE] * 20_000) + "\n").encode())
    path = tmp_path / "trace.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    records, log = _read(path)
    assert 1000 < len(records) < 20_000
    assert log.skipped >= 1 and any("truncated .gz" in why for _, why in log.first_errors)
    analysis = analyze_trace(path, fmt="auto")
    assert analysis.read.requests == len(records) and analysis.read.skipped == log.skipped
    strict = LineLog(str(path), strict=True)
    with pytest.raises(TraceError, match="truncated"):
        list(readers.read_trace(str(path), "mooncake", strict))


def test_a_corrupt_or_mislabelled_gz_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "plain.jsonl.gz"
    path.write_text(MOONCAKE_LINE + "\n")
    code, _, err = run_cli(capsys, "trace", str(path))
    assert code == 2 and "corrupt" in one_error_line(err)


def test_multi_member_gz_reads_every_member(tmp_path):
    path = tmp_path / "two.jsonl.gz"
    path.write_bytes(
        gzip.compress((MOONCAKE_LINE + "\n").encode() * 3) + gzip.compress((MOONCAKE_LINE + "\n").encode() * 4)
    )
    records, log = _read(path)
    assert len(records) == 7 and log.skipped == 0


@pytest.mark.parametrize(
    "name, body, fmt",
    [
        ("bom.jsonl", MOONCAKE_LINE + "\n" + MOONCAKE_LINE + "\n", "mooncake"),
        ("bom-prompts.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n', "prompts"),
        (
            "bom.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.1,10,4\n",
            "azure",
        ),
    ],
)
def test_a_byte_order_mark_is_read_past(tmp_path, name, body, fmt):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert readers.detect_format(str(path)) == fmt
    records, log = _read(path)
    assert len(records) == 2 and log.skipped == 0


def test_an_overlong_line_is_skipped_without_holding_it(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 4096)
    long_ids = json.dumps({"timestamp": 1, "hash_ids": list(range(5000))})
    for fmt, good, long_line in [
        ("mooncake", MOONCAKE_LINE, long_ids),
        ("prompts", '{"prompt": "a"}', json.dumps({"prompt": "x" * 50_000})),
        ("azure", "2023-11-16 18:15:46.68,374,44", "2023-11-16 18:15:46.68,3" + "4" * 9000 + ",44"),
    ]:
        path = tmp_path / f"{fmt}.txt"
        head = "TIMESTAMP,ContextTokens,GeneratedTokens\n" if fmt == "azure" else ""
        path.write_text(head + f"{good}\n{long_line}\n{good}\n{long_line}")  # the last without a newline
        records, log = _read(path, fmt)
        assert len(records) == 2 and log.skipped == 2, fmt
        assert "MAX_LINE_BYTES" in log.first_errors[0][1]
        assert [n for n, _ in log.first_errors] == ([3, 5] if fmt == "azure" else [2, 4])
        if fmt == "mooncake":  # the column reader, with chunks smaller than the line and larger
            for chunk in (1000, 1 << 20):
                log = LineLog(str(path), strict=False)
                batches = list(readers.read_hash_id_batches(str(path), log, chunk_bytes=chunk))
                assert sum(b.requests for b in batches) == 2 and log.skipped == 2, chunk


def test_a_100_mb_line_costs_no_more_than_a_few_chunks_of_memory(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "w") as fh:
        fh.write(MOONCAKE_LINE + "\n")
        fh.write('{"timestamp": 1, "hash_ids": [' + "12345678, " * (10 << 20) + "1]}\n")  # 100 MiB
        fh.write(MOONCAKE_LINE + "\n")
    script = textwrap.dedent(f"""
        import resource, sys
        from llm_diagnose.probes.traces import analyze_trace
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        a = analyze_trace({str(path)!r}, fmt="auto")
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(a.read.requests, a.read.skipped, round(grown))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    requests, skipped, grown_mib = map(int, proc.stdout.split())
    assert (requests, skipped) == (2, 1)
    assert grown_mib < 120, f"reading grew the process by {grown_mib} MiB"  # was 2.1 GB; the cap is 16 MiB


# --- 6: gate and report on undecodable requests.jsonl; a gate with nothing measured -------------
def test_gate_and_report_read_past_a_non_utf8_byte(tmp_path, capsys):
    base = write_run(tmp_path / "base", rich_evidence())
    cur = write_run(tmp_path / "cur", rich_evidence())
    with open(cur / "requests.jsonl", "ab") as fh:
        fh.write(b'{"request_id": "x\xff\xfe", "t_send": 1.0}\n\xc3\x28 not json\n')
        fh.write(b'{"request_id": "deep", "t_send": 1.0, "gaps_s": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n")
    (cur / "events.jsonl").write_bytes(b'{"event": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n\xff\n")
    code, out, err = run_cli(capsys, "gate", "--baseline", str(base), "--current", str(cur))
    assert code in (0, 1) and "Traceback" not in err and out.startswith("llm-diagnose gate:")
    code, out, err = run_cli(capsys, "report", str(cur), "--format", "html")
    assert code == 0 and "<html" in out.lower() and "Traceback" not in err


def test_gate_with_nothing_measured_is_inconclusive(tmp_path, capsys):
    empty = Evidence.from_dict({"schema": "llm-diagnose/evidence", "version": 1, "items": {}})
    base = write_run(tmp_path / "base", empty, with_requests=False)
    cur = write_run(tmp_path / "cur", empty, with_requests=False)
    code, out, _ = run_cli(capsys, "gate", "--baseline", str(base), "--current", str(cur))
    assert code == 0 and out.startswith("llm-diagnose gate: INCONCLUSIVE") and "every rule passed" not in out
    assert "neither run measured" in out
    code, _, _ = run_cli(capsys, "gate", "--baseline", str(base), "--current", str(cur), "--fail-on-inconclusive")
    assert code == 5


# --- 10: impossible evidence ------------------------------------------------------------------
PROV = {"method": "m", "source": "s", "taken_at": "t"}


def _evidence_text(**items) -> str:
    return json.dumps({"schema": "llm-diagnose/evidence", "version": 1, "items": items})


@pytest.mark.parametrize(
    "item, said",
    [
        ({"kind": "measurement", "value": "0.99", "unit": "fraction", "provenance": PROV}, "a string ('0.99')"),
        ({"kind": "measurement", "value": True, "unit": "fraction", "provenance": PROV}, "a boolean (true)"),
        ({"kind": "measurement", "value": "NaN", "unit": "fraction", "provenance": PROV}, "a string ('NaN')"),
        (
            {"kind": "measurement", "value": 0.5, "unit": "fraction", "provenance": PROV, "samples": [1, "2"]},
            "'samples'",
        ),
        ({"kind": "measurement", "value": 0.5, "unit": 3, "provenance": PROV}, "'unit'"),
        ({"kind": "measurement", "value": 0.5, "unit": "s", "provenance": {**PROV, "window_s": False}}, "window_s"),
        ({"kind": "measurement", "value": 0.5, "unit": "s", "provenance": PROV, "summary": {"n": 1}}, "summary"),
        ({"kind": "fact", "value": [[1]], "provenance": PROV}, "a list"),
        ({"kind": "measurement", "value": [[[[0.9]]]], "unit": "fraction", "provenance": PROV}, "a list"),
    ],
)
def test_a_value_of_the_wrong_type_becomes_a_hole_that_says_so(item, said):
    ev = Evidence.from_json(
        _evidence_text(**{"kv.usage_p95": item, "engine.name": {"kind": "fact", "value": "vllm", "provenance": PROV}})
    )
    hole = ev.items["kv.usage_p95"]
    assert isinstance(hole, NotMeasured) and hole.reason.startswith(INVALID_PREFIX) and said in hole.reason
    assert ev.fact("engine.name") == "vllm"  # the rest is read


def test_numbers_beyond_a_float_are_holes_not_overflow():
    text = (
        '{"schema": "llm-diagnose/evidence", "version": 1, "items": {'
        '"kv.usage_p95": {"kind": "measurement", "value": 1' + "0" * 400 + ', "unit": "fraction", '
        '"provenance": {"method": "m", "source": "s", "taken_at": "t"}}, '
        '"engine.max_model_len": {"kind": "fact", "value": 9' + "9" * 399 + ", "
        '"provenance": {"method": "m", "source": "s", "taken_at": "t"}}}}'
    )
    ev = Evidence.from_json(text)
    for key in ("kv.usage_p95", "engine.max_model_len"):
        assert ev.items[key].reason.startswith(INVALID_PREFIX) and "beyond the range" in ev.items[key].reason


def test_negative_fractions_load_as_they_are_for_the_judgement_to_flag():
    # The loader checks types and structure; ranges are the diagnosis' sanity findings.
    ev = Evidence.from_json(
        _evidence_text(
            **{"kv.usage_p95": {"kind": "measurement", "value": -0.5, "unit": "fraction", "provenance": PROV}}
        )
    )
    assert isinstance(ev.items["kv.usage_p95"], Measurement) and ev.items["kv.usage_p95"].value == -0.5


@pytest.mark.parametrize(
    "text, said",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (
            '{"schema": "llm-diagnose/evidence", "version": 1, "items": {"x": ' + "[" * 5000 + "]" * 5000 + "}}",
            "nested too deeply",
        ),
        ('{"schema": "llm-diagnose/evidence", "version": 1, "items": {"x": 1' + "0" * 5000 + "}}", "not readable"),
        ('{"schema": "llm-diagnose/evidence", "version": true, "items": {}}', "field 'version'"),
        ('{"schema": "llm-diagnose/evidence", "version": 1, "items": {"x": {"kind": "fact"}}}', "missing the field"),
    ],
)
def test_unreadable_structure_is_refused_with_one_line(tmp_path, capsys, text, said):
    with pytest.raises(EvidenceError, match=said):
        Evidence.from_json(text)
    path = tmp_path / "evidence.json"
    path.write_text(text)
    code, out, err = run_cli(capsys, "decide", str(path))
    assert code == 2 and out == "" and said in one_error_line(err)


def test_decide_diagnoses_around_an_invalid_value(tmp_path, capsys):
    path = tmp_path / "evidence.json"
    path.write_text(
        _evidence_text(
            **{
                "kv.usage_p95": {"kind": "measurement", "value": "0.99", "unit": "fraction", "provenance": PROV},
                "engine.name": {"kind": "fact", "value": "vllm", "provenance": PROV},
            }
        )
    )
    code, out, err = run_cli(capsys, "decide", str(path), "--json")
    assert code == 0 and "Traceback" not in err
    assert json.loads(out)["schema"] == "llm-diagnose/diagnosis"


# --- 11: a restart in the window; an interrupted run ------------------------------------------------
def test_a_restart_in_the_window_is_found_and_written_in_the_summary(tmp_path):
    steady = Window.from_jsonl(scrape_file(tmp_path / "steady", [PAGE_A, PAGE_B, PAGE_B]))
    assert window_restarts(steady) == ()
    restarted = Window.from_jsonl(scrape_file(tmp_path / "restarted", [PAGE_A, PAGE_B, PAGE_A, PAGE_B]))
    assert window_restarts(restarted) == (restarted.records[2].t_wall,)  # counters back down at page 3
    run = tmp_path / "restarted"
    result = finish_run(
        RunPlan(url="http://127.0.0.1:8000", out_dir=run),
        dict(evidence_from_scrapes(run).items),
        restarts=window_restarts(restarted),
    )
    summary = (run / "summary.txt").read_text()
    assert summary.startswith("SERVER RESTARTED in the window (1 time(s)") and result.restarts
    finish_run(RunPlan(url="http://127.0.0.1:8000", out_dir=tmp_path / "steady"), {})
    assert "RESTARTED" not in (tmp_path / "steady" / "summary.txt").read_text()


def test_an_interrupted_run_folder_can_be_decided_reported_and_gated(tmp_path, capsys):
    # What Ctrl-C leaves: metrics.jsonl only (plus a line cut mid-write).
    part = scrape_file(tmp_path / "part", [PAGE_A, PAGE_B])
    with open(part / "metrics.jsonl", "a") as fh:
        fh.write('{"t_wall": 1780000002.0, "t_mono": 102.0, "text": "# TYPE vllm')
    code, out, err = run_cli(capsys, "decide", str(part))
    assert code == 0 and "Bottleneck" in out and "diagnosing the scrapes" in err and "Traceback" not in err
    code, out, _ = run_cli(capsys, "decide", str(part), "--json")
    items = {a["question"]: a for a in json.loads(out)["answers"]}
    assert items  # a diagnosis of the scrapes
    code, out, err = run_cli(capsys, "report", str(part), "--format", "md")
    assert code == 0 and out.startswith("#") and "interrupted run" in err
    other = scrape_file(tmp_path / "other", [PAGE_A, PAGE_B])
    code, out, err = run_cli(capsys, "gate", "--baseline", str(other), "--current", str(part))
    assert code in (0, 1) and out.startswith("llm-diagnose gate:") and "Traceback" not in err
    ev = evidence_from_scrapes(part)
    assert ev.fact("live.window_complete") is False


def test_a_folder_with_nothing_readable_is_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_bytes(b"\xff\xfe garbage\n")
    code, _, err = run_cli(capsys, "decide", str(empty))
    assert code == 2 and "no readable scrape" in one_error_line(err.split("\n", 1)[1])


def test_ctrl_c_during_run_offers_decide_on_the_folder(tmp_path, capsys, monkeypatch):
    # Ctrl-C stands in for the scrape loop being interrupted: run_target raises it as asyncio.run does.
    from llm_diagnose.diagnose.commands import run as run_command

    def interrupted(plan, **_):
        scrape_file(plan.out_dir, [PAGE_A, PAGE_B])
        raise KeyboardInterrupt

    monkeypatch.setattr(run_command, "run_target", interrupted)
    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "run", "--url", "http://127.0.0.1:9", "--out", str(out), "--duration", "5", "--quiet"
    )
    assert code == 130 and f"llm-diagnose decide {out}" in err
    code, stdout, _ = run_cli(capsys, "decide", str(out))
    assert code == 0 and "Bottleneck" in stdout
