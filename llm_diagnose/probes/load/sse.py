"""Incremental server-sent-events decoding on bytes, and the meaning of OpenAI stream chunks.

The decoder works on raw bytes (no UTF-8 decode of the whole stream, no string rebuilding
per chunk): it splits at blank lines, keeps an incomplete tail for the next read, and
returns each event's `data` payload. The common case, one `data: {...}` line per event, takes
a fast path. Comments (`: ping`) and other fields (`event:`, `id:`, `retry:`) are skipped,
multi-line data is joined with newlines, and CRLF line ends are accepted (the SSE spec allows
them; some proxies rewrite LF to CRLF).

`read_chunk` turns one decoded JSON chunk into what the load driver records: did it carry a
token (and how many), a finish reason, usage, or an error; or why it is not a stream chunk at
all (`malformed`: a list, `choices` that are not objects, usage that is not an object), which
is the server's fault and never a client-side exception.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "ChunkInfo", "read_chunk", "plain_token_text", "DONE"]

DONE = b"[DONE]"
# A completions chunk that is one plain token, in compact JSON (what vLLM and SGLang send):
# it says `"finish_reason":null`, has a `"text":` and no usage object or error. Inside a JSON
# string every quote is escaped, so these byte patterns can only be keys, never generated
# text: the test is exact, and anything it does not recognise takes the json.loads path.
_TEXT_KEY = b'"text":"'
_UNFINISHED = b'"finish_reason":null'
_USAGE_OBJECT = b'"usage":{'
_ERROR_KEY = b'"error"'


def plain_token_text(data: bytes) -> bytes | None:
    """The raw JSON-escaped text of a plain completions token chunk; None: parse it properly.

    About 20 times cheaper than json.loads + read_chunk, which matters because it runs once
    per token for every stream (llm_diagnose/probes/load/client.py's hot path).
    """
    start = data.find(_TEXT_KEY)
    if start < 0 or _UNFINISHED not in data or _USAGE_OBJECT in data or _ERROR_KEY in data:
        return None
    start += len(_TEXT_KEY)
    end = data.find(b'"', start)
    while end > 0 and data[end - 1] == 0x5C:  # a backslash before the quote: escaped, or an escaped backslash?
        run = end - 1
        while data[run - 1] == 0x5C:
            run -= 1
        if (end - run) % 2 == 0:
            break  # an even run of backslashes escapes itself: this quote ends the text
        end = data.find(b'"', end + 1)
    return data[start:end] if end > 0 else None


class SSEDecoder:
    """Feed bytes as they arrive; get back the complete events' data payloads."""

    __slots__ = ("_tail", "_crlf")

    def __init__(self) -> None:
        self._tail = b""
        self._crlf = False

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._tail + chunk if self._tail else chunk
        hold = b""
        if not self._crlf and b"\r" in buf:
            self._crlf = True  # once a CR is seen, normalise the rest of the stream
        if self._crlf:
            if buf.endswith(b"\r"):
                hold, buf = b"\r", buf[:-1]  # a CRLF split across two reads: decide next time
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = buf.split(b"\n\n")
        self._tail = parts.pop() + hold
        out = []
        for event in parts:
            if event.startswith(b"data: ") and b"\n" not in event:
                out.append(event[6:])  # the fast path: one data line
            elif event:
                data = _event_data(event)
                if data is not None:
                    out.append(data)
        return out

    def flush(self) -> list[bytes]:
        """The stream ended: an unterminated last event still counts if it is a data line."""
        tail, self._tail = self._tail.rstrip(b"\r\n"), b""
        if not tail:
            return []
        data = _event_data(tail.replace(b"\r\n", b"\n"))
        return [] if data is None else [data]

    @property
    def pending(self) -> int:
        """Bytes held back waiting for the end of their event."""
        return len(self._tail)


def _event_data(event: bytes) -> bytes | None:
    lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        # ":" comments, event:, id:, retry: and unknown fields carry no data
    return b"\n".join(lines) if lines else None


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What one JSON chunk of an OpenAI-style stream carried."""

    is_token: bool  # it delivered generated output (possibly empty text, e.g. a special token)
    text: str  # the output it carried ("" when none)
    finish_reason: str | None
    usage: dict | None
    error: str | None
    malformed: str | None = None  # why this JSON is not an OpenAI stream chunk (a server fault)


_NOTHING = ChunkInfo(False, "", None, None, None)


def _malformed(why: str) -> ChunkInfo:
    return ChunkInfo(False, "", None, None, None, why)


def read_chunk(obj: object, chat: bool) -> ChunkInfo:
    """Classify a decoded chunk of /v1/completions (`chat=False`) or /v1/chat/completions.

    A chunk counts as a token event when it carries text, or carries an empty text with no
    finish reason (a special token that detokenises to nothing). An empty text *with* a finish
    reason is the terminal marker OpenAI sends after the last token, not a token. A chat
    chunk with only `role` is the role announcement that precedes the first token.
    """
    if not isinstance(obj, dict):
        return _malformed(f"chunk is {type(obj).__name__}, not an object")
    error = obj.get("error")
    if error is not None:
        message = error.get("message", error) if isinstance(error, dict) else error
        return ChunkInfo(False, "", None, None, str(message)[:300])
    usage = obj.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return _malformed(f"usage is {type(usage).__name__}, not an object")
    choices = obj.get("choices")
    if choices is not None and not isinstance(choices, list):
        return _malformed(f"choices is {type(choices).__name__}, not a list")
    if not choices:
        return ChunkInfo(False, "", None, usage, None) if usage else _NOTHING
    choice = choices[0]
    if not isinstance(choice, dict):
        return _malformed(f"a choice is {type(choice).__name__}, not an object")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        return _malformed(f"finish_reason is {type(finish).__name__}, not a string")
    if chat:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            return _malformed(f"delta is {type(delta).__name__}, not an object")
        produced = any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls"))
        empty_token = "content" in delta and "role" not in delta and finish is None
        is_token = bool(produced or empty_token)
        text = delta.get("content") or ""
    else:
        text = choice.get("text")
        is_token = bool(text) or (text is not None and finish is None)
        text = text or ""
    return ChunkInfo(is_token, text if isinstance(text, str) else "", finish, usage, None)
