"""Evidence: every result gathered for one target, as a versioned JSON document.

Evidence is what a diagnosis is computed from, so it is written to disk, re-read offline,
diffed and archived. The JSON form is exact: `Evidence.from_json(e.to_json()) == e`.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import (
    Fact,
    InvalidValue,
    Measurement,
    NotMeasured,
    Result,
    describe_json_value,
    now_iso,
    result_from_dict,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "Target",
    "Evidence",
    "EvidenceError",
    "tool_version",
    "INVALID_PREFIX",
    "catalogued",
    "parse_json_document",
]

SCHEMA = "llm-diagnose/evidence"
SCHEMA_VERSION = 1


class EvidenceError(ValueError):
    """Evidence that cannot be read; the message names the field."""


# The reason of a NotMeasured that stands for an item whose value was of the wrong type (or not
# finite) in the file read: the item is kept as a hole, and the diagnosis reports it.
INVALID_PREFIX = "invalid in the input:"


def parse_json_document(text: str) -> object:
    """json.loads for documents this tool reads back (evidence, diagnosis, gate inputs).

    Raises EvidenceError, one line, for text that is not JSON, nests deeper than Python can
    follow, or holds an integer too long to convert; never RecursionError or a bare ValueError.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvidenceError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise EvidenceError(
            "not readable: nested too deeply (arrays or objects inside one another hundreds of times)"
        ) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise EvidenceError(f"not readable: {exc}") from None


def _invalid(key: str, what: str) -> NotMeasured:
    return NotMeasured(
        reason=f"{INVALID_PREFIX} {what}",
        hint=f"fix items.{key} in the evidence file, or measure again (llm-diagnose run)",
    )


_SENTINEL = 987654321
# Key families with a size in their name (llm_diagnose.probes.quantities registers the usual sizes; "other
# sizes still travel"), as patterns built from the key functions themselves.
_FAMILIES = tuple(
    re.compile(re.escape(make(_SENTINEL)).replace(str(_SENTINEL), r"\d+") + r"\Z")
    for make in (
        Q.decode_step_latency_key,
        Q.decode_floor_key,
        Q.decode_bound_key,
        Q.prefill_latency_key,
        Q.prefill_floor_key,
        # The prefix-reuse curve the SVG report draws (diagnose/report/svg.py CURVE_KEY): hit share at N tokens.
        lambda n: f"prefix.lru_fraction_c{n}",
    )
)


def catalogued(key: str) -> bool:
    """Whether a probe defines this evidence key (probes/quantities.py, or one of its per-size families)."""
    return key in Q.CATALOGUE or any(p.match(key) for p in _FAMILIES)


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("llm-diagnose")
    except Exception:  # not installed as a distribution (running from a checkout)
        return "0+unknown"


@dataclass(frozen=True)
class Target:
    """What was diagnosed."""

    url: str | None = None  # a server URL, a trace file, a process
    label: str = ""

    def to_dict(self) -> dict:
        return {"url": self.url, "label": self.label}

    @classmethod
    def from_dict(cls, d: Mapping) -> Target:
        return cls(url=d.get("url"), label=str(d.get("label", "")))


# Which probe measures what, for keys no probe produced in this run: the longest matching
# prefix wins. These are the hints a user sees under "not measured".
_HOW_TO_MEASURE = {
    "prefix.potential_fraction": "analyse the requests the server sees: --trace FILE",
    "prefix.lru_fraction_at_capacity": "a trace and the server's KV capacity: --trace FILE (capacity from /metrics)",
    "prefix.hit_rate_first_requests": "the active prefix experiment: --active",
    "prompts.": "analyse the prompts themselves: --trace FILE",
    "outputs.": "a trace (--trace FILE) or requests finishing during the window",
    "inputs.": "a trace (--trace FILE) or requests finishing during the window",
    "batching.": "the active heterogeneity experiment: --active",
    "interference.itl_inflation": "the active interference experiment: --active",
    "kv.waste_fraction": "the in-process PyTorch probe (llm-diagnose instrument) on servers without paged KV",
    "memory.": "NVML on the GPU host (run llm-diagnose there, or in the sidecar described in docs/containers.md)",
    "pd.": "the KV-connector metrics of a disaggregated deployment (NIXL/Mooncake connectors)",
    "config.pd_disaggregation": "the engine's configuration: SGLang /server_info, vLLM dev-mode /server_info",
    "workload.interactive": "declare it: --interactive or --offline",
    "spec.": "the engine's spec-decode counters (only when speculative decoding is configured)",
    "decode.": "requests decoding during the window, or the active decode experiment: --active",
}


