"""Which names a Python suggestion reads that nothing binds where it lands.

A block copied from elsewhere (a draft: :mod:`.drafts`, or one shifted to another depth,
``completer.reindented``) parses as easily at column 0 between two functions as inside the
function it came from, and the syntax guard (:mod:`.syntax`) then keeps it; applied, the
file fails at import (``NameError: name 'values' is not defined``) or at the first call. So
a copied block needs one more piece of evidence: every name it reads is bound where it
lands, by

* the suggestion itself (assignments, ``for``/``with``/``except`` targets, imports, ``def``,
  comprehension variables, parameters of a ``lambda`` or ``def`` inside it),
* the function(s) enclosing the cursor (parameters and every name bound in their bodies,
  wherever in the body: a later assignment still makes the name local), and, for the code
  directly in a class body, that class body,
* the module (every top-level binding, names declared ``global`` anywhere, ``from m import *``
  accepting everything), or the builtins,
* or the buffer already reads it without binding it anywhere (a global it expects from
  elsewhere: an injected name, a helper not written yet).

Only the code around the cursor is parsed: the segment the syntax guard cuts (the innermost
``def``/``class`` holding the cursor) and the rest of the buffer, which is parsed once and
remembered across keystrokes (:func:`_rest_scopes`). When the buffer does not parse or does
not cut cleanly, or the suggestion does not parse as statements on its own (the end of a
line, an expression), nothing is judged: the check only ever removes a block whose reading
of a name is certain to fail.
"""

from __future__ import annotations

import ast
import builtins
import functools
import textwrap
from dataclasses import dataclass

from .syntax import SyntaxGuard, parse_tree

ALWAYS = frozenset(dir(builtins)) | {
    "__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__",
    "__builtins__", "__path__", "__annotations__", "__dict__", "__class__", "__module__",
    "__qualname__", "__debug__",
}
STAR = "*"
"""In a binding set: a ``from m import *`` is in scope, so any name may be bound."""

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _target_names(node: ast.AST, out: set[str]) -> None:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Starred | ast.MatchAs | ast.MatchStar) and getattr(n, "name", None):
            out.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            out.add(n.rest)


def bindings(body: list[ast.stmt] | list[ast.AST], *, into_scopes: bool = False) -> set[str]:
    """Names bound by these statements in their own scope (not inside nested functions or
    classes, whose own names are bound here all the same); ``into_scopes``: every binding
    anywhere (what a pasted block binds for itself). ``global`` names are included (they are
    bound at module level by whoever declares them)."""
    out: set[str] = set()
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
            for d in node.decorator_list:
                stack.append(d)
            if not into_scopes:
                continue
            if not isinstance(node, ast.ClassDef):
                out.update(_arg_names(node.args))
        elif isinstance(node, ast.Lambda):
            if into_scopes:
                out.update(_arg_names(node.args))
            else:
                continue
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                if a.name == "*":
                    out.add(STAR)
                else:
                    out.add(a.asname or a.name.split(".")[0])
            continue
        elif isinstance(node, ast.Global | ast.Nonlocal):
            out.update(node.names)
            continue
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store | ast.Del):
                out.add(node.id)
            continue
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            out.add(node.rest)
        elif isinstance(node, ast.comprehension):
            _target_names(node.target, out)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _arg_names(args: ast.arguments) -> set[str]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return {a.arg for a in every}


