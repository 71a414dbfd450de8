"""The one HTTP chokepoint: sessions, GET helpers, the API key, and errors that say what to do.

Every request llm-diagnose makes to a serving engine goes through here (the scraper, the
discovery of the server's configuration, and later the active load driver), so timeouts,
authentication, redaction and error wording are decided once.

The API key comes from the environment (`LLM_DIAGNOSE_API_KEY`, else `OPENAI_API_KEY`). It is
sent as a Bearer header and never appears in a message, a log line or a file: every URL or
header that leaves this module for text goes through `redact_url` / `redact_headers`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote_plus, urljoin, urlsplit, urlunsplit

import aiohttp

from llm_diagnose.probes.bounded_json import JSONBoundsError, loads_bounded

__all__ = [
    "API_KEY_ENV_VARS",
    "DEFAULT_TIMEOUT_S",
    "ProbeHTTPError",
    "InvalidTargetURL",
    "TargetUnreachable",
    "HTTPStatusError",
    "NotAnLLMServer",
    "MetricsUnavailable",
    "MalformedMetrics",
    "RedirectRefused",
    "ResponseTooLarge",
    "NotJSON",
    "JSONOutOfBounds",
    "HttpText",
    "MAX_REDIRECTS",
    "same_origin",
    "follow_redirect",
    "api_key_from_env",
    "normalize_base_url",
    "redact_url",
    "redact_headers",
    "make_session",
    "get_text",
    "get_json",
    "post_json",
    "decode_json",
    "MAX_JSON_BYTES",
    "response_error_text",
]

API_KEY_ENV_VARS = ("LLM_DIAGNOSE_API_KEY", "OPENAI_API_KEY")  # first one set wins
DEFAULT_TIMEOUT_S = 5.0  # a /metrics page renders in milliseconds; 5 s means "not answering"
DEFAULT_CONNECT_TIMEOUT_S = 3.0
DEFAULT_CONNECTION_LIMIT = 16  # the scraper needs 1; the load driver raises it explicitly
# Below the 5 s after which vLLM's uvicorn closes an idle connection (VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
# uvicorn's own default too). Reusing a connection at the moment the server closes it loses the
# request: seen on a real vLLM, three requests of a ramp at once, on connections a burst had
# opened together 5 s before, which then read as a server that stopped answering.
KEEPALIVE_S = 4.0
REDACTED = "***"
# The longest JSON answer read (/v1/models, /version, /server_info, /tokenize): vLLM's whole
# config in /server_info is ~50 KB; a /v1/models listing hundreds of adapters a few hundred KB.
MAX_JSON_BYTES = 8 << 20
# Same-origin redirects followed before the chain counts as a loop (curl and browsers stop at
# 20-50; an engine's API redirects once at most, e.g. a trailing slash).
MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Query parameters whose value is a credential (compared lower-case): API keys and tokens
# (?api_key=, ?token=), and the signatures of pre-signed URLs: S3's X-Amz-*, GCS's X-Goog-*,
# Azure SAS's sig, an OAuth redirect's code. A signed URL's signature is as good as a password
# until it expires.
_SECRET_QUERY_KEYS = frozenset(
    {
        "access_token", "api-key", "api_key", "apikey", "auth", "awsaccesskeyid", "client_secret", "code",
        "credential", "googleaccessid", "id_token", "key", "passwd", "password", "pwd", "refresh_token",
        "secret", "session_token", "sig", "signature", "token", "x-amz-credential", "x-amz-security-token",
        "x-amz-signature", "x-goog-credential", "x-goog-signature",
    }
)  # fmt: skip
# ... and any parameter whose name holds one of these (X-Custom-Token, upload_signature, ...).
_SECRET_QUERY_WORDS = ("token", "secret", "signature", "password", "credential", "api_key", "apikey", "api-key")
_QUERY_SEPARATORS = re.compile(r"([&;])")  # ';' too: some servers split on it, so a value may end there
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})


# --- errors ---------------------------------------------------------------------------------
class ProbeHTTPError(Exception):
    """Base of the errors below: `str(error)` is one actionable line with a redacted URL."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = None if url is None else redact_url(url)


