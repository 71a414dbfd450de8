"""Every engine setting the tool prints exists in that engine.

vLLM: each printed vLLM command is parsed by the installed vLLM's own `vllm serve` parser
(vllm.entrypoints.launchers.cli_args.make_arg_parser over FlexibleArgumentParser, built without
a GPU) or, for `vllm run-batch`, by its own parser; JSON values are checked against vLLM's config
classes. SGLang and TensorRT-LLM cannot be installed here, so their printed flags are checked
against the flag lists below, recorded from each engine's source and docs (URL and version in
the comment above each list). A flag that is in neither fails the test.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import shlex

import pytest

from llm_diagnose.diagnose.tree.techniques.catalogue import CATALOGUE
from llm_diagnose.diagnose.tree.techniques.setting import ENGINE_NAMES, ENGINES, Setting

# Placeholders the settings print, with a value of the right type for the parsers.
EXAMPLES = {
    "<N>": "2",
    "<M>": "2",
    "<GiB>": "8",
    "<bytes>": "8589934592",
    "<draft>": "org/draft-model",
    "<model>": "org/model",
}

FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def fill(text: str) -> str:
    for placeholder, value in EXAMPLES.items():
        text = text.replace(placeholder, value)
    left = re.findall(r"<[^>]+>", text)
    assert not left, f"placeholder without an example value in this test: {left}"
    return text


def every(engine: str) -> list[tuple[str, Setting]]:
    """(technique id, setting) for every setting of `engine` in the catalogue, scale-out included."""
    return [(t.id, s) for t in CATALOGUE.values() for s in t.settings_for(engine)]


def ids(pairs):
    return [f"{tid}:{s.command or s.note[:30]}" for tid, s in pairs]


# --- vLLM: the installed parser ---------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_serve():
    """`vllm serve`'s parser as vLLM 0.32 builds it (vllm/entrypoints/cli/serve.py)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


@pytest.fixture(scope="module")
def vllm_run_batch():
    from vllm.entrypoints.launchers.run_batch import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm run-batch"))


def parse(parser, argv: list[str]):
    """The namespace, or a test failure naming what the parser rejected (argparse exits on it).

    argparse also takes an unambiguous abbreviation of a flag; a printed flag must be spelled out.
    """
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag.startswith("-") and not re.fullmatch(r"-?\d+(\.\d+)?", flag):
            assert flag in parser._option_string_actions, f"{parser.prog} has no flag {flag} (spelled out)"
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{parser.prog} rejects {shlex.join(argv)}")


@pytest.fixture(scope="module")
def check_vllm_values(vllm_serve):
    """What argparse takes as free text but vLLM checks later: methods, connectors, JSON keys."""
    from vllm.config import SpeculativeConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    # vLLM 0.32 lists its speculative methods as the choices of --spec-method.
    methods = {c for c in vllm_serve._option_string_actions["--spec-method"].choices if c}

    def check(ns) -> None:
        if getattr(ns, "quantization", None) is not None:
            assert ns.quantization in QUANTIZATION_METHODS, f"--quantization {ns.quantization} is no vLLM method"
        spec = getattr(ns, "speculative_config", None)
        if spec is not None:
            assert set(spec) <= spec_fields, f"--speculative-config keys {set(spec) - spec_fields} are unknown"
            assert spec.get("method") in methods | {None}, f"speculative method {spec.get('method')!r} is not vLLM's"
        kv = getattr(ns, "kv_transfer_config", None)
        if kv is not None:
            assert kv.kv_connector in KVConnectorFactory._registry, f"kv_connector {kv.kv_connector} is unknown"

    return check


def vllm_flags_in_note(parser, note: str) -> None:
    for flag in FLAG.findall(note):
        assert flag in parser._option_string_actions, f"the note names {flag}, which vllm serve does not have"


