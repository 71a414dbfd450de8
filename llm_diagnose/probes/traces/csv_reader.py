"""Reading the CSV formats: lengths and arrival times only, no prompts.

- ``azure``: Azure LLM inference CSV (2023 and 2024): ``TIMESTAMP``, ``ContextTokens``,
  ``GeneratedTokens``.
- ``burstgpt``: BurstGPT CSV: ``Timestamp`` (s), ``Request tokens``, ``Response tokens``, ...
"""

from __future__ import annotations

import csv
from collections.abc import Iterator

from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceFormatError
from llm_diagnose.probes.traces.fields import _epoch_s, _int, _new_request
from llm_diagnose.probes.traces.files import _TOO_LONG, _damage_skipped, _lines, _open_binary
from llm_diagnose.probes.traces.records import BadRecord, LineLog, TraceRequest

__all__ = ["CSV_COLUMNS", "CSV_ROWS"]


def _lengths_only(line: int, ts: float, n_in: int, n_out: int) -> TraceRequest:
    return _new_request(TraceRequest, (line, ts, None, n_in, n_out, None, None, None, None, ()))


def _azure_row(row: dict, line: int) -> TraceRequest:
    return _lengths_only(
        line,
        _epoch_s(row["TIMESTAMP"], "TIMESTAMP"),
        _int(row["ContextTokens"], "ContextTokens"),
        _int(row["GeneratedTokens"], "GeneratedTokens"),
    )


def _burstgpt_row(row: dict, line: int) -> TraceRequest:
    return _lengths_only(
        line,
        _epoch_s(row["Timestamp"], "Timestamp", unit_s=1.0),
        _int(row["Request tokens"], "Request tokens"),
        _int(row["Response tokens"], "Response tokens"),
    )


CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
CSV_ROWS = {"azure": _azure_row, "burstgpt": _burstgpt_row}


def _read_csv(path: str, log: LineLog, fmt: str, *, max_line_bytes: int) -> Iterator[TraceRequest]:
    required = CSV_COLUMNS[fmt]
    with _open_binary(path) as raw:
        seen = [0]

        def text_lines() -> Iterator[str]:
            # Decoded line by line (csv counts what it is given, so line numbers stay the file's):
            # a line over max_line_bytes becomes an empty line, skipped and counted here.
            for n, line in _lines(raw, max_line_bytes):
                seen[0] = n
                if line is None:
                    log.lines += 1
                    log.skip(n, _TOO_LONG)
                    yield "\n"
                else:
                    text = line.decode("utf-8", "replace")
                    if "\r" in text.rstrip("\r\n"):  # old Mac line ends (what newline="" reading split on)
                        yield from text.splitlines(keepends=True)
                    else:
                        yield text

        reader = csv.reader(text_lines())
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise TraceFormatError(f"the CSV header cannot be read ({exc})", path=path, line=1) from None
        if header is None:
            raise EmptyTraceError("empty file", path=path)
        header = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(
                f"{fmt} CSV lacks the column(s) {', '.join(map(repr, missing))} (header: {', '.join(header)[:200]})",
                path=path,
                line=1,
            )
        index = {c: header.index(c) for c in required}
        parse = CSV_ROWS[fmt]
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                log.lines += 1
                log.skip(reader.line_num, f"bad CSV ({exc})")
                continue
            if not row or all(not c.strip() for c in row):
                continue
            log.lines += 1
            if len(row) < len(header):
                log.skip(reader.line_num, f"{len(row)} columns where the header has {len(header)}")
                continue
            try:
                record = parse({c: row[i] for c, i in index.items()}, reader.line_num)
            except BadRecord as exc:
                log.skip(reader.line_num, str(exc))
                continue
            log.requests += 1
            yield record
        _damage_skipped(raw, log, seen[0] + 1)
