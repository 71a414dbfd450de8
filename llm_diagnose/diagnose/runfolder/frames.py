"""A run folder's per-request records and scrapes as pandas DataFrames, for analysis in a notebook,
and as CSV or Parquet bytes for `llm-diagnose export`.

    from llm_diagnose.diagnose.runfolder import requests_frame, scrapes_frame
    requests = requests_frame("runs/staging")   # one row per request (requests.jsonl)
    samples = scrapes_frame("runs/staging")     # one row per sample of every /metrics page (metrics.jsonl)

pandas (and pyarrow, for Parquet) is the optional extra `analysis` (pip install 'llm-diagnose[analysis]'),
imported when a frame is built: the package imports, and every other command runs, without it.

Nothing is dropped silently: the frames come from the run-folder readers, which skip lines that
cannot be read and count them; `frame.attrs["skipped_lines"]` holds that count and
`frame.attrs["source"]` the file read. A page that failed to scrape or to parse is one row with
its `error` and no sample.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.runfolder.folder import RunFolder, RunFolderError, unreadable
from llm_diagnose.probes.runfolder_names import METRICS, REQUESTS

if TYPE_CHECKING:
    import pandas as pd

    from llm_diagnose.probes.load.records import RequestRecord
    from llm_diagnose.probes.metrics.window import ScrapeLine

__all__ = [
    "FORMATS",
    "REQUEST_COLUMNS",
    "SCRAPE_COLUMNS",
    "MissingExtra",
    "require",
    "requests_frame",
    "scrapes_frame",
    "frame_bytes",
]

Format = Literal["csv", "parquet"]
FORMATS: tuple[Format, ...] = ("csv", "parquet")

_HTTP = ("pool_wait_s", "connect_s", "reused", "headers_sent_s", "body_sent_s", "response_headers_s")
# One row per request: the fields of requests.jsonl under their names there (RequestRecord.to_dict),
# its HTTP phases as http_<phase>, and two derived from the record (completed, e2e_s).
REQUEST_COLUMNS = (
    "request_id", "experiment", "phase", "tag", "endpoint", "t_send", "t_send_wall", "status", "ttft_s",
    "gaps_s", "event_tokens", "tokens_in", "planned_tokens_in", "tokens_out", "tokens_out_from",
    "cached_tokens", "finish_reason", "fault", "fault_detail", "t_end_s", "e2e_s", "completed", "handling_s",
    *(f"http_{k}" for k in _HTTP),
)  # fmt: skip
# One row per sample of a page (name, labels in the exposition's {k="v"} form, value, the family's
# type), with the page's line number and times; a page with no sample is one row with its error.
SCRAPE_COLUMNS = ("line", "t_wall", "t_mono", "elapsed_s", "error", "name", "labels", "value", "type")
_LIST_COLUMNS = ("gaps_s", "event_tokens")  # lists of numbers: JSON text in a CSV cell

_EXTRA = "pip install 'llm-diagnose[analysis]'"


class MissingExtra(UsageError):
    """pandas or pyarrow is not installed: the optional extra `analysis` (exit 2)."""


def require(fmt: Format | None = None) -> None:
    """Raise MissingExtra (one line, what to install) where pandas, or pyarrow for Parquet, is missing."""
    needed = ["pandas", "pyarrow"] if fmt == "parquet" else ["pandas"]
    for name in needed:
        try:
            __import__(name)
        except ImportError:
            what = f"{name} is not installed (needed for {fmt or 'DataFrames'})"
            raise MissingExtra(f"{what}: {_EXTRA}") from None


def _pandas() -> Any:
    """pandas, imported when a frame is built (MissingExtra where it is not installed)."""
    require()
    import pandas as pd

    return pd


def _folder(run: RunFolder | str | Path) -> RunFolder:
    return run if isinstance(run, RunFolder) else RunFolder.open(run)


def _request_row(record: RequestRecord) -> dict[str, Any]:
    row = record.to_dict()
    http = row.pop("http", {})
    row.setdefault("event_tokens", [])
    row.setdefault("fault_detail", "")
    row.update({f"http_{k}": http.get(k) for k in _HTTP})
    row["completed"] = record.completed
    row["e2e_s"] = None if record.e2e_s is None else round(record.e2e_s, 7)
    return row


def requests_frame(run: RunFolder | str | Path) -> pd.DataFrame:
    """One row per request of the run's requests.jsonl (columns: REQUEST_COLUMNS); an empty frame of
    those columns where the folder has none (a passive run). RunFolderError for a bad folder."""
    pd = _pandas()
    folder = _folder(run)
    rows = [_request_row(r) for r in folder.requests or ()]
    frame = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    frame.attrs.update(source=str(folder.path / REQUESTS), skipped_lines=folder.skipped_in(REQUESTS))
    return frame


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    inner = ",".join(f'{k}="{json.dumps(v, ensure_ascii=False)[1:-1]}"' for k, v in sorted(pairs))
    return "{" + inner + "}"


def _sample_rows(line: ScrapeLine) -> Iterator[tuple]:
    from llm_diagnose.probes.http import MalformedMetrics
    from llm_diagnose.probes.metrics.exposition import MAX_SERIES, exposition_samples

    page = (line.number, line.t_wall, line.t_mono, line.elapsed_s)
    if line.text is None or line.error is not None:
        yield (*page, line.error or "no page", None, None, None, None)
        return
    try:
        samples = exposition_samples(line.text, line.url or "/metrics", MAX_SERIES)
    except MalformedMetrics as exc:
        yield (*page, str(exc), None, None, None, None)
        return
    if not samples:
        yield (*page, "an empty page", None, None, None, None)
    for name, labels, value, _timestamp, family_type in samples:
        yield (*page, None, name, _labels(labels), value, family_type)


def scrapes_frame(run: RunFolder | str | Path) -> pd.DataFrame:
    """One row per sample of every /metrics page in the run's metrics.jsonl (columns: SCRAPE_COLUMNS),
    read a page at a time; an empty frame where the folder has none. Lines that are no scrape
    record are skipped and counted (attrs["skipped_lines"]). RunFolderError for a bad folder."""
    from llm_diagnose.probes.metrics.window import scrape_lines

    pd = _pandas()
    folder = _folder(run)
    path = folder.path / METRICS
    rows: list[tuple] = []
    skipped = 0
    if path.exists() or path.is_symlink():
        try:
            for line in scrape_lines(path):
                if line.unreadable:
                    skipped += 1
                else:
                    rows.extend(_sample_rows(line))
        except OSError as exc:
            raise unreadable(path, exc) from None
    frame = pd.DataFrame.from_records(rows, columns=list(SCRAPE_COLUMNS))
    frame.attrs.update(source=str(path), skipped_lines=skipped)
    return frame


def frame_bytes(frame: pd.DataFrame, fmt: Format) -> bytes:
    """The frame as a CSV (UTF-8, list columns as JSON text) or Parquet file (pyarrow)."""
    require(fmt)
    if fmt == "parquet":
        buffer = io.BytesIO()
        try:
            frame.to_parquet(buffer, engine="pyarrow", index=False)
        except (ValueError, TypeError) as exc:  # a column pyarrow cannot type: a record of another shape
            raise RunFolderError(f"cannot write {frame.attrs.get('source', 'the frame')} as Parquet ({exc})") from None
        return buffer.getvalue()
    out = frame.copy()
    for column in _LIST_COLUMNS:
        if column in out:
            out[column] = out[column].map(lambda v: json.dumps(list(v)) if isinstance(v, (list, tuple)) else v)
    return out.to_csv(index=False, lineterminator="\n").encode("utf-8")
