"""`llm-diagnose export RUN --format csv|parquet`: a run folder's per-request records and scrapes as tables.

The run is read once (`RunFolder.open`); the tables are `runfolder.frames` (pandas, the optional
extra `analysis`; pyarrow for Parquet), written whole (a reader never sees half a file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_diagnose.diagnose.runfolder import METRICS, REQUESTS, out_path

__all__ = ["register", "run", "REQUESTS_TABLE", "SCRAPES_TABLE"]

REQUESTS_TABLE = "requests"  # <out>/requests.csv or .parquet: one row per request
SCRAPES_TABLE = "scrapes"  # <out>/scrapes.csv or .parquet: one row per sample of every /metrics page

EXAMPLE = """examples:
  llm-diagnose export runs/staging                       # runs/staging/requests.csv, scrapes.csv
  llm-diagnose export runs/staging --format parquet --out tables/

In a notebook, the same tables as DataFrames:
  from llm_diagnose.diagnose.runfolder import requests_frame, scrapes_frame
  df = requests_frame("runs/staging")

Needs pandas (and pyarrow for parquet): pip install 'llm-diagnose[analysis]'.
Lines of requests.jsonl or metrics.jsonl that cannot be read are skipped and counted on stderr."""


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's per-request records and scrapes as CSV or Parquet tables",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a run folder's requests.jsonl (one row per request) and metrics.jsonl (one row "
        "per sample of every /metrics page) as tables for analysis elsewhere.",
    )
    p.add_argument("run", metavar="RUN", help="a run folder, or its evidence.json or diagnosis.json")
    p.add_argument("--format", choices=("csv", "parquet"), default="csv", help="table format (default csv)")
    p.add_argument(
        "--out",
        type=out_path,
        metavar="DIR",
        help="folder to write requests.<format> and scrapes.<format> into (default: the run folder)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.errors import UsageError
    from llm_diagnose.diagnose.runfolder import RunFolder, prepare_out_dir, write_output
    from llm_diagnose.diagnose.runfolder.frames import frame_bytes, requests_frame, require, scrapes_frame

    require(args.format)  # before anything is read: exit 2 naming what to install
    folder = RunFolder.open(args.run)
    builders = {REQUESTS_TABLE: (REQUESTS, requests_frame), SCRAPES_TABLE: (METRICS, scrapes_frame)}
    present = {table: b for table, b in builders.items() if _present(folder.path / b[0])}
    if not present:
        raise UsageError(
            f"{folder.path} holds no {REQUESTS} or {METRICS}: nothing to export (run `llm-diagnose run` to record them)"
        )
    out: Path = args.out if args.out is not None else folder.path
    names = {table: f"{table}.{args.format}" for table in present}
    prepare_out_dir(out, files=tuple(names.values()))
    for table, (source, build) in present.items():
        frame = build(folder)
        write_output(out / names[table], frame_bytes(frame, args.format))
        skipped = frame.attrs.get("skipped_lines", 0)
        also = f"; {skipped} unreadable line(s) of {source} skipped" if skipped else ""
        print(f"llm-diagnose: wrote {out / names[table]} ({len(frame)} rows from {source}{also})", file=sys.stderr)
    return 0


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()  # a link is refused when read, not taken for absent
