"""LSP positions <-> offsets into the document text (Python str = code points).

A ``Position.character`` counts code units of the negotiated encoding: ``utf-8``
(bytes), ``utf-16`` (the default; characters outside the BMP count 2) or ``utf-32``
(code points). Lines follow pygls's document model (``str.splitlines(True)``), the
one its incremental sync applies edits with, so both agree on what a line is.

Rules (LSP 3.17): a character past the end of a line means the end of the line; a
unit in the middle of a multi-unit character rounds down to that character; a line
past the end of the document is an error (:class:`PositionError`), except the empty
line after a final newline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"


class PositionError(ValueError):
    """A position outside the document."""


def units(ch: str, encoding: str) -> int:
    """Code units of one character."""
    if encoding == UTF32:
        return 1
    cp = ord(ch)
    if encoding == UTF8:
        return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4
    return 2 if cp > 0xFFFF else 1


def strip_eol(line: str) -> str:
    """A line without its line ending."""
    if line.endswith("\r\n"):
        return line[:-2]
    if line and line[-1] in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029":
        return line[:-1]
    return line


def column_to_index(line: str, character: int, encoding: str) -> int:
    """Client column (code units) -> code-point index into ``line`` (no line ending)."""
    if character <= 0:
        return 0
    if encoding == UTF32:
        return min(character, len(line))
    if line.isascii():
        return min(character, len(line))
    seen = 0
    for i, ch in enumerate(line):
        seen += units(ch, encoding)
        if seen > character:
            return i
    return len(line)


def index_to_column(line: str, index: int, encoding: str) -> int:
    """Code-point index into ``line`` -> client column (code units)."""
    head = line[:index]
    if encoding == UTF32 or head.isascii():
        return len(head)
    if encoding == UTF8:
        return len(head.encode("utf-8"))
    return len(head.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class Cursor:
    """A resolved position: ``row``, ``col`` (code points) and ``offset`` into the text."""

    row: int
    col: int
    offset: int
    line: str  # the line's text without its ending


class LineIndex:
    """Lines of one document version with their start offsets (built once, reused)."""

    def __init__(self, source: str, lines: Sequence[str] | None = None) -> None:
        self.source = source
        self.lines = source.splitlines(True) if lines is None else list(lines)
        self.starts = [0, *itertools.accumulate(map(len, self.lines))]

    def line_text(self, row: int) -> str:
        if row == len(self.lines):
            return ""
        return strip_eol(self.lines[row])

    def resolve(self, line: int, character: int, encoding: str) -> Cursor:
        """Client (line, character) -> :class:`Cursor`; PositionError when outside."""
        n = len(self.lines)
        last_open = n == 0 or strip_eol(self.lines[-1]) != self.lines[-1]
        if line < 0 or character < 0:
            raise PositionError(f"negative position ({line}, {character})")
        if line > n or (line == n and not last_open):
            raise PositionError(f"line {line} is outside the document ({n} line(s))")
        text = self.line_text(line)
        col = column_to_index(text, character, encoding)
        return Cursor(row=line, col=col, offset=self.starts[line] + col, line=text)

    def position(self, row: int, col: int, encoding: str) -> tuple[int, int]:
        """(row, code-point col) -> client (line, character)."""
        return row, index_to_column(self.line_text(row), col, encoding)
