"""Import layers: probes never import diagnose; the decision tree loads no I/O module; diagnose is
layered (commands above features, renderers, judges, run folder and tree) and no module imports
itself round a circle.

Two checks, each shown to fail on a violation:
- `lint-imports` (contracts in pyproject.toml, run by `make check`) reads the source: every
  import, direct or through a chain of modules. The tests below break a copy of the package and
  see each contract broken.
- The test here imports the tree for real, in a fresh interpreter, and lists what that loaded.
  It catches what reading the source cannot (package `__init__`s, imports made by the standard
  library or by importlib), and it is an allow-list: a probe module the tree starts to import
  must be added to PURE_PROBES here, by someone who has read it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

TREE = "llm_diagnose.diagnose.tree"
# Probe modules the tree may load: values and statistics, no I/O (each says so in its docstring).
PURE_PROBES = frozenset(
    {
        "llm_diagnose.probes.quantities",
        "llm_diagnose.probes.results",
        "llm_diagnose.probes.stats",
        "llm_diagnose.probes.warning_codes",
    }
)
PACKAGES = frozenset({"llm_diagnose", "llm_diagnose.probes", "llm_diagnose.diagnose"})  # docstring-only __init__s
# Modules of diagnose below the tree (the layers contract): the tolerance registry the techniques'
# claims read their minimum effects from, and the one TOML reader; no I/O but reading one local file.
PURE_BELOW_TREE = frozenset({"llm_diagnose.diagnose.tolerances", "llm_diagnose.diagnose.toml_file"})
# Top-level modules that reach the network, other processes, an event loop or a device.
IO_MODULES = frozenset(
    {
        "socket",
        "ssl",
        "http",
        "urllib",
        "subprocess",
        "asyncio",
        "multiprocessing",
        "threading",
        "aiohttp",
        "prometheus_client",
        "pynvml",
        "torch",
        "vllm",
        "transformers",
    }
)

# Imports the package and every module under it in a fresh interpreter; prints what that loaded.
_LOADER = """
import importlib, json, pkgutil, sys
before = set(sys.modules)
root = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(root.__path__, sys.argv[1] + "."):
    importlib.import_module(info.name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def modules_loaded_by(package: str, root: Path = REPO) -> set[str]:
    """What importing `package` (and every module under it) from `root` loads."""
    # `python -c` puts its working folder first on sys.path, so the working folder picks the copy.
    out = subprocess.run(
        [sys.executable, "-c", _LOADER, package], cwd=root, capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(out.stdout))


def not_pure(loaded: set[str], package: str) -> list[str]:
    """What `package` loaded that a pure package may not: I/O modules, and project modules
    outside itself, PURE_PROBES and the docstring-only packages above them."""
    io = {m for m in loaded if m.split(".")[0] in IO_MODULES}
    project = {
        m
        for m in loaded
        if m.split(".")[0] == "llm_diagnose"
        and m not in PURE_PROBES | PACKAGES | PURE_BELOW_TREE
        and m != package
        and not m.startswith(package + ".")
    }
    return sorted(io | project)


def test_the_tree_loads_only_pure_modules() -> None:
    loaded = modules_loaded_by(TREE)
    assert f"{TREE}.walk" in loaded  # the walk did load: an empty list would prove nothing
    assert not_pure(loaded, TREE) == []


def test_the_load_check_sees_io_and_io_probes(tmp_path: Path) -> None:
    fake = tmp_path / "fake_tree"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "judge.py").write_text("import socket\nimport llm_diagnose.probes.quantities\n")
    (fake / "scrape.py").write_text("import llm_diagnose.probes.http\n")
    found = not_pure(modules_loaded_by("fake_tree", tmp_path), "fake_tree")
    assert "socket" in found
    assert "llm_diagnose.probes.http" in found
    assert "aiohttp" in found  # through llm_diagnose.probes.http
    assert "llm_diagnose.probes.quantities" not in found


def lint_imports(root: Path, contract: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "--contract", contract],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("contract", "module", "violation", "shown"),
    [
        (
            "probes-measure",
            "probes/quantities.py",
            "import llm_diagnose.diagnose.errors",
            "llm_diagnose.probes.quantities -> llm_diagnose.diagnose.errors",
        ),
        ("tree-pure", "diagnose/tree/signals.py", "import socket", "llm_diagnose.diagnose.tree.signals -> socket"),
        # Indirect: the tree reads results, which would then reach the network.
        ("tree-pure", "probes/results.py", "import aiohttp", "llm_diagnose.probes.results -> aiohttp"),
        (
            "tree-pure",
            "diagnose/tree/slo.py",
            "from llm_diagnose.probes import http",
            "llm_diagnose.diagnose.tree.slo -> llm_diagnose.probes.http",
        ),
        # Inside diagnose: the tree may not reach up to a renderer, nor the comparison core to a judge.
        (
            "diagnose-layers",
            "diagnose/tree/signals.py",
            "import llm_diagnose.diagnose.report.console",
            "llm_diagnose.diagnose.tree.signals -> llm_diagnose.diagnose.report.console",
        ),
        (
            "diagnose-layers",
            "diagnose/compare/metric.py",
            "import llm_diagnose.diagnose.gate.judge",
            "llm_diagnose.diagnose.compare.metric -> llm_diagnose.diagnose.gate.judge",
        ),
    ],
)
def test_each_contract_breaks_on_a_violation(
    tmp_path: Path, contract: str, module: str, violation: str, shown: str
) -> None:
    shutil.copytree(REPO / "llm_diagnose", tmp_path / "llm_diagnose", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "llm_diagnose" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{violation}\n", encoding="utf-8")
    run = lint_imports(tmp_path, contract)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BROKEN" in run.stdout
    assert shown in run.stdout


def import_cycles(package: str = "llm_diagnose") -> list[list[str]]:
    """Every set of modules that import each other round in a circle (strongly connected, size > 1),
    type-checking imports included: a circle only for the type checker is still one to untangle."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False)
    modules = sorted(m for m in graph.modules if m.split(".")[0] == package)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    assert import_cycles() == []


def test_the_circle_check_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "circle_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle_pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circle_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("circle_pkg") == [["circle_pkg.a", "circle_pkg.b"]]
