"""The parser layer for every language but Python: tree-sitter, one grammar wheel per language.

Offline: the grammars are compiled into their wheels (``tree-sitter-go``, ...); loading one is an
import of a local shared library, nothing is fetched. Without ``tree-sitter`` installed (or
without a language's wheel) :func:`grammar` is None and that language gets the text rules
only (:func:`available`, :func:`supported` say which load).

**Across keystrokes** each document's tree is kept (:func:`document_tree`, a few documents) and
the next buffer is parsed incrementally: the changed span (common prefix and suffix of the old
and new text) is applied with ``Tree.edit`` and the parser reuses every subtree outside it.

**The syntax guard** (:class:`TreeGuard`). A suggestion is dropped when the code where it lands
has no error (no ``ERROR`` or ``MISSING`` node) and has one with the suggestion applied. "Where
it lands" is a *segment*: the innermost node of the buffer's tree that strictly holds the edit,
has no error and, parsed on its own (after the language's ``wrap``), is again one node of the
same type (a block, a function, a class body, a statement: whatever the grammar makes of it);
failing that, the run of top-level nodes around the edit. A candidate costs one parse of its
segment; an edited segment that does not parse (or is no longer one node of that type) is
judged once more on the next segment out (an edit can join a neighbour: ``} else {``). Still
broken: dropped, unless the suggestion's last line opens a block (the language's ``opens``)
and closing it (the brackets it left open, or one of the language's ``closers``) makes the
segment parse: a user starting a block on purpose. No clean segment (the code around the
cursor has errors already: mid-typing), nothing is filtered, as for Python. Re-parsing the
whole buffer with the suggestion (:meth:`TreeGuard.keeps_whole`) is the reference rule; it is
not used on the hot path (an unclosed brace makes tree-sitter re-parse everything after it).
"""

from __future__ import annotations

import bisect
import functools
import importlib
import threading
import time
from collections import OrderedDict
from typing import Any

from .languages import LANGUAGES, Language, lookup, unclosed

try:
    import tree_sitter as _ts  # optional dependency: without it, text rules only
except ImportError:  # pragma: no cover - exercised where the wheel is missing
    _ts = None

DOCUMENTS = 8
"""How many documents' trees are kept for incremental parsing."""
_ANCESTORS = 12
"""How many enclosing nodes are tried as the segment before the top-level run."""
SEGMENTS = 3
WHOLE_BUDGET_S = 0.001
"""What a suggestion every segment rejects may spend on the whole buffer's re-parse (module doc)."""
"""How many segments, innermost first, an edited buffer is judged on before it is dropped."""


def available() -> bool:
    """Whether the tree-sitter bindings import."""
    return _ts is not None


@functools.lru_cache(maxsize=None)
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


# -- incremental trees across keystrokes -------------------------------------------------------

_DOCS: OrderedDict[tuple[str, str], tuple[bytes, Any]] = OrderedDict()
_DOCS_LOCK = threading.Lock()


def _point(data: bytes, off: int) -> tuple[int, int]:
    return data.count(b"\n", 0, off), off - (data.rfind(b"\n", 0, off) + 1)


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
           start_point=_point(old, start), old_end_point=_point(old, old_end),
           new_end_point=_point(new, new_end))
    return parse(name, new, t)


def document_tree(name: str, key: str, data: bytes) -> Any:
    """The tree of ``data``, the document ``key``'s text now: parsed incrementally from the
    last tree kept for that document (tree-sitter's edit API), or from scratch."""
    with _DOCS_LOCK:
        prev = _DOCS.get((name, key))
    if prev is not None and prev[0] == data:
        return prev[1]
    if prev is None:
        tree = parse(name, data)
    else:
        old, old_tree = prev
        p = _common_prefix(old, data)
        s = _common_suffix(old, data, min(len(old), len(data)) - p)
        tree = edited_tree(name, old_tree, old, data, p, len(old) - s, len(data) - s)
    with _DOCS_LOCK:
        _DOCS[(name, key)] = (data, tree)
        _DOCS.move_to_end((name, key))
        while len(_DOCS) > DOCUMENTS:
            _DOCS.popitem(last=False)
    return tree


# -- the syntax guard --------------------------------------------------------------------------


def _spans_as(root: Any, lo: int, hi: int, kind: str) -> bool:
    """Whether a node of type ``kind`` spans exactly ``[lo, hi)`` of the tree under ``root``, and
    the root holds nothing else but comments (``extra`` nodes)."""
    node = root.descendant_for_byte_range(lo, hi)
    while node is not None and node.start_byte == lo and node.end_byte == hi:
        if node.type == kind:
            break
        node = node.parent
    else:
        return False
    if node is None:
        return False
    top = node
    while top.parent is not None and top.parent != root:
        top = top.parent
    return all(c == top or c.is_extra or c.end_byte <= lo for c in root.children)