@pytest.mark.parametrize("tid, setting", every("vllm"), ids=ids(every("vllm")))
def test_every_vllm_setting_parses_with_the_installed_vllm(tid, setting, vllm_serve, vllm_run_batch, check_vllm_values):
    vllm_flags_in_note(vllm_serve, setting.note)
    argv = shlex.split(fill(setting.command))
    if setting.kind == "flags":
        assert argv and argv[0].startswith("-"), f"{tid}: a 'flags' setting starts with a flag: {setting.command!r}"
        check_vllm_values(parse(vllm_serve, argv))
    elif setting.kind == "command":
        program = argv[:2]
        assert program in (["vllm", "serve"], ["vllm", "run-batch"]), f"{tid}: unknown vLLM command {program}"
        parser = vllm_serve if program[1] == "serve" else vllm_run_batch
        check_vllm_values(parse(parser, argv[2:]))
    elif setting.kind == "python":
        import vllm

        m = re.fullmatch(r"vllm\.(\w+)\((\w+)=[^)]*\)\.(\w+)\(\w*\)", fill(setting.command))
        assert m, f"{tid}: unexpected vLLM Python form {setting.command!r}"
        cls = getattr(vllm, m[1])
        assert m[2] in inspect.signature(cls).parameters and hasattr(cls, m[3])
    else:
        assert setting.kind == "none" and not setting.command, f"{tid}: kind {setting.kind!r} for vLLM"
        assert setting.note, f"{tid}: a setting with nothing to type says why"


# --- SGLang: flags recorded from its source ---------------------------------------------------
# From sgl-project/sglang docs/advanced_features/server_arguments.md at commit b36e8e1 (the 0.5.x
# server arguments; https://github.com/sgl-project/sglang/blob/main/docs/advanced_features/server_arguments.md),
# the speculative algorithms cross-checked with python/sglang/srt/server_args.py at commit 001067f
# (EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, plus DFLASH/DSPARK there). Value: None = a switch,
# a type = its value's type, a tuple = its choices.
SGLANG_FLAGS = {
    # CUDA graphs: the "CUDA graph" section of the same page (ServerArgs.disable_cuda_graph,
    # ServerArgs.cuda_graph_max_bs; NVIDIA NeMo RL's SglangSpecificArgs maps the same two fields).
    "--disable-cuda-graph": None,
    "--cuda-graph-max-bs": int,
    "--model-path": str,
    "--host": str,
    "--port": int,
    "--context-length": int,
    "--quantization": (
        "awq",
        "fp8",
        "gptq",
        "marlin",
        "gptq_marlin",
        "awq_marlin",
        "bitsandbytes",
        "gguf",
        "modelopt",
        "modelopt_fp4",
        "petit_nvfp4",
        "w8a8_int8",
        "w8a8_fp8",
        "moe_wna16",
        "qoq",
        "w4afp8",
        "mxfp4",
    ),
    "--kv-cache-dtype": ("auto", "fp8_e5m2", "fp8_e4m3"),
    "--mem-fraction-static": float,
    "--max-running-requests": int,
    "--max-queued-requests": int,
    "--max-total-tokens": int,
    "--chunked-prefill-size": int,
    "--max-prefill-tokens": int,
    "--schedule-policy": ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority"),
    "--page-size": int,
    "--tensor-parallel-size": int,
    "--tp-size": int,
    "--pipeline-parallel-size": int,
    "--pp-size": int,
    "--data-parallel-size": int,
    "--dp-size": int,
    "--attention-backend": str,
    "--speculative-algorithm": ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
    "--speculative-draft-model-path": str,
    "--speculative-draft-model": str,
    "--speculative-num-steps": int,
    "--speculative-eagle-topk": int,
    "--speculative-num-draft-tokens": int,
    "--enable-hierarchical-cache": None,
    "--hicache-ratio": float,
    "--hicache-size": int,
    "--disable-radix-cache": None,
    "--enable-mixed-chunk": None,
    "--enable-metrics": None,
    "--disaggregation-mode": ("null", "prefill", "decode"),
    "--disaggregation-transfer-backend": ("mooncake", "nixl", "ascend", "fake"),
}


