"""Prompt pitfalls found in the prompts: dynamic prefixes and unstable JSON key order."""

from __future__ import annotations

import json

import pytest

from llm_diagnose.diagnose.trace_findings import trace_findings
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes.traces import analyze_trace
from llm_diagnose.probes.traces.pitfalls import classify_varying
from tests import trace_synthetic as synthetic


def _findings(a):
    """The findings `llm-diagnose trace` prints, judged with the default thresholds."""
    return trace_findings(a, Thresholds())


def _ids(a):
    return [f.id for f in _findings(a)]


@pytest.mark.parametrize("kind, category", [("iso", "ISO timestamp"), ("uuid", "uuid"), ("int", "integer id")])
def test_dynamic_prefix_says_where_and_what(tmp_path, kind, category):
    path = tmp_path / f"{kind}.jsonl"
    synthetic.dynamic_text_prompts(path, n=80, kind=kind)
    a = analyze_trace(path)
    assert a.prefix_reuse.token_fraction < 0.05  # the cache sees almost nothing ...
    assert a.similarity.dynamic_fraction > 0.8  # ... of content that is nearly all shared
    (finding,) = [f for f in _findings(a) if f.id == "dynamic-prefix"]
    assert finding.severity == "critical"
    example = finding.evidence["examples"][0]
    assert example["what_varies"] == category
    # "<|im_start|>system\nRequest " precedes the varying part: 27 characters.
    assert example["char_offset"] == 27 and 0 < example["token_offset"] < 16
    assert category in finding.fix and finding.fix.startswith("move the") and "end of the prompt" in finding.fix


def test_prompt_text_is_not_shown_unless_asked(tmp_path):
    path = tmp_path / "iso.jsonl"
    synthetic.dynamic_text_prompts(path, n=40, kind="iso")
    hidden = json.dumps(analyze_trace(path).to_dict())
    assert "2024-03" not in hidden and "helpful assistant" not in hidden
    shown = _findings(analyze_trace(path, show_text=True))[0].evidence["examples"][0]["snippets"]
    assert all(s.startswith("2024-03-") for s in shown)


def test_first_token_differences_are_dynamic_prefix(tmp_path):
    path = tmp_path / "first.jsonl"
    synthetic.first_token_differs(path, n=60, length=512)
    a = analyze_trace(path)
    assert a.similarity.dynamic_fraction > 0.9
    (finding,) = _findings(a)
    assert finding.id == "dynamic-prefix" and finding.evidence["divergence_token"] == 0
    assert finding.evidence["examples"][0]["what_varies"] == "token span of 1"


def test_shared_prefixes_without_dynamic_content_raise_nothing(tmp_path):
    path = tmp_path / "groups.jsonl"
    synthetic.shared_prefix_tokens(path, groups=3, per_group=40, prefix_blocks=8)
    a = analyze_trace(path)
    assert a.similarity.dynamic_fraction < 0.02
    assert _findings(a) == ()


def test_unstable_serialization_counts_reordered_payloads(tmp_path):
    path = tmp_path / "tools.jsonl"
    synthetic.shuffled_tool_chat(path, n=60, shuffle_every=3)
    a = analyze_trace(path)
    s = a.serialization
    assert s.unstable_requests == 19  # requests 3, 6, ..., 57
    assert s.unstable_fraction == pytest.approx(19 / 60) and s.locations == {"tools": 19}
    assert "unstable-serialization" in _ids(a)
    assert "sort_keys=True" in next(f for f in _findings(a) if f.id == "unstable-serialization").fix


def test_stable_serialization_and_json_inside_prompts(tmp_path):
    stable = tmp_path / "stable.jsonl"
    synthetic.shuffled_tool_chat(stable, n=30, shuffle_every=10**9)
    assert analyze_trace(stable).serialization.unstable_requests == 0
    embedded = tmp_path / "embedded.jsonl"
    rows = [
        {"prompt": 'Schema: {"a": 1, "b": {"c": 2, "d": 3}} answer'},
        {"prompt": 'Schema: {"b": {"d": 3, "c": 2}, "a": 1} answer'},
    ]
    embedded.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = analyze_trace(embedded).serialization
    assert s.unstable_requests == 1 and s.locations == {"prompt": 1}


@pytest.mark.parametrize(
    "text, category",
    [
        ("at 2024-05-01 10:11:12.5 UTC", "ISO timestamp"),
        ("id 123e4567-e89b-12d3-a456-426614174000 ok", "uuid"),
        ("user 48213 asks", "integer id"),
        ("req-8f3a22 now", "prefixed id"),
        ("sent 1714557601 here", "unix timestamp"),
        ("hash 9f86d081884c7d65 end", "hex id"),
        ("Dear Alice,", "text"),
    ],
)
def test_classify_varying(text, category):
    start = next(i for i, c in enumerate(text) if c.isdigit() or c == "A")
    assert classify_varying(text, start, start + 1)[0] == category
