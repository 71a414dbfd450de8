"""Fuzzing the commands that read files users bring: `decide` (evidence JSON; `report` and `gate`
on a run folder holding it too) and `trace` (every trace format, plain and gzipped). Whatever the
input, the command line answers with a documented exit code (docs/exit-codes.md) and never a
traceback.

The CLI entry (llm_diagnose.diagnose.cli.main) runs in-process, so an exception that escapes it fails the
test with its own traceback, and stdout/stderr are captured per example.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llm_diagnose.diagnose.cli import main
from llm_diagnose.probes.quantities import CATALOGUE

DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 4, 5, 130}  # docs/exit-codes.md
# LLMD_FUZZ_EXAMPLES=2000 for a longer hunt; the default keeps the suite quick.
FUZZ = settings(
    max_examples=int(os.environ.get("LLMD_FUZZ_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_answered(code: int, err: str) -> None:
    assert code in DOCUMENTED_EXIT_CODES, (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        errors = [ln for ln in err.splitlines() if ln.startswith("llm-diagnose: error:")]
        assert len(errors) == 1, err


# --- JSON values, from plausible to hostile ------------------------------------------------------
texts = st.text(max_size=12)
odd_numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**6), 10**6),
    st.integers(10**300, 10**400),  # beyond a float
    st.sampled_from([-1.0, 0.0, 1e308, -1e-308, 2.0, 0.99]),
)
deep = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)  # spliced in as raw text: json.dumps would recurse
scalars = st.one_of(st.none(), st.booleans(), odd_numbers, texts, st.sampled_from(["NaN", "Infinity", "0.99", "true"]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=12
)
provenances = st.one_of(
    st.fixed_dictionaries(
        {"method": texts, "source": texts, "taken_at": texts}, optional={"window_s": json_values, "timer": json_values}
    ),
    json_values,
)
items = st.one_of(
    st.fixed_dictionaries(
        {
            "kind": st.just("measurement"),
            "value": json_values | odd_numbers,
            "unit": texts | json_values,
            "provenance": provenances,
        },
        optional={
            "samples": st.lists(odd_numbers | json_values, max_size=5) | json_values,
            "calls_per_sample": json_values,
            "summary": json_values,
            "warnings": json_values,
            "note": json_values,
        },
    ),
    st.fixed_dictionaries(
        {"kind": st.just("fact"), "value": json_values, "provenance": provenances}, optional={"note": json_values}
    ),
    st.fixed_dictionaries(
        {"kind": st.just("not-measured"), "reason": texts | json_values},
        optional={"hint": json_values, "provenance": provenances},
    ),
    json_values,
)
keys = st.sampled_from(sorted(CATALOGUE)) | texts
evidence_docs = st.fixed_dictionaries(
    {
        "schema": st.just("llm-diagnose/evidence") | json_values,
        "version": st.just(1) | json_values,
        "items": st.dictionaries(keys, items, max_size=12) | json_values,
    },
    optional={
        "target": st.fixed_dictionaries({"url": json_values, "label": json_values}) | json_values,
        "created_at": json_values,
        "tool": json_values,
        "host": json_values,
    },
)


@st.composite
def evidence_texts(draw) -> bytes:
    doc = draw(evidence_docs)
    text = json.dumps(doc)
    mutation = draw(st.sampled_from(["none", "none", "deep", "cut", "bytes", "bom"]))
    if mutation == "deep" and '"items": {' in text:
        text = text.replace('"items": {', '"items": {"deep.key": ' + draw(deep) + ", ", 1)
    elif mutation == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    raw = text.encode()
    if mutation == "bytes":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    elif mutation == "bom":
        raw = b"\xef\xbb\xbf" + raw
    return raw


@FUZZ
@given(raw=evidence_texts(), as_json=st.booleans())
def test_decide_answers_any_evidence_file(raw, as_json):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "evidence.json"
        path.write_bytes(raw)
        code, out, err = run_cli(["decide", str(path)] + (["--json"] if as_json else []))
    assert_answered(code, err)
    assert code in (0, 2)
    if code == 0 and as_json:
        assert json.loads(out)["schema"] == "llm-diagnose/diagnosis"


@FUZZ
@given(raw=evidence_texts(), fmt=st.sampled_from(["html", "md", "json"]))
def test_report_and_gate_answer_any_run_folder(raw, fmt):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        (run / "evidence.json").write_bytes(raw)
        code, _, err = run_cli(["report", str(run), "--format", fmt])
        assert_answered(code, err)
        code, out, err = run_cli(["gate", "--baseline", str(run), "--current", str(run)])
        assert_answered(code, err)
    assert code in (0, 2)  # the same run twice: no regression, whatever it holds


# --- traces ----------------------------------------------------------------------------------------
def _field(good):
    return st.just(good) | json_values | odd_numbers


mooncake = st.fixed_dictionaries(
    {
        "timestamp": _field(1000),
        "input_length": _field(1024),
        "output_length": _field(8),
        "hash_ids": st.lists(st.integers(0, 2**64 + 5), max_size=6) | json_values,
    }
)
messages = (
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system"]) | json_values, "content": texts | json_values}
        ),
        max_size=3,
    )
    | json_values
)
openai = st.fixed_dictionaries(
    {"model": st.just("m") | json_values, "messages": messages},
    optional={
        "timestamp": _field("2024-05-01T10:00:00Z"),
        "latency_ms": _field(100),
        "response": json_values | st.just({"usage": {"prompt_tokens": 5}}),
    },
)
openai_wrapped = st.fixed_dictionaries({"request": openai | json_values}, optional={"response": json_values})
prompts = st.fixed_dictionaries(
    {"prompt": texts | st.lists(st.integers(-5, 2**40), max_size=6) | json_values},
    optional={"output_length": _field(20), "timestamp": _field(0.5), "timestamp_ms": _field(500)},
)
token_prompts = st.fixed_dictionaries(
    {"prompt_token_ids": st.lists(st.integers(-5, 2**40), max_size=6) | json_values},
    optional={"output_length": _field(20)},
)
JSONL = {"mooncake": mooncake, "openai": openai | openai_wrapped, "prompts": prompts | token_prompts}
CSV = {
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens", ["2023-11-16 18:15:46.6805900", "374", "44"]),
    "burstgpt": (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        ["5", "ChatGPT", "472", "18", "490", "Conversation log"],
    ),
}
csv_cells = st.sampled_from(["", "-1", "1e400", "nan", "x", '"', '"a,b"', "99999999999999999999", "\u00e9", "1.5"])


@st.composite
def trace_files(draw) -> tuple[str, bytes]:
    fmt = draw(st.sampled_from(sorted(JSONL) + sorted(CSV)))
    if fmt in JSONL:
        lines = [json.dumps(obj) for obj in draw(st.lists(JSONL[fmt], min_size=0, max_size=8))]
        if draw(st.booleans()):
            lines.insert(draw(st.integers(0, len(lines))), '{"prompt": ' + draw(deep) + "}")
        suffix = ".jsonl"
    else:
        header, good = CSV[fmt]
        rows = []
        for _ in range(draw(st.integers(0, 8))):
            row = list(good)
            for i in draw(st.lists(st.integers(0, len(row) - 1), max_size=2)):
                row[i] = draw(csv_cells)
            rows.append(",".join(row[: draw(st.integers(1, len(row)))] if draw(st.integers(0, 9)) == 0 else row))
        lines = [header] + rows
        suffix = ".csv"
    raw = ("\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n"]))).encode()
    mutation = draw(st.sampled_from(["none", "none", "bytes", "bom", "cut", "crlf"]))
    if mutation == "bytes":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=6)) + raw[at:]
    elif mutation == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif mutation == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif mutation == "crlf":
        raw = raw.replace(b"\n", b"\r\n")
    if draw(st.booleans()):
        raw = gzip.compress(raw)
        if draw(st.booleans()):
            raw = raw[: draw(st.integers(0, len(raw)))]  # a truncated .gz
        suffix += ".gz"
    given_fmt = draw(st.sampled_from(["auto", fmt]))
    return suffix + "|" + given_fmt, raw


@FUZZ
@given(trace=trace_files(), strict=st.booleans(), as_json=st.booleans())
@example(
    trace=(
        ".jsonl|auto",
        b'{"prompt": "", "timestamp": 0.5}\n{"prompt": "", "timestamp": 0.0}\n'
        b'{"prompt": "", "timestamp_ms": 1.8961503816218354e+157}\n',
    ),
    strict=False,
    as_json=True,
)  # found by this test in a full run: a timestamp beyond any time made the span infinite and --json raised
def test_trace_answers_any_trace_file(trace, strict, as_json):
    suffix_fmt, raw = trace
    suffix, fmt = suffix_fmt.split("|")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"trace{suffix}"
        path.write_bytes(raw)
        argv = (
            ["trace", str(path), "--format", fmt] + (["--strict"] if strict else []) + (["--json"] if as_json else [])
        )
        code, out, err = run_cli(argv)
    assert_answered(code, err)
    assert code in (0, 2)
    if code == 0 and as_json:
        json.loads(out)
