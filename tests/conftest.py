"""Session fixtures for the real-engine tests: one tiny model, real vLLM servers on loopback.

Starting a vLLM CPU server takes about 30 s, so servers are started once per distinct flag set
and shared by the whole session. A missing vLLM is a failure, not a skip: these tests are
mandatory in CI, and a skip would hide a broken install.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llm_diagnose.diagnose.demo.tiny_model import RECIPE_VERSION, make_tiny_model
from llm_diagnose.diagnose.demo.vllm_server import VllmServer, vllm_available

REAL_ENGINE_FIXTURES = {"vllm_server", "vllm_server_factory"}
# Each idle vLLM CPU server still polls (~0.15 core) and holds ~2.8 GB: keep few alive on 2 cores
# and 24 GB (a run with three alive had a load average of 9 and three live tests failing). Every
# start costs ~40-45 s on the 2-core host (three processes importing torch one after another), so
# the default server, which most tests use, is never the one stopped: in a full run without that
# rule it was started twice.
MAX_LIVE_SERVERS = 2


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_engine: runs against a real vLLM / transformers server on loopback")


# Modules that need the default server and its prefix-off twin run right after the others that
# do, while the factory still holds both: in file order a small-model server came in between, and
# the prefix-off one was started a second time (~65 s on the 2-core host).
RUN_AFTER = {
    "test_fleet_prometheus.py": "test_change_verified_live.py",
    "test_gate_real_engine.py": "test_change_verified_live.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that asks for a real server is a real-engine test, marked or not.
    for item in items:
        if REAL_ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_engine)
    last = {item.path.name: i for i, item in enumerate(items)}  # each module's last position

    def place(pair: tuple[int, pytest.Item]) -> tuple[float, int]:
        i, item = pair
        anchor = RUN_AFTER.get(item.path.name)
        if anchor is None or anchor not in last:  # not moved, or its anchor is not in this run
            return (float(i), i)
        return (last[anchor] + 0.5, i)  # after the anchor module, in its own order

    items[:] = [item for _, item in sorted(enumerate(items), key=place)]


ARTEFACTS_DIR = Path(__file__).resolve().parent.parent / ".test-artefacts"  # gitignored
ARTEFACT_TAIL_LINES = 40  # of each events.jsonl / summary.txt, printed in the failure report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test's temporary folder is kept, and the report says where and shows its events.

    pytest removes old temporary folders and CI's checkout is gone once it ends: the failure
    report (what CI prints) is the only artefact that survives, so the run's own account goes in.
    """
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    tmp = funcargs.get("tmp_path")
    # The servers' own logs (a VllmServer's .log): pytest rotates their folders away too.
    logs = [Path(v.log) for v in funcargs.values() if isinstance(getattr(v, "log", None), (str, Path))]
    logs = [log for log in logs if log.is_file()]
    if not (isinstance(tmp, Path) and tmp.is_dir()) and not logs:
        return
    kept = ARTEFACTS_DIR / item.nodeid.replace("/", "_").replace("::", "__")[:150]
    shutil.rmtree(kept, ignore_errors=True)
    if isinstance(tmp, Path) and tmp.is_dir():
        shutil.copytree(tmp, kept, symlinks=True, dirs_exist_ok=True)
    kept.mkdir(parents=True, exist_ok=True)
    lines = [f"temporary folder kept at {kept}"]
    for log in logs:
        shutil.copy2(log, kept / log.name)
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-ARTEFACT_TAIL_LINES:]
        lines += [f"--- server log {log.name} (last {len(tail)} lines)", *tail]
    for name in ("events.jsonl", "summary.txt"):
        for f in sorted(kept.rglob(name)):
            tail = f.read_text(encoding="utf-8", errors="replace").splitlines()[-ARTEFACT_TAIL_LINES:]
            lines += [f"--- {f.relative_to(kept)} (last {len(tail)} lines)", *tail]
    report.sections.append(("artefacts", "\n".join(lines)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded tiny Llama; under $LLMD_CACHE_DIR (reused across sessions) when set."""
    cache = os.environ.get("LLMD_CACHE_DIR")
    root = Path(cache) if cache else tmp_path_factory.mktemp("models")
    return make_tiny_model(root / f"tiny-llama-r{RECIPE_VERSION}")


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe's 23 M "small" model, slow enough on 2 cores for latency experiments."""
    cache = os.environ.get("LLMD_CACHE_DIR")
    root = Path(cache) if cache else tmp_path_factory.mktemp("models")
    return make_tiny_model(root / f"small-llama-r{RECIPE_VERSION}", size="small")


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module: the benchmarks are scripts, not a package."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_server_flags(small_model_dir: Path) -> dict:
    """The factory's flags for the small model's server, one server for the modules that use it.
    --enable-prompt-tokens-details: responses carry cached_tokens, the prefix experiment's second source."""
    return {"model_dir": small_model_dir, "extra_args": ("--enable-prompt-tokens-details",)}


@pytest.fixture(scope="session")
def vllm_server_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., VllmServer]]:
    """`get(**flags)`: a ready VllmServer for these keyword arguments, shared per session.

    The flags are VllmServer's keyword arguments (`max_model_len`, `prefix_caching`,
    `extra_args`, ...), plus `model_dir` to serve another model than the tiny one.
    """
    ok, why = vllm_available()
    if not ok:
        pytest.fail(f"real-engine tests need vLLM: {why}", pytrace=False)
    tiny_model_dir = request.getfixturevalue("tiny_model_dir")  # only once vLLM is known good
    servers: dict[str, VllmServer] = {}
    # Defaults are filled in so that get() and get(prefix_caching=True) share one server.
    defaults = {
        name: p.default
        for name, p in inspect.signature(VllmServer).parameters.items()
        if p.default is not inspect.Parameter.empty
    }

    def key_of(**flags: object) -> tuple[str, dict]:
        # model_in_engine_process: about 15 s less per start (VllmServer's docstring says why it is off by default).
        flags = {**defaults, "model_dir": tiny_model_dir, "model_in_engine_process": True, **flags}
        flags["extra_args"] = tuple(flags["extra_args"])  # type: ignore[arg-type]
        return repr(sorted(flags.items())), flags

    default_key, _ = key_of()

    def get(**flags: object) -> VllmServer:
        key, flags = key_of(**flags)
        if key in servers:
            servers[key] = servers.pop(key)  # most recently used last
        else:
            # Keep the most recently used few, stop the oldest that is not the default server.
            while len(servers) >= MAX_LIVE_SERVERS:
                servers.pop(next(k for k in servers if k != default_key)).stop()
            model_dir = Path(flags.pop("model_dir"))  # type: ignore[arg-type]
            server = VllmServer(model_dir, tmp_path_factory.mktemp("vllm"), **flags)  # type: ignore[arg-type]
            server.start()
            server.wait_ready()  # raises with the log tail; nothing is cached then
            servers[key] = server
        return servers[key]

    yield get
    for server in servers.values():
        server.stop()


@pytest.fixture  # per test: the factory may have stopped an older server since
def vllm_server(vllm_server_factory: Callable[..., VllmServer]) -> VllmServer:
    """The default server: prefix caching on, max-model-len 2048, served as tiny-llama."""
    return vllm_server_factory(prefix_caching=True, max_model_len=2048)
