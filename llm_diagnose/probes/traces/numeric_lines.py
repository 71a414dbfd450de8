"""JSONL lines of integers parsed a chunk at a time by numpy, without json.loads per line.

Machine-written traces repeat one line layout millions of times, e.g. Mooncake's

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

Everything in such a line except the numbers is the same literal text on every line. So the
layout is learned once (`LineLayout.learn`, from a line json.loads has checked), and a chunk
of the file is then parsed as a whole:

- the digit runs are found by one byte comparison and one scan for edges; each run's value
  comes from the 8 bytes ending at it, read as one little-endian word and reduced by three
  multiply-shift steps (the SWAR trick), 16 digits from two words;
- the text between two runs (a "gap") must be one of the layout's literals: the text between
  two fields, the list separator, the end of a line joined to the start of the next, or an
  empty list. A gap is compared word by word with the literal its length and first word
  select, so the check is exact; and each gap must be allowed to follow the one before (the
  literals of a layout are distinct and each has its one place in a line, so checking
  neighbours checks the whole line).

A line that does not fit (other spacing, a float, a negative number, a leading zero, a
missing field, more than 16 digits, a blank line, bad JSON) is reported back by its byte
range, for the caller to parse with json and report like any other line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

__all__ = ["LineLayout", "ParsedLines", "parse_lines"]

_PAD = 8  # spaces around a chunk: every 8-byte window read stays inside the buffer
_MAX_LITERAL = 64
_ZEROS = np.uint64(0x3030303030303030)
_POW8 = np.uint64(10**8)


@dataclass(frozen=True)
class LineLayout:
    """The literal text of a line layout: fields (one of them may be a list) and what lies between."""

    fields: tuple[str, ...]
    list_field: int | None  # index in fields of the list of integers, if any
    head: bytes  # before the first field's value ('{"timestamp": ')
    between: tuple[bytes, ...]  # between field i's value and field i+1's (a list's brackets included)
    tail: bytes  # after the last value ('}' or ']}')
    separator: bytes  # between list items (', ')

    @classmethod
    def learn(cls, raw: bytes) -> LineLayout | None:
        """The layout of one line, if it is a JSON object of non-negative integers and at most one
        list of them (with at least two items, to see the separator); None otherwise."""
        line = raw.rstrip(b"\n")
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or not obj:
            return None
        fields, list_field, runs = [], None, 0
        for i, (key, value) in enumerate(obj.items()):
            fields.append(key)
            if isinstance(value, list):
                if list_field is not None or len(value) < 2 or not all(_count(v) for v in value):
                    return None
                list_field = i
                runs += len(value)
            elif _count(value):
                runs += 1
            else:
                return None
        starts, ends = _digit_runs(line)
        if len(starts) != runs:
            return None  # e.g. a key with digits in it
        gaps = [line[e:s] for e, s in zip(ends[:-1].tolist(), starts[1:].tolist())]
        head, tail = line[: starts[0]], line[ends[-1] :]
        between, separator, k = [], b"", 0
        for i in range(len(fields)):
            n = len(obj[fields[i]]) if i == list_field else 1
            if i == list_field:
                separator = gaps[k]
                if any(g != separator for g in gaps[k : k + n - 1]):
                    return None
            k += n - 1
            if i < len(fields) - 1:
                between.append(gaps[k])
                k += 1
        layout = cls(tuple(fields), list_field, head, tuple(between), tail, separator)
        literals = layout._literals()
        if len(set(literals.values())) != len(literals) or max(map(len, literals.values())) > _MAX_LITERAL:
            return None  # two places in a line with the same text: neighbours would not tell them apart
        if b"\n" in line or any(not lit for lit in literals.values()):
            return None
        return layout

    def _literals(self) -> dict[tuple, bytes]:
        """Every gap text a chunk of such lines can hold, by its place: ('after', field i)."""
        out: dict[tuple, bytes] = {("after", len(self.fields) - 1): self.tail + b"\n" + self.head}  # line to line
        for i, text in enumerate(self.between):
            out[("after", i)] = text
        if self.list_field is not None:
            out[("item",)] = self.separator
            j = self.list_field
            if j > 0:  # an empty list: the texts before and after it meet (as the first field: not handled)
                after = self.tail + b"\n" + self.head if j == len(self.fields) - 1 else self.between[j]
                out[("empty",)] = self.between[j - 1] + after
        return out


def _count(v) -> bool:
    return type(v) is int and v >= 0


def _digit_runs(buf) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) of every run of ASCII digits in a bytes-like object."""
    digit = (np.frombuffer(buf, dtype=np.uint8) - np.uint8(48)) < 10  # (wraps below '0')
    edges = np.flatnonzero(digit[1:] != digit[:-1])
    edges += 1
    if len(digit) and digit[0]:
        edges = np.concatenate([[0], edges])
    if len(digit) and digit[-1]:
        edges = np.append(edges, len(digit))
    return edges[0::2], edges[1::2]


