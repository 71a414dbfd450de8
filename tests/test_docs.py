"""The documentation is kept true: README.md and docs/.

- every command of `llm-diagnose --help` has its page, docs/commands/<command>.md, and every flag
  of the command's own `--help` appears in that page;
- every relative link in README.md and docs/**/*.md resolves (the file, and the heading an anchor
  names);
- every identifier the decision tree can emit (questions, answers, verdicts, techniques, statuses,
  pitfalls, headline kinds, path nodes) is on docs/identifiers.md, and every exit code on
  docs/exit-codes.md;
- the README stays short, names its two set-up commands, and its first diagnosis is the tool's
  real output on a run folder of two recorded vLLM pages.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
from pathlib import Path
from typing import get_args

import pytest
from markdown_it import MarkdownIt

from llm_diagnose.diagnose.cli import COMMANDS, build_parser, main
from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.tree import diagnosis

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TREE = ROOT / "llm_diagnose" / "diagnose" / "tree"
FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
MD = MarkdownIt("commonmark").enable("table")

# A path node: a question id, a dot, a kebab-case name ("Q5.step-measured").
PATH_NODE = re.compile(r"^(Q[1-6]|KV|OB)\.[a-z0-9]+(?:-[a-z0-9]+)*$")
KEBAB = re.compile(r"^[a-z]+(?:-[a-z]+)*$")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


# --- commands and flags ---------------------------------------------------------------------------
def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings if opt not in ("-h", "--help")}


def mentions(text: str, flag: str) -> bool:
    """The flag as a whole word: `--trace` is not found inside `--trace-format`."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_every_command_has_a_page_naming_every_flag_of_its_help():
    parsers = subcommand_parsers()
    assert set(parsers) == set(COMMANDS)
    for name, parser in parsers.items():
        page = DOCS / "commands" / f"{name}.md"
        assert page.is_file(), f"`{name}` has no page: write {page.relative_to(ROOT)}"
        text = page.read_text(encoding="utf-8")
        missing = sorted(f for f in flags_of(parser) if not mentions(text, f))
        assert not missing, f"{page.relative_to(ROOT)} does not mention {missing}"


def test_every_command_page_is_for_a_command_that_exists():
    pages = {p.stem for p in (DOCS / "commands").glob("*.md")}
    assert pages <= set(COMMANDS), f"pages for no command: {sorted(pages - set(COMMANDS))}"


def test_the_flag_check_sees_a_missing_flag():
    # The check above must be able to fail: a page without `--trace` but with `--trace-format`.
    assert not mentions("use `--trace-format FORMAT`", "--trace")
    assert mentions("use `--trace FILE`", "--trace")
    assert "--budget-requests" in flags_of(subcommand_parsers()["run"])


# --- links ----------------------------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    tokens = MD.parse(path.read_text(encoding="utf-8"))
    return {slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


def links(path: Path) -> list[str]:
    found = []
    for token in MD.parse(path.read_text(encoding="utf-8")):
        for child in token.children or []:
            if child.type in ("link_open", "image"):
                found.append(str(child.attrs.get("href") or child.attrs.get("src") or ""))
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for href in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I):  # http:, https:, mailto:
            continue
        target, _, anchor = href.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{href} (no file {file})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{href} (no heading #{anchor} in {file.name})")
    return broken


def test_every_relative_link_resolves():
    assert len(markdown_files()) > 20
    for path in markdown_files():
        assert not broken_links(path), f"{path.relative_to(ROOT)}: {broken_links(path)}"


def test_the_link_check_sees_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("# A heading (here)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-here) [web](https://example.com/x)\n"
        "[gone](missing.md) [no anchor](there.md#elsewhere)\n",
        encoding="utf-8",
    )
    assert [b.split(" ")[0] for b in broken_links(page)] == ["missing.md", "there.md#elsewhere"]


# --- identifiers ----------------------------------------------------------------------------------
def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def tree_emits() -> tuple[set[str], set[str]]:
    """(verdicts, path nodes) written anywhere in the tree's source. A verdict is a kebab-case
    string given as `verdict=`, as the last argument of an `...answer(...)` call of five or more
    arguments (the tree's answer helpers end with the verdict), compared with an answer's
    `.verdict`, or listed in a *VERDICT* constant; a path node is any string of the form `Q5.name`."""
    verdicts: set[str] = set()
    nodes: set[str] = set()
    for source in sorted(TREE.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and PATH_NODE.match(node.value):
                nodes.add(node.value)
            found: list[str] = []
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                found += [s for kw in node.keywords if kw.arg == "verdict" for s in _strings(kw.value)]
                if name.endswith("answer") and len(node.args) >= 5:
                    found += _strings(node.args[-1])
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "verdict" for s in sides):
                    found += [s for side in sides for s in _strings(side)]
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and "VERDICT" in t.id for t in node.targets
            ):
                found += _strings(node.value)
            verdicts |= {s for s in found if KEBAB.match(s)}
    return verdicts, nodes


