"""Attach the probe to transformers without changing the server's code.

Two patches, each applied when its module is imported (or at once, if it already is):

- `transformers.modeling_utils.PreTrainedModel.from_pretrained`: every model a server loads
  is instrumented (`TorchProbe.instrument`), whatever Auto class loaded it;
- `transformers.generation.continuous_batching.continuous_api.ContinuousBatchProcessor._generation_step`:
  each continuous-batching step is accounted and timed (`TorchProbe.paged_step`), and
  `update_batch` reports the requests it finished (`TorchProbe.record_paged_update`).

A patch that finds its target missing (another transformers version) is skipped with a
note on stderr; the server runs unchanged. Post-import hooks are a `sys.meta_path` finder
that wraps the loader of the named modules, the mechanism tracing launchers use.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from llm_diagnose.probes.torch_probe.recorder import TorchProbe

__all__ = ["install", "patch_from_pretrained", "patch_continuous_batching", "when_imported"]

MODELING = "transformers.modeling_utils"
CONTINUOUS = "transformers.generation.continuous_batching.continuous_api"
_PATCHED = "_llmd_torch_probe_patched"


def _note(message: str) -> None:
    print(f"llm-diagnose instrument: {message}", file=sys.stderr, flush=True)


def patch_from_pretrained(module: ModuleType, probe: TorchProbe) -> bool:
    cls: Any = getattr(module, "PreTrainedModel", None)
    original = getattr(cls, "from_pretrained", None) if cls is not None else None
    if original is None:
        _note(
            f"{module.__name__}.PreTrainedModel.from_pretrained not found: models are not instrumented "
            "(call llm_diagnose.probes.torch_probe.instrument(model) in the server instead)"
        )
        return False
    if getattr(original, _PATCHED, False):
        return True
    func = original.__func__  # a classmethod: wrap the function, rebind as a classmethod

    @functools.wraps(func)
    def from_pretrained(klass: Any, *args: Any, **kwargs: Any) -> Any:
        model = func(klass, *args, **kwargs)
        target = model[0] if isinstance(model, tuple) else model  # output_loading_info=True returns a tuple
        try:
            probe.instrument(target)
        except Exception as exc:  # noqa: BLE001 - the server must not fail because of its probe
            _note(f"could not instrument {type(target).__name__}: {type(exc).__name__}: {exc}")
        return model

    setattr(from_pretrained, _PATCHED, True)
    cls.from_pretrained = classmethod(from_pretrained)
    return True


def patch_continuous_batching(module: ModuleType, probe: TorchProbe) -> bool:
    cls: Any = getattr(module, "ContinuousBatchProcessor", None)
    step = getattr(cls, "_generation_step", None) if cls is not None else None
    update = getattr(cls, "update_batch", None) if cls is not None else None
    if step is None or update is None:
        _note(
            f"{module.__name__}.ContinuousBatchProcessor._generation_step/update_batch not found: "
            "continuous-batching KV accounting is off (forward timings still work)"
        )
        return False
    if getattr(step, _PATCHED, False):
        return True
    cls._generation_step = _around(step, probe.paged_step)
    cls.update_batch = _after(update, probe.record_paged_update)
    return True


def _guarded(record: Callable[[Any], None], processor: Any) -> None:
    try:
        record(processor)
    except Exception as exc:  # noqa: BLE001 - accounting must never break a step
        _note(f"continuous-batching accounting failed: {type(exc).__name__}: {exc}")


def _around(method: Callable[..., Any], context: Callable[[Any], Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with context(self):  # the context guards its own accounting errors
            return method(self, *args, **kwargs)

    setattr(wrapper, _PATCHED, True)
    return wrapper


def _after(method: Callable[..., Any], record: Callable[[Any], None]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = method(self, *args, **kwargs)
        _guarded(record, self)
        return out

    setattr(wrapper, _PATCHED, True)
    return wrapper


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, Callable[[ModuleType], None]] = {}
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        hook = self.hooks.get(name)
        if hook is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        del self.hooks[name]
        spec.loader = _HookedLoader(spec.loader, hook)
        return spec


_FINDER = _PostImportFinder()


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run `hook(module)` once `name` is imported (now, if it already is)."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    _FINDER.hooks[name] = hook
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def install(probe: TorchProbe) -> None:
    """Instrument every transformers model loaded from now on, and its continuous batching."""

    def _on_modeling(module: ModuleType) -> None:
        patch_from_pretrained(module, probe)

    def _on_continuous(module: ModuleType) -> None:
        patch_continuous_batching(module, probe)

    when_imported(MODELING, _on_modeling)
    when_imported(CONTINUOUS, _on_continuous)
