"""The definitions the code at the cursor uses, resolved in the workspace (Python only).

Which symbols: the names the current file imports (``import a.b as c``, ``from .m import
f, G as H``; read from the import lines with a regular expression, so a buffer that does not
parse while it is typed still counts) that are *named near the cursor* (in the
``NEAR_LINES`` lines above it, its own line and the 3 below), most recently named first; for
a module imported whole, the attributes read from it there (``c.helper`` -> ``helper`` in
``a/b.py``).

Where: the module's file in the :class:`~.workspace.WorkspaceIndex` -- a relative import
from the current file's folder, an absolute one as ``a/b.py`` or ``a/b/__init__.py`` at the
end of an indexed path (the shortest such path wins).

What: the definition's outline, made with :mod:`ast` from the definition's own lines
(found with a regular expression at the module's top level, then parsed alone, so a whole
module is never parsed on a request): for a function its signature and the first line of its
docstring; for a class its header, the first docstring line and its methods' signatures;
for a module-level assignment the line itself. Outlines are cached per (file, text) --
:class:`DefinitionFinder` holds at most ``cache`` of them.

Other languages: not covered (the finder returns nothing for a buffer that is not Python).
"""

from __future__ import annotations

import ast
import re
import textwrap
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from .workspace import WorkspaceIndex

