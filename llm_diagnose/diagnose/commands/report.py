"""`llm-diagnose report DIR|FILE`: a diagnosis as an HTML page, Markdown, or JSON.

Each run is read once (`runfolder.load_run`: the folder, and the diagnosis to show).
"""

from __future__ import annotations

import argparse
import sys

from llm_diagnose.diagnose.commands.common import add_slo_flags, load_slo, load_thresholds
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.report import content as report_content
from llm_diagnose.diagnose.report import html, markdown
from llm_diagnose.diagnose.runfolder import check_out_file, load_run, out_path, write_output
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["register", "run", "FORMATS"]

FORMATS = {"html": ".html", "md": ".md", "json": ".json"}

EXAMPLE = """example:
  llm-diagnose report runs/staging --out runs/staging/report.html
  llm-diagnose report runs/staging/diagnosis.json --format md >> "$GITHUB_STEP_SUMMARY"
  llm-diagnose report runs/staging --format json | jq '.recommendations[].technique'
  llm-diagnose report runs/before runs/after --out before-after.html"""


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
