"""Import layers: probes never import diagnose; the decision tree loads no I/O module.

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
PURE_PROBES = frozenset({"llm_diagnose.probes.quantities", "llm_diagnose.probes.results", "llm_diagnose.probes.stats"})
PACKAGES = frozenset({"llm_diagnose", "llm_diagnose.probes", "llm_diagnose.diagnose"})  # docstring-only __init__s
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
        and m not in PURE_PROBES | PACKAGES
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