class InvalidTargetURL(ProbeHTTPError):
    """The target is not a usable http(s) URL."""


class TargetUnreachable(ProbeHTTPError):
    """Connection refused, DNS failure, timeout, or the server hung up mid-answer."""


class HTTPStatusError(ProbeHTTPError):
    """The server answered with a non-2xx status (discovery treats 404 as "not exposed")."""

    def __init__(self, message: str, url: str | None = None, status: int = 0, body: str = "") -> None:
        super().__init__(message, url)
        self.status = status
        self.body = body  # the start of the answer: a Prometheus API error explains itself there


class NotAnLLMServer(ProbeHTTPError):
    """Something answers HTTP at the URL, but not an OpenAI-compatible serving engine."""


class MetricsUnavailable(ProbeHTTPError):
    """No engine metrics: /metrics is missing, or serves no vllm:/sglang:/trtllm series."""


class RedirectRefused(ProbeHTTPError):
    """The server redirected off its own origin, or in a loop: not followed.

    What another host answers is not the target's measurement, and the API key must not
    travel there, so llm-diagnose follows a redirect only within the requested URL's origin
    (scheme, host and port), at most MAX_REDIRECTS times.
    """


class ResponseTooLarge(ProbeHTTPError):
    """The answer's body is longer than the caller's `max_bytes`: not read further."""

    def __init__(self, message: str, url: str | None = None, limit: int = 0) -> None:
        super().__init__(message, url)
        self.limit = limit


class NotJSON(NotAnLLMServer):
    """The answer is not JSON (an HTML page, a proxy's error page, ...)."""


class JSONOutOfBounds(NotAnLLMServer):
    """The answer is JSON past the bounds (llm_diagnose.probes.bounded_json): nested too deeply, or
    holding NaN, Infinity or a number beyond a float; `reason` says which."""

    def __init__(self, message: str, url: str | None = None, reason: str = "") -> None:
        super().__init__(message, url)
        self.reason = reason


class MalformedMetrics(ProbeHTTPError):
    """/metrics answered with text the Prometheus parser rejects; quotes the first bad line."""

    def __init__(
        self, message: str, url: str | None = None, line_number: int | None = None, line: str | None = None
    ) -> None:
        super().__init__(message, url)
        self.line_number = line_number
        self.line = line


