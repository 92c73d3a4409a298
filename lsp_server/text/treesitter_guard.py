"""The syntax guard for every language but Python, on the trees of :mod:`.treesitter`.

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
stricter (tests/unit/lsp_server/text/test_treesitter_guard.py).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from .languages import Language, balanced, lookup, unclosed
from .treesitter import (
    OPENER_LINE,
    OutOfTime,
    OverBudget,
    OverCPU,
    bounded_parse,
    byte_point,
    document_tree,
    edit_copy,
    edited_tree,
    parse,
)

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
SEGMENT_MAX = 48_000
"""Bytes: a larger enclosing node is not taken as a segment (its parse would cost too much)."""


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
        return byte_point(self.data, self.bo)

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
            except OutOfTime:
                return True  # the parser is stuck in error recovery: no verdict, nothing withheld
            except OverBudget as e:
                even = balanced(insert, self.lang)
                stuck = isinstance(e, OverCPU) and not even
                # the edit makes the parser redo the code after it: an unclosed bracket, or a
                # balanced edit inside a long literal (a table of thousands of numbers), which
                # gets one re-parse of its segment as from scratch
                if even:
                    try:
                        if self._segment_ok(a, b, kind, loose, ins, rr, budget + 2 * (b - a) // 64, None):
                            return True
                    except OutOfTime:
                        return True
                    except OverBudget:
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
        t = edit_copy(base, start, byte_point(old, start), self.data[self.bo:self.bo + rr], ins)
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
        except OverBudget:
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
