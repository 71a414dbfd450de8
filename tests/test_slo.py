"""Service-level objectives as input to the tree: parsing, judging from evidence, the answers
they change (Q5, Q6, OB), the saved diagnosis, the reports and the commands that take them.

Most tests are pure (hand-built evidence); one runs `run --active --slo` against the shared
real vLLM server, so an objective is judged from real measured gaps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.report import console, html, markdown
from llm_diagnose.diagnose.report import content as report_content
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.questions.catalogue import ASK
from llm_diagnose.diagnose.tree.slo import SLO, Objective, SLOError
from llm_diagnose.diagnose.tree.thresholds import Thresholds, ThresholdsError
from tests.evidence_builders import build, sampled

ROOT = Path(__file__).resolve().parents[1]
TH = Thresholds()
# Decode at 30 ms per token in the median, 90 ms at p99; prefills inflate ITL 2x; TTFT p99 3 s.
EVIDENCE = {
    "decode.itl_p50_s": 0.030,
    "decode.itl_p99_s": 0.090,
    "latency.ttft_p99_s": 3.0,
    "interference.itl_inflation": 2.0,
    "config.spec_decode": False,
    "config.chunked_prefill": False,
    "engine.name": "vllm",
}


def slo(*flags: str, interactive: bool | None = None) -> SLO:
    return SLO.from_flags(flags, interactive)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- reading objectives ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, metric, pct, limit",
    [
        ("itl:p50:50ms", "itl", 50.0, 0.05),
        ("TTFT:P99:2s", "ttft", 99.0, 2.0),
        ("e2e:p99.9:1500ms", "e2e", 99.9, 1.5),
        ("itl:p90:250us", "itl", 90.0, 250e-6),
    ],
)
def test_flags_parse_to_objectives(text, metric, pct, limit):
    o = Objective.parse(text)
    assert (o.metric, o.percentile) == (metric, pct) and o.limit_s == pytest.approx(limit)


@pytest.mark.parametrize(
    "text, says",
    [
        ("itl:p5O:1s", "METRIC:pNN:LIMIT"),  # a letter O for a zero
        ("itl:p50:1", "METRIC:pNN:LIMIT"),  # no unit
        ("tpot:p50:1s", "use one of ttft, itl, e2e"),
        ("itl:p100:1s", "between p0 and p100"),
        ("itl:p50:0s", "positive number of seconds"),
    ],
)
def test_bad_flags_say_how_to_write_one(text, says):
    with pytest.raises(SLOError, match=says.replace("(", r"\(")):
        Objective.parse(text)


def test_percentile_keys_round_trip_without_rounding():
    o = Objective("itl", 99.99999, 0.1)
    assert o.key == "itl_p99_99999_s"
    assert SLO.from_mapping({o.key: 0.1}).objectives == (o,)


def test_flags_replace_the_same_objective_of_the_file_and_the_offline_flag_contradicts_objectives():
    file = SLO.from_mapping({"itl_p50_s": 0.05, "ttft_p99_s": 2.0}, "slo.toml")
    merged = file.merged(slo("itl:p50:20ms"))
    assert {o.key: o.limit_s for o in merged.objectives} == {"itl_p50_s": 0.02, "ttft_p99_s": 2.0}
    with pytest.raises(SLOError, match="cannot be offline"):
        slo("itl:p50:20ms", interactive=False)


# --- judging an objective from evidence -------------------------------------------------------
def test_an_objective_is_judged_from_its_key_else_samples_else_a_bound_else_not_at_all():
    exact = Objective("itl", 99, 0.1).check_evidence(build(EVIDENCE))
    assert (exact.met, exact.observed_s, exact.evidence, exact.bound) == (True, 0.090, "decode.itl_p99_s", "")
    gaps = [0.01] * 80 + [0.2] * 20  # p90 lies among the slow fifth
    from_samples = Objective("itl", 90, 0.1).check_evidence(build({"decode.itl_p50_s": sampled(gaps)}))
    assert from_samples.met is False and from_samples.n == 100 and "samples" in from_samples.how
    too_few = Objective("itl", 99, 0.1).check_evidence(build({"decode.itl_p50_s": sampled(gaps[:50])}))
    assert too_few.met is None, "50 samples have no value beyond their p99"
    above_limit_at_p50 = Objective("itl", 90, 0.02).check_evidence(build(EVIDENCE))
    assert (above_limit_at_p50.met, above_limit_at_p50.bound) == (False, "at least")
    within_at_p99 = Objective("itl", 95, 0.1).check_evidence(build(EVIDENCE))
    assert (within_at_p99.met, within_at_p99.bound) == (True, "at most")
    between = Objective("itl", 90, 0.05).check_evidence(build(EVIDENCE))  # p50 30 ms, p99 90 ms
    assert between.met is None and "no percentile that bounds it" in between.how
    absent = Objective("e2e", 99, 30).check_evidence(build(EVIDENCE))
    assert absent.met is None and "latency.e2e_p50_s" in absent.how


# --- the questions ----------------------------------------------------------------------------
def test_a_loose_itl_objective_turns_q5_to_no_and_a_tight_one_to_yes_on_the_same_evidence():
    ev = build(EVIDENCE)
    loose = diagnose(ev, TH, slo=slo("itl:p99:200ms"))
    tight = diagnose(ev, TH, slo=slo("itl:p99:50ms"))
    assert (loose.answer("Q5").answer, loose.answer("Q5").verdict) == ("no", "slo-met")
    assert (tight.answer("Q5").answer, tight.answer("Q5").verdict) == ("yes", "slo-broken")
    assert loose.recommendation("speculative-decoding").status == "not-indicated"
    # The median is fine and prefills stall decode (inflation 2.0): the broken tail is Q6's, so the tight
    # objective does not call for speculative decoding (issue 13, item 3).
    tight_spec = tight.recommendation("speculative-decoding")
    assert tight_spec.status == "not-indicated" and "prefills stalling decode" in tight_spec.reason
    comparison = tight.answer("Q5").comparisons[0]
    assert (comparison.threshold, comparison.evidence, comparison.limit, comparison.holds) == (
        "slo.itl_p99_s",
        "decode.itl_p99_s",
        0.05,
        False,
    )
    assert "ITL objective" in tight.answer("Q5").rationale


def test_without_an_itl_objective_q5_says_it_used_the_fixed_thresholds():
    ev = build({**EVIDENCE, "decode.itl_p50_s": 0.08})
    for declared in (SLO(), slo("ttft:p99:5s")):
        a = diagnose(ev, TH, slo=declared).answer("Q5")
        assert a.answer == "yes" and "fixed thresholds q5.max_itl_*" in a.rationale
        assert {c.threshold for c in a.comparisons} >= {"q5.max_itl_p50_s"}


def test_an_itl_objective_the_evidence_cannot_judge_leaves_q5_unknown_not_the_fixed_thresholds():
    a = ASK["Q5"](build(EVIDENCE), TH, slo=slo("itl:p90:50ms"))
    assert (a.answer, a.verdict) == ("unknown", "slo-not-judged")
    assert not a.comparisons and "--active" in a.rationale


def test_decode_share_does_not_overrule_a_broken_itl_objective():
    ev = build({**EVIDENCE, "decode.time_share": 0.2})
    plain = ASK["Q5"](build({**EVIDENCE, "decode.itl_p50_s": 0.08, "decode.time_share": 0.2}), TH)
    assert plain.answer == "no", "with fixed thresholds a small decode share means decode is not the complaint"
    judged = ASK["Q5"](ev, TH, slo=slo("itl:p50:10ms"))
    assert judged.answer == "yes" and "only 20% of request time" in judged.rationale


def test_no_latency_slo_and_offline_recommends_offline_batch():
    ev = build(EVIDENCE)
    d = diagnose(ev, TH, slo=SLO(interactive=False))
    assert d.answer("OB").answer == "yes"
    assert d.recommendation("offline-batch").status == "recommended"
    assert (d.answer("Q5").answer, d.answer("Q5").verdict) == ("no", "offline"), "nobody waits for tokens"
    assert d.recommendation("speculative-decoding").status == "not-indicated"
    # the same from a file, and nothing declared leaves OB unknown as before
    assert diagnose(ev, TH, slo=SLO.from_mapping({"interactive": False})).answer("OB").answer == "yes"
    assert diagnose(ev, TH).answer("OB").answer == "unknown"


def test_the_slo_outranks_an_interactive_fact_in_older_evidence_and_says_so():
    recorded_offline = build({**EVIDENCE, "workload.interactive": False})
    a = ASK["OB"](recorded_offline, TH, slo=slo("ttft:p99:2s"))
    assert a.answer == "no" and "overruled" in a.rationale
    assert ASK["OB"](recorded_offline, TH).answer == "yes", "undeclared SLO: the evidence's fact decides"
    b = ASK["OB"](build({"workload.interactive": True}), TH, slo=SLO(interactive=False))
    assert b.answer == "yes" and "overruled" in b.rationale


def test_q6_says_whether_the_stalls_break_the_itl_or_ttft_objective():
    ev = build(EVIDENCE)
    broken = diagnose(ev, TH, slo=slo("ttft:p99:2s"))
    assert "the stalls matter" in broken.answer("Q6").rationale and "ttft p99" in broken.answer("Q6").rationale
    step = next(s for s in broken.path if s.node == "Q6.stalls-break-slo")
    assert step.outcome == "yes"
    met = diagnose(ev, TH, slo=slo("ttft:p99:5s", "itl:p99:1s"))
    assert "do not break it" in met.answer("Q6").rationale
    assert met.answer("Q6").answer == "yes", "contention is a fact of the engine, whatever the SLO"
    assert "SLO" not in diagnose(ev, TH).answer("Q6").rationale


def test_no_bottleneck_found_still_says_the_slo_breaks():
    ev = build({"decode.itl_p50_s": 0.01, "latency.ttft_p99_s": 9.0})
    d = diagnose(ev, TH, slo=slo("ttft:p99:2s"))
    assert d.bottleneck.startswith("no bottleneck found") and "yet the SLO breaks (ttft p99 <= 2 s)" in d.bottleneck


# --- the diagnosis and the reports -------------------------------------------------------------
def test_the_diagnosis_records_the_slo_and_round_trips_it():
    d = diagnose(build(EVIDENCE), TH, slo=slo("itl:p99:50ms", "ttft:p99.9:2s", "e2e:p95:30s"))
    data = json.loads(d.to_json())
    assert data["slo"]["objectives"] == {"itl_p99_s": 0.05, "ttft_p99_9_s": 2.0, "e2e_p95_s": 30.0}
    assert [c["status"] for c in data["slo"]["checks"]] == ["broken", "broken", "not judged"]  # p99.9 >= p99 = 3 s
    assert Diagnosis.from_dict(data) == d
    older = {k: v for k, v in data.items() if k != "slo"}  # written before SLOs existed
    assert Diagnosis.from_dict(older).slo == SLO() and Diagnosis.from_dict(older).slo_checks == ()


def test_every_report_shows_the_slo_and_each_objective():
    ev = build(EVIDENCE)
    d = diagnose(ev, TH, slo=slo("itl:p99:50ms", "ttft:p99:5s"))
    text = console.render(d, ev, verbose=False)
    assert "SLO (command line): 1 of 2 objective(s) broken" in text
    assert "! itl p99 <= 50 ms: 90.0 ms (broken)" in text and "= ttft p99 <= 5 s: 3 s (met)" in text
    md = markdown.render(d, ev)
    assert "**SLO:** 1 of 2 objective(s) broken" in md and "| itl p99 &lt;= 50 ms | 90.0 ms | broken |" in md
    page = html.render(d, ev)
    assert '<span class="badge broken">broken</span>' in page and '<span class="badge met">met</span>' in page
    doc = json.loads(report_content.render(d, ev))
    assert [o["status"] for o in doc["slo"]["objectives"]] == ["broken", "met"]
    assert doc["diagnosis"]["slo"]["objectives"] == {"itl_p99_s": 0.05, "ttft_p99_s": 5.0}
    undeclared = console.render(diagnose(ev, TH), ev, verbose=False)
    assert "SLO: none declared: Q5 judges decode latency against the fixed q5.max_itl_* thresholds" in undeclared


# --- files and commands ----------------------------------------------------------------------
def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_toml_file_may_hold_thresholds_and_an_slo(tmp_path):
    both = _write(
        tmp_path, "both.toml", "[thresholds.q5]\nmax_itl_p50_s = 0.01\n\n[slo]\nitl_p99_s = 0.05\nttft_p99_s = 2.0\n"
    )
    th = Thresholds.from_toml(both)
    assert th.overridden == {"q5.max_itl_p50_s"} and th["q5.max_itl_p50_s"] == 0.01
    assert {o.key for o in SLO.from_toml(both).objectives} == {"itl_p99_s", "ttft_p99_s"}
    only_slo = _write(tmp_path, "slo.toml", "[slo]\ninteractive = false\n")
    assert Thresholds.from_toml(only_slo).overridden == frozenset()
    assert SLO.from_toml(only_slo).interactive is False
    with pytest.raises(ThresholdsError, match="unknown threshold 'slos.itl_p99_s'"):
        Thresholds.from_toml(_write(tmp_path, "typo.toml", "[slos]\nitl_p99_s = 0.05\n"))


@pytest.fixture
def evidence_file(tmp_path) -> Path:
    return _write(tmp_path, "evidence.json", build(EVIDENCE).to_json())


def test_decide_judges_against_flags_and_the_thresholds_file(capsys, tmp_path, evidence_file):
    code, out, err = run_cli(capsys, "decide", evidence_file, "--slo", "itl:p99:50ms", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert {a["question"]: a["answer"] for a in d["answers"]}["Q5"] == "yes"
    assert d["slo"]["source"] == "command line" and d["slo"]["checks"][0]["status"] == "broken"
    toml = _write(tmp_path, "slo.toml", '[thresholds]\n"q6.min_itl_inflation" = 3.0\n\n[slo]\nitl_p99_s = 0.2\n')
    code, out, err = run_cli(capsys, "decide", evidence_file, "--thresholds", toml, "--json")
    assert code == 0, err
    d = json.loads(out)
    answers = {a["question"]: a["answer"] for a in d["answers"]}
    assert answers["Q5"] == "no" and answers["Q6"] == "no", "the file's SLO and its threshold both apply"
    assert d["thresholds"]["q6.min_itl_inflation"] == 3.0 and d["slo"]["source"] == str(toml)
    code, out, err = run_cli(capsys, "decide", evidence_file, "--thresholds", toml, "--slo", "itl:p99:50ms", "--json")
    assert {a["question"]: a["answer"] for a in json.loads(out)["answers"]}["Q5"] == "yes", "flags over the file"


def test_decide_offline_recommends_offline_batch_and_refuses_offline_with_objectives(capsys, evidence_file):
    code, out, _ = run_cli(capsys, "decide", evidence_file, "--offline", "--json")
    assert code == 0
    d = json.loads(out)
    assert {r["technique"]: r["status"] for r in d["recommendations"]}["offline-batch"] == "recommended"
    assert d["slo"]["interactive"] is False
    code, _, err = run_cli(capsys, "decide", evidence_file, "--offline", "--slo", "ttft:p99:2s")
    assert code == 2 and "cannot be offline" in err


def test_a_bad_slo_flag_is_a_usage_error_with_the_fix_on_one_line(evidence_file):
    proc = subprocess.run(
        [sys.executable, "-m", "llm_diagnose", "decide", str(evidence_file), "--slo", "itl:p5O:1s"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-diagnose: error: cannot read SLO 'itl:p5O:1s'")
    assert "write METRIC:pNN:LIMIT, e.g. ttft:p99:2s" in lines[0]


@pytest.mark.parametrize(
    "table, says",
    [
        ("[slo]\nitl_p50 = 0.05\n", "is not an objective: write e.g. ttft_p99_s = 2.0"),
        ('[slo]\ninteractive = "yes"\n', "interactive must be true or false"),
        ("[slo]\ninteractive = false\nitl_p50_s = 0.05\n", "cannot be offline"),
    ],
)
def test_a_bad_slo_table_is_a_usage_error(capsys, tmp_path, evidence_file, table, says):
    code, _, err = run_cli(capsys, "decide", evidence_file, "--thresholds", _write(tmp_path, "bad.toml", table))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_report_and_gate_judge_runs_without_a_diagnosis_against_the_slo_given(capsys, tmp_path):
    base, cur = tmp_path / "base", tmp_path / "cur"
    for folder in (base, cur):
        folder.mkdir()
        _write(folder, "evidence.json", build(EVIDENCE).to_json())
    code, out, err = run_cli(capsys, "report", base, "--format", "json", "--slo", "itl:p99:50ms")
    assert code == 0, err
    assert json.loads(out)["slo"]["objectives"][0]["status"] == "broken" and "the SLO from command line" in err
    # a diagnosis.json is used as written, with the SLO it recorded; the note says the flag did not apply
    _write(
        cur,
        "diagnosis.json",
        diagnose(Evidence.from_json((cur / "evidence.json").read_text()), TH, slo=slo("itl:p99:200ms")).to_json(),
    )
    code, out, err = run_cli(capsys, "report", cur, "--format", "json", "--slo", "itl:p99:50ms")
    assert json.loads(out)["slo"]["objectives"][0]["status"] == "met" and "applies only without a" in err
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--current", cur, "--slo", "itl:p99:50ms")
    assert code in (0, 1), err
    assert "judged against different SLOs (baseline: itl p99 <= 50 ms; current: itl p99 <= 200 ms)" in out


@pytest.mark.real_engine
def test_run_judges_an_objective_from_real_measured_gaps(vllm_server, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--url",
            vllm_server.url,
            "--duration",
            "2",
            "--interval",
            "0.5",
            "--out",
            str(out),
            "--quiet",
            "--active",
            "--budget-requests",
            "12",
            "--budget-seconds",
            "12",
            "--experiments",
            "decode",
            "--slo",
            "itl:p99:10s",
            "--slo",
            "itl:p90:10s",
        ]
    )
    _, stderr = capsys.readouterr()
    assert code == 0, stderr
    evidence = Evidence.from_json((out / "evidence.json").read_text())
    p99 = evidence.measurement("decode.batch1_itl_p99_s")  # the experiment's, beside the engine's decode.itl_p99_s
    assert p99 is not None and p99.samples, "the decode experiment keeps every gap"
    saved = Diagnosis.from_dict(json.loads((out / "diagnosis.json").read_text()))
    by_key = {c.objective.key: c for c in saved.slo_checks}
    # 10 s per token is far beyond any server: the point is that a real measurement judged it
    assert by_key["itl_p99_s"].met is True and by_key["itl_p99_s"].observed_s == p99.value
    assert by_key["itl_p90_s"].met is True and "samples" in by_key["itl_p90_s"].how
    assert saved.answer("Q5").verdict == "slo-met" and saved.slo == slo("itl:p99:10s", "itl:p90:10s")
    from tests.test_cli_run_demo import wait_idle

    wait_idle(vllm_server.url)  # the server is shared: leave it with no request still in flight