def check_recorded_flags(flags: dict, argv: list[str], what: str) -> None:
    """Walk argv as argparse would with the recorded flag list: each flag known, each value fits it."""
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag in flags, f"{what} has no flag {flag}"
        spec = flags[flag]
        if spec is None:
            i += 1
            continue
        assert i + 1 < len(argv), f"{flag} needs a value"
        value = argv[i + 1]
        if isinstance(spec, tuple):
            assert value in spec, f"{what} {flag} takes one of {spec}, not {value!r}"
        else:
            spec(value)  # int("x") fails: the value does not fit the flag
        i += 2


@pytest.mark.parametrize("tid, setting", every("sglang"), ids=ids(every("sglang")))
def test_every_sglang_setting_is_a_recorded_sglang_flag(tid, setting):
    for flag in FLAG.findall(setting.note):
        assert flag in SGLANG_FLAGS, f"the note names {flag}, which SGLang's server does not have"
    if setting.kind == "flags":
        check_recorded_flags(SGLANG_FLAGS, shlex.split(fill(setting.command)), "sglang.launch_server")
    elif setting.kind == "python":
        # sglang.Engine(**ServerArgs) is SGLang's offline engine (python/sglang/srt/entrypoints/engine.py).
        assert re.fullmatch(r"sglang\.Engine\(model_path=<model>\)\.generate\(prompts\)", setting.command), setting
    else:
        assert setting.kind == "none" and not setting.command and setting.note, f"{tid}: {setting}"


# --- TensorRT-LLM: flags recorded from its source ---------------------------------------------
# trtllm-serve: NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py at commit 00209af1 (1.x, the
# PyTorch-backend server; https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/commands/serve.py).
# --tp_size/--pp_size are aliases of --tensor_parallel_size/--pipeline_parallel_size there;
# --enable_chunked_prefill is a switch, off by default.
TRTLLM_SERVE_FLAGS = {
    "--tokenizer": str,
    "--host": str,
    "--port": int,
    "--backend": ("pytorch", "tensorrt", "trt", "_autodeploy"),
    "--log_level": str,
    "--max_beam_width": int,
    "--max_batch_size": int,
    "--max_num_tokens": int,
    "--max_seq_len": int,
    "--tensor_parallel_size": int,
    "--tp_size": int,
    "--pipeline_parallel_size": int,
    "--pp_size": int,
    "--context_parallel_size": int,
    "--cp_size": int,
    "--moe_expert_parallel_size": int,
    "--ep_size": int,
    "--gpus_per_node": int,
    "--free_gpu_memory_fraction": float,
    "--kv_cache_free_gpu_memory_fraction": float,
    "--trust_remote_code": None,
    "--config": str,
    "--extra_llm_api_options": str,
    "--server_role": str,
    "--enable_chunked_prefill": None,
}
# trtllm-serve disaggregated: same file, `disaggregated` command.
TRTLLM_DISAGG_FLAGS = {
    "-c": str,
    "--config_file": str,
    "-m": str,
    "--metadata_server_config_file": str,
    "-t": int,
    "--server_start_timeout": int,
    "-r": int,
    "--request_timeout": int,
}
# trtllm-build: tensorrt_llm/commands/build.py (same repository; KVCacheType has continuous, paged,
# disabled; --paged_kv_cache is marked deprecated there). trtllm-build has no --tp_size/--pp_size:
# the checkpoint conversion fixes the mapping.
TRTLLM_BUILD_FLAGS = {
    "--checkpoint_dir": str,
    "--output_dir": str,
    "--max_batch_size": int,
    "--max_num_tokens": int,
    "--max_seq_len": int,
    "--max_draft_len": int,
    "--kv_cache_type": ("continuous", "paged", "disabled"),
}
# The YAML trtllm-serve --config reads: LLM-API arguments, tensorrt_llm/llmapi/llm_args.py (1.x):
# KvCacheConfig (enable_block_reuse defaults to true; dtype is PyTorch-backend only; host_cache_size
# in bytes; tokens_per_block 32), speculative_config (decoding_type one of the listed;
# speculative_model_dir, and speculative_model, its newer name since PR #10099, Dec 2025).
TRTLLM_CONFIG = {
    "kv_cache_config": {
        "enable_block_reuse": bool,
        "dtype": ("auto", "fp8", "nvfp4"),
        "host_cache_size": int,
        "tokens_per_block": int,
        "free_gpu_memory_fraction": float,
        "max_tokens": int,
    },
    "speculative_config": {
        "decoding_type": ("DraftTarget", "Eagle", "Eagle3", "MTP", "NGram", "Medusa", "Lookahead", "UserProvided"),
        "max_draft_len": int,
        "speculative_model_dir": str,
        "speculative_model": str,
    },
    "enable_chunked_prefill": bool,
    "max_batch_size": int,
    "max_num_tokens": int,
}
TRTLLM_NOTE_FLAGS = {**TRTLLM_SERVE_FLAGS, **TRTLLM_BUILD_FLAGS}


