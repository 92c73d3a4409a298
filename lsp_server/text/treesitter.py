"""The parser layer for every language but Python: tree-sitter, one grammar wheel per language.

Offline: the grammars are compiled into their wheels (``tree-sitter-go``, ...); loading one is an
import of a local shared library, nothing is fetched. Without ``tree-sitter`` installed (or
without a language's wheel) :func:`grammar` is None and that language gets the text rules
only (:func:`available`, :func:`supported` say which load).

**Bounded parses** (:func:`bounded_parse`): a parse stops after a budget of parser work (the
parser's progress reports), of CPU time or of wall time, raising :class:`OverBudget`.

**Across keystrokes** each document's tree is kept (:func:`document_tree`, a few documents) and
the next buffer is parsed incrementally: the changed span (common prefix and suffix of the old
and new text) is applied with ``Tree.edit`` and the parser reuses every subtree outside it.

The syntax guard on these trees is :mod:`.treesitter_guard`.

**The multi-line policy** (:func:`multiline_at`, the ``auto`` policy): several lines in an
empty block body and after a block opener, one line in an argument list, a condition, an array
or the middle of an expression; the text rule elsewhere.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections import OrderedDict
from typing import Any

from .languages import LANGUAGES, Language, lookup

try:
    import tree_sitter as _ts  # optional dependency: without it, text rules only
except ImportError:  # pragma: no cover - exercised where the wheel is missing
    _ts = None

DOCUMENTS = 32
"""How many trees are kept for incremental parsing: documents, and segments (a few a document)."""
DOCUMENT_BUDGET = 400
"""Parser work a buffer's re-parse may take beyond twice that of a parse from scratch."""
DOCUMENT_CAP_S = 0.25
"""Seconds a buffer's first parse may take at most (error recovery can take seconds on a large
file with an unclosed string); past it nothing is judged for that request."""
EDIT_CAP_S = 0.1
"""Seconds a buffer's re-parse from its kept tree may take at most: a keystroke that opens a
string running to the end of a large file sends the parser into error recovery over all of it;
past the cap nothing is judged for that request, and the next keystroke starts again from the
kept tree (the one from before the string was opened)."""
OPENER_LINE = 400
"""Characters: a longer line is not looked at as a block opener (a generated one-line file)."""


def available() -> bool:
    """Whether the tree-sitter bindings import."""
    return _ts is not None


@functools.cache
def grammar(name: str) -> Any | None:
    """The ``tree_sitter.Language`` of a table language, or None (no grammar, or not installed)."""
    lang = lookup(name)
    if _ts is None or lang is None or lang.grammar is None:
        return None
    module, func = lang.grammar
    try:
        mod = importlib.import_module(module)
        return _ts.Language(getattr(mod, func)())
    except (ImportError, AttributeError, ValueError, OSError):  # a wheel missing or ABI-incompatible
        return None


def supported() -> tuple[str, ...]:
    """The table languages whose grammar loads here."""
    return tuple(lang.name for lang in LANGUAGES if lang.grammar and grammar(lang.name) is not None)


def language_for(language: str | None, path: str | None = None) -> Language | None:
    """The table entry of a document when its grammar loads (Python excluded: ``ast`` judges it)."""
    lang = lookup(language, path)
    if lang is None or lang.name == "python" or grammar(lang.name) is None:
        return None
    return lang


