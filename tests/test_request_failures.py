"""Failed requests are findings: the gate fails a server that fails what it is sent, verify blames
any change that makes it fail requests, and every output says how many failed.

Run folders are written through the load driver's own record type (as `run --active` writes them);
the real-engine counterpart (vLLM rejecting prompts longer than its max_model_len) is in
tests/test_judgement_live.py.
"""

from __future__ import annotations

import random
from pathlib import Path

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.compare.request_measurements import REQUEST_FAILED_FRACTION
from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.gate.judge import FAILURE_CEILING, compare
from llm_diagnose.diagnose.gate.result import RunData
from llm_diagnose.diagnose.gate.rules import GateRules, rules_from_mapping
from llm_diagnose.diagnose.report import console, html, markdown
from llm_diagnose.diagnose.runfolder import REQUESTS
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.verify.judge import verify
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.failures import tally_failures
from llm_diagnose.probes.load.faults import FaultKind
from llm_diagnose.probes.load.records import JsonlWriter, RequestRecord
from llm_diagnose.probes.results import Measurement, Provenance
from tests.evidence_builders import PROV, build
from tests.test_verify import side

N = 40


def _record(i: int, *, fail: FaultKind | None, prompt: str, prompt_tokens: int | None, rng: random.Random):
    common = {
        "request_id": f"r{i}",
        "experiment": "replay",
        "phase": "replay",
        "tag": prompt,
        "endpoint": "completions",
        "t_send": 1000.0 + 0.5 * i,
        "t_send_wall": 1.7e9 + i + rng.random(),
        "planned_prompt_tokens": None,  # text prompts: only the server's usage knows their length
    }
    if fail is not None:
        status = 500 if fail is FaultKind.SERVER_ERROR else 400
        return RequestRecord(**common, t_end=0.003, http_status=status, fault=fail, fault_detail=f"HTTP {status}")
    first = 0.05 * rng.lognormvariate(0, 0.1)
    times = tuple(first + 0.02 * rng.lognormvariate(0, 0.1) * k for k in range(16))
    return RequestRecord(
        **common,
        event_times=times,
        t_end=times[-1],
        http_status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=16,
        finish_reason="length",
    )


def write_run(
    folder: Path,
    *,
    failing: set[int] = frozenset(),  # type: ignore[assignment]
    kind: FaultKind = FaultKind.SERVER_ERROR,
    config: dict | None = None,
    seed: int = 1,
    long_rejected: bool = False,
) -> Path:
    """A replayed run of N requests, every other one a long prompt (900 tokens, else 60).

    `failing` are the indices that failed with `kind`; `long_rejected` fails every long one with
    HTTP 400 (what vLLM answers a prompt beyond its max_model_len): what was sent is the same.
    """
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    records = []
    for i in range(N):
        long = i % 2 == 1
        rejected = long_rejected and long
        fault = FaultKind.REJECTED if rejected else kind if i in failing else None
        records.append(
            _record(i, fail=fault, prompt="long" if long else "short", prompt_tokens=900 if long else 60, rng=rng)
        )
    tally = tally_failures(records)
    prov = Provenance("active-probe/run", "test")
    items = {
        "engine.name": "vllm",
        "engine.model": "tiny-llama",
        "config.prefix_caching": True,
        "prefix.hit_rate": Measurement(0.4, "fraction", PROV),
        Q.ACTIVE_REQUESTS_SENT: Measurement(float(tally.sent), "count", prov),
        Q.ACTIVE_FAILED_FRACTION: Measurement(
            tally.fraction, "fraction", prov, samples=tally.outcomes, note=f"faults: {tally.kinds_text()}"
        ),
        **(config or {}),
    }
    evidence = build(items)
    (folder / "evidence.json").write_text(evidence.to_json(), "utf-8")
    (folder / "diagnosis.json").write_text(diagnose(evidence).to_json(), "utf-8")
    with JsonlWriter(folder / REQUESTS) as out:
        for r in records:
            out.write(r.to_dict())
    return folder


def gate(baseline: Path, current: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["gate", "--baseline", str(baseline), "--current", str(current), "--verbose", *extra])
    return code, capsys.readouterr().out


def verdict_of(out: str, name: str) -> str:
    return next(line.split()[0] for line in out.splitlines() if line.split()[1:2] == [name])