def test_the_scan_finds_the_tree_identifiers():
    # The scan must find what the tree is known to emit, or the documentation check below proves nothing.
    verdicts, nodes = tree_emits()
    assert {"does-not-fit", "overloaded", "untested", "slo-broken", "inconclusive", "passive-low-load"} <= verdicts
    assert {"Q2.prefix-caching-on", "Q5.step-measured", "KV.offload-on"} <= nodes
    assert set(diagnosis.TECHNIQUE_ON_NODES.values()) <= nodes


def test_every_identifier_the_tree_can_emit_is_documented():
    text = (DOCS / "identifiers.md").read_text(encoding="utf-8")
    verdicts, nodes = tree_emits()
    expected = {
        "question": set(diagnosis.QUESTIONS),
        "answer": set(get_args(diagnosis.AnswerValue)),
        "verdict": verdicts,
        "technique": set(diagnosis.TECHNIQUES),
        "status": set(get_args(diagnosis.Status)),
        "pitfall": set(diagnosis.PITFALLS),
        "headline kind": set(diagnosis.HEADLINE_KINDS),
        "path node": nodes,
    }
    for kind, idents in expected.items():
        assert idents, kind
        missing = sorted(i for i in idents if f"`{i}`" not in text)
        assert not missing, f"docs/identifiers.md does not document the {kind}s {missing}"


def test_every_exit_code_is_documented():
    text = (DOCS / "exit-codes.md").read_text(encoding="utf-8")
    codes = {v for k, v in vars(ExitCode).items() if k.isupper() and isinstance(v, int)}
    assert {0, 1, 2, 3, 4, 5, 130} <= codes
    for code in codes:
        assert f"| {code} |" in text, f"docs/exit-codes.md has no row for exit code {code}"


# --- the README -----------------------------------------------------------------------------------
def test_readme_is_short_and_names_its_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120, "the README is read in three minutes: move detail to docs/"
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make \w+", setup, re.M)
    assert commands == ["make demo", "make test"]


def recorded_run(folder: Path) -> Path:
    """A run folder an interrupted run would leave: metrics.jsonl with two scrapes of a real
    vLLM 0.32 CPU server under KV pressure, half a second apart."""
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for i, name in enumerate(("a", "b")):
            page = (FIXTURES / f"vllm-0.32.0-cpu-kv-pressure-real-{name}.txt").read_text(encoding="utf-8")
            line = {
                "t_wall": 1_780_000_000.0 + i * 0.5,
                "t_mono": 100.0 + i * 0.5,
                "elapsed_s": 0.01,
                "url": "http://127.0.0.1:8000/metrics",
                "text": page,
            }
            fh.write(json.dumps(line) + "\n")
    return folder


def readme_first_diagnosis() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## A first diagnosis", 1)[1].split("\n## ", 1)[0]
    outputs = [t.content for t in MD.parse(section) if t.type == "fence" and not t.info]  # no language: output
    assert len(outputs) == 1, "one quoted output under 'A first diagnosis'"
    return outputs[0].rstrip("\n").splitlines()


def test_readme_first_diagnosis_is_the_real_output(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["decide", str(recorded_run(tmp_path / "run")), "--brief"])
    assert code == 0, err.getvalue()
    quoted = readme_first_diagnosis()
    assert len(quoted) > 10 and quoted[0].startswith("llm-diagnose: http://127.0.0.1:8000/metrics")
    assert quoted == out.getvalue().rstrip("\n").splitlines(), "README's first diagnosis differs: paste the output"


@pytest.mark.parametrize("name", ["README.md", "docs/README.md"])
def test_the_entry_pages_link_every_docs_page(name):
    # README links docs/README.md, and docs/README.md links every page: none is unreachable.
    text = (ROOT / name).read_text(encoding="utf-8")
    if name == "README.md":
        assert "docs/README.md" in text
        return
    linked = {(DOCS / href.partition("#")[0]).resolve() for href in links(DOCS / "README.md")}
    pages = {p.resolve() for p in DOCS.rglob("*.md")} - {(DOCS / "README.md").resolve()}
    assert not pages - linked, f"docs/README.md does not link {sorted(str(p) for p in pages - linked)}"
