"""The served model's shapes from its config.json, without its weights.

A decode step's time depends on the model's shapes and dtype, not on the values of its weights:
a model built from the config with seeded random weights streams the same bytes and does the same
FLOPs (tests/test_microbench.py times one against the real weights). So the step of any model can
be measured on the serving host from its config.json alone:

- `read_config(path)`: the config (a config.json, or a model folder holding one); a multimodal
  config's `text_config` is the decoder that steps;
- `shard(config, tp)`: one device's part of a tensor-parallel deployment, as vLLM and SGLang
  split it: attention heads, the MLP's intermediate width and the vocabulary divided by TP, the
  KV heads too (replicated when fewer than TP), the hidden width whole. The all-reduces between
  the shards are not in it: they are the interconnect's share of a step;
- `with_layers(config, n)`: the same model with n decoder layers, for a model whose shard does
  not fit the device: steps at two layer counts give the per-layer cost, scaled to the count;
- `build(config, device, dtype)`: the transformers causal LM with those shapes.

torch and transformers are imported inside `build`; the rest is standard library.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "read_config", "config_dtype", "shard", "with_layers", "build", "describe"]


class ConfigError(ValueError):
    """A config that cannot be read, sharded or built, with a one-line reason."""


_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16"}
_DTYPES.update({"float32": "float32", "fp32": "float32", "float": "float32"})


def read_config(path: str | Path) -> dict[str, Any]:
    """The decoder config at `path` (a config.json, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p} does not exist: give a config.json or a model folder that holds one") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} is not a JSON object: not a model config")
    text = data.get("text_config")
    cfg = dict(text) if isinstance(text, dict) else data
    if "model_type" not in cfg and "model_type" in data:
        cfg["model_type"] = data["model_type"]
    if not isinstance(cfg.get("model_type"), str):
        raise ConfigError(f"{p} has no model_type: not a transformers model config")
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{p}: {key} is {value!r}, expected a positive integer")
    return cfg


def config_dtype(config: dict[str, Any], default: str = "bfloat16") -> str:
    """The weights' dtype the config names (`dtype`, or `torch_dtype` in older files)."""
    named = config.get("dtype") or config.get("torch_dtype")
    return _DTYPES.get(str(named).lower(), default) if named else default


def shard(config: dict[str, Any], tp: int) -> tuple[dict[str, Any], str]:
    """One device's shard of a TP-`tp` deployment, and a phrase saying how it was cut."""
    if tp == 1:
        return dict(config), ""
    heads = config["num_attention_heads"]
    if heads % tp:
        raise ConfigError(f"num_attention_heads {heads} is not divisible by tensor parallel size {tp}")
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    out = dict(config)
    out.update(
        num_attention_heads=heads // tp,
        num_key_value_heads=max(1, kv // tp),  # fewer KV heads than devices: each device holds one, replicated
        head_dim=head_dim,
        intermediate_size=math.ceil(config["intermediate_size"] / tp),
        vocab_size=math.ceil(config["vocab_size"] / tp),
    )
    note = (
        f"one device's shard of tensor parallel {tp} (attention heads {heads} -> {heads // tp}, KV heads "
        f"{kv} -> {out['num_key_value_heads']}, intermediate {config['intermediate_size']} -> "
        f"{out['intermediate_size']}, vocabulary {config['vocab_size']} -> {out['vocab_size']}; the all-reduces "
        "between shards are not in it)"
    )
    return out, note


def with_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    out = dict(config)
    out["num_hidden_layers"] = layers
    for key in ("layer_types", "sliding_window_pattern"):  # per-layer lists sized to the old count
        if isinstance(out.get(key), list):
            out[key] = out[key][:layers]
    return out


def describe(path: str | Path, dtype: str, tp_note: str = "", layers_note: str = "") -> str:
    """What was timed: the config it was built from, random weights, dtype, shard and layers."""
    parts = [f"{path}: random weights of its shapes (no weights read), {dtype}"]
    parts += [n for n in (tp_note, layers_note) if n]
    return "; ".join(parts)


def build(config: dict[str, Any], *, device: Any = "cpu", dtype: str = "bfloat16", seed: int = 0) -> Any:
    """A transformers causal LM of `config`'s shapes with seeded random weights, made on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "auto_map")}
    fields.pop("dtype", None)
    fields.pop("torch_dtype", None)
    try:
        cfg = AutoConfig.for_model(config["model_type"], **fields)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"transformers does not know model_type {config['model_type']!r} ({exc})") from None
    torch.manual_seed(seed)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="sdpa")
        except ValueError as exc:  # no causal-LM class for this config
            raise ConfigError(f"no causal LM for model_type {config['model_type']!r}: {exc}") from None
    return model.eval()
