"""`llm-diagnose fleet --prometheus URL --selector SEL --since 10m --out DIR`: a fleet through Prometheus.

Reads every replica's engine metrics for the window from the Prometheus server that already
scrapes them (nothing is sent to the replicas), computes each replica's evidence as `run`
does, writes `DIR/replicas/<replica>/` as any run folder is written (collect.write_run:
evidence.json, re-diagnosed with `decide`; diagnosis.json; summary.txt), then compares the
replicas: `DIR/fleet.json` and `DIR/summary.txt`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.commands.common import add_trace_flags, dumps, load_thresholds
from llm_diagnose.diagnose.errors import TargetError, UsageError
from llm_diagnose.diagnose.runfolder import SUMMARY, out_path, prepare_out_dir, write_atomic
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.probes import quantities as Q

# The help names them. (Importing this module loads the probes.metrics package, HTTP client and
# Prometheus parser included, until that package's __init__ imports its submodules lazily.)
from llm_diagnose.probes.metrics.prometheus_api import DEFAULT_REPLICA_LABEL, PROMETHEUS_TOKEN_ENV

if TYPE_CHECKING:
    from llm_diagnose.probes.metrics.prometheus_api import FleetWindows

FLEET_FILE = "fleet.json"
REPLICAS_DIR = "replicas"
FLEET_SCHEMA = "llm-diagnose/fleet"
DEFAULT_SINCE = "10m"

EXAMPLE = f"""example:
  llm-diagnose fleet --prometheus http://prometheus:9090 --selector '{{job="vllm"}}' --since 10m --out runs/fleet
  llm-diagnose fleet --prometheus http://127.0.0.1:9090 --selector '{{namespace="serving"}}' \\
      --start 2026-12-01T14:00:00Z --end 2026-12-01T15:00:00Z --step 15 --replica-label pod --out runs/incident
  llm-diagnose decide runs/fleet/replicas/10.0.0.7_8000      # one replica, re-diagnosed offline

A Prometheus that wants credentials gets a Bearer token from {PROMETHEUS_TOKEN_ENV}."""

# How long a window may be (--since, or --end minus --start), and the shortest --step.
MAX_WINDOW_S = argtypes.MAX_FLEET_WINDOW_S
MIN_WINDOW_S = argtypes.MIN_STEP_S


def register(sub) -> None:
    p = sub.add_parser(
        "fleet",
        help="read a fleet's engine metrics from Prometheus and compare the replicas",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read the engine metrics of every replica matched by --selector from a Prometheus server "
        "for a window in the past (--start/--end) or up to now (--since), compute each replica's "
        "evidence and diagnosis, and show which replicas diverge and whether shared prefixes land on "
        "different replicas. Sends nothing to the replicas.",
    )
    p.add_argument(
        "--prometheus", required=True, metavar="URL", help="the Prometheus server, e.g. http://prometheus:9090"
    )
    p.add_argument(
        "--selector",
        default="{}",
        metavar="MATCHERS",
        help="label matchers for the replicas' series, e.g. '{job=\"vllm\"}' (default: every engine series)",
    )
    p.add_argument(
        "--since",
        type=argtypes.duration(MIN_WINDOW_S, MAX_WINDOW_S),
        metavar="DURATION",
        help=f"a window up to --end (default now): 90s, 10m, 2h (default {DEFAULT_SINCE}; at most 366d)",
    )
    p.add_argument(
        "--start",
        type=argtypes.parse_time,
        metavar="TIME",
        help="window start: ISO-8601 (2026-12-01T14:00:00Z) or unix seconds",
    )
    p.add_argument("--end", type=argtypes.parse_time, metavar="TIME", help="window end (default: now)")
    p.add_argument(
        "--step",
        type=argtypes.seconds(argtypes.MIN_STEP_S, MAX_WINDOW_S),
        metavar="SECONDS",
        help="read one value per series every SECONDS (query_range) instead of every raw sample: for long "
        "windows; use at least the scrape interval",
    )
    p.add_argument(
        "--replica-label",
        default=DEFAULT_REPLICA_LABEL,
        metavar="LABEL",
        help=f"the label that names a replica (default {DEFAULT_REPLICA_LABEL}; pod on Kubernetes)",
    )
    p.add_argument("--out", required=True, type=out_path, help="output folder (fleet.json, summary.txt, replicas/*/)")
    p.add_argument("--thresholds", metavar="FILE", help="TOML file overriding named thresholds (fleet.* included)")
    add_trace_flags(p)
    p.set_defaults(func=run)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1h30m` -> seconds, within the window's bounds."""
    try:
        return argtypes.parse_duration(text, MIN_WINDOW_S, MAX_WINDOW_S)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--since {exc}") from None


