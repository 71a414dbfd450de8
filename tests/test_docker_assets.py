"""The container and Kubernetes assets under docker/: linted, schema-checked, and their commands run.

No container engine runs on the project's machines, so no image is built here. What is checked:
the Dockerfile with hadolint, the job script with shellcheck, every YAML file with yamllint, the
compose files against the Compose Specification schema (the copy check-jsonschema ships), the
Kubernetes manifests against the bundled Kubernetes schemas (kubernetes-validate, strict), all
offline. Then every command those files run is run here, on the host: the same program (the image's
ENTRYPOINT `llm-diagnose` is this venv's console script, built from the same sources;
`llm-diagnose-job` is docker/llm-diagnose-job itself; `python -m ...` is this interpreter) with the
same arguments and environment, against the real vLLM CPU server of tests/conftest.py on 127.0.0.1.
Only what must differ on a host is substituted: the server's address (`http://vllm:8000` and the
like become the test server's URL), the folders the containers write (`/runs`, `/models` become
tmp_path), and the observation window (`--duration` and friends, shortened so the suite stays
short). Every substitution must match something, so a file that drifts fails here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from llm_diagnose.diagnose.demo.vllm_server import VllmServer, cpu_dtype
from llm_diagnose.diagnose.tree.evidence import Evidence

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
JOB_SCRIPT = DOCKER / "llm-diagnose-job"
COMPOSE_GPU = DOCKER / "compose.gpu.yaml"
COMPOSE_CPU = DOCKER / "compose.cpu.yaml"
K8S = DOCKER / "k8s"
YAMLLINT_CONFIG = DOCKER / ".yamllint.yaml"
BIN = Path(sys.executable).parent  # the venv's scripts: llm-diagnose, hadolint, yamllint, ...
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests promise to fit
RUN_TIMEOUT_S = 240
SECRET_ENV = ("LLM_DIAGNOSE_API_KEY", "OPENAI_API_KEY", "HF_TOKEN")


def _run(argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # the status is asserted


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing from {BIN}: pip install -e '.[test]'"
    return str(path)


# --- reading the files ---------------------------------------------------------------------------


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, dict[str, list[str] | None]]:
    """ENTRYPOINT and CMD (exec form) of each stage, inherited from the stage it is built FROM."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: dict[str, dict[str, list[str] | None]] = {}
    current: dict[str, list[str] | None] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            parent = stages.get(parts[0], {"ENTRYPOINT": None, "CMD": None})
            current = dict(parent)
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"#{len(stages)}"
            stages[name] = current
        elif word in ("ENTRYPOINT", "CMD"):
            assert current is not None, f"{word} before FROM"
            value = json.loads(rest)  # exec form only: a shell form would add `/bin/sh -c`
            assert isinstance(value, list), f"{word} must be the exec (JSON) form"
            current[word] = value
            if word == "ENTRYPOINT":
                current["CMD"] = None  # as Docker does: a new ENTRYPOINT resets an inherited CMD
    return stages


def default_stage(path: Path = DOCKERFILE) -> str:
    return list(dockerfile_stages(path))[-1]  # `docker build` without --target builds the last stage


def compose_file(path: Path) -> dict:
    return yaml.safe_load(path.read_text())  # PyYAML resolves the `<<` merge keys as compose does


def service_argv(compose: Mapping, service: str) -> list[str]:
    """The argv a compose service runs: its entrypoint and command over its image's (our Dockerfile)."""
    svc = compose["services"][service]
    stage = dockerfile_stages()[svc.get("build", {}).get("target") or default_stage()]
    if "entrypoint" in svc:
        entrypoint, command = svc["entrypoint"], svc.get("command") or []  # compose drops the image CMD then
    else:
        entrypoint, command = stage["ENTRYPOINT"] or [], svc.get("command") or stage["CMD"] or []
    assert isinstance(entrypoint, list) and isinstance(command, list), f"{service}: use the list form"
    return [*entrypoint, *command]


def service_env(compose: Mapping, service: str) -> dict[str, str]:
    """The literal `NAME=value` entries; bare names are passed from the user's shell, not set here."""
    entries = compose["services"][service].get("environment") or []
    assert isinstance(entries, list), f"{service}: environment as a list"
    return dict(e.split("=", 1) for e in entries if "=" in e)


def k8s_documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_container(kind: str, container: str) -> dict:
    for _, doc in k8s_documents():
        if doc["kind"] == kind:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["name"] == container:
                    return c
    raise AssertionError(f"no container {container!r} in a {kind}")


