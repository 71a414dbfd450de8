"""`llm-diagnose report DIR|FILE`: a diagnosis as an HTML page, Markdown, or JSON.

Also home of `load_run`, which reads what a run left behind (a run folder, its evidence.json,
or its diagnosis.json: `RunFolder.open`) and settles the diagnosis to show; shared with `gate`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_diagnose.diagnose.commands.common import add_slo_flags, load_slo, load_thresholds
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.report import content as report_content
from llm_diagnose.diagnose.report import html, markdown
from llm_diagnose.diagnose.runfolder import DIAGNOSIS, RunFolder, check_out_file, out_path, write_output
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["LoadedRun", "load_run", "register", "run", "FORMATS"]

FORMATS = {"html": ".html", "md": ".md", "json": ".json"}

EXAMPLE = """example:
  llm-diagnose report runs/staging --out runs/staging/report.html
  llm-diagnose report runs/staging/diagnosis.json --format md >> "$GITHUB_STEP_SUMMARY"
  llm-diagnose report runs/staging --format json | jq '.recommendations[].technique'
  llm-diagnose report runs/before runs/after --out before-after.html"""


@dataclass(frozen=True)
class LoadedRun:
    diagnosis: Diagnosis  # as written in diagnosis.json, or computed now (`note` says so)
    folder: RunFolder  # everything read from the run folder, once
    note: str = ""  # how the diagnosis was obtained, when that is worth saying

    @property
    def evidence(self) -> Evidence | None:  # None: a diagnosis.json with no evidence.json beside it
        return self.folder.evidence

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def label(self) -> str:
        return self.folder.label


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def load_run(path: str | Path, thresholds: Thresholds | None = None, slo: SLO | None = None) -> LoadedRun:
    """A run folder, an evidence.json or a diagnosis.json -> the diagnosis and its evidence.

    The diagnosis is read from diagnosis.json when there is one (it is what the run decided,
    with the thresholds and SLO it ran with); otherwise it is computed from the evidence, with
    `thresholds` and `slo` where given. Unreadable files, and files of another schema, raise
    RunFolderError (exit 2, one line).
    """
    folder = RunFolder.open(path)
    evidence, written = folder.evidence, folder.diagnosis
    if written is None:
        assert evidence is not None  # RunFolder.open refuses a folder with neither
        diagnosis = diagnose(evidence, thresholds, slo=slo)
        if folder.from_scrapes:
            return LoadedRun(diagnosis, folder, folder.note)
        note = (
            f"no {DIAGNOSIS} beside {folder.evidence_path}: diagnosed now"
            + (f" with thresholds from {thresholds.source}" if thresholds is not None else " with default thresholds")
            + (f" and the SLO from {slo.source}" if slo is not None and slo.declared else "")
        )
        return LoadedRun(diagnosis, folder, note)
    dg_path, ev_path = folder.diagnosis_path, folder.evidence_path
    note = ""
    # The tree is cheap and pure: re-running it is the one way to get the digest it records.
    if evidence is not None and written.evidence_digest != diagnose(evidence, thresholds).evidence_digest:
        note = f"{dg_path} was computed from other evidence than {ev_path}: it is used as written"
    if slo is not None and slo.declared and not slo.equivalent(written.slo):
        note = _notes(
            note,
            f"{dg_path} was judged against {'its recorded SLO' if written.slo.declared else 'no SLO'}, used as "
            f"written: the SLO given applies only without a {DIAGNOSIS} (re-judge: llm-diagnose decide "
            f"{ev_path} --slo ...)",
        )
    return LoadedRun(written, folder, note)


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write a diagnosis as HTML, Markdown or JSON",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Render a run's diagnosis: a self-contained HTML page with plots (no network "
        "needed to view it), Markdown for a pull-request comment, or JSON.",
    )
    p.add_argument(
        "runs",
        metavar="DIR|FILE",
        nargs="+",
        help="a run folder, or its diagnosis.json or evidence.json; two of them (BEFORE AFTER): one HTML page "
        "with verify's judgement of the change and the two diagnoses side by side",
    )
    p.add_argument("--format", choices=tuple(FORMATS), help="default: from --out's suffix, else html")
    p.add_argument("--out", type=out_path, metavar="FILE", help="write here (default: standard output)")
    p.add_argument("--thresholds", metavar="FILE", help="TOML thresholds, used only when there is no diagnosis.json")
    add_slo_flags(p)  # like --thresholds: used only when there is no diagnosis.json
    p.add_argument(
        "--include-prompts",
        action="store_true",
        help="show prompt text found in the evidence (withheld by default: hashes and lengths only)",
    )
    p.set_defaults(func=run)


_SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json"}


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    return _SUFFIXES.get(args.out.suffix.lower(), "html") if args.out is not None else "html"


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds) if args.thresholds else None
    slo = load_slo(args)
    fmt = _format(args)
    if len(args.runs) > 2:
        raise UsageError(f"report takes one run, or two (BEFORE AFTER) for the HTML page; got {len(args.runs)} runs")
    if len(args.runs) == 2 and fmt != "html":
        raise UsageError(
            f"two runs make one HTML page, not {fmt}: for two runs in Markdown or JSON use llm-diagnose verify "
            "BEFORE AFTER --markdown FILE / --json"
        )
    if args.out is not None:
        check_out_file(args.out)  # before the work
    if len(args.runs) == 2:
        return _run_pair(args, thresholds, slo if slo.declared else None)
    loaded = load_run(args.runs[0], thresholds, slo if slo.declared else None)
    render = {"html": html.render, "md": markdown.render, "json": report_content.render}[fmt]
    text = render(loaded.diagnosis, loaded.evidence, run=loaded.folder, include_prompts=args.include_prompts)
    if loaded.note:
        print(f"llm-diagnose: {loaded.note}", file=sys.stderr)
    _emit(args, text, fmt)
    return 0


def _emit(args: argparse.Namespace, text: str, what: str) -> None:
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_output(args.out, text)
        print(f"llm-diagnose: wrote {args.out} ({what})", file=sys.stderr)


def _run_pair(args: argparse.Namespace, thresholds: Thresholds | None, slo: SLO | None) -> int:
    """Two runs: verify's judgement of the change, then both diagnoses side by side (HTML)."""
    from llm_diagnose.diagnose.report.html_pair import PairSide, render_pair
    from llm_diagnose.diagnose.verify.judge import RunSide, verify

    loaded = [load_run(path, thresholds, slo) for path in args.runs]
    result = verify(*(RunSide.of(x.folder, x.diagnosis, x.note) for x in loaded))
    text = render_pair(PairSide.of(loaded[0]), PairSide.of(loaded[1]), result, include_prompts=args.include_prompts)
    for x in loaded:
        if x.note:
            print(f"llm-diagnose: {x.note}", file=sys.stderr)
    _emit(args, text, "html, before and after")
    return 0
