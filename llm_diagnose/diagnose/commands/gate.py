"""`llm-diagnose gate --baseline RUN --current RUN`: fail CI on a performance regression, not on noise.

Each run is read once (`load_run`: `RunFolder.open`), compared (`llm_diagnose.diagnose.gate.judge`) and
rendered (`llm_diagnose.diagnose.gate.render`, `report.markdown.render_gate`). The tolerances are the
registry's (`llm_diagnose.diagnose.tolerances`): the `[tolerances]` table of --thresholds sets
them, the `[gate]` table of --rules over it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.commands.common import add_slo_flags, load_slo
from llm_diagnose.diagnose.compare.request_measurements import request_measurements
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.gate.judge import compare
from llm_diagnose.diagnose.gate.render import render_json, render_junit, render_text
from llm_diagnose.diagnose.gate.result import RunData
from llm_diagnose.diagnose.gate.rules import GateRulesError, load_rules
from llm_diagnose.diagnose.report import markdown
from llm_diagnose.diagnose.runfolder import REQUESTS, check_out_file, load_run, out_path, write_output
from llm_diagnose.diagnose.tolerances import Tolerances, TolerancesError
from llm_diagnose.diagnose.toml_file import read_toml

if TYPE_CHECKING:
    from llm_diagnose.diagnose.tree.thresholds import Thresholds

EXAMPLE = """example:
  llm-diagnose gate --baseline runs/main --current runs/pr --junit gate.xml --markdown gate.md
  llm-diagnose gate --baseline baseline/evidence.json --current runs/pr --rules gate.toml --fail-on-inconclusive

exit codes: 0 no regression; 1 a regression beyond the noise; 2 bad usage or input;
5 inconclusive (too noisy to decide), only with --fail-on-inconclusive (otherwise 0)"""


def register(sub) -> None:
    p = sub.add_parser(
        "gate",
        help="compare two runs; fail on a regression beyond the noise",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare a current run with a baseline: latency and throughput quantiles, memory headroom, "
        "hit rates (bootstrap confidence interval of the change from the raw samples, against a "
        "tolerance per rule), and the diagnosis itself (new pitfalls, changed answers, newly "
        "recommended techniques). Rules: see docs/commands/gate.md.",
    )
    p.add_argument("--baseline", required=True, metavar="RUN", help="run folder, evidence.json or diagnosis.json")
    p.add_argument("--current", required=True, metavar="RUN", help="run folder, evidence.json or diagnosis.json")
    p.add_argument("--rules", metavar="FILE", help="TOML rules (defaults: built in)")
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="TOML: its [tolerances] set the comparison's tolerances (under --rules' [gate]); its [thresholds] "
        "and [slo] diagnose runs that lack a diagnosis.json",
    )
    add_slo_flags(p)  # like --thresholds: for runs that lack a diagnosis.json
    p.add_argument("--junit", type=out_path, metavar="FILE", help="also write JUnit XML here")
    p.add_argument("--markdown", type=out_path, metavar="FILE", help="also write a Markdown summary here")
    p.add_argument("--json", type=out_path, metavar="FILE", help="also write the outcomes as JSON here")
    p.add_argument("--fail-on-inconclusive", action="store_true", help="exit 5 when the runs are too noisy to decide")
    p.add_argument("--verbose", action="store_true", help="list passing rules too")
    p.set_defaults(func=run)


def load_thresholds_file(path: str | None) -> tuple[Thresholds | None, Tolerances]:
    """A --thresholds file, read once: the tree's thresholds (its `[thresholds]`; None without a file)
    and the registry's tolerances with its `[tolerances]` table set (the defaults without a file).
    The `[slo]` table is `load_slo`'s."""
    from llm_diagnose.diagnose.tree.thresholds import Thresholds, ThresholdsError

    if not path:
        return None, Tolerances()
    try:
        data = read_toml(path, "thresholds file", TolerancesError)
        tolerances = Tolerances().with_table(data, str(path))
        # The [tolerances] table is the registry's, not the tree's.
        thresholds = Thresholds.from_mapping({k: v for k, v in data.items() if k != "tolerances"}, str(path))
    except (TolerancesError, ThresholdsError) as exc:
        raise UsageError(str(exc)) from None
    return thresholds, tolerances


def _run_data(path: str, thresholds, slo=None) -> tuple[RunData, str]:
    loaded = load_run(path, thresholds, slo)
    if loaded.evidence is None:
        raise UsageError(f"{path}: the gate needs the run's evidence.json (its raw samples), not only a diagnosis")
    # Per-request samples, where the run was active, join the evidence for the comparison only.
    folder = loaded.folder
    evidence = loaded.evidence.with_items(request_measurements(folder.requests, str(folder.path / REQUESTS)))
    return RunData(evidence, loaded.diagnosis, loaded.label, folder.skipped_notes()), loaded.note


def _slo_text(slo) -> str:
    if not slo.declared:
        return "none"
    parts = [o.label for o in slo.objectives] or [("interactive" if slo.interactive else "offline")]
    return ", ".join(parts)


def _write(path: Path, text: str, flag: str) -> None:
    write_output(path, text, flag)


def run(args: argparse.Namespace) -> int:
    thresholds, tolerances = load_thresholds_file(args.thresholds)
    try:
        rules = load_rules(args.rules, tolerances)
    except GateRulesError as exc:
        raise UsageError(str(exc)) from None
    slo = load_slo(args)
    for flag in ("junit", "markdown", "json"):  # an output that cannot be written fails before the comparison
        if getattr(args, flag) is not None:
            check_out_file(getattr(args, flag), f"--{flag}")
    baseline, note_b = _run_data(args.baseline, thresholds, slo if slo.declared else None)
    current, note_c = _run_data(args.current, thresholds, slo if slo.declared else None)
    # Answers judged against different objectives may differ for that reason alone.
    note_slo = (
        ""
        if baseline.diagnosis.slo.equivalent(current.diagnosis.slo)
        else (
            f"the runs were judged against different SLOs (baseline: {_slo_text(baseline.diagnosis.slo)}; current: "
            f"{_slo_text(current.diagnosis.slo)}): a changed answer may come from that"
        )
    )
    result = compare(baseline, current, rules, notes=tuple(n for n in (note_b, note_c, note_slo) if n))
    sys.stdout.write(render_text(result, verbose=args.verbose))
    if args.junit:
        _write(args.junit, render_junit(result), "--junit")
    if args.markdown:
        _write(args.markdown, markdown.render_gate(result), "--markdown")
    if args.json:
        _write(args.json, render_json(result), "--json")
    return result.exit_code(fail_on_inconclusive=args.fail_on_inconclusive)
