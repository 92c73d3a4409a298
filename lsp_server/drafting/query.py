"""What every draft source shares (:mod:`.drafts` has the sources' overview): the
:class:`DraftQuery` a source reads, the :class:`Draft` s it returns, the :class:`DraftSource`
protocol, and the text helpers the sources have in common (the cursor line, fitting a draft,
token boundaries, CRLF).

Line ends: the sources work on ``"\\n"``; a CRLF document (and CRLF other documents) are read
with ``"\\r\\n"`` as ``"\\n"`` and the drafts come back with the document's ``"\\r\\n"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

LOOKUP = "lookup"
SUFFIX = "suffix"
ANALOGY = "analogy"
TYPEAHEAD = "typeahead"


@dataclass(frozen=True)
class Draft:
    text: str  # what to insert at the cursor (a middle), never empty
    source: str  # "lookup" | "analogy" | "typeahead"

    def __post_init__(self) -> None:
        if not self.text:
            raise ValueError("a draft is never empty")


@dataclass(frozen=True)
class DraftQuery:
    text: str  # the whole document
    offset: int  # cursor (character offset)
    others: Sequence[str] = ()  # texts of the other open documents
    workspace: Sequence[str] = ()  # chunks of workspace files like the code here, best first
    recalled: Sequence[str] = ()  # recent suggestions shown for this document, best/newest first
    multiline: bool = False  # single-line hole (stop at end of line) or a span
    max_chars: int = 400


class DraftSource(Protocol):
    name: str

    def propose(self, q: DraftQuery) -> list[Draft]: ...


# --- shared helpers --------------------------------------------------------------------------


def as_lf(q: DraftQuery) -> tuple[DraftQuery, bool]:
    """``q`` with ``"\\r\\n"`` read as ``"\\n"`` (offset moved to match), and whether the
    document used CRLF (its drafts go back with ``"\\r\\n"``)."""
    others_cr = any("\r" in o for o in q.others)
    recalled_cr = any("\r" in r for r in q.recalled)
    work_cr = any("\r" in w for w in q.workspace)
    if "\r" not in q.text and not others_cr and not recalled_cr and not work_cr:
        return q, False
    text, off = q.text, max(0, min(q.offset, len(q.text)))
    crlf = "\r\n" in text
    if crlf:
        if off and text[off - 1] == "\r" and text.startswith("\n", off):
            off -= 1  # between "\r" and "\n": the cursor is at the line end
        off -= text.count("\r\n", 0, off)
        text = text.replace("\r\n", "\n")
    others = tuple(o.replace("\r\n", "\n") for o in q.others) if others_cr else q.others
    recalled = tuple(r.replace("\r\n", "\n") for r in q.recalled) if recalled_cr else q.recalled
    work = tuple(w.replace("\r\n", "\n") for w in q.workspace) if work_cr else q.workspace
    return dataclasses.replace(q, text=text, offset=off, others=others, recalled=recalled,
                               workspace=work), crlf


def restore_crlf(drafts: list[Draft], crlf: bool) -> list[Draft]:
    if not crlf:
        return drafts
    return [Draft(d.text.replace("\n", "\r\n"), d.source) for d in drafts]


def cursor_of(q: DraftQuery) -> int:
    return max(0, min(q.offset, len(q.text)))


def line_around(text: str, off: int) -> tuple[str, str]:
    """The cursor line's text left of the cursor and right of it (without the newline)."""
    start = text.rfind("\n", 0, off) + 1
    end = text.find("\n", off)
    return text[start:off], text[off : len(text) if end < 0 else end]


def usable(draft: str, q: DraftQuery) -> bool:
    """Not blank, and not the text already right of the cursor (inserting that only doubles
    it)."""
    return bool(draft.strip()) and not q.text.startswith(draft, cursor_of(q))


def before_rest(draft: str, right: str) -> str:
    """A one-line draft that ends with the cursor line's rest (what is right of the cursor)
    without it: the middle."""
    tail = right.strip()
    if tail and "\n" not in draft and draft.rstrip().endswith(tail):
        return draft.rstrip()[: -len(tail)]
    return draft


def fit(draft: str, max_chars: int) -> str:
    """At most ``max_chars`` characters; a cut multi-line draft ends at a line end."""
    if len(draft) <= max_chars:
        return draft
    cut = draft[:max_chars]
    nl = cut.rfind("\n")
    return cut[:nl] if nl > 0 and cut[:nl].strip() else cut


def is_id_char(c: str) -> bool:
    return c == "_" or c.isalnum()


def at_boundary(s: str, i: int) -> bool:
    """Whether position ``i`` of ``s`` is not inside an identifier (a token may start there)."""
    return i <= 0 or i >= len(s) or not (is_id_char(s[i - 1]) and is_id_char(s[i]))
