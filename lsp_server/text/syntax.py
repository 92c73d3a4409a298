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
Other languages: judged on their tree-sitter tree (:mod:`.treesitter`, the same rule: a
suggestion is dropped when the code where it lands has no error and has one with it), for
those whose grammar wheel is installed (:mod:`.languages` lists them); the others are not
checked. Everything below is the Python path, unchanged by the other languages.

**Buffers of any size are checked** around the cursor. Over :data:`MAX_CHARS` characters the
whole buffer is never parsed (a 5 MB file costs ~1 s a parse): the segment around the cursor
must parse as it is and with the suggestion, and the rest of the buffer is taken on trust
(the one limit left: a segment cut inside a multi-line string of a huge file is judged as
code; with no segment that parses, nothing is filtered).

**Only the code around the cursor is re-parsed.** Parsing costs ~0.15-0.35 ms per KB, so
judging every candidate on the whole buffer (:meth:`SyntaxGuard.keeps_whole`, the
reference rule) would spend the whole 25 ms budget on a 100 KB file. Instead the buffer
is cut into *segment* -- the innermost ``def``/``class`` holding the cursor (decorators
included), or failing that an outer one, or the top-level statement(s) around the
cursor's line -- and *rest* (the buffer without it). The cut is *clean* when the segment,
as a block at its own indentation, parses and the rest parses, and the place where the
segment was cut out is not inside a string or a bracket of the rest (a code example in a
docstring looks like code): then the whole parses, and
an edit inside the segment leaves it parsing exactly when the edited segment still parses
as one block at that indentation. A candidate costs one parse of its segment; the rest is
parsed once and remembered across requests (it does not change while the user types
inside one function). An edited segment that does not parse is judged again with one
sibling statement more on each side (an edit can join its statement to a neighbour: a
decorator or a comment at the header's column, a trailing backslash). No clean cut (a
line inside a string at a lower indentation, a broken buffer): the reference rule.
``scripts/bench_syntax_guard.py`` times both and checks that they agree.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from collections import OrderedDict
from itertools import accumulate

from . import treesitter, treesitter_guard

MAX_CHARS = 300_000
WIDE_MAX = 8_000
"""Characters: the wider cut of an outer block (one sibling statement more on each side of a
block that holds the cut that failed) larger than this and than four times that cut is not
tried (an outer class: its parse per candidate would cost tens of ms); without a wider cut,
the edited cut alone decides, with the block-opener rule. The cut's own siblings are always
tried (a decorator the edit ends with belongs to the class after it, however large)."""
PYTHON_IDS = ("python",)


def is_python(language: str | None, path: str | None = None) -> bool:
    if language:
        return language.lower() in PYTHON_IDS
    return bool(path) and str(path).endswith((".py", ".pyi"))


def parses(source: str) -> bool:
    """True when ``source`` is syntactically valid Python (the running interpreter's grammar)."""
    return parse_tree(source) is not None