@functools.lru_cache(maxsize=256)
def errors(node: Any) -> int:
    """How many ``ERROR`` and ``MISSING`` nodes are under ``node`` (only the subtrees that hold
    one are visited)."""
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        if x.is_error or x.is_missing:
            n += 1
            if x.is_missing:
                continue
        stack.extend(c for c in x.children if c.has_error)
    return n


def _holds_list(parent: Any) -> bool:
    """Whether a node of ``parent`` sits in a list of statements or declarations (the root, a
    braced block, a body), where one node may become several."""
    if parent is None or parent.parent is None:
        return True
    first = parent.child(0)
    return (first is not None and first.type == "{") or any(
        w in parent.type for w in ("block", "body", "program", "statement", "group", "source", "list"))


def _standalone_ok(name: str, data: bytes, kind: str | None) -> bool:
    """Whether ``data`` (with the language's wrap) parses with no error, as one node of type
    ``kind`` when given. Remembered: a segment repeats across the candidates and keystrokes."""
    return _judge(name, data, kind)


def _judge(name: str, data: bytes, kind: str | None) -> bool:
    wrap = lookup(name).wrap.encode()
    tree = parse(name, wrap + data + b"\n")  # a line end closes the last statement (Go's terminator)
    root = tree.root_node
    if root.has_error:
        return False
    return kind is None or _spans_as(root, len(wrap), len(wrap) + len(data), kind)