def check_config(schema, data, path="") -> None:
    assert isinstance(data, dict), f"{path or 'the YAML'} is a mapping"
    for key, value in data.items():
        where = f"{path}{key}"
        assert key in schema, f"TensorRT-LLM's LLM API has no {where}"
        spec = schema[key]
        if isinstance(spec, dict):
            check_config(spec, value, where + ".")
        elif isinstance(spec, tuple):
            assert value in spec, f"{where} takes one of {spec}, not {value!r}"
        else:
            assert isinstance(value, spec), f"{where} is a {spec.__name__}, not {value!r}"


@pytest.mark.parametrize("tid, setting", every("trtllm"), ids=ids(every("trtllm")))
def test_every_trtllm_setting_is_a_recorded_trtllm_option(tid, setting):
    import yaml

    for flag in FLAG.findall(setting.note):
        assert flag in TRTLLM_NOTE_FLAGS, f"the note names {flag}, which neither trtllm-serve nor trtllm-build has"
    text = fill(setting.command)
    if setting.kind == "flags":
        check_recorded_flags(TRTLLM_SERVE_FLAGS, shlex.split(text), "trtllm-serve")
    elif setting.kind == "command":
        argv = shlex.split(text)
        if argv[:2] == ["trtllm-serve", "disaggregated"]:
            check_recorded_flags(TRTLLM_DISAGG_FLAGS, argv[2:], "trtllm-serve disaggregated")
        elif argv[0] == "trtllm-build":
            check_recorded_flags(TRTLLM_BUILD_FLAGS, argv[1:], "trtllm-build")
        else:
            check_recorded_flags(TRTLLM_SERVE_FLAGS, argv[1:] if argv[0] == "trtllm-serve" else argv, "trtllm-serve")
    elif setting.kind == "config":
        check_config(TRTLLM_CONFIG, yaml.safe_load(text))
    elif setting.kind == "python":
        assert re.fullmatch(r"tensorrt_llm\.LLM\(model=<model>\)\.generate\(prompts\)", setting.command), setting
    else:
        assert setting.kind == "none" and not setting.command and setting.note, f"{tid}: {setting}"


# --- transformers: the installed CLI ------------------------------------------------------------
@pytest.mark.parametrize("tid, setting", every("transformers"), ids=ids(every("transformers")))
def test_every_transformers_setting_parses_with_the_installed_cli(tid, setting):
    import typer
    from transformers.cli.serve import Serve

    argv = shlex.split(fill(setting.command))
    assert setting.kind == "command" and argv[:2] == ["transformers", "serve"], setting
    # `transformers serve` is the typer command Serve (transformers/cli/transformers.py registers it);
    # a one-command typer app gives that command's own click parser.
    app = typer.Typer()
    app.command(name="serve")(Serve)
    command = typer.main.get_command(app)
    try:
        command.make_context("serve", argv[2:])
    except Exception as exc:  # click raises UsageError/NoSuchOption for an unknown flag
        pytest.fail(f"transformers rejects {shlex.join(argv[1:])}: {exc}")


