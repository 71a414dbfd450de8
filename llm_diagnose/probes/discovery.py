"""What a running server says about itself: engine, version, model, and its configuration.

Read-only GETs, in this order: `/v1/models` (served name, root, `max_model_len`),
`/version`, one `/metrics` page (the engine from its metric prefixes), then the engine's
configuration endpoint where it has one: SGLang `/get_server_info` (later `/server_info`),
vLLM `/server_info?config_format=json` (only with VLLM_SERVER_DEV_MODE=1). Whatever stays
hidden is returned as NotMeasured with the reason and a way to learn it, so the report can
say what it could not see.

A target without engine metrics (a plain `transformers serve`, a home-grown OpenAI-compatible
server, a gateway that routes only /v1/*) is refused, unless the caller measures from the client
(`run --active`: `attach_plain`): then discovery returns it with `plain` saying why the
engine-side figures are missing, and the caller sends the one POST of `check_completions` before
it attaches (`attachment` is the decision, a pure function).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import aiohttp

from llm_diagnose.probes.http import (
    HTTPStatusError,
    JSONOutOfBounds,
    MalformedMetrics,
    MetricsUnavailable,
    NotAnLLMServer,
    ProbeHTTPError,
    RedirectRefused,
    ResponseTooLarge,
    TargetUnreachable,
    get_json,
    get_text,
    make_session,
    normalize_base_url,
    post_json,
    redact_url,
)
from llm_diagnose.probes.metrics.engines import EngineGuess, detect_engine, metrics_hint_for
from llm_diagnose.probes.metrics.exposition import MAX_PAGE_BYTES, MetricsTooLarge, page_too_large, parse_exposition
from llm_diagnose.probes.quantities import (
    BLOCK_SIZE,
    CHUNKED_PREFILL,
    ENGINE_MODEL,
    ENGINE_NAME,
    ENGINE_VERSION,
    GPU_MEMORY_UTILIZATION,
    KV_CACHE_DTYPE,
    KV_OFFLOAD,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    PD_DISAGGREGATION,
    PREFIX_CACHING,
    SPEC_DECODE,
    TARGET_KIND,
    TENSOR_PARALLEL,
    WEIGHT_QUANTIZATION,
)
from llm_diagnose.probes.results import Fact, NotMeasured, Provenance, Result

__all__ = [
    "Discovered",
    "discover",
    "attachment",
    "check_completions",
    "CompletionsCheck",
    "engine_side_not_measured",
    "plain_server_remedy",
    "DEFAULT_METRICS_PATH",
    "PLAIN_SERVER",
]

DEFAULT_METRICS_PATH = "/metrics"
_TRTLLM_PROMETHEUS_PATH = "/prometheus/metrics"  # trtllm-serve: /metrics is JSON iteration stats
# A context length past this is not one (the longest served today are ~10 M tokens): not read.
_MAX_MODEL_LEN = 1 << 40
# What a target with no engine metrics, attached from the client only, is called in messages.
PLAIN_SERVER = "plain OpenAI-compatible server"
# The completions check asks for this many tokens: an answer at all is what it checks.
CHECK_MAX_TOKENS = 1
CHECK_PROMPT = "Hello"
_QUANTIZED_NAME_MARKERS = ("awq", "gptq", "fp8", "int8", "int4", "w4a16", "w8a8", "nvfp4", "gguf", "bnb", "mxfp4")


@dataclass(frozen=True)
class Discovered:
    """What discovery learned. `facts` are evidence entries (key -> Fact or NotMeasured)."""

    base_url: str  # redacted
    metrics_url: str  # the URL to scrape (not redacted: it is what the scraper requests)
    engine: str | None
    version: str | None
    model: str | None
    max_model_len: int | None
    metrics_guess: EngineGuess | None
    server_args: Mapping[str, Any] = field(default_factory=dict)
    endpoints: Mapping[str, str] = field(default_factory=dict)  # path -> "200", "404", "not JSON", ...
    facts: Mapping[str, Result] = field(default_factory=dict)
    metrics_error: str | None = None
    # Where set (only with attach_plain): why the target has no engine metrics. It is then a plain
    # OpenAI-compatible server to the caller, measured from the client once check_completions answers.
    plain: str = ""

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        """(0, 32, 0) from "0.32.0" / "0.10.2rc1+cpu"; None when unknown or unparseable."""
        if not self.version:
            return None
        parts = []
        for piece in self.version.split("+")[0].split("."):
            digits = ""
            for ch in piece:
                if not ch.isdigit():
                    break
                digits += ch
            if not digits:
                break
            parts.append(int(digits))
        return tuple(parts) or None


def _engine_from_owner(owned_by: str | None) -> str | None:
    text = (owned_by or "").lower()
    if "vllm" in text:
        return "vllm"
    if "sglang" in text:
        return "sglang"
    if "tensorrt" in text or "trtllm" in text or "trt-llm" in text:
        return "trtllm"
    return None


async def _try_json(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    endpoints: dict[str, str],
    refused: dict[str, RedirectRefused] | None = None,
) -> Any | None:
    """GET JSON, recording the outcome; None for 404/405/non-JSON (the endpoint is not there), and
    for an answer past the bounds of llm_diagnose.probes.http (larger than MAX_JSON_BYTES, nested
    too deeply, a number that is not finite): what it says is not read.

    A redirect off the origin (or a loop) is not followed (llm_diagnose/probes/http.py): the endpoint counts
    as not there, and the refusal is kept in `refused` for the error if nothing else answers.
    TargetUnreachable and 401/403 propagate: those end discovery.
    """
    try:
        value = await get_json(session, url)
    except RedirectRefused as exc:
        endpoints[path] = "redirect not followed"
        if refused is not None:
            refused.setdefault(path, exc)
        return None
    except HTTPStatusError as exc:
        if exc.status in (401, 403):
            raise
        endpoints[path] = str(exc.status)
        return None
    except ResponseTooLarge as exc:
        endpoints[path] = f"too large (over {exc.limit:,} bytes)"
        return None
    except JSONOutOfBounds as exc:
        endpoints[path] = f"unusable JSON ({exc.reason})"
        return None
    except NotAnLLMServer:
        endpoints[path] = "not JSON"
        return None
    endpoints[path] = "200"
    return value


async def discover(
    base_url: str,
    *,
    metrics_url: str | None = None,
    session: aiohttp.ClientSession | None = None,
    require_metrics: bool = True,
    attach_plain: bool = False,
) -> Discovered:
    """Identify the server at `base_url` and read the configuration it exposes.

    `attach_plain` (run --active): a target with no engine metrics at the default metrics URL is
    returned with `plain` set instead of refused (see `attachment`); the caller confirms with
    `check_completions` before it sends anything else.

    Raises:
        InvalidTargetURL: `base_url` is not an http(s) URL.
        TargetUnreachable: nothing answers at `base_url` ("is the server running at URL?").
        HTTPStatusError: 401/403 (the message names the API-key variable).
        NotAnLLMServer: HTTP answers, but neither /v1/models nor engine metrics exist.
        MetricsUnavailable: an LLM server without engine metrics (only with `require_metrics`).
        MalformedMetrics: /metrics answered with text the Prometheus parser rejects
            (only with `require_metrics`).
        RedirectRefused: /metrics (with `require_metrics`), or /v1/models when nothing else
            answers, redirected off the target's origin or in a loop; the message says where.
        None of the last four with `attach_plain` where `metrics_url` is not given.
    """
    base = normalize_base_url(base_url)
    own = session is None
    session = session or make_session()
    try:
        return await _discover(session, base, metrics_url, require_metrics, attach_plain)
    finally:
        if own:
            await session.close()


# What `attachment` decides.
ENGINE, PLAIN, NOT_LLM, NO_METRICS, WITHOUT_METRICS = "engine", "plain", "not-llm", "no-metrics", "without-metrics"


def attachment(
    *, engine_metrics: bool, says_llm: bool, metrics_url_given: bool, require_metrics: bool, attach_plain: bool
) -> str:
    """How a target is met, from what discovery saw. Pure.

    - ENGINE: its engine metrics are there: read them.
    - PLAIN: none, and the caller measures from the client (`attach_plain`): attach it as a plain
      OpenAI-compatible server once POST /v1/completions answers. Not where the user named the
      metrics URL: metrics missing there are a mistake to report, not a server to work around.
    - NOT_LLM: none, and nothing else says it is an LLM server (no model listed, no engine, no
      version): NotAnLLMServer.
    - NO_METRICS: an LLM server without engine metrics, for a caller that needs them: MetricsUnavailable.
    - WITHOUT_METRICS: the same, for a caller that reads what there is (`require_metrics=False`).
    """
    if engine_metrics:
        return ENGINE
    if attach_plain and not metrics_url_given:
        return PLAIN
    if not says_llm:
        return NOT_LLM
    return NO_METRICS if require_metrics else WITHOUT_METRICS


def plain_server_remedy(engine: str | None) -> str:
    """What would measure the engine-side figures a plain server does not expose."""
    if engine and engine != "pytorch":  # a gateway in front of a known engine
        return (
            "give --metrics-url where the engine's own /metrics is (a gateway may route only /v1/*); "
            + metrics_hint_for(engine)
        )
    return (
        f"the in-process PyTorch probe measures them: {metrics_hint_for('pytorch')}, "
        "then pass --metrics-url with that page"
    )


def _not_attached_advice(engine: str | None) -> str:
    """The end of the error for a target without engine metrics, for a run that sends nothing."""
    instrument = ", or start it under `llm-diagnose instrument -- CMD ...`" if not engine else ""
    return f"pass --active to measure it from the client as a {PLAIN_SERVER}{instrument}"


async def _discover(
    session: aiohttp.ClientSession, base: str, metrics_url: str | None, require_metrics: bool, attach_plain: bool
) -> Discovered:
    endpoints: dict[str, str] = {}
    refused: dict[str, RedirectRefused] = {}
    shown = redact_url(base)
    # The first request tells whether anything listens: TargetUnreachable propagates from here.
    models = await _try_json(session, base + "/v1/models", "/v1/models", endpoints, refused)
    version_doc = await _try_json(session, base + "/version", "/version", endpoints)

    data = models.get("data") if isinstance(models, dict) else None
    model_entries: list[Any] = data if isinstance(data, list) else []
    first = model_entries[0] if model_entries and isinstance(model_entries[0], dict) else {}
    owner_engine = _engine_from_owner(first.get("owned_by"))

    murl = metrics_url or base + DEFAULT_METRICS_PATH
    guess, metrics_error, metrics_exc = await _probe_metrics(session, murl, endpoints)
    if guess is None and metrics_url is None and endpoints.get(DEFAULT_METRICS_PATH) == "JSON":
        murl = base + _TRTLLM_PROMETHEUS_PATH  # trtllm-serve keeps Prometheus text here
        guess, metrics_error, metrics_exc = await _probe_metrics(session, murl, endpoints, _TRTLLM_PROMETHEUS_PATH)

    engine = (guess.engine if guess and guess.engine else None) or owner_engine
    server_args: dict[str, Any] = {}
    if engine in (None, "sglang"):
        for path in ("/get_server_info", "/server_info"):
            doc = await _try_json(session, base + path, path, endpoints)
            if isinstance(doc, dict) and ("model_path" in doc or "tp_size" in doc):
                server_args, engine = doc, engine or "sglang"
                break
    if engine == "vllm":
        doc = await _try_json(session, base + "/server_info?config_format=json", "/server_info", endpoints)
        if isinstance(doc, dict):
            # Only the engine configuration: the same answer carries the server's environment.
            server_args = {"vllm_config": doc.get("vllm_config")}

    version = None
    if isinstance(version_doc, dict) and isinstance(version_doc.get("version"), str):
        version = version_doc["version"]
    elif isinstance(server_args.get("version"), str):
        version = server_args["version"]

    decision = attachment(
        engine_metrics=guess is not None and guess.engine is not None,
        says_llm=bool(model_entries) or engine is not None or version is not None,
        metrics_url_given=metrics_url is not None,
        require_metrics=require_metrics,
        attach_plain=attach_plain,
    )
    if decision == NOT_LLM:
        if isinstance(metrics_exc, RedirectRefused):  # where they redirected, and why it was not followed
            raise metrics_exc
        if "/v1/models" in refused:
            raise refused["/v1/models"]
        raise NotAnLLMServer(
            f"{shown} answers HTTP but is not an LLM serving engine: /v1/models gave "
            f"{endpoints.get('/v1/models', 'nothing')} and {redact_url(murl)} has no vllm:/sglang:/trtllm metrics "
            "(expected vLLM, SGLang or TensorRT-LLM; is the URL the engine's API port?)"
            + (
                f"; if it is a {PLAIN_SERVER} (transformers serve, a gateway), {_not_attached_advice(None)}"
                if metrics_url is None
                else ""
            ),
            base,
        )
    if decision == NO_METRICS:
        if isinstance(metrics_exc, (MalformedMetrics, RedirectRefused)):
            raise metrics_exc
        advice = "" if metrics_url is not None else f"; or {_not_attached_advice(engine)}"
        raise MetricsUnavailable(
            f"{shown} is an LLM server ({engine or 'engine unknown'}) but {redact_url(murl)} "
            f"{metrics_error or 'serves no engine metrics'}: {metrics_hint_for(engine)}{advice}",
            murl,
        )
    plain = ""
    if decision == PLAIN:
        listed = endpoints.get("/v1/models", "nothing")
        if listed == "200":
            listed += f", listing {len(model_entries) or 'no'} model(s)"
        plain = (
            f"{shown} has no engine metrics ({redact_url(murl)} {metrics_error or 'serves no engine metrics'}; "
            f"/v1/models gave {listed})"
        )

    model = first.get("id") if isinstance(first.get("id"), str) else None
    max_len = first.get("max_model_len")
    max_model_len = (
        int(max_len)
        if isinstance(max_len, (int, float)) and not isinstance(max_len, bool) and 1 <= max_len <= _MAX_MODEL_LEN
        else None
    )
    facts = _facts(base, engine, version, guess, first, model_entries, max_model_len, server_args, endpoints)
    return Discovered(
        base_url=shown,
        metrics_url=murl,
        engine=engine,
        version=version,
        model=model,
        max_model_len=max_model_len,
        metrics_guess=guess,
        server_args=MappingProxyType(server_args),
        endpoints=MappingProxyType(endpoints),
        facts=MappingProxyType(facts),
        metrics_error=metrics_error,
        plain=plain,
    )


async def _probe_metrics(
    session: aiohttp.ClientSession,
    url: str,
    endpoints: dict[str, str],
    path: str = DEFAULT_METRICS_PATH,
) -> tuple[EngineGuess | None, str | None, ProbeHTTPError | None]:
    try:
        answer = await get_text(session, url, max_bytes=MAX_PAGE_BYTES)
    except ResponseTooLarge as exc:  # bounded like every scrape: a huge page is refused, not parsed
        endpoints[path] = "too large"
        err = page_too_large(redact_url(url), exc.limit)
        return None, f"serves a page over the {exc.limit / (1 << 20):g} MiB limit (MAX_PAGE_BYTES)", err
    except RedirectRefused as exc:  # not followed: another host's metrics are not the target's
        endpoints[path] = "redirect not followed"
        return None, "redirects elsewhere", exc
    except HTTPStatusError as exc:
        if exc.status in (401, 403):
            raise
        endpoints[path] = str(exc.status)
        return None, f"answered HTTP {exc.status}", exc
    if answer.text.lstrip()[:1] in ("{", "["):
        endpoints[path] = "JSON"
        return None, "serves JSON, not Prometheus text", None
    try:
        scrape = parse_exposition(answer.text, answer.url)
    except MetricsTooLarge as exc:
        endpoints[path] = "too large"
        exc.url = answer.url
        return None, f"lists more than {exc.limit:,} series (limit {exc.limit_name})", exc
    except MalformedMetrics as exc:
        endpoints[path] = "malformed"
        exc.url = answer.url
        return None, "serves text the Prometheus parser rejects", exc
    endpoints[path] = "200"
    guess = detect_engine(scrape)
    return guess, (None if guess.engine else "serves no vllm:/sglang:/trtllm engine metrics"), None


def engine_side_not_measured(found: Discovered, keys: Iterable[str]) -> dict[str, Result]:
    """NotMeasured for each of `keys` (the engine's own figures: the passive window's) where a
    plain server was attached: why they are missing and what would measure them. Discovery's
    facts stay where it found one (a model, a context length)."""
    remedy = plain_server_remedy(found.engine)
    hole = NotMeasured(
        f"not measured here, because {found.plain}: attached as a {PLAIN_SERVER}, measured from the client only",
        remedy,
        Provenance("discovery", found.base_url),
    )
    out: dict[str, Result] = {}
    for key in keys:
        known = found.facts.get(key)
        out[key] = known if isinstance(known, Fact) else hole
    out[TARGET_KIND] = Fact(PLAIN_SERVER, Provenance("discovery", found.base_url), note=remedy)
    return out


@dataclass(frozen=True)
class CompletionsCheck:
    """What the completions check got: one line to print, and the model the answer named (a
    server may name it otherwise than it accepts it: transformers serve answers 'PATH@main' to
    requests that must say 'PATH', so it is a fact to report, not a name to send)."""

    description: str
    answered_model: str | None
    elapsed_s: float

    def model_fact(self, url: str) -> Fact | None:
        if not self.answered_model:
            return None
        return Fact(self.answered_model, Provenance("http-post", url), note="named in the completion check's answer")


async def check_completions(
    session: aiohttp.ClientSession, base_url: str, model: str | None, *, timeout_s: float
) -> CompletionsCheck:
    """The one POST that tells a plain server from anything else: a completion of CHECK_MAX_TOKENS
    token(s) asked of /v1/completions (naming `model` where known; a server pinned to one model
    serves it when none is named), within `timeout_s`.

    Raises:
        NotAnLLMServer: it answered anything but a completion (the message says what, and what to do).
        TargetUnreachable: nothing answered within `timeout_s`, or the connection broke.
        HTTPStatusError: 401/403 (the message names the API-key variable).
    """
    base = normalize_base_url(base_url)
    url = base + "/v1/completions"
    body: dict[str, Any] = {"prompt": CHECK_PROMPT, "max_tokens": CHECK_MAX_TOKENS, "stream": False}
    if model:
        body = {"model": model, **body}
    shown = redact_url(url)
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            answer = await post_json(session, url, body)
    except TimeoutError:
        raise TargetUnreachable(
            f"POST {shown} did not answer within {timeout_s:g} s: is the server overloaded or hung?", url
        ) from None
    except HTTPStatusError as exc:
        if exc.status in (401, 403):
            raise
        said = " ".join(exc.body.split())[:200]
        named = f"model {model!r}" if model else "no model (/v1/models listed none)"
        raise NotAnLLMServer(
            f"POST {shown} (asking for {named}) answered HTTP {exc.status}"
            + (f" ({said})" if said else "")
            + ": not attached; if it serves completions under another model name, pass --model NAME",
            url,
        ) from None
    except NotAnLLMServer as exc:
        raise NotAnLLMServer(f"POST {shown} did not answer with a completion: {exc}", url) from None
    elapsed = time.monotonic() - t0
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices:
        raise NotAnLLMServer(
            f"POST {shown} answered JSON without completion choices: not an OpenAI-compatible server", url
        )
    named_model = answer.get("model") if isinstance(answer, dict) else None
    served = named_model if isinstance(named_model, str) and named_model.strip() else None
    line = f"POST {shown} answered a completion in {elapsed:.2f} s" + (f" (model {served!r})" if served else "")
    return CompletionsCheck(line, served, elapsed)


# --- facts -------------------------------------------------------------------------------
def _facts(
    base: str,
    engine: str | None,
    version: str | None,
    guess: EngineGuess | None,
    first: Mapping[str, Any],
    model_entries: list[Any],
    max_model_len: int | None,
    server_args: Mapping[str, Any],
    endpoints: Mapping[str, str],
) -> dict[str, Result]:
    shown = redact_url(base)
    models_prov = Provenance("http-get", shown + "/v1/models")
    facts: dict[str, Result] = {}
    if engine:
        how = "metric-prefix" if guess and guess.engine else "v1-models-owned-by"
        note = guess.describe if guess and guess.engine else f"owned_by={first.get('owned_by')!r}"
        facts[ENGINE_NAME] = Fact(engine, Provenance(how, shown), note=note)
    else:
        facts[ENGINE_NAME] = NotMeasured(
            "the engine could not be identified from /v1/models or /metrics",
            "pass --engine, or check that the URL is the engine's own port",
        )
    if version:
        facts[ENGINE_VERSION] = Fact(
            version,
            Provenance("http-get", shown + ("/version" if endpoints.get("/version") == "200" else "/get_server_info")),
        )
    else:
        hint = guess.version_hint if guess and guess.version_hint else None
        facts[ENGINE_VERSION] = NotMeasured(
            "the server exposes no /version" + (f"; its metric names suggest {hint}" if hint else ""),
            "vLLM: GET /version exists in every release; SGLang: /get_server_info carries 'version'",
        )
    if isinstance(first.get("id"), str):
        served = [m.get("id") for m in model_entries if isinstance(m, dict)]
        extra = f"; also served: {', '.join(map(str, served[1:]))}" if len(served) > 1 else ""
        facts[ENGINE_MODEL] = Fact(first["id"], models_prov, note=f"root {first.get('root')!r}{extra}")
    if max_model_len is not None:
        facts[MAX_MODEL_LEN] = Fact(max_model_len, models_prov)
    if engine == "sglang" and server_args:
        facts.update(_sglang_facts(shown, server_args))
    elif engine == "vllm" and server_args:
        facts.update(_vllm_dev_facts(shown, server_args))
    _add_unseen(facts, engine, first)
    return facts


def _sglang_facts(shown: str, args: Mapping[str, Any]) -> dict[str, Result]:
    prov = Provenance("http-get", shown + "/get_server_info")
    facts: dict[str, Result] = {}

    def put(key: str, value: Any, note: str = "") -> None:
        if isinstance(value, bool) or (
            isinstance(value, (int, float, str)) and not (isinstance(value, float) and not math.isfinite(value))
        ):
            facts[key] = Fact(value, prov, note=note)

    put(TENSOR_PARALLEL, args.get("tp_size"), "server argument tp_size")
    if isinstance(args.get("max_running_requests"), int):
        put(MAX_NUM_SEQS, args["max_running_requests"], "server argument max_running_requests")
    else:
        states = args.get("internal_states")
        eff = (
            states[0].get("effective_max_running_requests_per_dp")
            if isinstance(states, list) and states and isinstance(states[0], dict)
            else None
        )
        if isinstance(eff, int):
            put(MAX_NUM_SEQS, eff, "effective_max_running_requests_per_dp (max_running_requests was not set)")
    chunk = args.get("chunked_prefill_size")
    if isinstance(chunk, int):
        put(CHUNKED_PREFILL, chunk > 0, f"chunked_prefill_size={chunk}")
        if chunk > 0:  # the prefill tokens one step takes: the active experiments size prompts against it
            put(MAX_NUM_BATCHED_TOKENS, chunk, "server argument chunked_prefill_size")
    if "disable_radix_cache" in args:
        put(PREFIX_CACHING, not bool(args["disable_radix_cache"]), f"disable_radix_cache={args['disable_radix_cache']}")
    if isinstance(args.get("quantization"), str):
        put(WEIGHT_QUANTIZATION, args["quantization"], "server argument quantization")
    if isinstance(args.get("kv_cache_dtype"), str):
        put(KV_CACHE_DTYPE, args["kv_cache_dtype"])
    if isinstance(args.get("page_size"), int):
        put(BLOCK_SIZE, args["page_size"], "server argument page_size")
    if isinstance(args.get("mem_fraction_static"), (int, float)):
        put(GPU_MEMORY_UTILIZATION, float(args["mem_fraction_static"]), "mem_fraction_static")
    if "speculative_algorithm" in args:
        algo = args.get("speculative_algorithm")
        put(SPEC_DECODE, algo not in (None, "", "None"), f"speculative_algorithm={algo!r}")
    if "disaggregation_mode" in args:
        mode = args.get("disaggregation_mode")
        put(PD_DISAGGREGATION, mode not in (None, "null", ""), f"disaggregation_mode={mode!r}")
    if "enable_hierarchical_cache" in args:
        put(KV_OFFLOAD, bool(args["enable_hierarchical_cache"]), "enable_hierarchical_cache (HiCache)")
    return facts


def _dig(doc: Mapping[str, Any], *path: str) -> Any:
    cur: Any = doc
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    return cur


def _vllm_dev_facts(shown: str, doc: Mapping[str, Any]) -> dict[str, Result]:
    """Facts from vLLM's dev-mode /server_info (?config_format=json; older releases send text)."""
    prov = Provenance("http-get", shown + "/server_info")
    config = doc.get("vllm_config", doc)
    facts: dict[str, Result] = {}
    lookups: dict[str, tuple[str, ...]]  # evidence key -> where the config holds it
    if isinstance(config, str):
        config = _parse_config_text(config)
        lookups = {
            TENSOR_PARALLEL: ("tensor_parallel_size",),
            WEIGHT_QUANTIZATION: ("quantization",),
            CHUNKED_PREFILL: ("enable_chunked_prefill",),
            PREFIX_CACHING: ("enable_prefix_caching",),
            KV_CACHE_DTYPE: ("kv_cache_dtype",),
        }
    else:
        lookups = {
            TENSOR_PARALLEL: ("parallel_config", "tensor_parallel_size"),
            MAX_NUM_SEQS: ("scheduler_config", "max_num_seqs"),
            MAX_NUM_BATCHED_TOKENS: ("scheduler_config", "max_num_batched_tokens"),
            CHUNKED_PREFILL: ("scheduler_config", "enable_chunked_prefill"),
            WEIGHT_QUANTIZATION: ("model_config", "quantization"),
            PREFIX_CACHING: ("cache_config", "enable_prefix_caching"),
            KV_CACHE_DTYPE: ("cache_config", "cache_dtype"),
        }
    for key, path in lookups.items():
        value = _dig(config, *path) if isinstance(config, Mapping) else None
        if key == WEIGHT_QUANTIZATION and value in (None, "None"):
            value = "none"  # the full config names the method when there is one
        if isinstance(value, (bool, int, float, str)):
            facts[key] = Fact(value, prov, note="VLLM_SERVER_DEV_MODE /server_info: " + ".".join(path))
    if isinstance(config, Mapping) and "speculative_config" in config:
        facts[SPEC_DECODE] = Fact(
            config.get("speculative_config") not in (None, "None", {}), prov, note="speculative_config in /server_info"
        )
    return facts


