"""Attaching to a plain OpenAI-compatible server (no engine metrics): the decision, the evidence's
reasons, the completions check, and `run --model`.

The decision (`discovery.attachment`) and the reasons (`engine_side_not_measured`,
`plain_server_remedy`) are pure and tested here without a server. The completions check meets
a REAL web server that is not an LLM server: Python's own `http.server` (the wrong-port case:
it lists a folder on GET and answers 501 to every POST). The real `transformers serve` is in
tests/test_plain_server_live.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.discovery import (
    ENGINE,
    NO_METRICS,
    NOT_LLM,
    PLAIN,
    WITHOUT_METRICS,
    Discovered,
    attachment,
    check_completions,
    discover,
    engine_side_not_measured,
    plain_server_remedy,
)
from llm_diagnose.probes.http import NotAnLLMServer, make_session
from llm_diagnose.probes.results import Fact, NotMeasured, Provenance


# --- the decision --------------------------------------------------------------------------------
def decide(**seen: bool) -> str:
    base = {
        "engine_metrics": False,
        "says_llm": False,
        "metrics_url_given": False,
        "require_metrics": True,
        "attach_plain": False,
    }
    return attachment(**{**base, **seen})


def test_engine_metrics_attach_as_an_engine_whatever_else_was_seen() -> None:
    for says_llm in (False, True):
        for attach_plain in (False, True):
            assert decide(engine_metrics=True, says_llm=says_llm, attach_plain=attach_plain) == ENGINE


def test_without_engine_metrics_an_active_run_attaches_a_plain_server() -> None:
    # transformers serve: /v1/models 500 or empty, no /version, /metrics 404: nothing says "LLM" before the POST.
    assert decide(says_llm=False, attach_plain=True) == PLAIN
    # a gateway in front of vLLM: /v1/models names the engine (owned_by), /metrics is not routed.
    assert decide(says_llm=True, attach_plain=True) == PLAIN


def test_a_run_that_sends_nothing_refuses_a_target_without_engine_metrics() -> None:
    assert decide(says_llm=False) == NOT_LLM
    assert decide(says_llm=True) == NO_METRICS
    assert decide(says_llm=True, require_metrics=False) == WITHOUT_METRICS  # the load read before sending


def test_a_metrics_url_the_user_named_is_never_worked_around() -> None:
    # --metrics-url with nothing there is a mistake to report, even with --active.
    assert decide(says_llm=True, attach_plain=True, metrics_url_given=True) == NO_METRICS
    assert decide(says_llm=False, attach_plain=True, metrics_url_given=True) == NOT_LLM


# --- what the evidence says instead of the engine's figures --------------------------------------
def plain_found(engine: str | None) -> Discovered:
    prov = Provenance("http-get", "http://127.0.0.1:8000/v1/models")
    return Discovered(
        base_url="http://127.0.0.1:8000",
        metrics_url="http://127.0.0.1:8000/metrics",
        engine=engine,
        version=None,
        model="tiny",
        max_model_len=2048,
        metrics_guess=None,
        facts={
            Q.MAX_MODEL_LEN: Fact(2048, prov),
            Q.ENGINE_NAME: NotMeasured("the engine could not be identified", "pass --engine"),
        },
        plain="http://127.0.0.1:8000 has no engine metrics (http://127.0.0.1:8000/metrics answered HTTP 404)",
    )


def test_engine_figures_of_a_plain_server_say_why_and_name_the_in_process_probe() -> None:
    found = plain_found(None)
    items = engine_side_not_measured(found, (Q.KV_USAGE_P95, Q.ENGINE_NAME, Q.MAX_MODEL_LEN))
    for key in (Q.KV_USAGE_P95, Q.ENGINE_NAME):
        hole = items[key]
        assert isinstance(hole, NotMeasured), key
        assert hole.reason.startswith("not measured here, because " + found.plain), hole.reason
        assert "plain OpenAI-compatible server" in hole.reason
        assert "llm-diagnose instrument -- CMD" in hole.hint and "--metrics-url" in hole.hint, hole.hint
    assert items[Q.MAX_MODEL_LEN] == found.facts[Q.MAX_MODEL_LEN]  # what discovery did learn stays


def test_a_gateway_to_a_known_engine_is_told_where_its_metrics_are_not_to_instrument() -> None:
    remedy = plain_server_remedy("vllm")
    assert "--metrics-url" in remedy and "--disable-log-stats" in remedy, remedy
    assert "instrument" not in remedy
    assert "llm-diagnose instrument" in plain_server_remedy(None)
    assert "llm-diagnose instrument" in plain_server_remedy("pytorch")


# --- the completions check against a web server that is not an LLM server ------------------------
class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[str]:
    """Python's http.server on a free loopback port, serving an empty folder."""
    handler = functools.partial(QuietFiles, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def test_a_web_server_that_is_no_llm_server_is_attached_only_pending_the_check_and_fails_it(file_server: str) -> None:
    async def main() -> tuple[Discovered, str]:
        async with make_session() as session:
            found = await discover(file_server, session=session, attach_plain=True)
            with pytest.raises(NotAnLLMServer) as info:
                await check_completions(session, file_server, None, timeout_s=10)
            return found, str(info.value)

    found, error = asyncio.run(main())
    assert found.plain.startswith(f"{file_server} has no engine metrics"), found.plain
    assert "/v1/models gave 404" in found.plain, found.plain
    assert "/v1/completions" in error and "answered HTTP 501" in error and "--model" in error, error


def test_without_active_the_same_server_is_refused_with_both_ways_to_measure_it(file_server: str) -> None:
    with pytest.raises(NotAnLLMServer) as info:
        asyncio.run(discover(file_server))
    line = str(info.value)
    assert "not an LLM serving engine" in line and "\n" not in line
    assert "pass --active to measure it from the client" in line and "llm-diagnose instrument" in line, line


# --- run --model ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty model name"),
        ("   ", "empty model name"),
        ("tiny\x00llama", "control character"),
        ("tiny\nllama", "control character"),
        ("a" * (argtypes.MAX_MODEL_NAME_CHARS + 1), "at most 4,096"),
    ],
)
def test_a_model_name_that_cannot_be_one_is_refused(text: str, why: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        argtypes.model_name(text)


def test_a_model_name_is_taken_as_served() -> None:
    assert argtypes.model_name(" meta-llama/Llama-3.1-8B-Instruct ") == "meta-llama/Llama-3.1-8B-Instruct"
    assert argtypes.model_name("/models/tiny llama") == "/models/tiny llama"  # a folder may hold a space


def test_model_without_active_is_a_one_line_usage_error(tmp_path: Path) -> None:
    from llm_diagnose.diagnose.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "o"), "--model", "tiny"])
    assert code == 2, err.getvalue()
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("llm-diagnose: error:")]
    assert len(lines) == 1 and "--model" in lines[0] and "--active" in lines[0], err.getvalue()
    assert not (tmp_path / "o").exists()  # refused before anything was touched