class _Parsers(threading.local):
    """One parser per language and thread (a parser is not shared between threads)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Any] = {}


_PARSERS = _Parsers()


def parser(name: str) -> Any:
    p = _PARSERS.by_name.get(name)
    if p is None:
        p = _PARSERS.by_name[name] = _ts.Parser(grammar(name))
    return p


def parse(name: str, data: bytes, old: Any = None) -> Any:
    return parser(name).parse(data, old) if old is not None else parser(name).parse(data)


# -- bounded parses ---------------------------------------------------------------------------


class OverBudget(Exception):
    """The parse took more parser work than its budget."""


class OverCPU(OverBudget):
    """The parse took more CPU time than its cap (:data:`.treesitter_guard.CANDIDATE_CPU_S`)."""


class OutOfTime(OverBudget):
    """The parse took more time than its cap (error recovery gone wild: each step slow)."""


def bounded_parse(name: str, data: bytes, old: Any, budget: int, cap_s: float = 0.05,
                  cpu_s: float | None = None) -> Any:
    """``data`` parsed (reusing ``old``, an edited tree, when given); :class:`OverBudget` after
    ``budget`` progress reports or, ``cpu_s`` given, after that much CPU time of this thread
    (:data:`.treesitter_guard.CANDIDATE_CPU_S`), :class:`OutOfTime` after ``cap_s`` seconds of
    wall time; the parser reset then (else its next parse would resume this one)."""
    p = parser(name)
    left = [budget]
    deadline = time.perf_counter() + cap_s
    cpu_deadline = time.thread_time() + cpu_s if cpu_s is not None else None
    why: list[type[OverBudget]] = []

    def read(off: int, _point: Any) -> bytes:
        return data[off:off + 65536]

    def late(_off: int, _err: bool) -> bool:
        left[0] -= 1
        if left[0] < 0:
            why.append(OverBudget)
        elif cpu_deadline is not None and time.thread_time() > cpu_deadline:
            why.append(OverCPU)
        elif time.perf_counter() > deadline:
            why.append(OutOfTime)
        return bool(why)

    try:
        if old is None:
            return p.parse(read, progress_callback=late)
        return p.parse(read, old, progress_callback=late)
    except ValueError:  # cancelled
        p.reset()
        raise (why[0] if why else OverBudget) from None


# -- incremental trees across keystrokes -------------------------------------------------------

_DOCS: OrderedDict[tuple[str, str], tuple[bytes, Any]] = OrderedDict()
_DOCS_LOCK = threading.Lock()


def byte_point(data: bytes, off: int) -> tuple[int, int]:
    """(row, byte column) of byte ``off`` of ``data``: a tree-sitter point."""
    return data.count(b"\n", 0, off), off - (data.rfind(b"\n", 0, off) + 1)


def _after(point: tuple[int, int], text: bytes) -> tuple[int, int]:
    """The point after ``text`` written at ``point``."""
    nl = text.count(b"\n")
    return (point[0], point[1] + len(text)) if not nl else (point[0] + nl, len(text) - text.rfind(b"\n") - 1)


def edit_copy(tree: Any, start: int, start_point: tuple[int, int], old: bytes, new: bytes) -> Any:
    """A copy of ``tree`` told that ``old``, at byte ``start`` (``start_point``), became ``new``."""
    t = tree.copy()
    t.edit(start_byte=start, old_end_byte=start + len(old), new_end_byte=start + len(new),
           start_point=start_point, old_end_point=_after(start_point, old),
           new_end_point=_after(start_point, new))
    return t


def _common_prefix(a: bytes, b: bytes) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # a binary search on slice comparisons (memcmp), not a loop over bytes
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def edited_tree(name: str, tree: Any, old: bytes, new: bytes, start: int, old_end: int,
                new_end: int) -> Any:
    """``new`` parsed reusing ``tree`` (of ``old``), ``old[start:old_end]`` having become
    ``new[start:new_end]`` (``tree`` itself is not changed)."""
    t = tree.copy()
    t.edit(start_byte=start, old_end_byte=old_end, new_end_byte=new_end,
           start_point=byte_point(old, start), old_end_point=byte_point(old, old_end),
           new_end_point=byte_point(new, new_end))
    return parse(name, new, t)


def document_tree(name: str, key: str, data: bytes) -> Any | None:
    """The tree of ``data``, the document ``key``'s text now: parsed incrementally from the
    last tree kept for that document (tree-sitter's edit API), or from scratch; None when that
    takes more than :data:`DOCUMENT_BUDGET` (error recovery gone wild on a large file)."""
    with _DOCS_LOCK:
        prev = _DOCS.get((name, key))
    if prev is not None and prev[0] == data:
        return prev[1]
    budget = DOCUMENT_BUDGET + 2 * len(data) // 64  # twice what a parse from scratch takes
    if prev is None:
        edited = None
    else:
        old, old_tree = prev
        p = _common_prefix(old, data)
        s = _common_suffix(old, data, min(len(old), len(data)) - p)
        edited = edit_copy(old_tree, p, byte_point(old, p), old[p:len(old) - s], data[p:len(data) - s])
    try:
        tree = bounded_parse(name, data, edited, budget, DOCUMENT_CAP_S if edited is None else EDIT_CAP_S)
    except OverBudget:
        return None
    with _DOCS_LOCK:
        _DOCS[(name, key)] = (data, tree)
        _DOCS.move_to_end((name, key))
        while len(_DOCS) > DOCUMENTS:
            _DOCS.popitem(last=False)
    return tree


# -- the multi-line policy ---------------------------------------------------------------------

_OPEN_BRACKETS = {"(", "[", "{"}
_EXPRESSION_END = tuple("+-*/%=&|^<>,.?!([")


def multiline_at(text: str, offset: int, language: str | None, path: str | None = None) -> bool | None:
    """The ``auto`` multi-line decision from the tree, for a language whose grammar loads (not
    Python: its text rule stays): True in an empty block body (``{|}``) or on the line after a
    block opener (the cursor at its end, or on a blank line below it); False inside parentheses
    or square brackets (an argument list, a condition, an array, a subscript) or right after an
    operator or comma (the middle of an expression); None elsewhere (the text rule: several
    lines at the end of a line)."""
    lang = language_for(language, path)
    if lang is None:
        return None
    line_start = text.rfind("\n", 0, offset) + 1
    before = text[line_start:offset]
    stripped = before.rstrip()[-OPENER_LINE:]
    data = text.encode("utf-8", "surrogatepass")
    bo = len(text[:offset].encode("utf-8", "surrogatepass"))
    tree = document_tree(lang.name, path or lang.name, data)
    if tree is None:
        return None
    node = tree.root_node.descendant_for_byte_range(bo, bo)
    up = node
    while up is not None:
        if up.start_byte < bo < up.end_byte and ("string" in up.type or "comment" in up.type):
            return None  # in a string or a comment: the text rule
        up = up.parent
    if stripped.endswith(_EXPRESSION_END) and not stripped.endswith(("=>", "->", "++", "--")):
        return False  # the middle of an expression, an argument list
    while node is not None and node.parent is not None:
        if node.start_byte < bo < node.end_byte and node.child_count and node.child(0).type in _OPEN_BRACKETS:
            if node.has_error:
                break  # the tree is no guide here (mid-typing)
            if node.child(0).type in ("(", "["):
                return False  # an argument list, a condition, an array, a subscript
            if not [c for c in node.named_children if not c.is_extra]:
                return True  # an empty block (or literal) body
            break
        node = node.parent
    eol = text.find("\n", offset)
    after = text[offset:eol if eol >= 0 else len(text)]
    if stripped and lang.opens.search(stripped) and not after.strip(")]} \t"):
        return True  # at the end of a block opener
    if not stripped:
        prev = text[:line_start].rstrip("\n").rsplit("\n", 1)[-1]
        if len(prev) <= OPENER_LINE and lang.opens.search(prev.rstrip()):
            return True  # the line after a block opener
    return None
