"""Syntax guard: never offer a suggestion that breaks a Python buffer that parses.

A wrong suggestion that still parses costs the user a glance; one that breaks the
file (an unclosed bracket, a stray ``else``, an indentation error) costs an undo.
So, for Python documents, a suggestion is dropped when

* the buffer as it is parses (``ast.parse``, nothing is executed), and
* the buffer with the suggestion applied does not,

unless the only problem is the one a user creates on purpose when starting a block:
a suggestion whose last line opens a block (``for x in xs:``) with no body yet is
accepted when an indented ``pass`` after that line makes the buffer parse again.

When the buffer does not parse already (the user is in the middle of typing, which
is the common case mid-line), nothing is filtered: there is no baseline to protect.
Buffers over :data:`MAX_CHARS` characters are not checked (parsing is linear, but a
completion must stay fast). Other languages: not checked.
"""

from __future__ import annotations

import ast
import functools
import warnings

MAX_CHARS = 300_000
PYTHON_IDS = ("python",)


def is_python(language: str | None, path: str | None = None) -> bool:
    if language:
        return language.lower() in PYTHON_IDS
    return bool(path) and str(path).endswith((".py", ".pyi"))


def parses(source: str) -> bool:
    """True when ``source`` is syntactically valid Python (the running interpreter's grammar)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes
            ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def apply(text: str, offset: int, insert: str, replace_right: int = 0) -> str:
    return text[:offset] + insert + text[offset + replace_right:]


def _opens_block_ok(text: str, offset: int, insert: str, replace_right: int) -> bool:
    """Whether the only problem is a block opened by the suggestion's last line with no body
    yet: an indented ``pass`` after that line makes the buffer parse."""
    edited = apply(text, offset, insert, replace_right)
    end = offset + len(insert)
    line_start = edited.rfind("\n", 0, end) + 1
    last = edited[line_start:end]
    indent = last[: len(last) - len(last.lstrip(" \t"))]
    unit = "\t" if indent.startswith("\t") else "    "
    # the rest of the suggestion's line stays where it is; the body goes after that line
    nl = edited.find("\n", end)
    cut = len(edited) if nl < 0 else nl
    body = "\n" + indent + unit + "pass"
    return parses(edited[:cut] + body + edited[cut:])


class SyntaxGuard:
    """Built once per request from the buffer; :meth:`keeps` judges one suggestion.

    Parsing costs ~0.2 ms per KB, so nothing is parsed up front: a suggestion whose edited
    buffer parses is kept at the cost of that one parse, and the buffer itself is parsed
    (once, cached) only when some suggestion breaks it."""

    def __init__(self, text: str, offset: int, *, language: str | None, path: str | None = None) -> None:
        self.text, self.offset = text, offset
        self.applies = is_python(language, path) and len(text) <= MAX_CHARS

    @functools.cached_property
    def active(self) -> bool:
        """Whether the guard judges at all: a Python buffer, not huge, that parses as it is."""
        return self.applies and parses(self.text)

    def keeps(self, insert: str, replace_right: int = 0) -> bool:
        if not self.applies or not insert:
            return True
        if parses(apply(self.text, self.offset, insert, replace_right)):
            return True
        return not self.active or _opens_block_ok(self.text, self.offset, insert, replace_right)