def _parse_config_text(text: str) -> dict[str, str | bool | int]:
    """`key=value, key=value` pairs of vLLM's one-line config repr (True/False and digits read as
    booleans and integers; other values stay strings)."""
    out: dict[str, str | bool | int] = {}
    for part in text.split(", "):
        key, sep, raw = part.partition("=")
        if sep and key.strip().isidentifier():
            value = raw.strip().strip("'\"")
            if value in ("True", "False"):
                out[key.strip()] = value == "True"
            elif value.isdigit():
                out[key.strip()] = int(value)
            else:
                out[key.strip()] = value
    return out


def _add_unseen(facts: dict[str, Result], engine: str | None, first: Mapping[str, Any]) -> None:
    """NotMeasured for configuration the server keeps to itself, with ways to learn it."""
    dev = (
        "start vLLM with VLLM_SERVER_DEV_MODE=1 to expose /server_info"
        if engine == "vllm"
        else "SGLang: /get_server_info lists every server argument"
        if engine == "sglang"
        else "the engine's launch command shows it"
    )
    name = f"{first.get('id', '')} {first.get('root', '')}".lower()
    marker = next((m for m in _QUANTIZED_NAME_MARKERS if m in name), None)
    unseen = {
        MAX_NUM_SEQS: (
            "the server does not expose its cap on concurrent sequences (max_num_seqs)",
            "batch.running_cap_estimate estimates it from the running-batch plateau while requests wait; or " + dev,
        ),
        TENSOR_PARALLEL: (
            "the server does not expose its tensor-parallel degree",
            "recent vLLM completions carry it in system_fingerprint (tpN); or " + dev,
        ),
        WEIGHT_QUANTIZATION: (
            "the server does not expose its weight quantization"
            + (f" (the model name contains {marker!r})" if marker else ""),
            "read quantization_config in the model's config.json; or " + dev,
        ),
        CHUNKED_PREFILL: (
            "the server does not expose whether chunked prefill is on"
            + (" (vLLM V1 enables it by default)" if engine == "vllm" else ""),
            dev,
        ),
    }
    for key, (reason, hint) in unseen.items():
        facts.setdefault(key, NotMeasured(reason, hint))
