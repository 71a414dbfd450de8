"""`llm-diagnose report DIR|FILE`: a diagnosis as an HTML page, Markdown, or JSON.

Also home of `load_run`, which reads what a run left behind (a run folder, its evidence.json,
or its diagnosis.json) and is shared with `gate`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_diagnose.diagnose.commands.common import add_slo_flags, load_slo, load_thresholds
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.report import capacity, html, markdown
from llm_diagnose.diagnose.report import content as report_content
from llm_diagnose.diagnose.runfolder import DIAGNOSIS, EVIDENCE, METRICS, check_out_file, out_path, write_output
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import DIAGNOSIS_SCHEMA, Diagnosis
from llm_diagnose.diagnose.tree.evidence import SCHEMA as EVIDENCE_SCHEMA
from llm_diagnose.diagnose.tree.evidence import Evidence, EvidenceError, parse_json_document
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds

__all__ = ["LoadedRun", "load_run", "register", "run", "FORMATS"]

FORMATS = {"html": ".html", "md": ".md", "json": ".json"}

EXAMPLE = """example:
  llm-diagnose report runs/staging --out runs/staging/report.html
  llm-diagnose report runs/staging/diagnosis.json --format md >> "$GITHUB_STEP_SUMMARY"
  llm-diagnose report runs/staging --format json | jq '.recommendations[].technique'"""


@dataclass(frozen=True)
class LoadedRun:
    diagnosis: Diagnosis
    evidence: Evidence | None  # None: a diagnosis.json with no evidence.json beside it
    run_dir: Path | None  # the folder per-request files are read from
    label: str
    note: str = ""  # how the diagnosis was obtained, when that is worth saying


def _read_json(path: Path) -> dict:
    try:
        data = parse_json_document(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc})") from None
    except EvidenceError as exc:
        raise UsageError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return data


def _evidence(path: Path, data: dict) -> Evidence:
    try:
        return Evidence.from_dict(data)
    except EvidenceError as exc:
        raise UsageError(f"{path}: {exc}") from None


def load_run(path: str | Path, thresholds: Thresholds | None = None, slo: SLO | None = None) -> LoadedRun:
    """A run folder, an evidence.json or a diagnosis.json -> the diagnosis and its evidence.

    The diagnosis is read from diagnosis.json when there is one (it is what the run decided,
    with the thresholds and SLO it ran with); otherwise it is computed from the evidence, with
    `thresholds` and `slo` where given.
    """
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p} does not exist: give a run folder, an evidence.json or a diagnosis.json")
    if p.is_dir():
        folder, ev_path, dg_path = p, p / EVIDENCE, p / DIAGNOSIS
        if not ev_path.exists() and not dg_path.exists():
            if (p / METRICS).exists():  # an interrupted run: its scrapes are all there is
                from llm_diagnose.diagnose.collect import evidence_from_scrapes

                evidence = evidence_from_scrapes(p)
                return LoadedRun(
                    diagnose(evidence, thresholds, slo=slo),
                    evidence,
                    folder,
                    str(p),
                    f"no {EVIDENCE} in {p} (an interrupted run?): diagnosed from the scrapes in {p / METRICS}",
                )
            raise UsageError(f"{p} holds neither {EVIDENCE} nor {DIAGNOSIS}: is it a run folder?")
    else:
        schema = _read_json(p).get("schema")
        folder = p.parent
        if schema == DIAGNOSIS_SCHEMA:
            ev_path, dg_path = folder / EVIDENCE, p
        elif schema == EVIDENCE_SCHEMA:
            ev_path, dg_path = p, folder / DIAGNOSIS
        else:
            raise UsageError(f"{p}: field 'schema' is {schema!r}; expected {EVIDENCE_SCHEMA!r} or {DIAGNOSIS_SCHEMA!r}")
    evidence = _evidence(ev_path, _read_json(ev_path)) if ev_path.exists() else None
    note = ""
    if dg_path.exists():
        try:
            diagnosis = Diagnosis.from_dict(_read_json(dg_path))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:  # a file edited by hand
            raise UsageError(
                f"{dg_path}: not a diagnosis this tool can read ({type(exc).__name__}: {exc}); "
                f"remove it to diagnose {EVIDENCE} afresh"
            ) from None
        # The tree is cheap and pure: re-running it is the one way to get the digest it records.
        if evidence is not None and diagnosis.evidence_digest != diagnose(evidence, thresholds).evidence_digest:
            note = f"{dg_path} was computed from other evidence than {ev_path}: it is used as written"
        if slo is not None and slo.declared and not slo.equivalent(diagnosis.slo):
            note = "; ".join(
                n
                for n in (
                    note,
                    (
                        f"{dg_path} was judged against {'its recorded SLO' if diagnosis.slo.declared else 'no SLO'}, used as "
                        f"written: the SLO given applies only without a {DIAGNOSIS} (re-judge: llm-diagnose decide "
                        f"{ev_path} --slo ...)"
                    ),
                )
                if n
            )
    else:
        assert evidence is not None  # one of the two exists (checked above)
        diagnosis = diagnose(evidence, thresholds, slo=slo)
        note = (
            f"no {DIAGNOSIS} beside {ev_path}: diagnosed now"
            + (f" with thresholds from {thresholds.source}" if thresholds is not None else " with default thresholds")
            + (f" and the SLO from {slo.source}" if slo is not None and slo.declared else "")
        )
    return LoadedRun(diagnosis, evidence, folder, str(p), note)


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write a diagnosis as HTML, Markdown or JSON",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Render a run's diagnosis: a self-contained HTML page with plots (no network "
        "needed to view it), Markdown for a pull-request comment, or JSON.",
    )
    p.add_argument("run", metavar="DIR|FILE", help="a run folder, or its diagnosis.json or evidence.json")
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


def _capacity_markdown(run_dir: Path | None) -> str:
    """The capacity-plan section, when `llm-diagnose plan --out` wrote one into the run folder."""
    plan = capacity.load_plan(run_dir)
    return "" if plan is None else "\n" + "\n".join(capacity.markdown_lines(plan))


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds) if args.thresholds else None
    slo = load_slo(args)
    if args.out is not None:
        check_out_file(args.out)  # before the work
    loaded = load_run(args.run, thresholds, slo if slo.declared else None)
    fmt = _format(args)
    if fmt == "html":
        text = html.render(
            loaded.diagnosis, loaded.evidence, run_dir=loaded.run_dir, include_prompts=args.include_prompts
        )
    elif fmt == "md":
        text = markdown.render(loaded.diagnosis, loaded.evidence, include_prompts=args.include_prompts)
        text += _capacity_markdown(loaded.run_dir)
    else:
        text = report_content.render(
            loaded.diagnosis,
            loaded.evidence,
            include_prompts=args.include_prompts,
            capacity_plan=capacity.load_plan(loaded.run_dir),
        )
    if loaded.note:
        print(f"llm-diagnose: {loaded.note}", file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_output(args.out, text)
        print(f"llm-diagnose: wrote {args.out} ({fmt})", file=sys.stderr)
    return 0