# --- URLs, keys, redaction ------------------------------------------------------------------
def api_key_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The API key to send, from the first of API_KEY_ENV_VARS that is set and not empty."""
    env = os.environ if environ is None else environ
    for var in API_KEY_ENV_VARS:
        value = env.get(var, "").strip()
        if value:
            return value
    return None


def normalize_base_url(url: str) -> str:
    """`localhost:8000` -> `http://localhost:8000`; drops a trailing slash.

    Raises:
        InvalidTargetURL: not http(s), or no host.
    """
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidTargetURL(
            f"{redact_url(url)!r} is not an http(s) URL with a host (expected e.g. http://127.0.0.1:8000)", None
        )
    try:
        _ = parts.port  # raises ValueError on a port that is not a number
    except ValueError:
        raise InvalidTargetURL(f"{redact_url(url)!r} has an invalid port", None) from None
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), parts.query, ""))


def _is_secret_param(name: str) -> bool:
    key = unquote_plus(name).strip().lower()
    return key in _SECRET_QUERY_KEYS or any(word in key for word in _SECRET_QUERY_WORDS)


def _redact_params(text: str) -> str:
    """`a=1&sig=xyz` -> `a=1&sig=***`: each secret parameter keeps its name, the rest stays as written."""
    out = []
    for piece in _QUERY_SEPARATORS.split(text):
        name, eq, _ = piece.partition("=")
        out.append(f"{name}={REDACTED}" if eq and _is_secret_param(name) else piece)
    return "".join(out)


def redact_url(url: str) -> str:
    """The URL fit to print or store: user:password and secret query values replaced by ***.

    Every URL that leaves this package for text (a message, a progress line, a run folder's
    files) goes through here. Userinfo goes whole (`http://***@host`); a query parameter named
    like a credential or a signature (see _SECRET_QUERY_KEYS) keeps its name, not its value
    (`?sig=***&X-Amz-Signature=***`), and so does one in a fragment (`#access_token=***`). A URL
    typed without a scheme (`user:pw@host:8000`) is redacted the same way.
    """
    bare = "://" not in url and not url.startswith("//")
    try:
        parts = urlsplit("//" + url if bare else url)
    except ValueError:
        return REDACTED  # unparseable: printing it could leak whatever it holds
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
    shown = urlunsplit((parts.scheme, netloc, parts.path, _redact_params(parts.query), _redact_params(parts.fragment)))
    return shown[2:] if bare and shown.startswith("//") else shown


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy of the headers fit to print: credentials replaced by *** (the scheme kept)."""
    out = {}
    for name, value in headers.items():
        if name.lower() in _SECRET_HEADERS:
            scheme = value.split(" ", 1)[0] if " " in value else ""
            out[name] = f"{scheme} {REDACTED}".strip()
        else:
            out[name] = value
    return out


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs share scheme, host and port (a port left out is the scheme's default).

    127.0.0.1 and localhost are different origins here, as in a browser: the tool cannot know
    they are one server, so it does not assume so.
    """
    try:
        return _origin(a) == _origin(b)
    except ValueError:  # an unparseable port
        return False


def follow_redirect(origin_url: str, current_url: str, status: int, location: str | None, hops: int) -> str | None:
    """Where a 3xx answer to `current_url` may be followed, or None when it is not a redirect.

    `origin_url` is the URL first requested (its origin is the only one allowed); `hops` counts
    the redirects already followed. The answer is absolute.

    Raises:
        RedirectRefused: the Location leaves the origin, cannot be parsed, or the chain is
            longer than MAX_REDIRECTS (a loop). The message says where it pointed and why it was
            not followed.
    """
    if status not in REDIRECT_STATUSES or not location:
        return None
    shown = redact_url(current_url)
    root = redact_url(_server_root(origin_url))
    try:
        target = urljoin(current_url, location.strip())
        _origin(target)
    except ValueError:
        raise RedirectRefused(
            f"{shown} answered HTTP {status} with a Location that is not a URL ({location[:80]!r}): not followed",
            current_url,
        ) from None
    if not same_origin(origin_url, target):
        raise RedirectRefused(
            f"{shown} answered HTTP {status} redirecting to {redact_url(_server_root(target))}, another origin "
            f"than {root}: not followed (llm-diagnose measures only the server it is pointed at, and the API key "
            "stays there); if that server is the one to diagnose, pass its URL directly",
            current_url,
        )
    if hops >= MAX_REDIRECTS:
        raise RedirectRefused(
            f"{redact_url(origin_url)} redirected {hops} times within {root} and was still "
            f"redirecting (HTTP {status} to {redact_url(target)}): a redirect loop; check the URL, "
            "or the proxy in front of the server",
            current_url,
        )
    return target


# --- sessions and requests ------------------------------------------------------------------
def make_session(
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    connection_limit: int = DEFAULT_CONNECTION_LIMIT,
    api_key: str | None = "env",
    trust_env: bool = False,
    trace_configs: list[aiohttp.TraceConfig] | None = None,
) -> aiohttp.ClientSession:
    """An aiohttp session for talking to one serving engine.

    `api_key="env"` reads the key from the environment; None sends no key. `trust_env=False`
    keeps HTTP(S)_PROXY out of the way: diagnosis targets are usually on loopback or the
    cluster network, where a corporate proxy would only add latency or refuse the request.
    `trace_configs`: aiohttp's request tracing (the load client times each request's phases).
    Must be created (and closed) inside a running event loop.
    """
    key = api_key_from_env() if api_key == "env" else api_key
    headers = {"User-Agent": "llm-diagnose"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
    # Keep-alive on: the scraper reuses one connection, so a scrape costs one request, not a
    # TCP handshake. DNS is cached so a slow resolver is paid once per run. An idle connection
    # is dropped after KEEPALIVE_S, before the server drops it (see KEEPALIVE_S).
    connector = aiohttp.TCPConnector(limit=connection_limit, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(
        timeout=timeout, headers=headers, connector=connector, trust_env=trust_env, trace_configs=trace_configs
    )


@dataclass(frozen=True)
class HttpText:
    """A successful GET: status, body, and how long it took on the monotonic clock."""

    url: str  # redacted
    status: int
    text: str
    content_type: str
    elapsed_s: float


def _server_root(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _status_message(status: int, url: str) -> str:
    shown = redact_url(url)
    if status in (401, 403):
        return (
            f"{shown} answered HTTP {status}: the server wants an API key; "
            f"set {API_KEY_ENV_VARS[0]} (or {API_KEY_ENV_VARS[1]}) to the key it was started with"
        )
    if status == 404:
        return f"{shown} answered HTTP 404 (not found)"
    return f"{shown} answered HTTP {status}"


async def _read_text(resp: aiohttp.ClientResponse, max_bytes: int | None, url: str) -> str:
    """The body as text; past `max_bytes` (decompressed) ResponseTooLarge, without reading the rest."""
    if max_bytes is None:
        return await resp.text(errors="replace")
    too_large = ResponseTooLarge(
        f"{redact_url(url)} answered with more than {max_bytes:,} bytes: not read further", url, max_bytes
    )
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    # The declared charset, else UTF-8 (aiohttp's own fallback, and the Prometheus text format's).
    encoding = resp.charset or "utf-8"
    try:
        return b"".join(chunks).decode(encoding, errors="replace")
    except LookupError:  # an unknown charset name
        return b"".join(chunks).decode("utf-8", errors="replace")


async def _request(
    session: aiohttp.ClientSession, method: str, url: str, json_body: object = None, max_bytes: int | None = None
) -> HttpText:
    """One request with every transport failure mapped to an actionable error (GET and POST).

    Redirects are followed here, not by aiohttp, and only within `url`'s origin (see
    RedirectRefused): a 303, or a 301/302 to a POST, continues as a GET, as aiohttp would.
    """
    shown = redact_url(url)
    root = redact_url(_server_root(url))
    t0 = time.monotonic()
    current, hops = url, 0
    try:
        while True:
            async with session.request(method, current, json=json_body, allow_redirects=False) as resp:
                target = follow_redirect(url, current, resp.status, resp.headers.get("Location"), hops)
                if target is None:
                    body = await _read_text(resp, max_bytes, current)
                    elapsed = time.monotonic() - t0
                    if not 200 <= resp.status < 300:
                        raise HTTPStatusError(_status_message(resp.status, current), current, resp.status, body[:2000])
                    return HttpText(redact_url(current), resp.status, body, resp.content_type or "", elapsed)
                if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                    method, json_body = "GET", None
            current, hops = target, hops + 1
    except aiohttp.InvalidURL:
        raise InvalidTargetURL(f"{shown} is not a valid URL", url) from None
    except ValueError as exc:  # aiohttp: credentials in the URL beside the Bearer header
        if "AUTHORIZATION" in str(exc).upper():
            raise InvalidTargetURL(
                f"{shown} carries user:password credentials while an API key is set: drop them "
                f"from the URL and keep the key in {API_KEY_ENV_VARS[0]}",
                url,
            ) from None
        raise
    except aiohttp.ClientConnectorError as exc:
        why = exc.os_error.strerror if exc.os_error and exc.os_error.strerror else str(exc.os_error or exc)
        raise TargetUnreachable(
            f"cannot connect to {root} ({why.lower()}): is the server running at {root}?", url
        ) from None
    except (TimeoutError, aiohttp.ServerTimeoutError):
        raise TargetUnreachable(
            f"no answer from {shown} within {session.timeout.total:g} s: is the server at {root} overloaded or hung?",
            url,
        ) from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        raise TargetUnreachable(
            f"the connection to {root} broke during {method} {shown} ({type(exc).__name__}): "
            "did the server stop or restart?",
            url,
        ) from None
    except aiohttp.ClientResponseError as exc:  # a garbled HTTP answer: not a web server we know
        raise NotAnLLMServer(
            f"{shown} did not answer with valid HTTP ({response_error_text(exc)}): "
            f"is {root} the serving engine's HTTP port?",
            url,
        ) from None


def response_error_text(exc: aiohttp.ClientResponseError) -> str:
    """What went wrong in a ClientResponseError, never empty (aiohttp leaves `message` blank
    for some, e.g. TooManyRedirects, which printed as "()")."""
    return exc.message or (f"HTTP {exc.status}, " if exc.status else "") + type(exc).__name__


def decode_json(answer: HttpText, url: str, *, advice: str = "is this the serving engine's URL?") -> object:
    """The JSON of an answer, within the bounds of llm_diagnose.probes.bounded_json: the one JSON
    reader of what servers send (engines and Prometheus alike). `advice` ends the message.

    Raises:
        NotJSON: the body is not JSON (the message quotes its first line).
        JSONOutOfBounds: JSON nested too deeply, or holding a number that is not finite.
    """
    try:
        return loads_bounded(answer.text)
    except JSONBoundsError as exc:
        if not exc.reason.startswith("not JSON"):
            raise JSONOutOfBounds(
                f"{answer.url} answered JSON that is not read: {exc.reason}; {advice}", url, exc.reason
            ) from None
        first = answer.text.strip().splitlines()[0][:80] if answer.text.strip() else "(empty body)"
        raise NotJSON(
            f"{answer.url} did not answer with JSON (it sent {answer.content_type or 'no type'}: {first!r}): {advice}",
            url,
        ) from None


async def get_text(session: aiohttp.ClientSession, url: str, *, max_bytes: int | None = None) -> HttpText:
    """GET `url` and return its body.

    Raises:
        InvalidTargetURL: the URL cannot be requested.
        TargetUnreachable: refused, DNS failure, timeout, or the connection dropped mid-answer.
        HTTPStatusError: a non-2xx answer (the message says what a 401/403 needs).
        ResponseTooLarge: the body is longer than `max_bytes` (the /metrics scrape's bound).
    """
    return await _request(session, "GET", url, max_bytes=max_bytes)


async def get_json(session: aiohttp.ClientSession, url: str, *, max_bytes: int = MAX_JSON_BYTES) -> object:
    """GET `url` and decode its JSON body (at most `max_bytes`).

    Raises:
        InvalidTargetURL, TargetUnreachable, HTTPStatusError: as `get_text`.
        ResponseTooLarge: the body is longer than `max_bytes`.
        NotJSON, JSONOutOfBounds (both NotAnLLMServer): as `decode_json`.
    """
    return decode_json(await get_text(session, url, max_bytes=max_bytes), url)


async def post_json(session: aiohttp.ClientSession, url: str, body: object) -> object:
    """POST `body` as JSON to `url` and decode the JSON answer (the load driver: /tokenize and
    other small JSON calls; streamed completions are read chunk by chunk in llm_diagnose/probes/load).

    Raises:
        InvalidTargetURL, TargetUnreachable, HTTPStatusError: as `get_text`.
        ResponseTooLarge: the answer is longer than MAX_JSON_BYTES.
        NotJSON, JSONOutOfBounds (both NotAnLLMServer): as `decode_json`.
    """
    return decode_json(await _request(session, "POST", url, json_body=body, max_bytes=MAX_JSON_BYTES), url)
