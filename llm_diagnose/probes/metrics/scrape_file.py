"""metrics.jsonl, bounded: a run's raw scrapes within MAX_METRICS_FILE_BYTES, however long it runs.

Each scrape attempt is one JSON line (scraper.py lists its fields), appended and flushed as it
is taken, so an interrupted run loses nothing the file was meant to hold. Every attempt is
written until this run's lines reach MAX_METRICS_FILE_BYTES. At the bound the file is rewritten
(a fresh file beside it, renamed over it: runfiles.write_atomic, so a reader sees the old file
or the new one, never half of one) keeping this run's first line and every other line after
it; from then on one attempt in 2 is written, then one in 4 after the next rewrite, and so on.
When the loop ends, its last attempt is written even where the sample would skip it (the one
line the file may hold past its bound).

So the file always holds the run's first scrape and an even sample of the later ones, in the
order they were taken, with their own times; a finished run's file also ends with its last
scrape. Read back (`Window.from_jsonl`; `decide RUN_DIR` on an interrupted run), it gives a
window over the same span with fewer pages: counter and histogram increases are the same
(counters are cumulative), gauges are sampled more coarsely, a restart still shows (a counter
lower than on the kept page before it, or a new `_created`). Lines the file held before this
run began are kept as they were, and not counted against the bound.

At 1 s scrapes of a real vLLM page (~60 KB a line) 256 MiB is ~70 minutes of every scrape; a day
ends with one scrape in 32 (~2,700 pages). Each rewrite reads the file once (the scraper runs it
in a worker thread, off the event loop); there is one per doubling, ~5 in a day.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from llm_diagnose.probes.runfiles import open_append, open_plain, write_atomic

__all__ = ["ScrapeFile", "MAX_METRICS_FILE_BYTES"]

MAX_METRICS_FILE_BYTES = 256 << 20


class ScrapeFile:
    """Appends scrape lines to `path`, thinning them past `max_bytes` (see the module docstring)."""

    def __init__(self, path: str | Path, max_bytes: int = MAX_METRICS_FILE_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.stride = 1  # one attempt in `stride` is written
        self.offered = 0  # attempts offered
        self.written = 0  # this run's lines in the file now
        self.problem: str | None = None  # why lines stopped being written, if they did
        self._bytes = 0  # this run's bytes in the file now
        self._pending: str | None = None  # the latest line the sample skipped
        self._fh: IO[str] | None = open_append(self.path)  # never through a link
        self._before = os.fstat(self._fh.fileno()).st_size  # bytes of an earlier run: kept as they are

    def would_rewrite(self, line: str) -> bool:
        """Whether offering this line (the next attempt's) rewrites the file first: slow, so the
        scraper runs that write off the event loop."""
        return (
            self._fh is not None
            and self.offered % self.stride == 0
            and self.written >= 2
            and self._bytes + len(line) + 1 > self.max_bytes
        )

    def write(self, line: str) -> None:
        """Offer one attempt's line (JSON, no newline): written when the sample takes it."""
        if self.would_rewrite(line):
            self._rewrite()
        seq = self.offered
        self.offered += 1
        if self._fh is None:  # closed, or a rewrite failed (`problem` says why)
            return
        if seq % self.stride:
            self._pending = line
            return
        self._pending = None
        self._append(line)

    def close(self) -> None:
        """Write the last attempt if the sample skipped it, and close the file."""
        if self._fh is None:
            return
        if self._pending is not None:
            self._append(self._pending)
            self._pending = None
        self._fh.close()
        self._fh = None

    def _append(self, line: str) -> None:
        assert self._fh is not None
        self._fh.write(line + "\n")  # json.dumps writes ASCII: one character, one byte
        self._fh.flush()
        self._bytes += len(line) + 1
        self.written += 1

    def _rewrite(self) -> None:
        """Keep this run's first line and every other one after it; write one attempt in twice as many."""
        assert self._fh is not None
        self._fh.close()
        self._fh = None
        kept = [0, 0]  # lines, bytes

        def lines() -> Iterator[bytes]:
            with open_plain(self.path) as f:
                left = self._before
                while left > 0:  # an earlier run's lines, as they are
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    left -= len(chunk)
                    yield chunk
                for position, raw in enumerate(f):
                    if position % 2 == 0:
                        kept[0] += 1
                        kept[1] += len(raw)
                        yield raw

        try:
            write_atomic(self.path, lines())
        except OSError as exc:
            # The file is as it was (write_atomic renames only a whole file): keep it, write no more.
            self.problem = (
                f"{self.path.name} could not be thinned at its bound of {self.max_bytes >> 20} MiB "
                f"({getattr(exc, 'strerror', None) or exc}); later scrapes were not written to it"
            )
            return
        self.stride *= 2
        self.written, self._bytes = kept
        self._fh = open_append(self.path)