NEAR_LINES = 30
MAX_DEFS = 5
MAX_CHARS = 500  # one outline (Tabby: 5 declarations x 500 characters)
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([^#\n]*)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^#\n]+)", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Imported:
    name: str  # as named in this file
    module: str  # dotted, without the leading dots
    level: int  # leading dots of a relative import (0: absolute)
    symbol: str | None  # the name in that module; None: the module itself


@dataclass(frozen=True)
class Definition:
    path: str
    name: str
    text: str


def imports(text: str) -> dict[str, Imported]:
    """name as used here -> what it is, from the file's import lines (later ones win)."""
    out: dict[str, Imported] = {}
    for m in _FROM.finditer(text):
        dots, mod, names = len(m.group(1)), m.group(2), m.group(3)
        end = m.end()
        if "(" in m.group(0) and ")" not in names:  # a parenthesised list over lines
            close = text.find(")", end)
            names += " " + text[end:close if close >= 0 else end + 2000]
        for part in names.replace(")", " ").split(","):
            bits = part.split()
            if not bits or bits[0] == "*":
                continue
            sym = bits[0]
            alias = bits[2] if len(bits) >= 3 and bits[1] == "as" else sym
            if _NAME.fullmatch(sym) and _NAME.fullmatch(alias):
                out[alias] = Imported(alias, mod, dots, sym)
    for m in _IMPORT.finditer(text):
        for part in m.group(1).split(","):
            bits = part.split()
            if not bits:
                continue
            mod = bits[0]
            if len(bits) >= 3 and bits[1] == "as":
                out[bits[2]] = Imported(bits[2], mod, 0, None)
            elif re.fullmatch(r"[\w.]+", mod):
                out[mod.split(".")[0]] = Imported(mod.split(".")[0], mod.split(".")[0], 0, None)
    return out


_TOP_DEF = re.compile(r"^(?:async[ \t]+def|def|class)[ \t]", re.MULTILINE)


def _lines_above(text: str, offset: int, lines: int) -> int:
    """Where the ``lines`` lines above ``offset`` begin: the newline before them, or 0 at
    the top of the text (one scan backwards, not a split of the whole buffer)."""
    lo = offset
    for _ in range(lines):
        lo = text.rfind("\n", 0, lo - 1) if lo > 0 else -1
        if lo < 0:
            return 0
    return lo


def import_region(text: str, offset: int) -> str:
    """The lines imports are read from: the module's head (up to its first top-level
    ``def``/``class``) and the ``NEAR_LINES`` lines above the cursor (a function's own
    imports), so a long buffer is not scanned on every request."""
    m = _TOP_DEF.search(text, 0, min(len(text), 200_000))
    head = text[: m.start()] if m else text[:200_000]
    lo = _lines_above(text, offset, NEAR_LINES)
    return head + "\n" + text[max(lo, len(head)):offset] if lo >= len(head) or not m else text[:offset]


def near_names(text: str, offset: int, lines: int = NEAR_LINES) -> list[str]:
    """Names (and ``a.b`` attribute reads) around the cursor, nearest the cursor first."""
    lo = _lines_above(text, offset, lines)
    hi = offset
    for _ in range(4):
        nl = text.find("\n", hi + 1)
        if nl < 0:
            hi = len(text)
            break
        hi = nl
    window = text[lo:hi]
    cut = offset - lo
    found = [(abs(m.start() - cut), m.group(0)) for m in re.finditer(r"[A-Za-z_][\w.]*", window)]
    found.sort(key=lambda x: x[0])
    return list(dict.fromkeys(n.rstrip(".") for _, n in found))


def module_path(index: WorkspaceIndex, imp: Imported, current: str | None) -> str | None:
    """The indexed file of the module ``imp`` names."""
    parts = [p for p in imp.module.split(".") if p]
    if imp.level:
        if not current:
            return None
        base = current.replace("\\", "/").rsplit("/", 1)[0]
        for _ in range(imp.level - 1):
            base = base.rsplit("/", 1)[0]
        stem = "/".join([base, *parts])
        for cand in (stem + ".py", stem + "/__init__.py"):
            if cand in index:
                return cand
        return None
    if not parts:
        return None
    tail = "/".join(parts)
    return index.find_module(tail)


def _line_start(text: str, needle: str, assignment: bool = False) -> int:
    """Where a line starting with ``needle`` (then not an identifier character; for an
    assignment, then ``=`` or ``:`` after optional spaces) begins in ``text``; -1 if none."""
    pos = 0 if text.startswith(needle) else text.find("\n" + needle)
    while pos >= 0:
        start = pos if pos == 0 and text.startswith(needle) else pos + 1
        after = text[start + len(needle): start + len(needle) + 40]
        nxt = after[:1]
        if assignment:
            if after.lstrip(" \t")[:1] in ("=", ":") and not after.lstrip(" \t").startswith("=="):
                return start
        elif not (nxt.isalnum() or nxt == "_"):
            return start
        pos = text.find("\n" + needle, start + 1)
    return -1


def _block(text: str, name: str) -> str | None:
    """The top-level definition of ``name`` in ``text``: its lines (the statement and the
    lines indented under it), or None. Found with ``str.find`` (no pattern per name)."""
    found = [p for p in (_line_start(text, "def " + name), _line_start(text, "async def " + name),
                         _line_start(text, "class " + name),
                         _line_start(text, name, assignment=True)) if p >= 0]
    if not found:
        return None
    start = min(found)
    lines = text[start:start + 40_000].split("\n")
    out = [lines[0]]
    for ln in lines[1:]:
        if ln.strip() and not ln[:1].isspace() and not ln.lstrip().startswith((")", "]", "}")):
            break
        out.append(ln)
        if len(out) > 400:
            break
    return "\n".join(out).rstrip() + "\n"


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, indent: str = "") -> str:
    kw = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{indent}{kw} {node.name}({ast.unparse(node.args)}){ret}: ..."


def _doc_line(node: ast.AST, indent: str) -> list[str]:
    doc = ast.get_docstring(node, clean=True) if isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) else None
    first = doc.strip().split("\n", 1)[0].strip() if doc else ""
    return [f'{indent}"""{first}"""'] if first else []


