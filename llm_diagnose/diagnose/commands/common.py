"""Pieces several sub-commands share: loading evidence, thresholds and SLOs, declared workload facts.

The flag helpers run while parsers are built, so this module imports no more than they need;
the loaders import the decision tree's types when they are called (see llm_diagnose/diagnose/cli.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.runfolder import EVIDENCE, METRICS, read_document
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Provenance

if TYPE_CHECKING:
    from llm_diagnose.diagnose.tree.evidence import Evidence
    from llm_diagnose.diagnose.tree.slo import SLO
    from llm_diagnose.diagnose.tree.thresholds import Thresholds


def evidence_path(path: str | Path) -> Path:
    """A run folder or an evidence file -> the evidence file."""
    p = Path(path)
    if p.is_dir():
        p = p / EVIDENCE
    if not p.exists():
        raise UsageError(f"{p} does not exist: give an evidence.json or a run folder that holds one")
    return p


def load_evidence(path: str | Path) -> Evidence:
    """An evidence file, or a run folder's; a folder an interrupted run left (metrics.jsonl, no
    evidence.json) gives the evidence rebuilt from its scrapes, with a note on stderr."""
    from llm_diagnose.diagnose.tree.evidence import Evidence, EvidenceError

    folder = Path(path)
    if folder.is_dir() and not (folder / EVIDENCE).exists() and (folder / METRICS).exists():
        from llm_diagnose.diagnose.runfolder import evidence_from_scrapes

        print(
            f"llm-diagnose: no {EVIDENCE} in {folder} (an interrupted run?): diagnosing the scrapes in "
            f"{folder / METRICS}",
            file=sys.stderr,
        )
        return evidence_from_scrapes(folder)
    p = evidence_path(path)
    try:
        return Evidence.from_json(read_document(p))  # a plain file, not a link; at most MAX_DOCUMENT_BYTES
    except EvidenceError as exc:
        raise UsageError(f"{p}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None


def join_evidence(run: Evidence, other: Evidence) -> Evidence:
    """`run` with `other`'s items (a microbenchmark's, for `decide RUN MICROBENCH` and `run --microbench`),
    each keeping its own provenance: a key both hold keeps the run's, except the microbenchmark's own keys
    (quantities.is_microbench_key), which come from `other`; a measured item never gives way to a hole."""
    mine = {k: v for k, v in other.items.items() if Q.is_microbench_key(k)}
    rest = {k: v for k, v in other.items.items() if not Q.is_microbench_key(k)}
    return run.with_items(rest, prefer_new=False).with_items(mine, prefer_new=True)


def load_thresholds(path: str | None) -> Thresholds:
    from llm_diagnose.diagnose.tree.thresholds import Thresholds, ThresholdsError

    if not path:
        return Thresholds()
    try:
        return Thresholds.from_toml(path)
    except ThresholdsError as exc:
        raise UsageError(str(exc)) from None


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--offline",
        dest="interactive",
        action="store_false",
        default=None,
        help="nobody waits for single responses (enables the offline-batch answer)",
    )
    group.add_argument("--interactive", dest="interactive", action="store_true", help="people wait for the responses")


def add_slo_flags(parser: argparse.ArgumentParser) -> None:
    """`--slo METRIC:pNN:LIMIT` (repeatable); a `[slo]` table in the --thresholds file counts too."""
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC:pNN:LIMIT",
        help="a latency objective, e.g. ttft:p99:2s, itl:p50:50ms, e2e:p95:30s (repeatable; "
        "over the [slo] table of the --thresholds file)",
    )


def load_slo(args: argparse.Namespace) -> SLO:
    """The SLO of this invocation: the [slo] table of --thresholds, then --slo flags, then
    --offline/--interactive. Undeclared (SLO()) when none of them is given."""
    from llm_diagnose.diagnose.tree.slo import SLO, SLOError

    try:
        path = getattr(args, "thresholds", None)
        slo = SLO.from_toml(path) if path else SLO()
        slo = slo.merged(SLO.from_flags(getattr(args, "slo", None) or ()))
        # The --interactive/--offline flag wins over the SLO's own `interactive`; with latency
        # objectives, --offline contradicts them and is refused (SLOError below).
        interactive = getattr(args, "interactive", None)
        if interactive is not None:
            slo = SLO(slo.objectives, bool(interactive), slo.source if slo.declared else "command line")
        return slo
    except SLOError as exc:
        raise UsageError(str(exc)) from None


def add_trace_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        metavar="FILE",
        type=Path,
        help="a request trace of this workload (formats: see `llm-diagnose trace --help`)",
    )
    parser.add_argument("--trace-format", default="auto", metavar="FORMAT", help="trace format (default: auto)")
    parser.add_argument(
        "--block-size",
        type=argtypes.TOKENS,
        metavar="N",
        help="prefix-cache block size for the trace (default: the server's, else 16)",
    )
    parser.add_argument(
        "--kv-capacity-tokens",
        type=argtypes.TOKENS,
        metavar="N",
        help="KV capacity for the trace's LRU simulation (default: the server's)",
    )


def declared_facts(args: argparse.Namespace) -> dict:
    """Facts the user declared on the command line, with that provenance."""
    items = {}
    if getattr(args, "interactive", None) is not None:
        items[Q.INTERACTIVE] = Fact(bool(args.interactive), Provenance(method="declared", source="command line"))
    return items


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"