# --- what is printed is what is checked --------------------------------------------------------
def test_every_technique_has_checked_settings():
    """Each engine the catalogue names is covered by a test above, and vLLM by every technique."""
    for t in CATALOGUE.values():
        assert {e for e, _ in t.options} <= set(ENGINES), t.id
        assert t.settings_for("vllm"), f"{t.id} has no vLLM setting"


def _diagnose(items: dict):
    # Imported here: the settings checks above need only the catalogue, not the tree.
    from llm_diagnose.diagnose.tree import diagnose
    from llm_diagnose.diagnose.tree.thresholds import Thresholds
    from tests.evidence_builders import build

    return diagnose(build(items), Thresholds())


def test_printed_lines_are_the_checked_settings():
    """A diagnosis prints each setting as str(Setting) of the catalogue, so the checks above cover it."""
    d = _diagnose(
        {
            "prefix.potential_fraction": 0.6,
            "config.prefix_caching": False,
            "kv.usage_p95": 0.99,
            "kv.preemptions": 12,
            "interference.itl_inflation": 3.0,
            "config.chunked_prefill": False,
            "workload.interactive": False,
        }
    )
    assert d.recommendations
    for r in d.recommendations:
        for engine, lines in r.settings:
            assert list(lines) == [str(s) for s in CATALOGUE[r.technique].settings_for(engine)], (r.technique, engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_is_told_to_switch_to_itself(engine):
    """The settings shown to a server of one engine never tell it to serve with that engine."""
    from llm_diagnose.diagnose.report.content import shown_settings

    d = _diagnose({"engine.name": engine, "prefix.potential_fraction": 0.6, "config.prefix_caching": False})
    name = ENGINE_NAMES[engine]
    assert d.engine == engine and {r.technique for r in d.recommendations} == set(CATALOGUE)
    for rec in d.recommendations:
        for _, line in shown_settings(d, rec):
            assert not re.search(rf"\b(serve with|switch to|move to|use) {re.escape(name)}\b", line, re.I), (
                f"{rec.technique} tells a {name} server: {line}"
            )


# --- flags named anywhere in the tool's texts ----------------------------------------------------
def _tool_flags() -> set[str]:
    """Every option of llm-diagnose and its commands (the texts also point to these)."""
    import argparse

    from llm_diagnose.diagnose.cli import build_parser

    seen, todo = set(), [build_parser()]
    while todo:
        p = todo.pop()
        for action in p._actions:
            seen.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return seen


# Flags in the texts that belong to neither: the user's own program in `instrument`'s help example.
NOT_ENGINE_FLAGS = {"--workers"}


def _flags_in_sources() -> tuple[dict[str, list[str]], set[str]]:
    """Flags in the string literals of diagnose/ (pitfall fixes, rationales, hints), with where,
    and the flags diagnose/ defines itself with add_argument (helper scripts such as the demo model)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "llm_diagnose" / "diagnose"
    found: dict[str, list[str]] = {}
    defined: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                defined.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for flag in FLAG.findall(node.value):
                    if flag.startswith("--"):
                        found.setdefault(flag, []).append(f"{path.name}:{node.lineno}")
    return found, defined


def test_every_flag_in_the_tools_texts_exists_somewhere(vllm_serve):
    """A flag in any text of diagnose/ is the tool's own or an engine's: a misspelt engine flag in a
    pitfall's fix or a question's rationale fails here even though the catalogue never lists it."""
    from transformers.cli.serve import Serve

    transformers_flags = {"--" + name.replace("_", "-") for name in inspect.signature(Serve).parameters}
    found, defined = _flags_in_sources()
    known = (
        _tool_flags()
        | defined
        | NOT_ENGINE_FLAGS
        | set(vllm_serve._option_string_actions)
        | set(SGLANG_FLAGS)
        | set(TRTLLM_NOTE_FLAGS)
        | set(TRTLLM_DISAGG_FLAGS)
        | transformers_flags
    )
    unknown = {flag: where for flag, where in found.items() if flag not in known}
    assert not unknown, f"flags no engine and no llm-diagnose command has: {unknown}"
