"""Readers: every format, detection, and bad input (line numbers, skipped counts, strict)."""

from __future__ import annotations

import gzip
import json

import pytest

from llm_diagnose.probes.traces import (
    EmptyTraceError,
    TraceFormatError,
    TraceLineError,
    analyze_trace,
    detect_format,
    trace_evidence,
)
from llm_diagnose.probes.traces.readers import read_trace
from llm_diagnose.probes.traces.records import LineLog

MOONCAKE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 27, "input_length": 1024, "output_length": 30, "hash_ids": [0, 1]},
]


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _read(path, fmt, strict=False):
    log = LineLog(str(path), strict)
    return list(read_trace(str(path), fmt, log)), log.report()


def test_mooncake(tmp_path):
    path = _jsonl(tmp_path / "m.jsonl", MOONCAKE)
    assert detect_format(str(path)) == "mooncake"
    recs, report = _read(path, "mooncake")
    assert [r.timestamp_s for r in recs] == [0.0, 0.027]
    assert recs[0].hash_ids == [0, 1, 2] and recs[0].input_tokens == 1100
    # Full blocks only: 1100 tokens fill two 512-token blocks; the second request reuses both.
    p = analyze_trace(path).prefix_reuse
    assert p.hit_tokens == 1024 and p.prompt_tokens == 2124


def test_azure_csv_with_fractional_timestamps(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    assert detect_format(str(path)) == "azure"
    recs, _ = _read(path, "azure")
    assert recs[1].timestamp_s - recs[0].timestamp_s == pytest.approx(4.314579, abs=1e-6)
    assert (recs[0].input_tokens, recs[0].output_tokens) == (374, 44)
    a = analyze_trace(path)
    assert a.content == "lengths only" and a.prefix_reuse is None and "prefix_reuse" in a.not_measured


def test_burstgpt_csv(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,API log\n"
    )
    assert detect_format(str(path)) == "burstgpt"
    recs, _ = _read(path, "burstgpt")
    assert [(r.timestamp_s, r.input_tokens, r.output_tokens) for r in recs] == [(5.0, 472, 18), (45.0, 1087, 0)]


def test_openai_chat_and_completion_logs(tmp_path):
    path = _jsonl(
        tmp_path / "o.jsonl",
        [
            {
                "request": {
                    "model": "m",
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                },
                "response": {"usage": {"prompt_tokens": 12, "completion_tokens": 3}},
                "start_time": "2024-05-01T10:00:00Z",
                "end_time": "2024-05-01T10:00:02Z",
            },
            {
                "model": "m",
                "prompt": "Once upon a time",
                "max_tokens": 5,
                "created": 1714557601,
                "response": {"choices": [{"text": "there was a cat"}]},
                "latency_ms": 500,
            },
        ],
    )
    assert detect_format(str(path)) == "openai"
    recs, _ = _read(path, "openai")
    assert "be brief" in recs[0].text and recs[0].input_tokens == 12 and recs[0].output_tokens == 3
    assert recs[0].end_s - recs[0].timestamp_s == 2.0
    assert recs[1].text == "Once upon a time" and recs[1].output_text == "there was a cat"
    assert recs[1].end_s - recs[1].timestamp_s == pytest.approx(0.5)
    a = analyze_trace(path)
    assert a.output_tokens.count == 2 and a.arrivals.concurrency_source == "completion times"


def test_prompt_jsonl_text_and_token_ids(tmp_path):
    text = _jsonl(tmp_path / "t.jsonl", [{"prompt": "hello there", "output_length": 4, "timestamp": 1.5}])
    ids = _jsonl(tmp_path / "i.jsonl", [{"prompt": [1, 2, 3]}, {"token_ids": [4, 5], "timestamp_ms": 250}])
    assert detect_format(str(text)) == detect_format(str(ids)) == "prompts"
    recs, _ = _read(ids, "prompts")
    assert recs[0].tokens.tolist() == [1, 2, 3] and recs[1].tokens.tolist() == [4, 5] and recs[1].timestamp_s == 0.25
    a = analyze_trace(text)
    assert a.content == "text" and not a.tokenizer_exact and any("approximation" in w for w in a.warnings)


def test_gzip_is_read_as_a_stream(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in MOONCAKE))
    assert detect_format(str(path)) == "mooncake"
    assert analyze_trace(path).requests == 2