def _absent(key: str) -> NotMeasured:
    match = max((p for p in _HOW_TO_MEASURE if key.startswith(p)), key=len, default=None)
    hint = _HOW_TO_MEASURE[match] if match else "no probe of this tool measures it in this mode"
    return NotMeasured(reason="not measured in this run", hint=hint)


@dataclass(frozen=True)
class Evidence:
    target: Target
    items: Mapping[str, Result] = field(default_factory=dict)
    created_at: str = field(default_factory=now_iso)
    tool: str = field(default_factory=tool_version)
    host: str = field(default_factory=platform.node)

    def __post_init__(self) -> None:
        # Sorted, read-only copy: equality and JSON do not depend on insertion order.
        object.__setattr__(self, "items", dict(sorted(dict(self.items).items())))

    # --- reading -------------------------------------------------------------------------
    def get(self, key: str) -> Result:
        """The result for `key`; a NotMeasured saying so when no probe produced it."""
        return self.items.get(key) or _absent(key)

    def measurement(self, key: str) -> Measurement | None:
        r = self.items.get(key)
        return r if isinstance(r, Measurement) else None

    def fact(self, key: str):
        """The value of a Fact, or None when it was not observed."""
        r = self.items.get(key)
        return r.value if isinstance(r, Fact) else None

    def missing(self, key: str) -> NotMeasured | None:
        r = self.get(key)
        return r if isinstance(r, NotMeasured) else None

    # --- building ------------------------------------------------------------------------
    def with_items(self, items: Mapping[str, Result], *, prefer_new: bool = True) -> Evidence:
        """A copy with more results. A real result never gives way to a NotMeasured."""
        merged = dict(self.items)
        for key, new in items.items():
            old = merged.get(key)
            if old is None or (prefer_new and not isinstance(new, NotMeasured)) or isinstance(old, NotMeasured):
                merged[key] = new
        return Evidence(self.target, merged, self.created_at, self.tool, self.host)

    # --- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "target": self.target.to_dict(),
            "created_at": self.created_at,
            "tool": self.tool,
            "host": self.host,
            "items": {k: v.to_dict() for k, v in self.items.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: object) -> Evidence:
        if not isinstance(d, Mapping):
            raise EvidenceError("evidence must be a JSON object")
        if d.get("schema") != SCHEMA:
            raise EvidenceError(f"field 'schema' must be {SCHEMA!r}, got {d.get('schema')!r}")
        version = d.get("version")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise EvidenceError(f"field 'version' is {version!r}; this tool reads version {SCHEMA_VERSION}")
        items_raw = d.get("items")
        if not isinstance(items_raw, Mapping):
            raise EvidenceError("field 'items' must be an object of results")
        items: dict[str, Result] = {}
        for key, raw in items_raw.items():
            try:
                result = result_from_dict(raw)
            except InvalidValue as exc:  # a value of the wrong type: a hole that says so, the rest is read
                items[key] = _invalid(key, str(exc))
                continue
            except ValueError as exc:  # the structure is wrong: the file is refused
                raise EvidenceError(f"field 'items.{key}': {exc}") from None
            items[key] = result
        target = d.get("target", {})
        if not isinstance(target, Mapping):
            raise EvidenceError("field 'target' must be an object")
        if target.get("url") is not None and not isinstance(target.get("url"), str):
            raise EvidenceError(f"field 'target.url' is {describe_json_value(target.get('url'))}, expected a string")
        return cls(
            target=Target.from_dict(target),
            items=items,
            created_at=str(d.get("created_at", "")),
            tool=str(d.get("tool", "")),
            host=str(d.get("host", "")),
        )

    @classmethod
    def from_json(cls, text: str) -> Evidence:
        return cls.from_dict(parse_json_document(text))