HALF = set(range(0, N, 2))


def test_a_server_failing_half_its_requests_fails_the_gate_even_asked_only_to_warn(tmp_path, capsys):
    baseline = write_run(tmp_path / "ok")
    current = write_run(tmp_path / "half", failing=HALF, seed=2)
    code, out = gate(baseline, current, capsys)
    assert code == ExitCode.REGRESSION, out
    assert verdict_of(out, REQUEST_FAILED_FRACTION) == "regression", out
    assert verdict_of(out, FAILURE_CEILING) == "regression", out
    assert "20 of 40 requests failed (50%: 20 server-error)" in out, out
    # The latencies of the answered half alone pass: without the failure rules this gate passed.
    assert verdict_of(out, "requests.ttft_p50_s") in ("pass", "inconclusive"), out
    # A shared runner's rules make every metric's regression a warning: a failing server still fails.
    rules = tmp_path / "warn.toml"
    rules.write_text('[gate]\nseverity = "warning"\n')
    code, out = gate(baseline, current, capsys, "--rules", str(rules))
    assert code == ExitCode.REGRESSION and verdict_of(out, REQUEST_FAILED_FRACTION) == "warning", out


def test_a_server_failing_every_request_fails_the_gate(tmp_path, capsys):
    baseline = write_run(tmp_path / "ok")
    current = write_run(tmp_path / "none", failing=set(range(N)), kind=FaultKind.RATE_LIMITED, seed=2)
    code, out = gate(baseline, current, capsys, "--fail-on-inconclusive")
    assert code == ExitCode.REGRESSION, out
    assert "40 of 40 requests failed (100%: 40 rate-limited)" in out, out


def test_failing_as_much_as_the_baseline_still_fails_the_ceiling(tmp_path, capsys):
    baseline = write_run(tmp_path / "half-a", failing=HALF)
    current = write_run(tmp_path / "half-b", failing=HALF, seed=2)
    code, out = gate(baseline, current, capsys)
    assert code == ExitCode.REGRESSION, out
    assert verdict_of(out, REQUEST_FAILED_FRACTION) in ("pass", "inconclusive"), out  # not shown worse ...
    assert verdict_of(out, FAILURE_CEILING) == "regression", out  # ... and still failing what it is sent
    # The ceiling is a setting: 1 turns it off, and the comparison alone then passes.
    rules = tmp_path / "lenient.toml"
    rules.write_text("[gate]\nmax_failed_fraction = 1.0\n")
    code, out = gate(baseline, current, capsys, "--rules", str(rules))
    assert verdict_of(out, FAILURE_CEILING) == "pass" and code == ExitCode.OK, out


def test_one_failure_in_forty_is_within_the_noise_and_the_ceiling(tmp_path, capsys):
    baseline = write_run(tmp_path / "ok")
    current = write_run(tmp_path / "one", failing={7}, seed=2)
    code, out = gate(baseline, current, capsys)
    assert code == ExitCode.OK, out
    assert verdict_of(out, REQUEST_FAILED_FRACTION) in ("pass", "inconclusive"), out
    assert verdict_of(out, FAILURE_CEILING) == "pass", out


def test_the_gate_compares_failures_by_their_interval(tmp_path):
    # Pure: the comparison rule is the gate's bootstrap of the mean of one 0/1 per request sent.
    ok, half = write_run(tmp_path / "ok"), write_run(tmp_path / "half", failing=HALF, seed=2)
    base, cur = side(ok), side(half)
    result = compare(RunData(base.evidence, base.diagnosis), RunData(cur.evidence, cur.diagnosis), GateRules())
    failed = next(o for o in result.outcomes if o.name == REQUEST_FAILED_FRACTION)
    assert failed.verdict == "regression" and failed.interval is not None and failed.interval[0] > 0.25, failed