def test_corrupt_lines_are_skipped_counted_and_located(tmp_path):
    path = _jsonl(
        tmp_path / "bad.jsonl",
        [
            MOONCAKE[0],
            "{not json",
            "",
            MOONCAKE[1],
            '{"timestamp": 5, "input_length": 10}',
            "[1, 2]",
            '{"timestamp": 9, "hash_ids": [1, -2]}',
        ],
    )
    a = analyze_trace(path, fmt="mooncake")
    assert a.requests == 2 and a.read.skipped == 4
    lines = [n for n, _ in a.read.first_errors]
    assert lines == [2, 5, 6, 7]  # the blank line 3 is neither read nor skipped
    assert "hash_ids" in dict(a.read.first_errors)[5]
    assert any("4 unreadable lines skipped (first at line 2" in w for w in a.warnings)


def test_strict_mode_fails_at_the_line(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", [MOONCAKE[0], MOONCAKE[1], "{oops"])
    with pytest.raises(TraceLineError) as err:
        analyze_trace(path, strict=True)
    assert err.value.line == 3 and f"{path}:3:" in str(err.value)


def test_invalid_utf8_line_is_skipped(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_bytes(json.dumps(MOONCAKE[0]).encode() + b"\n" + b'{"hash_ids": [1], "x": "\xff"}\n')
    a = analyze_trace(path, fmt="mooncake")
    assert a.read.skipped == 1 and a.read.first_errors[0][0] == 2


def test_csv_missing_column_names_it(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,374\n")
    with pytest.raises(TraceFormatError, match="GeneratedTokens"):
        analyze_trace(path, fmt="azure")
    with pytest.raises(TraceFormatError, match="cannot tell the format"):
        detect_format(str(path))


def test_csv_bad_rows_have_line_numbers(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1,m,10,5,15,x\n2,m,ten,5,15,x\n3,m,10\n4,m,10,5,15,x\n"
    )
    a = analyze_trace(path)
    assert a.requests == 2 and [n for n, _ in a.read.first_errors] == [3, 4]


def test_empty_and_unreadable_files(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(EmptyTraceError):
        analyze_trace(empty)
    junk = _jsonl(tmp_path / "j.jsonl", ["{bad", "{worse"])
    with pytest.raises(EmptyTraceError):
        analyze_trace(junk, fmt="prompts")
    with pytest.raises(TraceFormatError, match="no such file"):
        analyze_trace(tmp_path / "missing.jsonl")
    unknown = _jsonl(tmp_path / "k.jsonl", [{"foo": 1}])
    with pytest.raises(TraceFormatError, match="foo"):
        analyze_trace(unknown)


def test_hash_ids_refuse_another_block_size(tmp_path):
    path = _jsonl(tmp_path / "m.jsonl", MOONCAKE)
    with pytest.raises(Exception, match="512"):
        analyze_trace(path, block_size=16)


def test_tokenizer_directory_gives_exact_counts(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "there": 2, "world": 3}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tok.save(str(model_dir / "tokenizer.json"))
    path = _jsonl(tmp_path / "t.jsonl", [{"prompt": "hello there world"}, {"prompt": "hello world"}])
    a = analyze_trace(path, tokenizer=str(model_dir))
    assert a.tokenizer_exact and a.input_tokens.max == 3 and a.input_tokens.count == 2
    items = trace_evidence(a)
    assert not items["inputs.length_p50"].warnings


def test_token_lists_parse_the_same_with_and_without_the_numpy_path(tmp_path):
    from llm_diagnose.probes.traces.readers import _loads_with_token_list

    for raw in (
        b'{"prompt_token_ids": [1, 2, 3], "timestamp": 2}',
        b'{"a": "x\\"tokens\\": [9]", "tokens": []}',
        b'{"prompt": [5,6], "n": 1}',
        b'{"prompt": "text [1, 2]"}',
        b'{"input_ids": [1, 2.5]}',
        b'{"request": {"prompt": [7, 8]}, "model": "m"}',
    ):
        fast = _loads_with_token_list(raw)
        slow = json.loads(raw)
        assert {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in fast.items()} == slow
    bad = _jsonl(tmp_path / "bad.jsonl", ['{"token_ids": [1, -2]}', '{"token_ids": [1, "x"]}', '{"token_ids": [3]}'])
    a = analyze_trace(bad)
    assert a.requests == 1 and [n for n, _ in a.read.first_errors] == [1, 2]


FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "traces"


@pytest.mark.parametrize(
    "name, fmt, requests, content",
    [
        ("mooncake_conversation.jsonl", "mooncake", 5, "hash-ids"),
        ("azure_conv.csv", "azure", 5, "lengths only"),
        ("burstgpt.csv", "burstgpt", 4, "lengths only"),
        ("openai_gateway.jsonl", "openai", 3, "text"),
        ("prompts_token_ids.jsonl", "prompts", 2, "token-ids"),
    ],
)
def test_checked_in_samples_of_each_format(name, fmt, requests, content):
    a = analyze_trace(FIXTURES / name)
    assert (a.format, a.requests, a.content, a.read.skipped) == (fmt, requests, content, 0)
    assert a.input_tokens.count == requests


def test_mooncake_sample_reuse_by_hand():
    # Full blocks: 13, 14, 17, 15, 1. Request 2 reuses 12 blocks of request 1; request 4
    # reuses 14 blocks of request 2 (its own 15th is new); the others share nothing.
    p = analyze_trace(FIXTURES / "mooncake_conversation.jsonl").prefix_reuse
    assert p.hit_tokens == (12 + 14) * 512
    assert p.continuation_requests_fraction == pytest.approx(1 / 5)  # request 4 extends request 2


def test_records_built_directly_equal_the_named_constructor():
    from llm_diagnose.probes.traces.readers import _parse_mooncake
    from llm_diagnose.probes.traces.records import TraceRequest

    r = _parse_mooncake({"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [3, 4]}, 9)
    assert r == TraceRequest(line=9, timestamp_s=1.5, input_tokens=600, output_tokens=7, hash_ids=[3, 4])
    assert len(TraceRequest._fields) == 10  # the direct construction lists all ten fields


# --- the numpy reader of hash-id traces (numeric_lines) against json, line by line -----------------
def _odd_mooncake_lines(rng, odd_share: float = 0.15) -> list[str]:
    """Mooncake lines in the canonical layout, with every kind of line that leaves it mixed in."""

    def line(i):
        ids = [rng.randrange(0, 40)] + list(range(1000 + 10 * i, 1000 + 10 * i + rng.randrange(0, 5)))
        return {
            "timestamp": 27 * i,
            "input_length": 512 * len(ids) - rng.randrange(0, 600),
            "output_length": i % 9,
            "hash_ids": ids,
        }

    odd = [
        lambda i: json.dumps(line(i)).replace(": ", ":"),  # other spacing
        lambda i: json.dumps(dict(reversed(list(line(i).items())))),  # other key order
        lambda i: json.dumps({**line(i), "timestamp": 27.5 * i}),  # a float
        lambda i: json.dumps({**line(i), "hash_ids": [1, -2]}),  # a negative id (skipped)
        lambda i: json.dumps(line(i)).replace("[", "[007, "),  # a leading zero: not JSON (skipped)
        lambda i: json.dumps({**line(i), "hash_ids": [10**16 - 1, 10**15 + 7, 12345678, 123456789]}),  # 16 digits
        lambda i: json.dumps({**line(i), "hash_ids": [10**17 + 3, 4]}),  # 18 digits: json's to read
        lambda i: json.dumps({**line(i), "hash_ids": []}),  # an empty list
        lambda i: "",  # a blank line
        lambda i: json.dumps(line(i)) + "\r",  # a CR LF line end
        lambda i: "{not json",
        lambda i: json.dumps({k: v for k, v in line(i).items() if k != "input_length"}),  # a field missing
        lambda i: json.dumps({**line(i), "extra": 5}),  # a field more
        lambda i: json.dumps({**line(i), "output_length": True}),  # a boolean
    ]
    out = []
    for i in range(300):
        out.append(rng.choice(odd)(i) if rng.random() < odd_share else json.dumps(line(i)))
    return out


@pytest.mark.parametrize("seed, odd_share", [(0, 0.15), (1, 0.15), (2, 0.6)])
@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 21])
def test_numpy_reader_of_hash_ids_reads_what_json_reads(tmp_path, seed, odd_share, chunk_bytes):
    import random

    import numpy as np

    from llm_diagnose.probes.traces.readers import hash_id_records_batch, read_hash_id_batches

    rng = random.Random(seed)
    path = tmp_path / "m.jsonl"
    lines = _odd_mooncake_lines(rng, odd_share)
    text = "\n".join(lines) + ("\n" if seed else "")  # seed 0: no newline after the last line
    path.write_text(text)
    json_records, json_report = _read(path, "mooncake")
    log = LineLog(str(path), False)
    batches = list(read_hash_id_batches(str(path), log, chunk_bytes=chunk_bytes))
    want = hash_id_records_batch(json_records)
    for field in want._fields:
        dtype = getattr(want, field).dtype  # (ids: int64 from numpy, uint64 from json)
        got = np.concatenate([getattr(b, field).astype(dtype) for b in batches])
        assert np.array_equal(got, getattr(want, field), equal_nan=True), field
    assert log.report() == json_report
    assert json_report.skipped > 0 and json_report.requests > 200


def test_hash_id_analysis_is_the_same_through_json(tmp_path, monkeypatch):
    import random

    from llm_diagnose.probes.traces import readers
    from tests import trace_synthetic as synthetic

    path = tmp_path / "m.jsonl"
    synthetic.mooncake_hash_ids(path, n=5000, groups=30, shared_blocks=3)
    with open(path, "a") as f:
        f.write("\n".join(_odd_mooncake_lines(random.Random(5))) + "\n")
    fast = analyze_trace(path, kv_capacity_tokens=512 * 200).to_dict()
    monkeypatch.setattr(readers, "_learn_layout", lambda chunk, keys: None)  # every line through json
    slow = analyze_trace(path, kv_capacity_tokens=512 * 200).to_dict()
    fast.pop("taken_at"), slow.pop("taken_at")
    assert fast == slow


def test_line_layout_takes_numbers_only():
    from llm_diagnose.probes.traces.numeric_lines import LineLayout

    assert LineLayout.learn(b'{"timestamp": 1, "hash_ids": [1, 2]}') is not None
    for raw in (
        b'{"timestamp": 1.5, "hash_ids": [1, 2]}',
        b'{"t": true, "hash_ids": [1, 2]}',
        b'{"model": "m", "hash_ids": [1, 2]}',
        b'{"hash_ids": [[1], [2]]}',
        b'{"a": [1, 2], "b": [3, 4]}',
        b'{"hash_ids": [1]}',
        b"[1, 2]",
        b'{"k2": 1, "hash_ids": [1, 2]}',
        b"{not json",
    ):
        assert LineLayout.learn(raw) is None, raw


def test_numeric_lines_values_of_every_length():
    from llm_diagnose.probes.traces.numeric_lines import LineLayout, parse_lines

    values = [0, 7, 10, 99, 12345678, 123456789, 10**15, 10**16 - 1] + [int("9" * k) for k in range(1, 17)]
    rows = [{"n": v, "ids": [v, 1, v]} for v in values]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    parsed, bad = parse_lines(text, LineLayout.learn(text.split(b"\n")[0]))
    assert not bad and parsed.columns["n"].tolist() == values
    assert parsed.items.tolist() == [x for v in values for x in (v, 1, v)]
    assert parsed.counts.tolist() == [3] * len(values)


def test_a_transposed_batch_has_the_fields_of_a_request():
    # The analysis transposes a batch with _Columns(*zip(*batch)): each column must be the field it is named for.
    from llm_diagnose.probes.traces.analysis import _Columns
    from llm_diagnose.probes.traces.records import TraceRequest

    assert _Columns._fields == TraceRequest._fields
    batch = [TraceRequest(line=1, timestamp_s=0.5, text="a"), TraceRequest(line=2, output_tokens=7)]
    cols = _Columns(*zip(*batch))
    assert cols.line == (1, 2) and cols.timestamp_s == (0.5, None) and cols.output_tokens == (None, 7)
    assert cols.text == ("a", None)
