"""`llm-diagnose verify BEFORE AFTER`: did the change between two runs deliver what it promised?

Each run is read once (`load_run`: `RunFolder.open`), judged (`llm_diagnose.diagnose.verify.judge`)
and rendered (`llm_diagnose.diagnose.verify.render`). The tolerances are the registry's
(`llm_diagnose.diagnose.tolerances`), set by the `[tolerances]` table of --thresholds.
"""

from __future__ import annotations

import argparse
import sys

from llm_diagnose.diagnose.runfolder import out_path

SUMMARY = "compare two runs before and after a change: did the adopted technique deliver?"
EXAMPLE = """example:
  llm-diagnose verify runs/before runs/after
  llm-diagnose verify runs/before runs/after --change "turned on prefix caching" --junit verify.xml --markdown v.md
  llm-diagnose verify runs/before runs/after --html before-after.html   (also: report BEFORE AFTER)
  llm-diagnose verify runs/before runs/after --control runs/before-again   (A/B/A: two runs of the old settings)

The adopted technique is identified from the configuration each run discovered (a switch turned
on, a setting changed); --change only adds a note. With no configuration change, the techniques
the BEFORE run's diagnosis recommended are judged. Two server instances of one configuration can
differ by more than the noise inside each run: --control RUN (BEFORE's configuration run again, on
a fresh server) brackets AFTER between two controls, and a verdict stands only against both.

exit codes: 0 every claim delivered or no harm; 1 a claim made it worse (or a harmful side
effect); 2 bad usage or input; 5 the runs are not comparable (different workloads), or a claim
cannot be told with --fail-on-inconclusive"""


def register(sub) -> None:
    p = sub.add_parser(
        "verify",
        help=SUMMARY,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare two runs of the same server and workload, before and after a change: what "
        "changed in the discovered configuration, which technique that adopts, whether each of its "
        "promised effects was delivered (bootstrap interval of the change, the gate's comparison), "
        "side effects beyond the noise, and whether the two workloads were comparable at all.",
    )
    p.add_argument("before", metavar="BEFORE", help="run folder (or its evidence.json) before the change")
    p.add_argument("after", metavar="AFTER", help="run folder (or its evidence.json) after the change")
    p.add_argument(
        "--control",
        metavar="RUN",
        help="a second run of BEFORE's configuration (fresh server): AFTER is judged against both (A/B/A)",
    )
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="TOML: its [tolerances] set the comparison's tolerances (the workload checks', the failure ceiling, "
        "the metrics'); its [thresholds] and [slo] diagnose runs that lack a diagnosis.json",
    )
    p.add_argument("--change", metavar="NOTE", default="", help="what was changed, in words (a note only)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of text")
    p.add_argument("--junit", type=out_path, metavar="FILE", help="also write JUnit XML here")
    p.add_argument("--markdown", type=out_path, metavar="FILE", help="also write a Markdown summary here")
    p.add_argument(
        "--html", type=out_path, metavar="FILE", help="also write the HTML page: this result, both runs side by side"
    )
    p.add_argument(
        "--fail-on-inconclusive", action="store_true", help="exit 5 when a claim cannot be told from the runs"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.commands.common import load_slo
    from llm_diagnose.diagnose.commands.gate import load_thresholds_file
    from llm_diagnose.diagnose.compare.settings import CompareSettings
    from llm_diagnose.diagnose.runfolder import check_out_file, load_run, write_output
    from llm_diagnose.diagnose.verify.bracket import verify_bracketed
    from llm_diagnose.diagnose.verify.judge import RunSide, verify
    from llm_diagnose.diagnose.verify.render import render_json, render_junit, render_markdown, render_text

    for flag in ("junit", "markdown", "html"):  # an output that cannot be written fails before the comparison
        if getattr(args, flag) is not None:
            check_out_file(getattr(args, flag), f"--{flag}")
    thresholds, tolerances = load_thresholds_file(args.thresholds)
    settings = CompareSettings(tolerances=tolerances)
    slo = load_slo(args)
    loaded = [load_run(path, thresholds, slo if slo.declared else None) for path in (args.before, args.after)]
    before, after = (RunSide.of(x.folder, x.diagnosis, x.note) for x in loaded)
    if args.control is None:
        result = verify(before, after, change_note=args.change, settings=settings)
    else:
        control = load_run(args.control, thresholds, slo if slo.declared else None)
        result = verify_bracketed(
            before,
            after,
            RunSide.of(control.folder, control.diagnosis, control.note),
            change_note=args.change,
            settings=settings,
        )
    sys.stdout.write(render_json(result) if args.json else render_text(result))
    if args.junit:
        write_output(args.junit, render_junit(result), "--junit")
    if args.markdown:
        write_output(args.markdown, render_markdown(result), "--markdown")
    if args.html:
        from llm_diagnose.diagnose.report.html_pair import PairSide, render_pair

        write_output(args.html, render_pair(PairSide.of(loaded[0]), PairSide.of(loaded[1]), result), "--html")
    return result.exit_code(fail_on_inconclusive=args.fail_on_inconclusive)
