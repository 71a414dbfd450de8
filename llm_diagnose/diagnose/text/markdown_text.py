"""Text safe in Markdown: plain text, table cells, inline code (GitHub-flavoured)."""

from __future__ import annotations

import re

__all__ = ["text", "cell", "code"]

_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def text(s: str) -> str:
    """Plain text, safe anywhere in Markdown: no markup, no HTML, one line."""
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", " ".join(s.split()))


def cell(s: str) -> str:
    """Text for a table cell (pipes escaped like everything else; never empty, so the row keeps its shape)."""
    return text(s) or " "


def code(s: str) -> str:
    """An inline code span, safe in a table cell.

    Inside a code span Markdown shows characters as they are, so only two things need care:
    a backtick run (the fence is made longer than any run inside) and the pipe, which GFM
    splits table cells on even inside code unless it is escaped.
    """
    s = " ".join(s.split()).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"
