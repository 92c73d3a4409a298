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
it lands" is a *segment*: a node of the buffer's tree that strictly holds the edit, spans whole
lines (a statement, a block, a declaration: not a piece of an expression), has no error and,
parsed on its own (after the language's ``wrap``, before a line end), is again one node of the
same type; failing those, the run of top-level nodes around the edit. Up to :data:`SEGMENTS`
of them, innermost first; a larger one than :data:`SEGMENT_MAX` is not taken. Each segment's
tree is remembered (and re-parsed incrementally on the next keystroke), so a candidate costs an
incremental re-parse of its segment with the edit applied; it is kept when one segment still
parses (as one node of its type, unless that node sits in a list of statements, where one may
become several). Every segment broken: dropped, unless

* the suggestion's last line opens a block with no body yet (the language's ``opens``; the
  code after it is not indented deeper) and closing it (the brackets it left open, or one of
  the language's ``closers``) makes the segment parse: a user starting a block on purpose;
* or the whole buffer re-parsed with the suggestion (incrementally, within the same budget)
  has no error, or fewer error and missing nodes than before: the suggestion restores a
  structure the segments could not see (a Ruby ``begin`` whose ``end`` closed the method
  until then, a brace missing further down).

No clean segment (the code around the cursor has errors already: mid-typing), nothing is
filtered, as for Python. Every re-parse of a candidate is bounded in parser work
(:data:`BUDGET`, the parser's progress reports) and in the CPU time of the judging thread
(:data:`CANDIDATE_CPU_S`; CPU time, not wall time, so that the machine being busy changes a
verdict only through cache contention, on a candidate whose re-parse costs about the cap): an edit that makes the parser redo more than that after it (an unclosed bracket
re-parses the rest of the segment, in error recovery) counts as broken, unless the suggestion
is balanced (closes every bracket and string it opens, :func:`.languages.balanced`): then its
segment is re-parsed once more with the work budget of a parse from scratch and no CPU cap (an
edit inside a long literal table); the whole-buffer re-parse of a buffer with errors, where a
suggestion shows it repairs them, has the work budget only. A parse stuck in error recovery (a
wall-time cap far above a normal parse) decides nothing and the suggestion is kept. Re-parsing the whole buffer with the suggestion
(:meth:`TreeGuard.keeps_whole`) is the reference rule; the segment rule agrees with it or is
stricter (tests/unit/lsp_server/test_treesitter.py).

**The multi-line policy** (:func:`multiline_at`, the ``auto`` policy): several lines in an
empty block body and after a block opener, one line in an argument list, a condition, an array
or the middle of an expression; the text rule elsewhere.
"""

from __future__ import annotations

import functools
import importlib
import re
import threading
import time
from collections import OrderedDict
from typing import Any

from .languages import LANGUAGES, Language, balanced, lookup, unclosed

try:
    import tree_sitter as _ts  # optional dependency: without it, text rules only
except ImportError:  # pragma: no cover - exercised where the wheel is missing
    _ts = None

DOCUMENTS = 32
"""How many trees are kept for incremental parsing: documents, and segments (a few a document)."""
_ANCESTORS = 12
"""How many enclosing nodes are tried as the segment before the top-level run."""
SEGMENTS = 3
"""How many segments, innermost first, an edited buffer is judged on before it is dropped."""
BUDGET = 40
"""Parser work one candidate may spend on one re-parse, in the parser's progress reports (one
about every 70 bytes parsed anew: ~3 KB), plus one for every 64 bytes it inserts. Counted in
work, not wall time, so that a verdict does not depend on how busy the machine is (module doc)."""
CANDIDATE_CPU_S = 0.0012
"""CPU seconds (of the judging thread: not counting the time other work on the machine takes
from it) one re-parse of a candidate may take, beside :data:`BUDGET`: in error recovery a
progress report can stand for far more work than ~70 bytes (an unclosed parenthesis in a 17 KB
Go switch: 0.1 ms a report), and the budget alone let a broken candidate cost 4-7 ms. A valid
edit re-parses in far less (up to where the tree joins the old one): with 1.2 ms every true
middle of the languages bench is kept as with no cap (0.7 ms lost some in JavaScript and C++)."""
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
SEGMENT_MAX = 48_000
"""Bytes: a larger enclosing node is not taken as a segment (its parse would cost too much)."""


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


# -- incremental trees across keystrokes -------------------------------------------------------

_DOCS: OrderedDict[tuple[str, str], tuple[bytes, Any]] = OrderedDict()
_DOCS_LOCK = threading.Lock()


def _point(data: bytes, off: int) -> tuple[int, int]:
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
           start_point=_point(old, start), old_end_point=_point(old, old_end),
           new_end_point=_point(new, new_end))
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
        edited = edit_copy(old_tree, p, _point(old, p), old[p:len(old) - s], data[p:len(data) - s])
    try:
        tree = bounded_parse(name, data, edited, budget, DOCUMENT_CAP_S if edited is None else EDIT_CAP_S)
    except _OverBudget:
        return None
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


def error_nodes(node: Any) -> list[tuple[int, str]]:
    """``(start byte, type)`` of the ``ERROR`` and ``MISSING`` nodes under ``node`` (a cursor walk
    that skips every subtree holding none)."""
    if not node.has_error:
        return []
    out, cur = [], node.walk()
    while True:
        x = cur.node
        if x.is_error or x.is_missing:
            out.append((x.start_byte, "MISSING " + x.type if x.is_missing else x.type))
        if not x.is_missing and x.has_error and cur.goto_first_child():
            continue
        while not cur.goto_next_sibling():
            if not cur.goto_parent():
                return out


@functools.cache
def _keyword_pattern(words: tuple[str, ...]) -> re.Pattern[bytes]:
    # not after `.`, `::`, `@`, `$` (a method called on a receiver, a variable), not before a
    # name character, `?`, `!` or `:` (another name, a hash key)
    alt = b"|".join(re.escape(w.encode()) for w in words)
    return re.compile(rb"(?<![\w.:@$])(?:" + alt + rb")(?![\w?!:])")


_NAMED_ON_PURPOSE = frozenset({"method", "singleton_method", "alias", "undef"})


def strays(lang: Language, root: Any, data: bytes, ranges: list[tuple[int, int]]) -> int:
    """How many of the language's ``keywords`` the tree ``root`` (of ``data``) reads as a plain
    name (an ``identifier`` leaf, not a method's own name) inside ``ranges``: each an error the
    grammar does not report (a stray ``end`` in Ruby)."""
    if not lang.keywords:
        return 0
    pat, n = _keyword_pattern(lang.keywords), 0
    for lo, hi in ranges:
        for m in pat.finditer(data, max(lo, 0), hi):
            node = root.descendant_for_byte_range(m.start(), m.end())
            if node is not None and node.type == "identifier" and node.start_byte == m.start() \
                    and node.end_byte == m.end() and (node.parent is None or node.parent.type not in _NAMED_ON_PURPOSE):
                n += 1
    return n


def _changed(old: Any, new: Any, lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranges of ``new`` whose structure differs from the edited tree ``old``, and
    ``[lo, hi)`` (the inserted bytes)."""
    return [(r.start_byte, r.end_byte) for r in old.changed_ranges(new)] + [(lo, hi)]


def _holds_list(parent: Any) -> bool:
    """Whether a node of ``parent`` sits in a list of statements or declarations (the root, a
    braced block, a body), where one node may become several."""
    if parent is None or parent.parent is None:
        return True
    first = parent.child(0)
    return (first is not None and first.type == "{") or any(
        w in parent.type for w in ("block", "body", "program", "statement", "group", "source", "list"))


class _OverBudget(Exception):
    """The parse took more parser work than its budget."""


class _OverCPU(_OverBudget):
    """The parse took more CPU time than its cap (:data:`CANDIDATE_CPU_S`)."""


class _OutOfTime(_OverBudget):
    """The parse took more time than its cap (error recovery gone wild: each step slow)."""


def bounded_parse(name: str, data: bytes, old: Any, budget: int, cap_s: float = 0.05,
                  cpu_s: float | None = None) -> Any:
    """``data`` parsed (reusing ``old``, an edited tree, when given); :class:`_OverBudget` after
    ``budget`` progress reports or, ``cpu_s`` given, after that much CPU time of this thread
    (:data:`CANDIDATE_CPU_S`), :class:`_OutOfTime` after ``cap_s`` seconds of wall time; the
    parser reset then (else its next parse would resume this one)."""
    p = parser(name)
    left = [budget]
    deadline = time.perf_counter() + cap_s
    cpu_deadline = time.thread_time() + cpu_s if cpu_s is not None else None
    why: list[type[_OverBudget]] = []

    def read(off: int, _point: Any) -> bytes:
        return data[off:off + 65536]

    def late(_off: int, _err: bool) -> bool:
        left[0] -= 1
        if left[0] < 0:
            why.append(_OverBudget)
        elif cpu_deadline is not None and time.thread_time() > cpu_deadline:
            why.append(_OverCPU)
        elif time.perf_counter() > deadline:
            why.append(_OutOfTime)
        return bool(why)

    try:
        if old is None:
            return p.parse(read, progress_callback=late)
        return p.parse(read, old, progress_callback=late)
    except ValueError:  # cancelled
        p.reset()
        raise (why[0] if why else _OverBudget) from None


@functools.lru_cache(maxsize=64)
def segment_tree(name: str, data: bytes, kind: str | None, where: str = "") -> Any | None:
    """The tree of ``data`` parsed on its own (after the language's wrap, before a line end that
    closes the last statement: Go's terminator) when it has no error and, ``kind`` given, is one
    node of that type; else None. Remembered: a segment repeats across candidates, and each
    candidate re-parses its edited segment incrementally from this tree; ``where`` names the
    segment's place (document, start, type) so that the next keystroke's segment there is
    parsed incrementally from this one."""
    wrap = lookup(name).wrap.encode()
    whole = wrap + data + b"\n"
    tree = document_tree(name, where, whole) if where else parse(name, whole)
    if tree is None:
        return None
    root = tree.root_node
    if root.has_error or (kind is not None and not _spans_as(root, len(wrap), len(wrap) + len(data), kind)):
        return None
    return tree


def _judge(name: str, data: bytes, kind: str | None, after: int = 0) -> bool:
    """Whether ``data`` parses on its own with no error (as one node of type ``kind`` when given),
    no keyword read as a name from byte ``after`` on (:func:`strays`)."""
    lang = lookup(name)
    wrap = lang.wrap.encode()
    whole = wrap + data + b"\n"
    root = parse(name, whole).root_node
    return not root.has_error and (kind is None or _spans_as(root, len(wrap), len(wrap) + len(data), kind)) \
        and not strays(lang, root, whole, [(len(wrap) + after, len(whole))])


class TreeGuard:
    """Built once per request from the buffer; :meth:`keeps` judges one suggestion (module doc)."""

    def __init__(self, text: str, offset: int, lang: Language, key: str | None = None) -> None:
        self.lang, self.text, self.offset = lang, text, offset
        self.data = text.encode("utf-8", "surrogatepass")
        self.bo = len(text[:offset].encode("utf-8", "surrogatepass"))
        self.key = key or lang.name
        self._segs: dict[int, list[tuple[int, int, str | None, bool]]] = {}

    @functools.cached_property
    def tree(self) -> Any | None:
        """The buffer's tree (None: not parsed within its budget; nothing is judged then)."""
        return document_tree(self.lang.name, self.key, self.data)

    @functools.cached_property
    def point(self) -> tuple[int, int]:
        """(row, byte column) of the cursor."""
        return _point(self.data, self.bo)

    @functools.cached_property
    def clean(self) -> bool:
        """Whether the whole buffer parses with no error."""
        return self.tree is not None and not self.tree.root_node.has_error

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
        if self.tree is None:
            return []
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
                if b - a <= SEGMENT_MAX and segment_tree(self.lang.name, self.data[a:b], node.type,
                                                         f"{self.key}@{a}:{node.type}"):
                    out.append((a, b, node.type, _holds_list(node.parent)))
            node = node.parent
        if len(out) < SEGMENTS:
            run = self._top_run(lo, hi)
            if run is not None and self._whole_lines(*run) and not (out and out[-1][:2] == run):
                a, b = run
                if b - a <= SEGMENT_MAX and segment_tree(self.lang.name, self.data[a:b], None,
                                                         f"{self.key}@{a}"):
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
        neighbour on its side (None when one of them has an error). A binary search over the
        root's children (a large file has thousands)."""
        root = self.tree.root_node
        count = root.child_count
        if not count:
            return None

        def first_ending_at(x: int) -> int:  # the first child whose end is at or after x
            a, b = 0, count - 1
            while a < b:
                m = (a + b) // 2
                if root.child(m).end_byte < x:
                    a = m + 1
                else:
                    b = m
            return a

        i, j = first_ending_at(lo), first_ending_at(hi)
        first, last = root.child(i), root.child(j)
        if first.start_byte >= lo and i > 0:
            first = root.child(i - 1)  # lo is before that node: take the one before too
        if first.has_error or last.has_error:
            return None
        return min(first.start_byte, lo), max(last.end_byte, hi)

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
        budget = BUDGET + len(ins) // 64
        stuck = False
        for a, b, kind, loose in segs:
            try:
                if self._segment_ok(a, b, kind, loose, ins, rr, budget):
                    return True
            except _OutOfTime:
                return True  # the parser is stuck in error recovery: no verdict, nothing withheld
            except _OverBudget as e:
                even = balanced(insert, self.lang)
                stuck = isinstance(e, _OverCPU) and not even
                # the edit makes the parser redo the code after it: an unclosed bracket, or a
                # balanced edit inside a long literal (a table of thousands of numbers), which
                # gets one re-parse of its segment as from scratch
                if even:
                    try:
                        if self._segment_ok(a, b, kind, loose, ins, rr, budget + 2 * (b - a) // 64, None):
                            return True
                    except _OutOfTime:
                        return True
                    except _OverBudget:
                        pass
                break  # judged on the whole buffer
        a, b, kind, loose = segs[-1]
        kind = None if loose else kind
        if self._opens_block_ok(insert, lambda extra: _judge(
                self.lang.name, self._edited(a, b, ins + extra, rr), kind, self.bo - a), replace_right):
            return True
        if stuck and self.clean:
            # a bracket or string left open sent its segment's re-parse into error recovery past
            # the CPU cap: the whole buffer's, from the same edit, would go the same way
            return False
        return self._whole_ok(ins, rr, budget)

    def _segment_ok(self, a: int, b: int, kind: str | None, loose: bool, ins: bytes, rr: int,
                    budget: int, cpu_s: float | None = CANDIDATE_CPU_S) -> bool:
        """Whether the segment ``[a, b)`` with the edit parses with no error (as one node of type
        ``kind`` unless ``loose``): re-parsed incrementally from its remembered tree."""
        name = self.lang.name
        base = segment_tree(name, self.data[a:b], kind, f"{self.key}@{a}" + (f":{kind}" if kind else ""))
        wrap = self.lang.wrap.encode()
        old = wrap + self.data[a:b] + b"\n"
        new = wrap + self._edited(a, b, ins, rr) + b"\n"
        start = len(wrap) + self.bo - a
        t = edit_copy(base, start, _point(old, start), self.data[self.bo:self.bo + rr], ins)
        tree = bounded_parse(name, new, t, budget, cpu_s=cpu_s)
        root = tree.root_node
        if root.has_error or strays(self.lang, root, new, _changed(t, tree, start, start + len(ins))):
            return False
        return loose or kind is None or _spans_as(root, len(wrap), len(new) - 1, kind)

    @functools.cached_property
    def error_nodes(self) -> list[tuple[int, str]]:
        """The error and missing nodes of the buffer's tree (:func:`error_nodes`)."""
        return error_nodes(self.tree.root_node)

    def _whole_ok(self, ins: bytes, rr: int, budget: int) -> bool:
        """Whether the whole buffer with the edit, re-parsed incrementally within ``budget``
        (:func:`bounded_parse`), has no error, or fewer error and missing nodes than the buffer
        and none that the buffer did not have (at the same place, after the edit: an error
        where the suggestion lands); no keyword read as a name where the structure changed
        (:func:`strays`); not decided in time: False."""
        new = self.data[:self.bo] + ins + self.data[self.bo + rr:]
        t = edit_copy(self.tree, self.bo, self.point, self.data[self.bo:self.bo + rr], ins)
        try:
            # a buffer with errors: the re-parse that shows the suggestion repairing them is
            # its one chance (work budget only); a clean one: as a segment's
            tree = bounded_parse(self.lang.name, new, t, budget, cpu_s=CANDIDATE_CPU_S if self.clean else None)
        except _OverBudget:
            return False
        root, end = tree.root_node, self.bo + len(ins)
        if strays(self.lang, root, new, _changed(t, tree, self.bo, end)):
            return False
        if not root.has_error:
            return True
        shift = len(ins) - rr
        before = {(s, k) for s, k in self.error_nodes if s <= self.bo} | \
                 {(s + shift, k) for s, k in self.error_nodes if s >= self.bo + rr}
        now = error_nodes(root)
        return len(now) < len(self.error_nodes) and all(e in before for e in now)

    def _opens_block_ok(self, insert: str, judge, replace_right: int = 0) -> bool:
        """The suggestion's last line opens a block with no body yet (the code after it is not
        indented deeper: it is not that block's body) and closing it makes the code parse."""
        last = (self.text[self.text.rfind("\n", 0, self.offset) + 1:self.offset] + insert).rsplit("\n", 1)[-1]
        if len(last) > OPENER_LINE or not self.lang.opens.search(last):
            return False
        lead = last[: len(last) - len(last.lstrip(" \t"))]
        eol = self.text.find("\n", self.offset + replace_right)
        following = next((ln for ln in self.text[eol + 1:eol + 2000].split("\n") if ln.strip()), "") \
            if eol >= 0 else ""
        if len(following) - len(following.lstrip(" \t")) > len(lead):
            return False
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
        if not tree.root_node.has_error and not strays(self.lang, tree.root_node, new, [(self.bo, len(new))]):
            return True

        def judge(extra: bytes) -> bool:
            closed = new[:self.bo + len(ins)] + extra + new[self.bo + len(ins):]
            root = parse(self.lang.name, closed).root_node
            return not root.has_error and not strays(self.lang, root, closed, [(self.bo, len(closed))])
        return self._opens_block_ok(insert, judge, replace_right)


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
