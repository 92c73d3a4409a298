"""What a request gets from outside its buffer: one place that asks the workspace index, the
definition finder and the ring of recent regions, for the context header
(:class:`~.context.Snippet` s, most relevant first) and for the draft sources (chunk texts).

Order of the header's candidates (the priority :func:`.context.build_context` fits them
in): the definitions the code at the cursor uses (Tabby and Continue put the language
server's declarations first: they say what the names near the cursor are), then the
workspace chunks most like the code at the cursor (BM25, best first), then the recent
regions of other documents (newest first). Each is off unless its option is on
(``definitionsContext``, ``workspaceContext``, ``recentContext``); the draft sources get the
same retrieved chunks, with the lines that follow each (``workspaceDrafts``).

The query: the ``QUERY_LINES_ABOVE`` lines above the cursor, its line and
``QUERY_LINES_BELOW`` below (the unfinished code; CrossCodeEval's retrieval query is the
prefix's last lines). Paths in the header are relative to the workspace folder holding the
file when there is one.

Bounded: a search costs ~1 ms on a 5,000-file index (:mod:`.workspace`), a definition is
outlined once per file text (:mod:`.definitions`) -- with ``budget_ms`` (the server's
:data:`DEFINITIONS_BUDGET_MS`) the outlines not made by then are left to a background
thread and come with a later request --, the ring holds 16 regions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..text.context import Snippet
from .definitions import DefinitionFinder
from .recent import RecentRing
from .workspace import CHUNK_LINES, WorkspaceIndex

QUERY_LINES_ABOVE = 10
QUERY_LINES_BELOW = 3
RETRIEVED = 4  # chunks for the header
DRAFT_CHUNKS = 8  # chunks for the draft sources
RECENT = 3
DEFINITIONS_BUDGET_MS = 2.0


@dataclass
class Extras:
    snippets: list[Snippet] = field(default_factory=list)
    workspace: list[str] = field(default_factory=list)
    ms: float = 0.0
    deferred: list[tuple[str, str]] = field(default_factory=list)  # outlines not made in time


def query_window(text: str, offset: int, above: int = QUERY_LINES_ABOVE,
                 below: int = QUERY_LINES_BELOW) -> str:
    lo = offset
    for _ in range(above + 1):
        lo = text.rfind("\n", 0, lo)
        if lo < 0:
            break
    hi = offset
    for _ in range(below + 1):
        hi = text.find("\n", hi + 1)
        if hi < 0:
            hi = len(text)
            break
    return text[max(lo, 0):hi]


class Gatherer:
    def __init__(self, index: WorkspaceIndex | None, ring: RecentRing | None = None,
                 roots: Sequence[str] = ()) -> None:
        self.index = index
        self.ring = ring
        self.roots = [os.path.abspath(r) for r in roots]
        self.finder = DefinitionFinder(index) if index is not None else None

    def shown_path(self, path: str) -> str:
        """``path`` relative to the workspace folder holding it (else as it is)."""
        for r in self.roots:
            if path.startswith(r + os.sep):
                return path[len(r) + 1:].replace(os.sep, "/")
        return path

    def gather(self, text: str, offset: int, *, path: str | None, language: str | None = None,
               uri: str | None = None, definitions: bool = False, retrieved: bool = False,
               recent: bool = False, drafts: bool = False,
               text_of: Callable[[str], str | None] | None = None,
               exclude: str | None = None, budget_ms: float | None = None) -> Extras:
        """The extras for the cursor at ``offset`` of ``text`` (the file ``path``, as the
        index names it; ``exclude``: the indexed file left out of the search, default
        ``path``; ``uri``/``text_of``: the document and how to read open documents, for the
        ring; ``budget_ms``: past it, definitions not outlined yet are left for later,
        ``Extras.deferred``)."""
        t0 = time.perf_counter()
        out = Extras()
        here = path
        idx = self.index
        if idx is not None and len(idx) and (retrieved or drafts):
            hits = idx.search(query_window(text, offset), k=max(DRAFT_CHUNKS, RETRIEVED),
                              exclude=exclude or here)
            if drafts:
                out.workspace = [t for h in hits[:DRAFT_CHUNKS]
                                 if (t := idx.text(h, before=2, after=CHUNK_LINES))]
            if retrieved:
                # the chunk the hit is, and the one after it (what follows similar code)
                taken: set[tuple[str, int]] = set()
                for h in hits:
                    if len(out.snippets) >= RETRIEVED:
                        break
                    if (h.path, h.chunk - 1) in taken or (h.path, h.chunk + 1) in taken:
                        continue  # overlaps one taken (it reads half the next chunk)
                    taken.add((h.path, h.chunk))
                    body = idx.text(h, after=CHUNK_LINES // 2)
                    if body.strip():
                        out.snippets.append(Snippet(self.shown_path(h.path), body, None,
                                                    "workspace"))
        if definitions and self.finder is not None and _is_python(language, path):
            deadline = None if budget_ms is None else t0 + budget_ms / 1000.0
            defs = [Snippet(self.shown_path(d.path), d.text, "python", "definition")
                    for d in self.finder.find(text, offset, here, deadline=deadline,
                                              deferred=out.deferred)]
            out.snippets[:0] = defs
        if recent and self.ring is not None and text_of is not None:
            for c in self.ring.chunks(text_of, exclude=uri, limit=RECENT):
                out.snippets.append(Snippet(self.shown_path(c.path), c.text, c.language,
                                            "recent"))
        out.ms = (time.perf_counter() - t0) * 1000.0
        return out


def _is_python(language: str | None, path: str | None) -> bool:
    return (language or "").lower() == "python" or bool(path and path.endswith((".py", ".pyi")))