def parse_tree(source: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes
            return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


@functools.lru_cache(maxsize=16)
def _rest_cut_ok(rest: str, line: int) -> bool:
    """Whether ``rest`` parses and a block can have been cut out of it at the start of (1-based)
    ``line``: that line does not start inside one expression or simple statement (a string or
    a bracket running over several lines). Only the nodes spanning ``line`` are visited.
    Remembered: the rest and the cut repeat across keystrokes."""
    tree = parse_tree(rest)
    if tree is None:
        return False
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        lo = getattr(node, "lineno", None)
        if lo is not None:
            hi = getattr(node, "end_lineno", None) or lo
            if not lo < line <= hi:
                continue
            if isinstance(node, ast.expr | ast.pattern) or (
                isinstance(node, ast.stmt) and not hasattr(node, "body")
            ):
                return False
        stack.extend(ast.iter_child_nodes(node))
    return True


_GOOD_RESTS: OrderedDict[tuple[str, int], bool] = OrderedDict()
"""The rests (and cut lines) :func:`_rest_cut_ok` accepted lately, looked up without parsing
(:attr:`SyntaxGuard.typing_here`)."""


def parses_as_block(source: str, indent: int) -> bool:
    """Whether ``source`` parses as statements of one block at column ``indent`` (0: module
    level): a line dedented below ``indent`` would leave the block, and a block whose
    statements all sit deeper (its header edited away) is another block: neither accepted."""
    if indent == 0:
        return parses(source)
    tree = parse_tree("class _:\n" + source)  # a class takes no else/elif/except/finally
    return (tree is not None and len(tree.body) == 1
            and all(st.col_offset == indent for st in tree.body[0].body))


_span_parses = functools.lru_cache(maxsize=32)(parses_as_block)
""":func:`parses_as_block` remembered, for the buffer's own spans (the cut and the typing check
parse the same ones, and the next keystroke the same rest); an edited span is parsed anew."""


def apply(text: str, offset: int, insert: str, replace_right: int = 0) -> str:
    return text[:offset] + insert + text[offset + replace_right:]


def _opens_block_ok(text: str, offset: int, insert: str, replace_right: int, indent: int = 0) -> bool:
    """Whether the only problem is a block opened by the suggestion's last line with no body
    yet: an indented ``pass`` after that line makes ``text`` (a block at column ``indent``)
    parse."""
    edited = apply(text, offset, insert, replace_right)
    end = offset + len(insert)
    line_start = edited.rfind("\n", 0, end) + 1
    last = edited[line_start:end]
    lead = last[: len(last) - len(last.lstrip(" \t"))]
    unit = "\t" if lead.startswith("\t") else "    "
    # the rest of the suggestion's line stays where it is; the body goes after that line
    nl = edited.find("\n", end)
    cut = len(edited) if nl < 0 else nl
    if not _ENDS_BLOCK_HEADER.search(edited[line_start:cut]):
        return False  # a line that opens a block ends with a colon (and maybe a comment)
    body = "\n" + lead + unit + "pass"
    return parses_as_block(edited[:cut] + body + edited[cut:], indent)


_ENDS_BLOCK_HEADER = re.compile(r":[ \t]*(#.*)?$")


# -- cutting the buffer around the cursor ---------------------------------------------------

_HEADER = re.compile(r"[ \t]*(?:async[ \t]+def|def|class)\b")
_CONTINUES = frozenset(("else", "elif", "except", "finally"))
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _is_code(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _closes(line: str) -> bool:
    """A code line that starts with a closing bracket (it continues a statement above)."""
    return line.lstrip(" \t")[0] in ")]}"


def _starts_at(line: str, col: int) -> bool:
    """Whether ``line`` can start a statement of a block at column ``col``: code indented
    exactly ``col``, not a closing bracket, not the ``else``/``elif``/``except``/``finally``
    of the statement before."""
    if not _is_code(line) or _indent(line) != col or _closes(line):
        return False
    m = _WORD.match(line.lstrip(" \t"))
    return not (m and m.group() in _CONTINUES)


def _ends_before(line: str, col: int) -> bool:
    """Whether ``line`` cannot belong to a statement of a block at column ``col`` that
    started above it: code indented less than ``col`` (not a closing bracket), or a new
    statement at ``col``."""
    if not _is_code(line):
        return False
    if _indent(line) < col:
        return not _closes(line)
    return _starts_at(line, col)


class _Lines:
    """The buffer's lines (without ``\\n``) and the offset where each starts."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0, *accumulate(len(ln) + 1 for ln in self.lines[:-1])]

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, offset)

    def offset_of(self, i: int) -> int:
        return self.starts[i] if i < len(self.lines) else len(self.text)

    def headers(self, cur: int) -> list[int]:
        """``def``/``class`` lines enclosing line ``cur`` (or on it), innermost first: each is
        indented less than every code line between it and ``cur``."""
        out, bound = [], None
        for k in range(cur, -1, -1):
            ln = self.lines[k]
            if not _is_code(ln):
                continue
            ind = _indent(ln)
            if bound is None or ind < bound:
                if _HEADER.match(ln):
                    out.append(k)
                bound = ind
                if ind == 0:
                    break
        return out

    def statement_start(self, i: int, col: int) -> int:
        """Line ``i`` (a statement start at ``col``) moved up over its decorators."""
        k = i - 1
        while k >= 0:
            ln = self.lines[k]
            if _is_code(ln):
                if _indent(ln) != col or not ln.lstrip(" \t").startswith("@"):
                    break
                i = k
            k -= 1
        return i

    def span_end(self, cur: int, col: int) -> int:
        """First line after ``cur`` that ends a block-``col`` statement running through ``cur``."""
        j = cur + 1
        while j < len(self.lines) and not _ends_before(self.lines[j], col):
            j += 1
        return j

    def top_level(self, cur: int) -> int:
        i = cur
        while i > 0 and not _starts_at(self.lines[i], 0):
            i -= 1
        return self.statement_start(i, 0)

    def previous_sibling(self, i: int, col: int) -> int:
        """Start of the statement at ``col`` just above line ``i`` in the same block (``i`` if none)."""
        k = i - 1
        while k >= 0:
            ln = self.lines[k]
            if _is_code(ln):
                if _indent(ln) < col and not _closes(ln):
                    return i  # the block's header: no sibling above
                if _starts_at(ln, col):
                    return self.statement_start(k, col)
            k -= 1
        return i

    def next_sibling_end(self, j: int, col: int) -> int:
        """End of the statement at ``col`` starting on line ``j`` (``j`` if none starts there)."""
        if j >= len(self.lines) or not _starts_at(self.lines[j], col):
            return j
        return self.span_end(j, col)


class SyntaxGuard:
    """Built once per request from the buffer; :meth:`keeps` judges one suggestion.

    Nothing is parsed up front. :meth:`keeps` parses the segment around the cursor with the
    suggestion applied (the rest of the buffer once, remembered across requests) and falls
    back to :meth:`keeps_whole` when the buffer does not cut cleanly (module doc)."""

    def __init__(self, text: str, offset: int, *, language: str | None, path: str | None = None) -> None:
        self.text, self.offset = text, offset
        self.applies = is_python(language, path)
        lang = None if self.applies else treesitter.language_for(language, path)
        self.tree_guard = None if lang is None else treesitter_guard.TreeGuard(text, offset, lang, key=path)
        """The judge for a language other than Python (None: Python, or no grammar: text rules)."""
        self.huge = len(text) > MAX_CHARS  # judged on the segment alone (module doc)
        self._segments: dict[tuple[bool, int | None], tuple[int, int, int] | None] = {}
        self._wide: dict[int | None, tuple[tuple[int, int, int] | None, bool]] = {}
        """need -> (the wider cut, without the check of its rest; whether an outer block's was
        left out for its size)"""
        self._skipped = False

    def prepare(self) -> None:
        """The work of a request that no candidate changes, done now (it is done lazily by the
        first :meth:`keeps` otherwise): for Python the cut at the cursor's own indentation and,
        without a clean one, whether the user is typing there; for the other languages the
        buffer's incremental re-parse and the segments around the cursor."""
        if self.tree_guard is not None:
            self.tree_guard.segments(0)
        elif self.applies and self.segment(False, self.written_indent("", 0)) is None:
            _ = self.typing_here

    @functools.cached_property
    def typing_here(self) -> bool:
        """Whether a cut around the cursor does not parse while the rest of the buffer does and
        was cut cleanly there (the rest remembered across keystrokes): then the buffer does
        not parse either, the user is typing, and nothing is withheld -- the
        reference rule's verdict, found without parsing the whole buffer (~70 ms on 200 KB)
        on every keystroke of a statement being typed. False on a huge buffer."""
        if not self.applies or self.huge or not self._spans:
            return False
        L, t = self._lines, self.text
        broken = []
        for i, j, col in self._spans:  # innermost first; an outer one whose rest is known
            a, b = L.offset_of(i), L.offset_of(j)  # (its header typed two keys ago) decides too
            if _span_parses(t[a:b], col):
                break  # the code around the cursor parses up to here: not typing in it
            if _GOOD_RESTS.get((t[:a] + t[b:], i + 1)):
                return True
            broken.append((a, b))
        # else the rest of each, innermost first (a class's only method leaves a bodiless
        # class behind: its rest fails, the class's own holds); each remembered for the next keys
        return any(self._rest_ok(a, b) for a, b in broken)

    @functools.cached_property
    def active(self) -> bool:
        """Whether the whole-buffer rule judges: a Python buffer, not huge, that parses."""
        return self.applies and not self.huge and parses(self.text)

    def segment(self, wide: bool = False, need: int | None = None) -> tuple[int, int, int] | None:
        """``(a, b, col)``: the characters ``[a, b)`` of the innermost clean cut around the cursor,
        a block at column ``col <= need`` (``wide``: one sibling statement more on each side),
        or None."""
        key = (wide, need)
        if key not in self._segments:
            self._segments[key] = self._cut(wide, need) if self.applies else None
        return self._segments[key]

    @functools.cached_property
    def _lines(self) -> _Lines:
        return _Lines(self.text)

    @functools.cached_property
    def _spans(self) -> list[tuple[int, int, int]]:
        """(first line, end line, col) of the cuts to try, innermost first."""
        L = self._lines
        cur = L.line_of(self.offset)
        spans = []
        for h in L.headers(cur):
            col = _indent(L.lines[h])
            spans.append((L.statement_start(h, col), L.span_end(cur, col), col))
        spans.append((L.top_level(cur), L.span_end(cur, 0), 0))
        return spans

    def _cut(self, wide: bool, need: int | None, rest: bool = True,
             limit: tuple[int, int] | None = None) -> tuple[int, int, int] | None:
        """The first of the spans (``wide``: one sibling more each side) at a column ``<= need``
        that parses as a block and, ``rest``, whose rest parses and was cut cleanly there;
        ``limit = (col, chars)``: a span at a column below ``col`` (an outer block) only when
        it is at most ``chars`` characters."""
        L, t = self._lines, self.text
        tried = set()
        for i, j, col in self._spans:
            if need is not None and col > need:
                continue
            if wide:
                i, j = L.previous_sibling(i, col), L.next_sibling_end(j, col)
            if limit is not None and col < limit[0] and L.offset_of(j) - L.offset_of(i) > limit[1]:
                self._skipped = True
                continue
            if (i, j) in tried:
                continue
            tried.add((i, j))
            a, b = L.offset_of(i), L.offset_of(j)
            if not _span_parses(t[a:b], col):
                continue
            if not rest or self.huge or self._rest_ok(a, b):
                return a, b, col
        return None

    def _rest_ok(self, a: int, b: int) -> bool:
        """Whether the buffer without ``[a, b)`` (a span of whole lines) parses and was cut
        cleanly there (:func:`_rest_cut_ok`, remembered across keystrokes)."""
        t = self.text
        key = (t[:a] + t[b:], self._lines.line_of(a) + 1)  # it sat at rest's line i + 1
        ok = _rest_cut_ok(*key)
        if ok:
            _GOOD_RESTS[key] = True
            _GOOD_RESTS.move_to_end(key)
            while len(_GOOD_RESTS) > 16:
                _GOOD_RESTS.popitem(last=False)
        return ok

    def written_indent(self, insert: str, replace_right: int) -> int | None:
        """Least indentation among the code lines the edit writes or moves (the cursor's line
        with the suggestion in it); None when there are none."""
        t, off = self.text, self.offset
        start = t.rfind("\n", 0, off) + 1
        end = t.find("\n", off + replace_right)
        end = len(t) if end < 0 else end
        written = t[start:off] + insert + t[off + replace_right : end]
        cols = [_indent(ln) for ln in written.split("\n") if _is_code(ln)]
        return min(cols) if cols else None

    def keeps(self, insert: str, replace_right: int = 0) -> bool:
        """Whether to offer ``insert`` at the cursor (replacing ``replace_right`` characters).

        Judged on the innermost clean cut whose block holds every line the edit writes;
        when the edited cut does not parse, on one sibling statement more on each side;
        the whole-buffer rule when there is no clean cut."""
        if self.tree_guard is not None:
            return self.tree_guard.keeps(insert, replace_right)
        if not self.applies or not insert:
            return True
        need = self.written_indent(insert, replace_right)
        seg = self.segment(False, need)
        if seg is None or self.offset + replace_right > seg[1]:
            return self._no_cut(insert, replace_right)
        a, b, col = seg
        part, off = self.text[a:b], self.offset - a
        if parses_as_block(apply(part, off, insert, replace_right), col):
            return True
        # one sibling statement more on each side (an edit can join its statement to a
        # neighbour: a decorator, a backslash), an outer block's within WIDE_MAX; its rest is
        # parsed only when it parses with the edit
        if need not in self._wide:
            self._skipped = False
            self._wide[need] = (self._cut(True, need, rest=False, limit=(col, max(WIDE_MAX, 4 * (b - a)))),
                                self._skipped)
        wider, skipped = self._wide[need]
        if wider is None and not skipped:
            return self._no_cut(insert, replace_right)  # no wider cut at all: as without a cut
        if wider is not None:
            if self.offset + replace_right > wider[1]:
                return self._no_cut(insert, replace_right)
            a, b, col = wider
            part, off = self.text[a:b], self.offset - a
            if parses_as_block(apply(part, off, insert, replace_right), col):
                if self.segment(True, need) == wider:
                    return True
                return self.keeps_whole(insert, replace_right)  # the wide cut is not clean
        return _opens_block_ok(part, off, insert, replace_right, col)

    def _no_cut(self, insert: str, replace_right: int) -> bool:
        """The verdict where no clean cut holds the edit: nothing withheld while the user is
        typing there (:attr:`typing_here`), else the reference rule."""
        if self.typing_here:
            return True  # the buffer does not parse (mid-typing): nothing to protect
        return self.keeps_whole(insert, replace_right)

    def keeps_whole(self, insert: str, replace_right: int = 0) -> bool:
        """The reference rule on the whole buffer (slow on large files; never run on a huge
        one, which it keeps: module doc)."""
        if self.tree_guard is not None:
            return self.tree_guard.keeps_whole(insert, replace_right)
        if not self.applies or not insert or self.huge:
            return True
        if parses(apply(self.text, self.offset, insert, replace_right)):
            return True
        return not self.active or _opens_block_ok(self.text, self.offset, insert, replace_right)
