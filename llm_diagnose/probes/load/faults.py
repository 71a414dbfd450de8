"""What can go wrong with one streamed request, named so that no fault passes for a response.

Every request the load driver sends ends either normally (the server said why it stopped:
`finish_reason`, then `[DONE]`) or with exactly one `FaultKind`. A faulted request keeps
whatever it measured before the fault (its gaps are real), but it never counts as a
completed response: a stream that was cut after two tokens is not a fast request.

`classify_exception` maps aiohttp/asyncio exceptions to a kind and a one-line detail. It is
the only place that knows aiohttp's exception hierarchy for streaming (llm_diagnose/probes/http.py does
the same for plain GETs, where a fault is an error to raise, not a datum to record).
"""

from __future__ import annotations

import asyncio
import enum

import aiohttp

from llm_diagnose.probes.http import redact_url, response_error_text

__all__ = ["FaultKind", "SERVER_FAULTS", "classify_exception", "classify_status"]


class FaultKind(str, enum.Enum):
    """Why a request did not complete normally (the value is what requests.jsonl holds)."""

    UNREACHABLE = "unreachable"  # connection refused / DNS: nothing listens (a server that stopped)
    CONNECTION_LOST = "connection-lost"  # the server hung up before sending a response
    CUT_OFF = "cut-off"  # the response started streaming and ended without finish_reason / [DONE]
    RATE_LIMITED = "rate-limited"  # HTTP 429
    SERVER_ERROR = "server-error"  # HTTP 5xx
    REJECTED = "rejected"  # HTTP 4xx other than 429 (prompt too long, unknown model, bad key)
    STREAM_ERROR = "stream-error"  # an {"error": ...} event inside a 200 stream
    MALFORMED = "malformed"  # not SSE carrying a JSON chunk of the expected shape (or JSON nested absurdly deep)
    TIMEOUT_CONNECT = "timeout-connect"  # no TCP connection within the connect timeout
    TIMEOUT_IDLE = "timeout-idle"  # no token within the idle timeout (first token or between tokens)
    TIMEOUT_TOTAL = "timeout-total"  # the request outlived its total timeout (or the budget's deadline)
    # The client stopped a stream (phase over, deadline) that had stopped sending mid-response:
    # silent for far longer than its own gaps (StreamTimeouts.stall_s). The server's fault, not ours.
    STALLED = "stalled"
    # Response headers came, then no token (at most comments, keep-alives, empty chunks) for
    # longer than the client's no-progress bound while the server sent no token on any other
    # stream either: a hung engine behind a live HTTP layer (StreamingClient.no_progress_bound_s).
    NO_PROGRESS = "no-progress"
    REDIRECTED = "redirected"  # a 3xx not followed: off the target's origin, a loop, or a POST turned GET
    STOPPED_BY_CLIENT = "stopped-by-client"  # we ended it (phase over, budget spent): not the server's fault
    CLIENT_ERROR = "client-error"  # a bug or resource limit on our side (too many open files, ...)


# Faults that say something about the server (as opposed to our own decision to stop).
SERVER_FAULTS = frozenset(FaultKind) - {FaultKind.STOPPED_BY_CLIENT, FaultKind.CLIENT_ERROR}


# aiohttp >= 3.10 tells a connect timeout from a read timeout; 3.9 has only the read one.
_CONNECT_TIMEOUT: type | tuple = getattr(aiohttp, "ConnectionTimeoutError", ())
_IDLE_TIMEOUT: type = getattr(aiohttp, "SocketTimeoutError", aiohttp.ServerTimeoutError)


def classify_status(status: int) -> FaultKind:
    """The fault kind of a non-200 answer."""
    if status == 429:
        return FaultKind.RATE_LIMITED
    if status >= 500:
        return FaultKind.SERVER_ERROR
    return FaultKind.REJECTED


def classify_exception(exc: BaseException, url: str, *, started_streaming: bool) -> tuple[FaultKind, str]:
    """The fault kind and a one-line, redacted detail for an exception raised by a request.

    `started_streaming` says whether the response headers had arrived: the same broken
    connection is a lost connection before them and a cut-off stream after them.
    """
    shown = redact_url(url)
    # aiohttp's timeout classes derive from asyncio.TimeoutError, so they must come first.
    if isinstance(exc, _CONNECT_TIMEOUT):
        return FaultKind.TIMEOUT_CONNECT, f"no connection to {shown} within the connect timeout"
    if isinstance(exc, _IDLE_TIMEOUT):
        where = "between two events" if started_streaming else "before the response headers"
        return FaultKind.TIMEOUT_IDLE, f"{shown} sent nothing {where} within the idle timeout"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return FaultKind.TIMEOUT_TOTAL, f"the request to {shown} outlived its total timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = exc.os_error.strerror if exc.os_error and exc.os_error.strerror else type(exc.os_error).__name__
        return FaultKind.UNREACHABLE, f"cannot connect to {shown} ({str(why).lower()})"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return FaultKind.CUT_OFF, f"the stream from {shown} broke off mid-response ({type(exc).__name__})"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)):
        kind = FaultKind.CUT_OFF if started_streaming else FaultKind.CONNECTION_LOST
        return kind, f"{shown} closed the connection ({type(exc).__name__})"
    if isinstance(exc, aiohttp.ClientResponseError):
        return FaultKind.MALFORMED, f"{shown} did not answer with valid HTTP ({response_error_text(exc)})"
    if isinstance(exc, OSError):
        # EMFILE and friends: our process ran out of something; the server is not to blame.
        return FaultKind.CLIENT_ERROR, f"client-side OS error: {exc.strerror or type(exc).__name__}"
    return FaultKind.CLIENT_ERROR, f"client-side {type(exc).__name__}: {exc}"[:200]