@dataclass
class ParsedLines:
    """One chunk of lines: per field a column (lines in order), the list flattened."""

    lines: int  # lines parsed
    columns: dict[str, np.ndarray]  # scalar fields, int64
    items: np.ndarray | None  # the list field's items, all lines end to end (int64)
    counts: np.ndarray | None  # items per line


class _Compiled:
    """A layout's literals as arrays, for matching gaps vectorised."""

    def __init__(self, layout: LineLayout) -> None:
        self.layout = layout
        lits = layout._literals()
        places = list(lits)
        self.places = places
        self.texts = [lits[p] for p in places]
        nf = len(layout.fields)
        # The "item" and "empty" places exist only in a layout with a list field.
        lf = layout.list_field if layout.list_field is not None else -1
        # The field whose value follows each place, and which places may follow which.
        follows = []
        for p in places:
            if p[0] == "after":
                follows.append((p[1] + 1) % nf)
            elif p[0] == "item":
                follows.append(lf)
            else:  # empty list: the value after it belongs to the next field (wrapping to a new line)
                follows.append((lf + 1) % nf)
        allowed = np.zeros((len(places) + 1, len(places) + 1), dtype=bool)
        for a in range(len(places)):
            field = follows[a]  # the value between gap a and the next gap belongs to this field
            for c, pc in enumerate(places):
                if pc[0] == "item":
                    ok = field == lf
                elif pc[0] == "empty":
                    ok = field == (lf - 1) % nf
                else:
                    ok = pc[1] == field
                allowed[a, c] = ok
        self.allowed = allowed  # the last row and column: an unknown gap, allowed nowhere
        self.lengths = np.array([len(t) for t in self.texts], dtype=np.int64)
        self.first_words = np.array([_word(t[:8]) for t in self.texts] + [0], dtype=np.uint64)
        self.by_length = None  # place by gap length, where no two literals are as long
        if len(set(self.lengths.tolist())) == len(self.texts):
            self.by_length = np.full(int(self.lengths.max()) + 2, len(self.texts), dtype=np.int64)
            self.by_length[self.lengths] = np.arange(len(self.texts))


def _word(text: bytes) -> int:
    return int.from_bytes(text[:8].ljust(8, b"\0"), "little")


_LOW_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_HIGH_MASKS = np.array([0] + [((1 << 64) - 1) ^ ((1 << (8 * (8 - k))) - 1) for k in range(1, 9)], dtype=np.uint64)
_compiled: dict[LineLayout, _Compiled] = {}


def _words(buf: bytes) -> np.ndarray:
    """The 8-byte little-endian word starting at every byte offset (a strided view, no copy)."""
    return np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, offset=0, strides=(1,))


