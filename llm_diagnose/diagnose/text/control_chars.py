"""Control characters in text outputs are shown, never obeyed.

A model name, a metric label, a server's error text or a rules file can carry terminal control
characters: ESC sequences that clear a line or move the cursor, a carriage return that sends
the rest of the line over what came before, C1 controls (U+0080-U+009F: U+009B is an 8-bit
CSI), DEL, and the Unicode bidirectional overrides that make text read in another order than
it is stored. Printed raw to a terminal, or to summary.txt that someone `cat`s, "\\x1b[2K\\r all
good" erases the real line and writes its own. So every text renderer passes its finished
output through `escape_controls`, which writes each such character as a visible escape
(`\\x1b`, `\\u202e`); newlines and tabs are the layout and stay. ESC itself being escaped, what
followed it ("[2K") is plain text.

JSON outputs: `json.dumps` escapes C0 always, and C1, DEL and the bidi controls only with
ensure_ascii (its default); a JSON document written with ensure_ascii=False (readable non-ASCII
text) passes through `escape_controls_in_json`, which writes those as \\uXXXX escapes: the same
string to a JSON reader, inert bytes to a terminal.
"""

from __future__ import annotations

import re

__all__ = ["CONTROLS", "escape_controls", "escape_controls_in_json"]

# C0 but tab and newline (the layout), DEL, C1, and the bidi embeddings, overrides and isolates.
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with every control character but newline and tab written as a visible escape.

    Idempotent: what it writes is printable, so a text escaped twice reads the same.
    """
    return CONTROLS.sub(_visible, text)


def escape_controls_in_json(document: str) -> str:
    """A JSON document (from json.dumps) with the controls it left raw written as \\uXXXX.

    Only valid on json.dumps output: there these characters can stand only inside strings
    (its own layout is spaces and newlines), where \\uXXXX means the same character.
    """
    return CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", document)