def _reads(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def free_names(code: str) -> set[str] | None:
    """Names ``code`` (statements, any common indentation) reads and does not bind itself,
    builtins left out; None when it does not parse as statements on its own."""
    src = textwrap.dedent(code)
    tree = parse_tree(src)
    if tree is None:  # a return/yield/await outside a function, or a fragment
        tree = parse_tree("def _():\n" + textwrap.indent(src, "    "))
        if tree is None:
            return None
        tree = tree.body[0]  # type: ignore[assignment]
        own = bindings(tree.body, into_scopes=True)  # type: ignore[attr-defined]
    else:
        own = bindings(tree.body, into_scopes=True)
    return _reads(tree) - own - ALWAYS


@dataclass(frozen=True)
class _Outer:
    """What the buffer outside the cursor's segment tells: ``seen`` the names visible at the
    cut (module, enclosing functions), ``class_body`` those of a class body right around it,
    ``reads``/``binds`` every name it reads / binds anywhere."""

    seen: frozenset[str]
    class_body: frozenset[str]
    reads: frozenset[str]
    binds: frozenset[str]


def _enclosing(body: list[ast.stmt], line: int) -> list[ast.AST]:
    """The function, lambda and class nodes whose lines hold (1-based) ``line``, outermost
    first."""
    chain: list[ast.AST] = []

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            lo, hi = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
            if lo is not None and hi is not None and not lo <= line <= hi:
                continue
            if lo is not None and isinstance(node, _SCOPES):
                chain.append(node)
            visit(list(ast.iter_child_nodes(node)))

    visit(list(body))
    return chain


def _visible(module_body: list[ast.stmt], chain: list[ast.AST]) -> set[str]:
    """Names visible inside the innermost of ``chain`` (functions see the module and the
    enclosing functions, not class bodies; code directly in a class body sees that body)."""
    seen = bindings(module_body)
    for i, node in enumerate(chain):
        innermost = i == len(chain) - 1
        if isinstance(node, ast.ClassDef):
            if innermost:
                seen |= bindings(node.body)
        elif isinstance(node, ast.Lambda):
            seen |= _arg_names(node.args)
        else:
            seen |= _arg_names(node.args) | bindings(node.body)  # type: ignore[attr-defined]
    return seen


@functools.lru_cache(maxsize=16)
def _rest_scopes(rest: str, line: int, col: int) -> _Outer | None:
    """What the buffer without the cursor's segment binds for a block at column ``col`` cut
    out of it at (1-based) ``line``: the module's names and those of the functions around the
    cut, and the names of the class body right around it (if any). Remembered: the rest does
    not change while the user types inside one function."""
    tree = parse_tree(rest)
    if tree is None:
        return None
    lines = rest.split("\n")
    last = next((k + 1 for k in range(min(line, len(lines) + 1) - 2, -1, -1)
                 if lines[k].strip() and not lines[k].lstrip().startswith("#")), 0)
    chain = _around_cut(tree.body, line, last, col)
    seen = _visible(tree.body, [n for n in chain if not isinstance(n, ast.ClassDef)])
    # a class body is seen by code directly in it, not by the methods it holds
    body = bindings(chain[-1].body) if chain and isinstance(chain[-1], ast.ClassDef) else ()
    return _Outer(frozenset(seen), frozenset(body), frozenset(_reads(tree)),
                  frozenset(bindings(tree.body, into_scopes=True)))


def _around_cut(body: list[ast.stmt], line: int, last: int, col: int) -> list[ast.AST]:
    """The scopes of ``rest`` that held a block at column ``col`` cut out before its (1-based)
    ``line``: they start above the cut, at a column left of ``col``, and run at least to
    ``last``, the last code line before it (the cut block may have been their last statement)."""
    chain: list[ast.AST] = []

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            lo, hi = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
            if lo is not None and hi is not None:
                if not (lo < line and hi >= last and node.col_offset < col):
                    continue
                if isinstance(node, _SCOPES):
                    chain.append(node)
            visit(list(ast.iter_child_nodes(node)))

    visit(list(body))
    return chain


class NameCheck:
    """Built once per request beside the :class:`~.syntax.SyntaxGuard`; :meth:`unbound` names
    what a suggestion would read unbound where it lands (module doc)."""

    def __init__(self, guard: SyntaxGuard) -> None:
        self.guard = guard
        self._arounds: dict[tuple[int, int, int], tuple[frozenset[str], frozenset[str]] | None] = {}

    def _around(self, seg: tuple[int, int, int]) -> tuple[frozenset[str], frozenset[str]] | None:
        """What a segment's surroundings bind, whatever is inserted in it (computed once per
        segment, not once per draft): the names seen there and those of a class body right
        around it; None when the buffer cannot tell."""
        if seg not in self._arounds:
            a, b, col = seg
            text = self.guard.text
            scopes = _rest_scopes(text[:a] + text[b:], text.count("\n", 0, a) + 1, col)
            whole = None if scopes is None else parse_tree(
                textwrap.dedent(text[a:b]) if col else text[a:b])
            if scopes is None or whole is None:
                self._arounds[seg] = None
            else:
                # names the buffer reads and binds nowhere: globals it expects from elsewhere
                # (an injected name, a star import, a helper not written yet); a copy may
                # read them too
                external = (scopes.reads | _reads(whole)) - scopes.binds - bindings(
                    whole.body, into_scopes=True)
                # the segment's own top-level names (its def's name) live in the scope around it
                seen = scopes.seen | bindings(whole.body) | external
                self._arounds[seg] = (frozenset(seen), scopes.class_body)
        return self._arounds[seg]

    def unbound(self, insert: str, line_prefix: str = "") -> set[str]:
        """Names ``insert`` (typed at the cursor after ``line_prefix`` on its line) reads that
        nothing binds where it lands; empty when that cannot be told."""
        g = self.guard
        if not g.applies or g.huge or not insert.strip():
            return set()
        free = free_names(line_prefix.lstrip(" \t") + insert)
        if not free:
            return set()
        seg = g.segment(False, g.written_indent(insert, 0))
        if seg is None:
            return set()
        around = self._around(seg)
        if around is None:
            return set()
        seen_here, class_body = around
        a, b, col = seg
        text = g.text
        off = g.offset - a
        edited = text[a:g.offset] + insert + text[g.offset:b]
        tree = parse_tree(textwrap.dedent(edited) if col else edited)
        if tree is None:
            return set()  # the syntax guard judges this one
        lead = len(insert) - len(insert.lstrip())
        line = edited.count("\n", 0, off + lead) + 1
        chain = _enclosing(tree.body, line)
        seen = set(seen_here)
        seen |= _visible([], chain) if chain else class_body
        if STAR in seen:
            return set()
        return free - seen