def k8s_pod_spec(kind: str) -> dict:
    return next(doc["spec"]["template"]["spec"] for _, doc in k8s_documents() if doc["kind"] == kind)


def k8s_literal_env(container: Mapping) -> dict[str, str]:
    # valueFrom entries (the optional API-key Secret) are left unset: no Secret exists here.
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# --- running them on the host --------------------------------------------------------------------


def substitute(items: Sequence[str], replace: Mapping[str, str], flags: Mapping[str, str] = {}) -> list[str]:
    """`replace`: whole items, or an item's leading path/URL; `flags`: the value after a flag.

    Each key must be used at least once, so a changed file cannot slip past the substitution.
    """
    out, used = [], set()
    for i, item in enumerate(items):
        if i > 0 and items[i - 1] in flags:
            out.append(flags[items[i - 1]])
            used.add(items[i - 1])
            continue
        for old, new in replace.items():
            if item == old or item.startswith(old.rstrip("/") + "/"):
                item = new + item[len(old) :]
                used.add(old)
                break
        out.append(item)
    missing = (set(replace) | set(flags)) - used
    assert not missing, f"substitutions that matched nothing in {list(items)}: {sorted(missing)}"
    assert not any("${" in item for item in out), f"uninterpolated variable in {out}"
    return out


def host_program(argv: list[str]) -> list[str]:
    """The image's programs, found here: the venv's console scripts, this interpreter, our script."""
    program = {
        "llm-diagnose": _tool("llm-diagnose"),
        "python": sys.executable,
        "python3": sys.executable,
        "llm-diagnose-job": str(JOB_SCRIPT),
    }.get(argv[0])
    assert program, f"unknown program {argv[0]!r}"
    return [program, *argv[1:]]


def host_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}  # the test server has no key
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # the job script's `llm-diagnose`
    return {**env, **extra}


@pytest.fixture
def server(vllm_server_factory: Callable[..., VllmServer]) -> VllmServer:
    return vllm_server_factory()  # the shared default server (prefix caching on, max-model-len 2048)