def _digits_value(words: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Values of digit runs ending (exclusive) at `end`, of their last min(length, 8) digits."""
    mask = _HIGH_MASKS[np.minimum(length, 8)]
    w = words[end - 8]
    w &= mask  # the run in the top bytes, zeros (leading zeros) below
    mask &= _ZEROS
    w -= mask  # digit values, byte by byte (no borrow: every byte kept is >= '0')
    for factor, shift, keep in _SWAR_STEPS:
        t = w >> shift
        w *= factor
        w += t
        w &= keep
    return w


_SWAR_STEPS = [
    (np.uint64(10), np.uint64(8), np.uint64(0x00FF00FF00FF00FF)),
    (np.uint64(100), np.uint64(16), np.uint64(0x0000FFFF0000FFFF)),
    (np.uint64(10000), np.uint64(32), np.uint64(0xFFFFFFFF)),
]


def parse_lines(chunk: bytes, layout: LineLayout) -> tuple[ParsedLines | None, list[tuple[int, int]]]:
    """Parse a chunk of whole lines (each ending in a newline) laid out as `layout`.

    Returns the parsed lines, or None with the byte ranges of the lines that do not fit
    (the caller re-parses the chunk piecewise: good stretches here, the rest with json).
    """
    comp = _compiled.get(layout)
    if comp is None:
        comp = _compiled[layout] = _Compiled(layout)
    if not chunk:
        return ParsedLines(
            0,
            {f: np.empty(0, dtype=np.int64) for f in _scalars(layout)},
            None if layout.list_field is None else np.empty(0, dtype=np.int64),
            None if layout.list_field is None else np.empty(0, dtype=np.int64),
        ), []
    buf = b" " * _PAD + layout.tail + b"\n" + chunk + b" " * _PAD  # a virtual line end before line one
    b = np.frombuffer(buf, dtype=np.uint8)
    words = _words(buf)
    starts, ends = _digit_runs(buf)
    # Gaps: from the end of each run (or the virtual line end) to the next run, and the chunk's end.
    gap_start = np.concatenate([[_PAD], ends])
    gap_end = np.append(starts, len(buf) - _PAD)
    length = gap_end - gap_start
    first = words[gap_start] & _LOW_MASKS[np.minimum(length, 8)]
    # Candidate place by length (or, where two literals are as long, by length and first word);
    # then every word compared exactly.
    unknown = len(comp.texts)
    if comp.by_length is not None:
        place = comp.by_length[np.minimum(length, len(comp.by_length) - 1)]
        place[first != comp.first_words[place]] = unknown
    else:
        place = np.full(len(length), unknown, dtype=np.int64)
        for i in range(unknown):
            place[(length == comp.lengths[i]) & (first == comp.first_words[i])] = i
    for i, text in enumerate(comp.texts):
        if len(text) <= 8:
            continue
        cand = np.flatnonzero(place == i)
        for off in range(8, len(text), 8):
            piece = text[off : off + 8]
            w = words[gap_start[cand] + off] & _LOW_MASKS[len(piece)]
            place[cand[w != np.uint64(_word(piece))]] = unknown
    # The last gap is the chunk's end: the tail, a newline and the head (of no next line).
    last = comp.texts.index(layout.tail + b"\n" + layout.head)
    end_text = layout.tail + b"\n"
    if length[-1] == len(end_text) and buf[gap_start[-1] : gap_end[-1]] == end_text:
        place[-1] = last
    # (the first gap is the virtual line end: tail + newline + head before line one)
    run_len = ends - starts
    bad_run = (run_len > 16) | ((run_len > 1) & (b[starts] == 48))  # too long, or a leading zero
    ok_gap = comp.allowed.ravel()[place[:-1] * (unknown + 1) + place[1:]] & ~bad_run
    line_end = place == last  # gaps that end a line (and start the next)
    if layout.list_field == len(layout.fields) - 1 and ("empty",) in comp.places:
        line_end |= place == comp.places.index(("empty",))  # a line ending in an empty list
    if not ok_gap.all() or place[0] != last:
        at = gap_start[np.flatnonzero(~ok_gap) + 1] - (_PAD + len(layout.tail) + 1)
        return None, _bad_ranges(chunk, at if place[0] == last else np.append(at, 0))
    # Values.
    values = _digits_value(words, ends, run_len)
    long_ = np.flatnonzero(run_len > 8)
    if len(long_):  # 9 to 16 digits: the digits before the last 8 too
        values[long_] += _digits_value(words, ends[long_] - 8, run_len[long_] - 8) * _POW8
    values = values.view(np.int64)
    # Line l's runs are those between its line-ending gaps; every line has one run per scalar.
    bounds = np.flatnonzero(line_end)
    lines = len(bounds) - 1
    nf = len(layout.fields)
    columns = {}
    scalar_runs = []
    for i, name in enumerate(layout.fields):
        if layout.list_field is None or i < layout.list_field:
            at = bounds[:-1] + i
        elif i > layout.list_field:
            at = bounds[1:] - (nf - i)
        else:
            continue
        columns[name] = values[at]
        scalar_runs.append(at)
    items = counts = None
    if layout.list_field is not None:
        counts = np.diff(bounds) - (nf - 1)
        in_list = np.ones(len(values), dtype=bool)
        for at in scalar_runs:
            in_list[at] = False
        items = values[in_list]
    return ParsedLines(lines, columns, items, counts), []


def _scalars(layout: LineLayout) -> list[str]:
    return [f for i, f in enumerate(layout.fields) if i != layout.list_field]


def _bad_ranges(chunk: bytes, positions: np.ndarray) -> list[tuple[int, int]]:
    """The byte ranges of the lines holding these positions (merged, in order)."""
    out: list[tuple[int, int]] = []
    for p in np.unique(np.clip(positions, 0, max(0, len(chunk) - 1))).tolist():
        if out and p < out[-1][1]:
            continue
        lo = chunk.rfind(b"\n", 0, p) + 1
        hi = chunk.find(b"\n", p)
        hi = len(chunk) if hi < 0 else hi + 1
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out