def outline(block: str) -> str | None:
    """A definition's lines -> its outline (see the module doc); None when they do not parse."""
    try:
        tree = ast.parse(textwrap.dedent(block))
    except (SyntaxError, ValueError):
        return None
    if not tree.body:
        return None
    node = tree.body[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = [_signature(node)]
        doc = _doc_line(node, "    ")
        if doc:
            lines[0] = lines[0][:-5] + ":"
            lines += doc
        return "\n".join(lines) + "\n"
    if isinstance(node, ast.ClassDef):
        bases = ", ".join([ast.unparse(b) for b in node.bases]
                          + [ast.unparse(k) for k in node.keywords])
        lines = [f"class {node.name}({bases}):" if bases else f"class {node.name}:"]
        lines += _doc_line(node, "    ")
        for sub in node.body:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines.append(_signature(sub, "    "))
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)) and len(lines) < 12:
                lines.append("    " + ast.unparse(sub).split("\n", 1)[0][:120])
        if len(lines) == 1:
            lines.append("    ...")
        return "\n".join(lines) + "\n"
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return block.split("\n", 1)[0][:200] + "\n"
    return None


class DefinitionFinder:
    """:func:`definitions` with the outlines cached (thread-safe)."""

    def __init__(self, index: WorkspaceIndex, cache: int = 512) -> None:
        self.index = index
        self.cache_size = cache
        self._cache: OrderedDict[tuple[str, str, int], str | None] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, path: str, name: str) -> tuple[bool, str | None]:
        """(known, outline) without reading the file."""
        key = (path, name, self.index.version(path) or 0)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return True, self._cache[key]
        return False, None

    def outline_of(self, path: str, name: str) -> str | None:
        known, got = self.cached(path, name)
        if known:
            return got
        key = (path, name, self.index.version(path) or 0)
        text = self.index.file_text(path)
        if text is None:
            return None
        block = _block(text, name)
        got = outline(block) if block is not None else None
        if got is not None and len(got) > MAX_CHARS:
            got = got[:MAX_CHARS].rsplit("\n", 1)[0] + "\n"
        with self._lock:
            self._cache[key] = got
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return got

    def find(self, text: str, offset: int, path: str | None, *, limit: int = MAX_DEFS,
             deadline: float | None = None, deferred: list[tuple[str, str]] | None = None
             ) -> list[Definition]:
        """The definitions of the imported names used near the cursor, nearest use first.
        ``deadline`` (a ``time.perf_counter()`` value): past it, outlines not cached yet are
        not made but appended to ``deferred`` (for a background thread to make)."""
        imps = imports(import_region(text, offset))
        if not imps:
            return []
        out: list[Definition] = []
        seen: set[tuple[str, str]] = set()
        for used in near_names(text, offset):
            head, _, attr = used.partition(".")
            imp = imps.get(head)
            if imp is None:
                continue
            for mod, target in self._candidates(imp, head, used, attr, path):
                if (mod, target) in seen:
                    break
                if deadline is not None and time.perf_counter() > deadline:
                    known, got = self.cached(mod, target)
                    if not known:
                        if deferred is not None:
                            deferred.append((mod, target))
                        continue
                else:
                    got = self.outline_of(mod, target)
                if got:
                    seen.add((mod, target))
                    out.append(Definition(mod, target, got))
                    break
            if len(out) >= limit:
                break
        return out

    def _candidates(self, imp: Imported, head: str, used: str, attr: str, path: str | None
                    ) -> list[tuple[str, str]]:
        """(file, name) pairs where the definition of ``used`` may be, most likely first."""
        first = attr.split(".")[0] if attr else ""
        tries: list[tuple[Imported, str]] = []
        if imp.symbol is not None:  # from M import S: S defined in M, or M.S a module
            tries.append((Imported(head, imp.module, imp.level, None), imp.symbol))
            if first:
                sub = f"{imp.module}.{imp.symbol}".strip(".")
                tries.append((Imported(head, sub, imp.level, None), first))
        elif imp.module != head:  # import a.b as c: c.x is x in a.b
            if first:
                tries.append((Imported(head, imp.module, 0, None), first))
        else:  # import a.b: a.b.x is x in a.b (or b in a)
            parts = used.split(".")
            for k in range(len(parts) - 1, 0, -1):
                tries.append((Imported(head, ".".join(parts[:k]), 0, None), parts[k]))
        out = []
        for where, name in tries:
            mod = module_path(self.index, where, path)
            if mod is not None and mod != path:
                out.append((mod, name))
        return out
