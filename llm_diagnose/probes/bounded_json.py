"""JSON a server sent, parsed within bounds: nesting depth and finite numbers.

`json.loads` follows nesting with recursion, so `[[[[...]]]]` a few thousand deep raises
RecursionError (and a document just under the limit breaks whatever walks it next); it accepts
`NaN` and `Infinity`, and turns `1e400` into infinity, which later meets `int()`, `datetime` or
a comparison that NaN always fails. No API this tool reads nests deeper than a dozen levels or
sends a non-finite number, so past MAX_JSON_DEPTH, or on one such number, the document is
refused whole, with the reason. The size bound is the reader's (llm_diagnose.probes.http reads
at most `max_bytes` of an answer).

Both are checked before parsing, on the text with its strings removed: the depth on the
brackets alone, innermost pairs removed one level per pass (one regular-expression
substitution each, so a typical answer costs two passes over its brackets); the numbers by
substring searches. Only a document that may hold a non-finite number is parsed with the
checking hooks, which cost a Python call per number.
"""

from __future__ import annotations

import json
import re

__all__ = ["MAX_JSON_DEPTH", "JSONBoundsError", "loads_bounded", "deeper_than"]

# vLLM's /server_info (its whole config) nests 7 levels, a Prometheus query answer 5.
MAX_JSON_DEPTH = 64
_MAX_NUMBER_DIGITS = 308  # an integer longer than this does not fit a float (1.8e308)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")
_EXPONENT = re.compile(r"[eE]\+?0*[1-9][0-9]{2}")  # 1e100 and beyond: may overflow a float
# What JSON holds outside its strings besides brackets (numbers, separators, literals, blanks),
# deleted in one C pass; anything left over (text that is not JSON) goes through _NOT_BRACKET.
_NOT_BRACKET_TABLE = str.maketrans("", "", "0123456789.,:+-eE \t\r\ntruefalsnNIiy")
_BRACKETS_GONE = str.maketrans("", "", "[]{}")
_DIGITS_AS_ZERO = str.maketrans("123456789", "000000000")
_LONG_NUMBER = "0" * (_MAX_NUMBER_DIGITS + 1)


class JSONBoundsError(ValueError):
    """Text that is not JSON, or JSON past the bounds; `reason` says which, in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _without_strings(text: str) -> str:
    """JSON text with its strings cut out. Without a backslash every quote opens or closes a
    string, and a split on quotes (twice as quick as the regular expression) finds them."""
    if "\\" not in text:
        return "".join(text.split('"')[0::2])
    return _STRING.sub("", text)


def _deeper(bare: str, max_depth: int) -> bool:
    """`deeper_than` on JSON text with its strings already removed."""
    brackets = bare.translate(_NOT_BRACKET_TABLE)
    if brackets.translate(_BRACKETS_GONE):  # something else than JSON's own characters: the general way
        brackets = _NOT_BRACKET.sub("", brackets)
    for _ in range(max_depth):
        if not brackets:
            return False
        inner = _INNERMOST.sub("", brackets)
        if len(inner) == len(brackets):
            return False
        brackets = inner
    return bool(brackets) and _INNERMOST.search(brackets) is not None


def deeper_than(text: str, max_depth: int) -> bool:
    """Whether JSON `text` nests arrays and objects more than `max_depth` levels deep.

    Unbalanced brackets (text that is not JSON) answer False once no pair is left to remove:
    the parser then says what is wrong.
    """
    return _deeper(_without_strings(text), max_depth)


def _may_not_be_finite(bare: str) -> bool:
    """Whether JSON text without its strings may hold NaN, Infinity or a number past a float:
    a literal, an exponent of three digits, or more than 308 digits in a row. Plain substring
    searches (C speed); the exponent's regular expression only where an `e` is left once the
    literals true and false are gone."""
    if "NaN" in bare or "Infinity" in bare or _LONG_NUMBER in bare.translate(_DIGITS_AS_ZERO):
        return True
    rest = bare.replace("true", "").replace("false", "")
    return ("e" in rest or "E" in rest) and _EXPONENT.search(rest) is not None


def _refuse_constant(name: str) -> float:
    raise JSONBoundsError(f"it holds {name}, not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JSONBoundsError(f"it holds the number {text[:40]}, beyond what a float holds")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_NUMBER_DIGITS:
        raise JSONBoundsError(f"it holds an integer of {len(text.lstrip('-'))} digits, beyond what a float holds")
    return int(text)


def loads_bounded(text: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`json.loads(text)`, refusing nesting past `max_depth` and numbers that are not finite.

    Raises:
        JSONBoundsError: not JSON (reason "not JSON: ..."), nested too deeply, NaN or
            Infinity, or a number past a float's range.
    """
    bare = _without_strings(text)
    if _deeper(bare, max_depth):
        raise JSONBoundsError(f"it nests arrays or objects more than {max_depth} levels deep")
    try:
        if _may_not_be_finite(bare):  # the parser's hooks (a Python call per number) only where needed
            return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
        return json.loads(text)
    except JSONBoundsError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONBoundsError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # unbalanced brackets the depth check let through
        raise JSONBoundsError(f"it nests arrays or objects more than {max_depth} levels deep") from None
    except ValueError as exc:  # an integer past the interpreter's digit limit
        raise JSONBoundsError(f"not JSON: {exc}") from None
