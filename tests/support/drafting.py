"""What the draft-source tests share: buffers written with ``|`` at the cursor, the sources at
short-buffer settings, and a buffer of two sibling test functions."""

from __future__ import annotations

from diffill.lsp_server.drafting.drafts import Analogy, Typeahead
from diffill.lsp_server.drafting.lookup import PromptLookup
from diffill.lsp_server.drafting.query import Draft, DraftQuery

LOOK = PromptLookup(min_match=8)  # the mechanics on short buffers; the default is 16
SOURCES = (LOOK, Analogy(), Typeahead())


def query(marked: str, **kw) -> DraftQuery:
    off = marked.index("|")
    return DraftQuery(marked[:off] + marked[off + 1 :], off, **kw)


def texts(drafts: list[Draft]) -> list[tuple[str, str]]:
    return [(d.source, d.text) for d in drafts]


SIBLINGS = """def test_add():
    calc = Calculator()
    assert calc.add(1, 2) == 3
    assert calc.total == 3


def test_sub():
    calc = Calculator()
|
    assert calc.total == -1
"""
