"""The run folder as one loaded, immutable object: lines skipped are counted and shown, and a
file of another schema is refused in one line (exit 2) instead of being skipped line by line."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.compare.request_measurements import request_measurements
from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.runfolder import EVENTS, REQUESTS, RunFolder, RunFolderError
from llm_diagnose.probes.load.records import read_records
from llm_diagnose.probes.runfiles import LineSchemaError
from tests.test_gate_outputs import SCHEMA as JUNIT_SCHEMA
from tests.test_report_samples import rich_evidence, write_run

DAMAGED = b'{"request_id": "half", "t_se\n\xc3\x28 not json\n[1, 2]\n\n'  # cut, not UTF-8, not an object; a blank line
OTHER_SCHEMA = '{"id": "r-new", "sent_at": 1000.0, "ttft_ms": 80}\n'  # JSON, but not a record of this version


def _error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("llm-diagnose: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_folder_is_read_once_into_an_immutable_object(tmp_path):
    run = RunFolder.load(write_run(tmp_path / "run", rich_evidence()))
    assert run.evidence is not None and run.diagnosis is not None and len(run.requests) == 40
    assert len(run.prefill_times()) == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.requests = ()  # type: ignore[misc]


def test_unreadable_lines_are_skipped_and_counted_per_file(tmp_path):
    folder = write_run(tmp_path / "run", rich_evidence())  # each file ends with one line cut by a kill
    with open(folder / REQUESTS, "ab") as fh:
        fh.write(b"\n" + DAMAGED)
    run = RunFolder.load(folder)
    counts = {r.name: (r.kept, r.skipped) for r in run.lines}
    # the cut line and the three damaged ones (the blank lines are not counted)
    assert counts == {REQUESTS: (40, 4), EVENTS: (4, 1)}
    assert run.skipped_notes() == (
        f"4 unreadable line(s) of {REQUESTS} skipped (40 read)",
        f"1 unreadable line(s) of {EVENTS} skipped (4 read)",
    )


def test_a_passive_folder_has_no_requests_and_nothing_skipped(tmp_path):
    run = RunFolder.load(write_run(tmp_path / "run", rich_evidence(), with_requests=False))
    assert run.requests is None and run.events == () and run.lines == () and run.skipped_notes() == ()


def test_report_shows_the_skipped_lines_in_every_format(tmp_path, capsys):
    folder = write_run(tmp_path / "run", rich_evidence())
    with open(folder / REQUESTS, "ab") as fh:
        fh.write(b"\n" + DAMAGED)
    for fmt in ("md", "html", "json"):
        assert main(["report", str(folder), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert f"4 unreadable line(s) of {REQUESTS} skipped (40 read)" in out, fmt
    assert main(["report", str(folder), "--format", "json"]) == 0
    rows = dict(json.loads(capsys.readouterr().out)["provenance"])
    assert rows["skipped lines"].startswith(f"4 unreadable line(s) of {REQUESTS}")


def test_a_report_of_a_clean_folder_says_nothing_about_skipped_lines(tmp_path, capsys):
    folder = write_run(tmp_path / "run", rich_evidence(), with_requests=False)
    assert main(["report", str(folder), "--format", "md"]) == 0
    assert "skipped lines" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, line, said",
    [
        (REQUESTS, OTHER_SCHEMA, "no field 'request_id'"),
        (REQUESTS, '{"request_id": "r", "t_send": 1.0, "fault": "gremlins"}\n', "'gremlins' is not a valid"),
        (REQUESTS, '{"request_id": "r", "t_send": "soon"}\n', "ValueError"),
        (EVENTS, '{"name": "prefill-injected", "t": 1.0}\n', "field 'event'"),
        (EVENTS, '{"event": "prefill-injected", "t": "late"}\n', "field 't'"),
    ],
)
def test_a_file_of_another_schema_is_one_line_exit_2(tmp_path, capsys, name, line, said):
    folder = write_run(tmp_path / "run", rich_evidence())
    with open(folder / name, "a", encoding="utf-8") as fh:
        fh.write("\n" + line)
    with pytest.raises(RunFolderError) as exc:
        RunFolder.load(folder)
    assert exc.value.exit_code == ExitCode.USAGE == 2
    for argv in (["report", str(folder)], ["gate", "--baseline", str(folder), "--current", str(folder)]):
        assert main(argv) == 2
        message = _error_line(capsys.readouterr().err)
        assert str(folder / name) in message and "line " in message and said in message
        assert "another version" in message


def test_evidence_of_another_version_is_one_line_exit_2(tmp_path, capsys):
    folder = write_run(tmp_path / "run", rich_evidence(), with_requests=False)
    doc = json.loads((folder / "evidence.json").read_text())
    (folder / "evidence.json").write_text(json.dumps({**doc, "version": 2}))
    assert main(["report", str(folder)]) == 2
    assert "this tool reads version 1" in _error_line(capsys.readouterr().err)


def test_the_probes_reader_counts_damaged_lines_and_refuses_another_schema(tmp_path):
    # Issue 23: read_records used to drop both silently (`plan` read through it); it is the one
    # requests.jsonl reader now, under RunFolder too.
    folder = write_run(tmp_path / "run", rich_evidence())
    with open(folder / REQUESTS, "ab") as fh:
        fh.write(b"\n" + DAMAGED)
    read = read_records(folder)
    assert len(read) == 40 and (read.lines.kept, read.lines.skipped) == (40, 4)  # as RunFolder counts them
    with open(folder / REQUESTS, "a", encoding="utf-8") as fh:
        fh.write(OTHER_SCHEMA)
    with pytest.raises(LineSchemaError) as refused:
        read_records(folder)
    line_of_it = (folder / REQUESTS).read_bytes().count(b"\n")
    assert refused.value.number == line_of_it and "request_id" in refused.value.why


def test_gate_reports_the_skipped_lines_in_every_output(tmp_path, capsys):
    base = write_run(tmp_path / "base", rich_evidence())
    cur = write_run(tmp_path / "cur", rich_evidence())
    with open(cur / REQUESTS, "ab") as fh:
        fh.write(b"\n" + DAMAGED)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = ["gate", "--baseline", str(base), "--current", str(cur)]
    outputs = ["--junit", str(out_dir / "g.xml"), "--markdown", str(out_dir / "g.md")]
    outputs += ["--json", str(out_dir / "g.json")]
    assert main(argv + outputs) == 0
    text = capsys.readouterr().out
    cur_line = f"current: 4 unreadable line(s) of {REQUESTS} skipped (40 read)"
    base_line = f"baseline: 1 unreadable line(s) of {REQUESTS} skipped (40 read)"  # the sample's cut last line
    assert f"skipped lines: {cur_line}" in text and f"skipped lines: {base_line}" in text
    doc = json.loads((out_dir / "g.json").read_text())
    assert cur_line in doc["skipped_lines"] and base_line in doc["skipped_lines"]
    assert cur_line in (out_dir / "g.md").read_text()
    JUNIT_SCHEMA.validate(str(out_dir / "g.xml"))
    props = {p.get("name"): p.get("value") for p in ET.parse(out_dir / "g.xml").iter("property")}
    assert cur_line in props["skipped_lines"]
    # The samples compared are the 40 records read, not fewer, and say how many.
    cur_run = RunFolder.load(cur)
    samples = request_measurements(cur_run.requests, str(cur / REQUESTS))
    assert len(samples["requests.ttft_p50_s"].samples) == 40


def test_gate_of_clean_passive_runs_has_no_skipped_lines(tmp_path, capsys):
    base = write_run(tmp_path / "base", rich_evidence(), with_requests=False)
    assert main(["gate", "--baseline", str(base), "--current", str(base)]) == 0
    assert "skipped lines" not in capsys.readouterr().out
