"""A settings file (TOML) read for its tables: one reader, one-line errors that name the file.

The gate's rules (`gate --rules`) and the comparison tolerances of `--thresholds` read through it;
each caller raises its own error class, so its command turns it into a usage error (exit 2).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

__all__ = ["read_toml", "flatten"]


def read_toml(path: str | Path, what: str, error: type[Exception] = ValueError) -> dict:
    """A TOML file's tables; `what` names the file in the error ("rules file", "thresholds file").

    Raises:
        error: the file is missing, unreadable, not UTF-8, not TOML, or nested too deeply.
    """
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{what} {path} is not readable: arrays or tables nested too deeply") from None


def flatten(table: Mapping, prefix: str = "") -> dict[str, object]:
    """Nested tables as dotted names: {"workload": {"prompt_tokens": 0.2}} -> {"workload.prompt_tokens": 0.2}."""
    out: dict[str, object] = {}
    for k, v in table.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
