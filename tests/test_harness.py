"""The real-engine harness itself: the seeded tiny model, a real vLLM server, transformers serve."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import pytest

from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model
from llm_diagnose.diagnose.demo.vllm_server import TransformersServer, VllmServer, group_members


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def _post(url: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})


def _stream_events(url: str, body: dict) -> list[dict]:
    """The JSON events of a server-sent-event stream, up to `data: [DONE]`."""
    events = []
    with urllib.request.urlopen(_post(url, body), timeout=60) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            events.append(json.loads(data))
    return events


def _hashes(model_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}


def test_tiny_model_is_byte_for_byte_reproducible(tmp_path: Path, tiny_model_dir: Path) -> None:
    a = make_tiny_model(tmp_path / "a")
    assert _hashes(a) == _hashes(tiny_model_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(_hashes(a))
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert make_tiny_model(a) == a  # already complete: reused, not rebuilt
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime


def test_tiny_model_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        make_tiny_model(tmp_path)


def test_tiny_model_loads_with_transformers_and_generates(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("hello the question")["input_ids"]
    assert ids[0] == 1 and tok.decode(ids, skip_special_tokens=True) == "hello the question"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.dtype == torch.bfloat16 and model.config.num_hidden_layers == 2
    # Random weights may pick EOS at any step; min_new_tokens makes the length exact.
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape == (1, len(ids) + 8)


@pytest.mark.real_engine
def test_vllm_models_report_name_and_max_len(vllm_server: VllmServer) -> None:
    models = json.loads(_get(vllm_server.url + "/v1/models"))["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny-llama", 2048)]
    assert "--enable-prefix-caching" in vllm_server.args
    assert vllm_server.log_path.exists()


@pytest.mark.real_engine
def test_vllm_stream_with_ignore_eos_gives_exactly_max_tokens(vllm_server: VllmServer) -> None:
    events = _stream_events(
        vllm_server.url + "/v1/completions",
        {
            "model": "tiny-llama",
            "prompt": "hello the question",
            "max_tokens": 40,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        },
    )
    token_ids = [t for e in events for c in e["choices"] for t in c.get("token_ids") or ()]
    assert len(token_ids) == 40
    assert events[-1]["usage"]["completion_tokens"] == 40
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]


@pytest.mark.real_engine
def test_vllm_metrics_show_prefix_caching_on(vllm_server: VllmServer) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = _get(vllm_server.url + "/metrics").decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (info,) = families["vllm:cache_config_info"].samples
    assert info.labels["enable_prefix_caching"] == "True"


@pytest.mark.real_engine
def test_vllm_server_that_cannot_start_fails_fast_with_its_log(tmp_path: Path, vllm_server_factory: object) -> None:
    with pytest.raises(FileNotFoundError):
        VllmServer(tmp_path / "no-such-model", tmp_path).start()
    (tmp_path / "empty").mkdir()  # a directory, but no model in it
    server = VllmServer(tmp_path / "empty", tmp_path, ready_timeout=120)
    server.start()
    with pytest.raises(RuntimeError, match="exited with code") as err:
        server.wait_ready()
    assert "\n" not in str(err.value) and str(server.log_path) in str(err.value)
    assert group_members(server.pid) == []


@pytest.mark.real_engine
def test_transformers_server_answers_a_completion(tiny_model_dir: Path, tmp_path: Path) -> None:
    with TransformersServer(tiny_model_dir, tmp_path) as server:
        assert "--continuous-batching" not in server.args
        # transformers serve rejects vLLM's ignore_eos (422), so the length is not exact.
        with urllib.request.urlopen(
            _post(server.url + "/v1/completions", {"model": server.model_name, "prompt": "hello", "max_tokens": 8}),
            timeout=60,
        ) as r:
            answer = json.loads(r.read())
        assert isinstance(answer["choices"][0]["text"], str)
        assert 1 <= answer["usage"]["completion_tokens"] <= 8
    assert group_members(server.pid) == []