def test_max_failed_fraction_must_be_a_fraction():
    assert rules_from_mapping({"gate": {"max_failed_fraction": 0.2}}).settings.max_failed_fraction == 0.2
    for bad in (-0.1, 1.5, "0.1"):
        try:
            rules_from_mapping({"gate": {"max_failed_fraction": bad}}, "rules.toml")
        except ValueError as exc:
            assert "gate.max_failed_fraction" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_a_change_that_rejects_the_long_half_is_harm_not_another_workload(tmp_path, capsys):
    # The same requests replayed; AFTER's server rejects every long prompt (HTTP 400), so only the
    # short half was served. Judged on what was served, the prompts got shorter and verify said
    # "not comparable"; judged on what was sent, half the requests failed: harm, whatever changed.
    before = write_run(tmp_path / "before", config={"config.max_model_len": 2048})
    after = write_run(tmp_path / "after", long_rejected=True, seed=2, config={"config.max_model_len": 512})
    result = verify(side(before), side(after))
    assert result.comparability.comparable, result.comparability.reasons
    prompts = next(c for c in result.comparability.checks if c.name == "prompt tokens (median)")
    assert prompts.before == prompts.after, prompts
    failed = next(s for s in result.side_effects if s.name == REQUEST_FAILED_FRACTION)
    assert failed.harmful and failed.attributed, failed
    assert result.exit_code() == ExitCode.REGRESSION
    assert any("AFTER: 20 of 40 requests failed (50%: 20 rejected)" in n for n in result.notes), result.notes
    assert main(["verify", str(before), str(after)]) == ExitCode.REGRESSION
    assert f"HARM  {REQUEST_FAILED_FRACTION}" in capsys.readouterr().out


def test_failures_are_blamed_on_a_change_that_cannot_slow_anything_else(tmp_path):
    # Prefix caching cannot make a decode step worse (a slower decode is not attributed to it), but
    # any change can make a server fail requests: the failures stay harmful.
    before = write_run(tmp_path / "before", config={"config.prefix_caching": False})
    after = write_run(tmp_path / "after", failing=HALF, seed=2)
    result = verify(side(before), side(after))
    assert [a.technique for a in result.adopted] == ["prefix-caching"]
    failed = next(s for s in result.side_effects if s.name == REQUEST_FAILED_FRACTION)
    assert failed.harmful and failed.attributed, failed


def test_every_output_says_how_many_requests_failed(tmp_path):
    folder = side(write_run(tmp_path / "half", failing=HALF))
    text = console.render(folder.diagnosis, folder.folder.evidence)
    first = text.splitlines()[2]
    assert first == "Requests: 20 of 40 sent FAILED (50%; faults: 20 server-error)", text
    assert "<strong>Requests:</strong> 20 of 40 sent FAILED" in html.render(folder.diagnosis, folder.folder.evidence)
    assert "**Requests:** 20 of 40 sent FAILED" in markdown.render(folder.diagnosis, folder.folder.evidence)
    healthy = side(write_run(tmp_path / "ok"))
    assert "Requests: 40 sent, none failed" in console.render(healthy.diagnosis, healthy.folder.evidence)
    passive = build({"engine.name": "vllm"})
    assert "Requests:" not in console.render(diagnose(passive), passive)


def test_a_control_that_is_before_itself_is_refused(tmp_path, capsys):
    before = write_run(tmp_path / "before", config={"config.prefix_caching": False})
    after = write_run(tmp_path / "after", seed=2)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in before.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    for control, why in ((before, "the same folder"), (copy, "a copy")):
        assert main(["verify", str(before), str(after), "--control", str(control)]) == ExitCode.USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is BEFORE itself" in err[0] and why in err[0], err


def test_another_engine_is_not_comparable_and_another_host_credits_nothing(tmp_path):
    off = {"config.prefix_caching": False, "prefix.hit_rate": Measurement(0.0, "fraction", PROV)}
    before = write_run(tmp_path / "before", config={**off, "engine.version": "0.11.0"})
    sglang = write_run(tmp_path / "sglang", seed=2, config={"engine.name": "sglang"})
    result = verify(side(before), side(sglang))
    assert not result.comparability.comparable
    assert any("different engines: vllm before, sglang after" in r for r in result.comparability.reasons)
    upgraded = write_run(tmp_path / "upgraded", seed=3, config={"engine.version": "0.12.0"})
    result = verify(side(before), side(upgraded))
    rows = {c.key: c for c in result.config}
    assert rows["engine.version"].change == "changed", rows
    hit = next(c for c in result.claims if c.claim.key == "prefix.hit_rate")  # 0% -> 40%: delivered, but ...
    assert hit.verdict == "cannot-tell" and "engine.version 0.11.0 -> 0.12.0" in hit.basis, hit
    assert any(n.startswith("not two runs of one server in order") for n in result.notes), result.notes
