"""Fuzzing the whole command line: every command, with hostile values for its numeric flags.

Each example draws a command and some of its duration, rate and count flags, each with a value
from NaN, infinities, -1, 0, 1e300, integers of thirty digits, units and garbage strings, or a
plausible one. Whatever is drawn, the command answers with its documented exit codes
(docs/exit-codes.md; narrower per command here, see EXPECTED) and never a traceback; a refused
value is one `llm-diagnose: error:` line. A second fuzz does the same for the settings files
(`--thresholds`, `gate --rules`): a value that is not finite is always refused, by name.

Network-free and bounded: URLs point at 127.0.0.1's discard port, where nothing listens, so a
command that gets past its flags fails at once on the connection (exit 3); `instrument` gets a
command that does not exist (it never execs); `demo` is told vLLM is missing (it never starts
a server); `microbench` gets an unknown preset (it never times a model). The commands run
in-process through `llm_diagnose.diagnose.cli.main`, so an exception that escapes fails the test
with its own traceback.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.tree.thresholds import DEFAULTS
from tests.evidence_builders import build

CLOSED = "http://127.0.0.1:9"
# Per command and per settings file. LLMD_FUZZ_EXAMPLES=2000 for a longer hunt; the default keeps
# the suite quick (about a second per ten examples).
FUZZ = settings(
    max_examples=int(os.environ.get("LLMD_FUZZ_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# A run folder recorded from a real vLLM (tests/test_export.py says how), read only: export writes to "out".
REAL_RUN = Path(__file__).parent / "fixtures" / "runs" / "vllm-0.32.0-cpu-decode"
TRACE = '{"timestamp": 0, "prompt": "hello world, a prompt", "output_length": 5}\n' * 3

HOSTILE = [
    "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "-1", "0", "-0", "0.0", "1e300", "-1e300", "1e-300",
    "1e309", "9" * 30, "-" + "9" * 30, "99999999999h", "1h30m", "500ms", "10m", "0s", "now", "100",
    "2026-12-01T14:00:00Z", "0001-01-01T00:00:00+14:00", "abc", "", " ", "1,2", "1,,0", "0x10", "1_000",
    "\u00bd", "1e", "--", "65536", "0.0001", "0.1", "1", "2", "30", "1.5",
    "csv", "parquet",  # export's --format: the valid values, drawn among the hostile ones
]  # fmt: skip
values = st.one_of(
    st.sampled_from(HOSTILE),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.text(max_size=6),
)


def _paths(tmp: Path) -> dict[str, str]:
    (tmp / "evidence.json").write_text(build({"engine.name": "vllm"}).to_json())
    (tmp / "t.jsonl").write_text(TRACE)
    return {"tmp": str(tmp), "out": str(tmp / "out"), "trace": str(tmp / "t.jsonl"), "run": str(REAL_RUN)}


# command -> (its fixed arguments, its numeric flags, the exit codes it may answer with)
COMMANDS: dict[str, tuple[Callable[[dict[str, str]], list[str]], tuple[str, ...], set[int]]] = {
    "run": (
        lambda p: ["run", "--url", CLOSED, "--out", p["out"], "--quiet"],
        (
            "--duration",
            "--interval",
            "--budget-requests",
            "--budget-seconds",
            "--max-rps",
            "--block-size",
            "--kv-capacity-tokens",
            "--model",
        ),
        {2, 3},
    ),  # fmt: skip
    "fleet": (
        lambda p: ["fleet", "--prometheus", CLOSED, "--out", p["out"]],
        ("--since", "--start", "--end", "--step", "--block-size", "--kv-capacity-tokens"),
        {2, 3},
    ),
    "plan": (
        lambda p: ["plan", "--evidence", p["tmp"], "--trace", p["trace"], "--slo", "ttft:p99:2s", "--target-rps", "5"],
        (
            "--target-rps",
            "--max-batched-tokens",
            "--budget-requests",
            "--budget-seconds",
            "--max-rps",
            "--trial-requests",
            "--search-steps",
            "--search-span",
        ),
        {2},  # valid flags meet "no measured model": the folder has no requests.jsonl
    ),  # fmt: skip
    "trace": (
        lambda p: ["trace", p["trace"]],
        ("--block-size", "--kv-capacity-tokens", "--assume-tpot-ms"),
        {0, 2},
    ),
    "demo": (lambda p: ["demo", "--out", p["out"]], ("--duration", "--requests"), {2}),
    # --out stays the test's folder (a drawn one would write where the tests run): --format is drawn
    "export": (lambda p: ["export", p["run"], "--out", p["out"]], ("--format",), {0, 2}),
    "instrument": (lambda p: ["instrument", "--", "/nonexistent/llmd-fuzz-no-such-command"], ("--port",), {2}),
    "microbench": (
        lambda p: ["microbench", "--preset", "llmd-fuzz-no-such-preset"],
        ("--batch", "--context", "--prompt", "--budget", "--tp", "--layers"),
        {2},
    ),
}


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse refusing a flag
            code = exc.code if isinstance(exc.code, int) else -1
    return code, out.getvalue(), err.getvalue()


def assert_answered(code: int, err: str, allowed: set[int]) -> None:
    assert code in allowed, (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert len([ln for ln in err.splitlines() if ln.startswith("llm-diagnose: error:")]) == 1, err


@pytest.fixture(autouse=True)
def _no_vllm(monkeypatch):
    """`demo` would start a real vLLM: here it is told there is none (it checks before anything else)."""
    from llm_diagnose.diagnose.demo import vllm_server

    monkeypatch.setattr(vllm_server, "vllm_available", lambda: (False, "disabled by tests/test_cli_fuzz.py"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@FUZZ
@given(data=st.data())
def test_every_command_answers_any_number_without_a_traceback(command, data):
    fixed, flags, allowed = COMMANDS[command]
    chosen = data.draw(
        st.lists(st.sampled_from(flags), min_size=1, max_size=min(3, len(flags)), unique=True), label="flags"
    )
    drawn = [f"{flag}={data.draw(values, label=flag)}" for flag in chosen]  # `=`: a value may start with '-'
    with tempfile.TemporaryDirectory() as tmp:
        argv = fixed(_paths(Path(tmp)))
        cut = argv.index("--") if "--" in argv else len(argv)  # instrument: the flags go before the command
        code, _, err = run_cli([*argv[:cut], *drawn, *argv[cut:]])
    assert_answered(code, err, allowed)


# --- settings files --------------------------------------------------------------------------------
toml_values = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "0.5", "1e300", "-1e300", "2", '"0.5"', "true", "[1]"]),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda x: "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(x)
    ),
    st.integers(-(2**63), 2**63 - 1).map(str),
)


def _not_finite(literal: str) -> bool:
    return literal.lstrip("+-") in ("nan", "inf")


@FUZZ
@given(name=st.sampled_from(sorted(DEFAULTS)), literal=toml_values)
def test_a_threshold_that_is_not_finite_is_refused_by_name(name, literal):
    with tempfile.TemporaryDirectory() as tmp:
        paths = _paths(Path(tmp))
        (Path(tmp) / "th.toml").write_text(f'[thresholds]\n"{name}" = {literal}\n')
        code, _, err = run_cli(["decide", paths["tmp"], "--thresholds", str(Path(tmp) / "th.toml"), "--json"])
    assert_answered(code, err, {0, 2})
    if _not_finite(literal):
        assert code == 2 and f"threshold {name!r} must be a finite number" in err, err


GATE_FIELDS = ("confidence", "resamples", "seed", "min_samples", "tolerance", "tail_tolerance", "max_failed_fraction")


@FUZZ
@given(field=st.sampled_from(GATE_FIELDS), literal=toml_values)
def test_a_gate_setting_that_is_not_finite_is_refused_by_name(field, literal):
    with tempfile.TemporaryDirectory() as tmp:
        paths = _paths(Path(tmp))
        rules = Path(tmp) / "rules.toml"
        rules.write_text(f"[gate]\n{field} = {literal}\n")
        code, _, err = run_cli(["gate", "--baseline", paths["tmp"], "--current", paths["tmp"], "--rules", str(rules)])
    assert_answered(code, err, {0, 1, 2, 5})
    if _not_finite(literal):
        assert code == 2 and f"gate.{field}" in err, err