# --- linters and schemas -------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    result = _run([_tool("hadolint"), "--no-color", str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_job_script_passes_shellcheck():
    result = _run([_tool("shellcheck"), "--shell=sh", str(JOB_SCRIPT)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_yaml_passes_yamllint():
    result = subprocess.run(
        [_tool("yamllint"), "--strict", "-c", str(YAMLLINT_CONFIG), str(DOCKER)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_files_match_the_compose_spec():
    # check-jsonschema ships the compose-spec schema (vendor.compose-spec): no network needed.
    result = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_GPU), str(COMPOSE_CPU)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_manifests_match_the_schemas():
    docs = k8s_documents()
    assert {doc["kind"] for _, doc in docs} >= {"Job", "PersistentVolumeClaim", "Deployment", "Service"}
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']}: {exc.message} at {list(exc.path)}")


def test_the_checks_reject_broken_files(tmp_path):
    """Each checker above fails on a file broken the way a careless edit would break ours."""
    bad_dockerfile = tmp_path / "Dockerfile"
    bad_dockerfile.write_text(DOCKERFILE.read_text().replace("FROM ${PYTHON_IMAGE} AS base", "FROM python AS base"))
    assert subprocess.run([_tool("hadolint"), str(bad_dockerfile)], capture_output=True, check=False).returncode != 0
    bad_script = tmp_path / "job"
    bad_script.write_text(JOB_SCRIPT.read_text().replace('--out "$out"', "--out $out"))
    assert _run([_tool("shellcheck"), "--shell=sh", str(bad_script)]).returncode != 0
    bad_compose = tmp_path / "compose.yaml"
    bad_compose.write_text(COMPOSE_GPU.read_text().replace("read_only: true", "readonly: true"))
    assert (
        subprocess.run(
            [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(bad_compose)],
            capture_output=True,
            check=False,
        ).returncode
        != 0
    )
    job = next(doc for _, doc in k8s_documents() if doc["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


# --- what the files promise ----------------------------------------------------------------------


def test_no_secret_is_written_into_an_image_or_a_manifest():
    dockerfile = DOCKERFILE.read_text()
    for name in SECRET_ENV:
        assert not re.search(rf"^\s*(ENV|ARG)\b.*\b{name}\b", dockerfile, re.MULTILINE), f"{name} baked into the image"
    for path in (COMPOSE_GPU, COMPOSE_CPU):
        for name, svc in compose_file(path)["services"].items():
            literal = {e.split("=", 1)[0] for e in svc.get("environment") or [] if "=" in e}
            assert not literal & set(SECRET_ENV), f"{path.name}: {name} sets a secret literally"
    for path, doc in k8s_documents():
        if doc["kind"] in ("Job", "Deployment"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    if e["name"] in SECRET_ENV:
                        assert "secretKeyRef" in e.get("valueFrom", {}), f"{path.name}: {e['name']} not from a Secret"


def test_diagnoser_containers_run_unprivileged_on_a_read_only_root():
    stages = DOCKERFILE.read_text().split("\nFROM ")
    for stage in stages[2:]:  # demo and diagnoser (the first chunk is the preamble, then base)
        users = re.findall(r"^USER (\d+):(\d+)$", stage, re.MULTILINE)
        assert users and int(users[-1][0]) != 0, f"stage {stage.split()[2]} must end as a numeric non-root user"
    for kind in ("Job", "Deployment"):
        c = k8s_container(kind, "llm-diagnose")
        pod = k8s_pod_spec(kind)
        sc = {**pod.get("securityContext", {}), **c["securityContext"]}
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert not sc.get("privileged") and not pod.get("hostPID")
        assert pod["automountServiceAccountToken"] is False
    for path in (COMPOSE_GPU, COMPOSE_CPU):
        svc = compose_file(path)["services"]["diagnoser"]
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"] and not svc.get("privileged")


def test_gpu_sidecars_get_nvml_without_a_gpu_of_their_own():
    sidecar = k8s_container("Deployment", "llm-diagnose")
    env = k8s_literal_env(sidecar)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in json.dumps(sidecar["resources"]), "the sidecar must not take a GPU from vLLM"
    assert k8s_pod_spec("Deployment")["runtimeClassName"] == "nvidia"
    assert k8s_container("Deployment", "vllm")["resources"]["limits"]["nvidia.com/gpu"] == 1
    compose = compose_file(COMPOSE_GPU)["services"]
    for name, caps in (("vllm", ["gpu"]), ("diagnoser", ["gpu", "utility"])):
        (device,) = compose[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == caps
    assert service_env(compose_file(COMPOSE_GPU), "diagnoser")["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


# --- the commands, run ---------------------------------------------------------------------------


def test_image_default_command_prints_the_help():
    for target, stage in dockerfile_stages().items():
        if stage["ENTRYPOINT"]:
            argv = host_program([*stage["ENTRYPOINT"], *(stage["CMD"] or [])])
            result = subprocess.run(argv, capture_output=True, text=True, env=host_env({}), timeout=60, check=False)
            assert result.returncode == 0 and "usage: llm-diagnose" in result.stdout, (target, result.stderr)


def test_cpu_demo_model_command_makes_the_model_the_tests_serve(tmp_path, tiny_model_dir):
    compose = compose_file(COMPOSE_CPU)
    argv = substitute(service_argv(compose, "model"), {"/models": str(tmp_path / "models")})
    result = _run(host_program(argv), env=host_env({}), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    made = tmp_path / "models" / "tiny-llama"
    # Same recipe, same seed: the same files the test server loads (the weights byte for byte).
    assert sorted(p.name for p in made.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    for name in ("config.json", "model.safetensors"):
        assert (made / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_cpu_demo_vllm_command_is_the_test_servers_command(server):
    """The compose `vllm` service runs what the suite's own default server runs (so every
    real-engine test exercises it), bound to 0.0.0.0:8000 instead of a loopback port."""
    compose = compose_file(COMPOSE_CPU)
    argv = substitute(
        service_argv(compose, "vllm"),
        {
            "/models/tiny-llama": str(server.model_dir),
            "0.0.0.0": "127.0.0.1",
            "${LLMD_DEMO_DTYPE:-bfloat16}": cpu_dtype(),
        },  # the host's choice, as the compose comment says
        flags={"--port": str(server.port)},
    )
    assert host_program(argv) == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *server.args]
    env = service_env(compose, "vllm")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(server.kv_cache_space_gib)
    assert compose_file(COMPOSE_CPU)["services"]["diagnoser"]["depends_on"]["vllm"]["condition"] == "service_healthy"


def test_compose_healthchecks_pass_against_a_real_vllm(server):
    for path in (COMPOSE_GPU, COMPOSE_CPU):
        check = compose_file(path)["services"]["vllm"]["healthcheck"]["test"]
        assert check[0] == "CMD"
        argv = [a.replace("http://127.0.0.1:8000", server.url) for a in check[1:]]
        assert argv != check[1:], f"{path.name}: the healthcheck does not probe 127.0.0.1:8000"
        result = subprocess.run(host_program(argv), capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


def test_diagnoser_commands_diagnose_a_real_vllm(server, tmp_path):
    """Compose diagnosers, the Kubernetes Job and the sidecar, all at once against one server."""
    runs = tmp_path / "runs"
    short = {"--duration": "3", "--interval": "0.5"}
    gpu = compose_file(COMPOSE_GPU)
    cpu = compose_file(COMPOSE_CPU)
    jobs: dict[str, tuple[list[str], dict[str, str], Path]] = {
        "compose.gpu diagnoser": (
            substitute(service_argv(gpu, "diagnoser"), {"http://vllm:8000": server.url, "/runs": str(runs)}, short),
            service_env(gpu, "diagnoser"),
            runs / "gpu",
        ),
        "compose.cpu diagnoser": (
            substitute(
                service_argv(cpu, "diagnoser"),
                {"http://vllm:8000": server.url, "/runs": str(runs)},
                # 8 s: with 4, a busy CI host left 2 s to one experiment whose only request did
                # not finish in it, and the run had nothing to record (an honest empty run).
                {"--duration": "8", "--budget-seconds": "8"},
            ),
            service_env(cpu, "diagnoser"),
            runs / "demo",
        ),
    }
    for kind, url in (("Job", "http://vllm.default.svc:8000"), ("Deployment", "http://127.0.0.1:8000")):
        c = k8s_container(kind, "llm-diagnose")
        env = k8s_literal_env(c)
        assert env["VLLM_URL"] == url and env["RUN_DIR"] == "/runs"
        # ROUNDS=1 ends the sidecar's every-PAUSE_S loop after one round; HOSTNAME is the pod's name,
        # which Kubernetes puts in every container's environment.
        env.update(
            VLLM_URL=server.url,
            RUN_DIR=str(runs / kind),
            DURATION_S="3",
            INTERVAL_S="0.5",
            ROUNDS="1",
            HOSTNAME=f"llm-diagnose-{kind.lower()}-x7k2p",
        )
        jobs[f"k8s {kind}"] = ([*c["command"], *c.get("args", [])], env, runs / kind)

    procs = {
        name: subprocess.Popen(
            host_program(argv),
            env=host_env(env),
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for name, (argv, env, _) in jobs.items()
    }
    outputs = {}
    try:
        for name, p in procs.items():
            outputs[name] = p.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # each child leads its own group: the job script's too
        late = {name: p.communicate()[1][-1500:] for name, p in procs.items() if name not in outputs}
        pytest.fail(f"still running after {RUN_TIMEOUT_S} s: {late}")
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}: exit {p.returncode}: {outputs[name][1][-2000:]}"

    for name, (_, _, out) in jobs.items():
        if name.startswith("k8s"):
            (out,) = out.iterdir()  # one round: one folder named after the pod and the time
            assert out.name.startswith("llm-diagnose-"), out.name
            html = (out / "report.html").read_text()
            assert "<html" in html.lower() and "Content-Security-Policy" in html, name
        evidence = Evidence.from_json((out / "evidence.json").read_text())
        assert evidence.fact("engine.name") == "vllm", name
        assert evidence.fact("engine.max_model_len") == 2048, name
        if "--interactive" in jobs[name][0]:
            assert evidence.fact("workload.interactive") is True, name
        assert (out / "diagnosis.json").stat().st_size > 0 and (out / "summary.txt").stat().st_size > 0, name
    assert "Bottleneck:" in outputs["compose.cpu diagnoser"][0]
    requests = (runs / "demo" / "requests.jsonl").read_text().splitlines()
    assert 0 < len(requests) <= 120, "the demo's active run sends requests, within its budget"
    assert not (runs / "gpu" / "requests.jsonl").exists(), "the GPU compose diagnoser is passive"


def test_docs_name_only_files_that_exist():
    page = (ROOT / "docs" / "containers.md").read_text()  # moved from the README's "Containers and Kubernetes"
    named = set(re.findall(r"docker/[\w./-]+[\w]", page))
    assert {"docker/Dockerfile", "docker/compose.cpu.yaml", "docker/k8s/job.yaml"} <= named
    for name in named:
        assert (ROOT / name).exists(), f"docs/containers.md names {name}, which does not exist"