class TreeGuard:
    """Built once per request from the buffer; :meth:`keeps` judges one suggestion (module doc)."""

    def __init__(self, text: str, offset: int, lang: Language, key: str | None = None) -> None:
        self.lang, self.text, self.offset = lang, text, offset
        self.data = text.encode("utf-8", "surrogatepass")
        self.bo = len(text[:offset].encode("utf-8", "surrogatepass"))
        self.key = key or lang.name
        self._segs: dict[int, list[tuple[int, int, str | None, bool]]] = {}

    @functools.cached_property
    def tree(self) -> Any:
        return document_tree(self.lang.name, self.key, self.data)

    @functools.cached_property
    def clean(self) -> bool:
        """Whether the whole buffer parses with no error."""
        return not self.tree.root_node.has_error

    def _nbytes(self, replace_right: int) -> int:
        return len(self.text[self.offset:self.offset + replace_right].encode("utf-8", "surrogatepass"))

    def segments(self, rr: int) -> list[tuple[int, int, str | None, bool]]:
        if rr not in self._segs:
            self._segs[rr] = self._find_segments(rr)
        return self._segs[rr]

    def _find_segments(self, rr: int) -> list[tuple[int, int, str | None, bool]]:
        """``(a, b, kind, loose)``: clean segments around the edit ``[bo, bo + rr)`` (bytes),
        innermost first, at most :data:`SEGMENTS` (module doc); ``kind`` None for the top-level
        run; ``loose``: the edited segment may be any run of nodes (its parent holds a list)."""
        lo, hi = self.bo, self.bo + rr
        root = self.tree.root_node
        out: list[tuple[int, int, str | None, bool]] = []
        node = root.descendant_for_byte_range(lo, hi)
        tried = 0
        while node is not None and node != root and len(out) < SEGMENTS and tried < _ANCESTORS:
            a, b = node.start_byte, node.end_byte
            if a < lo and hi < b and node.has_error:
                return out  # the code around the cursor is broken already: nothing wider is clean
            if a < lo and hi < b and node.is_named and not node.is_extra and self._whole_lines(a, b) \
                    and not (out and out[-1][:2] == (a, b)):
                tried += 1
                if _standalone_ok(self.lang.name, self.data[a:b], node.type):
                    out.append((a, b, node.type, _holds_list(node.parent)))
            node = node.parent
        if len(out) < SEGMENTS:
            run = self._top_run(lo, hi)
            if run is not None and not (out and out[-1][:2] == run):
                a, b = run
                if _standalone_ok(self.lang.name, self.data[a:b], None):
                    out.append((a, b, None, True))
        return out

    def _whole_lines(self, a: int, b: int) -> bool:
        """Whether ``[a, b)`` starts its line (after indentation) and ends one (before ``;`` or
        a comment): a statement, a block, a declaration, not a piece of an expression."""
        d = self.data
        if d[d.rfind(b"\n", 0, a) + 1:a].strip():
            return False
        e = d.find(b"\n", b)
        tail = d[b:e if e >= 0 else len(d)].strip()
        return not tail or tail.startswith((b";", self.lang.comment.encode()))

    def _top_run(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The top-level nodes holding ``lo`` and ``hi``; an end that sits between nodes takes the
        neighbour on its side (None when one of them has an error)."""
        kids = self.tree.root_node.children
        if not kids:
            return None
        ends = [k.end_byte for k in kids]
        i = min(bisect.bisect_left(ends, lo), len(kids) - 1)  # the first node ending at or after lo
        if kids[i].start_byte >= lo and i > 0:
            i -= 1  # lo is before that node: take the one before too
        j = min(bisect.bisect_left(ends, hi), len(kids) - 1)
        if kids[i].has_error or kids[j].has_error:
            return None
        return min(kids[i].start_byte, lo), max(kids[j].end_byte, hi)

    def _edited(self, a: int, b: int, ins: bytes, rr: int) -> bytes:
        return self.data[a:self.bo] + ins + self.data[self.bo + rr:b]

    def keeps(self, insert: str, replace_right: int = 0) -> bool:
        """Whether to offer ``insert`` at the cursor (replacing ``replace_right`` characters)."""
        if not insert:
            return True
        rr = self._nbytes(replace_right)
        segs = self.segments(rr)
        ins = insert.encode("utf-8", "surrogatepass")
        if not segs:
            return True  # the code around the cursor has errors already (mid-typing): no baseline
        for a, b, kind, loose in segs:
            if _judge(self.lang.name, self._edited(a, b, ins, rr), None if loose else kind):
                return True
        a, b, kind, loose = segs[-1]
        kind = None if loose else kind
        if self._opens_block_ok(insert, lambda extra: _judge(
                self.lang.name, self._edited(a, b, ins + extra, rr), kind)):
            return True
        return self._whole_ok(ins, rr, WHOLE_BUDGET_S, fewer=True)

    @functools.cached_property
    def errors(self) -> int:
        """How many error and missing nodes the buffer's tree holds."""
        return errors(self.tree.root_node)

    def _whole_ok(self, ins: bytes, rr: int, budget_s: float, fewer: bool = False) -> bool:
        """Whether the whole buffer with the edit, re-parsed incrementally within ``budget_s``
        seconds, has no error, or no more error and missing nodes than the buffer (``fewer``:
        fewer; not decided in time: False)."""
        new = self.data[:self.bo] + ins + self.data[self.bo + rr:]
        t = self.tree.copy()
        t.edit(start_byte=self.bo, old_end_byte=self.bo + rr, new_end_byte=self.bo + len(ins),
               start_point=_point(self.data, self.bo), old_end_point=_point(self.data, self.bo + rr),
               new_end_point=_point(new, self.bo + len(ins)))
        deadline = time.perf_counter() + budget_s

        def read(off: int, _point: Any) -> bytes:
            return new[off:off + 65536]

        p = parser(self.lang.name)
        try:
            tree = p.parse(read, t, progress_callback=lambda _off, _err: time.perf_counter() > deadline)
        except ValueError:  # cancelled: out of time
            p.reset()  # else the next parse would resume this one
            return False
        if not tree.root_node.has_error:
            return True
        n = errors(tree.root_node)
        return n < self.errors if fewer else n <= self.errors

    def _opens_block_ok(self, insert: str, judge) -> bool:
        """The suggestion's last line opens a block and closing it makes the code parse."""
        last = (self.text[self.text.rfind("\n", 0, self.offset) + 1:self.offset] + insert).rsplit("\n", 1)[-1]
        if not self.lang.opens.search(last):
            return False
        lead = last[: len(last) - len(last.lstrip(" \t"))]
        brackets = "".join(unclosed(insert, self.lang))
        tries = [brackets] if brackets else []
        tries += [c for c in self.lang.closers]
        return any(judge(("\n" + lead + c).encode()) for c in tries)

    def keeps_whole(self, insert: str, replace_right: int = 0) -> bool:
        """The reference rule: the whole buffer re-parsed with the suggestion (incrementally)."""
        if not insert or not self.clean:
            return True
        rr = self._nbytes(replace_right)
        ins = insert.encode("utf-8", "surrogatepass")
        new = self.data[:self.bo] + ins + self.data[self.bo + rr:]
        tree = edited_tree(self.lang.name, self.tree, self.data, new, self.bo, self.bo + rr,
                           self.bo + len(ins))
        if not tree.root_node.has_error:
            return True

        def judge(extra: bytes) -> bool:
            return not parse(self.lang.name, new[:self.bo + len(ins)] + extra
                             + new[self.bo + len(ins):]).root_node.has_error
        return self._opens_block_ok(insert, judge)