def parse_time(text: str, flag: str) -> float:
    """ISO-8601 (a naive time is UTC), unix seconds, or `now` -> unix seconds (1970 to year 9999)."""
    try:
        return argtypes.parse_time(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{flag} {exc}") from None


def window_of(args: argparse.Namespace, now: float | None = None) -> tuple[float, float]:
    """[start, end] in unix seconds from --since/--start/--end (numbers as argparse parsed them,
    or their text).

    Raises:
        UsageError: both --since and --start, an empty window, one longer than MAX_WINDOW_S, or
            one that starts before 1970 (--end minus --since).
    """
    if args.since is not None and args.start is not None:
        raise UsageError("give --since or --start, not both")

    def moment(value: float | str | None, flag: str, default: float) -> float:
        if value is None:
            return default
        return parse_time(value, flag) if isinstance(value, str) else float(value)

    end = moment(args.end, "--end", time.time() if now is None else now)
    since = args.since if args.since is not None else DEFAULT_SINCE
    start = moment(args.start, "--start", end - (parse_duration(since) if isinstance(since, str) else float(since)))
    if start >= end:
        raise UsageError(f"the window is empty: --start ({_iso(start)}) is not before --end ({_iso(end)})")
    if start < 0:
        raise UsageError(
            f"the window starts before 1970 ({start:.0f} unix seconds: --end minus --since): give a later --end "
            "or a shorter --since"
        )
    if end - start > MAX_WINDOW_S:
        raise UsageError(
            f"the window from {_iso(start)} to {_iso(end)} is longer than {MAX_WINDOW_S / 86400:g} days: "
            "give a later --start or an earlier --end"
        )
    return start, end


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def folder_names(replicas) -> dict[str, str]:
    """replica -> a folder name: the name with anything but [A-Za-z0-9._-] as _, made unique."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for replica in replicas:
        base = re.sub(r"[^A-Za-z0-9._-]", "_", replica).strip(".") or "replica"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        taken.add(name)
        out[replica] = name
    return out


def _read(args: argparse.Namespace, start: float, end: float) -> FleetWindows:
    from llm_diagnose.probes.http import InvalidTargetURL, ProbeHTTPError
    from llm_diagnose.probes.metrics.prometheus_api import InvalidSelector, PrometheusRefused, read_fleet

    try:
        return asyncio.run(
            read_fleet(
                args.prometheus,
                args.selector,
                start,
                end,
                step_s=args.step,
                replica_label=args.replica_label,
                token=os.environ.get(PROMETHEUS_TOKEN_ENV) or None,
            )
        )
    except (InvalidSelector, InvalidTargetURL) as exc:
        raise UsageError(f"{exc}") from None
    except PrometheusRefused as exc:
        if exc.error_type == "bad_data":
            raise UsageError(f"{exc}: check --selector (PromQL label matchers) and the window") from None
        raise TargetError(f"{exc}: try a shorter window, or --step SECONDS to read fewer points") from None
    except ProbeHTTPError as exc:
        raise TargetError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.collect import trace_items_for, write_run
    from llm_diagnose.diagnose.fleet import fleet_view, render_text
    from llm_diagnose.diagnose.tree.evidence import Evidence, Target
    from llm_diagnose.probes.metrics.passive import passive_evidence

    thresholds = load_thresholds(args.thresholds)
    start, end = window_of(args)  # a bad window leaves no folder behind
    prepare_out_dir(args.out, files=(FLEET_FILE, SUMMARY))  # before Prometheus is asked
    fw = _read(args, start, end)
    folders = folder_names(fw.windows)
    evidences: dict[str, Evidence] = {}
    replicas_json: dict[str, dict] = {}
    for replica, window in fw.windows.items():
        items = passive_evidence(window)
        evidence = Evidence(Target(url=window.source, label=replica), items)
        # written as every run folder is (evidence, diagnosis, summary): `decide`/`report` read it back
        diagnosis = write_run(args.out / REPLICAS_DIR / folders[replica], evidence, thresholds).diagnosis
        evidences[replica] = evidence
        replicas_json[replica] = {
            "folder": f"{REPLICAS_DIR}/{folders[replica]}",
            "window": window.describe(),
            "bottleneck": diagnosis.bottleneck,
            "recommended": [r.technique for r in diagnosis.recommended],
        }
    trace_items = {}
    if args.trace is not None:
        # Simulated with the replicas' own block size and one replica's KV capacity: the reuse
        # a prefix-aware router could still get from any one of them.
        known = next(
            (e.items for e in evidences.values() if e.measurement(Q.KV_CAPACITY_TOKENS) and e.fact(Q.BLOCK_SIZE)), {}
        )
        trace_items = trace_items_for(
            known, args.trace, args.trace_format, block_size=args.block_size, kv_capacity_tokens=args.kv_capacity_tokens
        )
    view = fleet_view(evidences, thresholds, trace_items)
    document = {
        "schema": FLEET_SCHEMA,
        "version": 1,
        "prometheus": fw.prometheus,
        "selector": fw.selector,
        "query": fw.query,
        "method": fw.method,
        "start": _iso(fw.start),
        "end": _iso(fw.end),
        "replica_label": fw.replica_label,
        "targets_without_engine_series": list(fw.without_engine),
        "prometheus_warnings": list(fw.warnings),
        "replicas": replicas_json,
        "view": view.to_dict(),
        "trace": {
            key: r.to_dict() for key, r in trace_items.items() if key in (Q.PREFIX_POTENTIAL, Q.PREFIX_AT_CAPACITY)
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / FLEET_FILE, dumps(document))
    head = (
        f"fleet: {len(fw.windows)} replicas of {fw.selector} from {fw.prometheus}, {_iso(fw.start)} to "
        f"{_iso(fw.end)}; read as {fw.method}\n"
    )
    extra = "".join(f"  {r}: {info['bottleneck']}\n" for r, info in replicas_json.items())
    if fw.without_engine:
        extra += f"targets without engine series (not compared): {', '.join(fw.without_engine)}\n"
    summary = head + "\n" + render_text(view) + "\nper replica (replicas/<name>/diagnosis.json):\n" + extra
    summary = escape_controls(summary)  # replica names are Prometheus labels: they may carry terminal escapes
    write_atomic(args.out / SUMMARY, summary)
    sys.stdout.write(summary)
    print(f"\nfleet folder: {args.out} (fleet.json, summary.txt, replicas/*/: evidence, diagnosis, summary)")
    return 0
