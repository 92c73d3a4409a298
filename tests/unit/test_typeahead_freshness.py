"""The typed-ahead cache never outlives an edit elsewhere in the document
(TypeaheadCache.invalidate / generation), including a model run that finishes after
the edit: the soak test found a stale entry answering the next document version."""

from __future__ import annotations

from diffill.lsp_server.completer import Suggestion
from diffill.lsp_server.scheduler import TypeaheadCache
from lsprotocol import types

URI = "file:///a.py"
SUGG = [Suggestion(text="total", score=0.0)]


def edit(line0: int, line1: int, text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(line=line0, character=0),
                          end=types.Position(line=line1, character=0)), text=text)


def test_typing_on_the_row_keeps_the_entry():
    c = TypeaheadCache()
    c.store(URI, 3, "    return ", "", SUGG)
    c.invalidate(URI, [edit(3, 3, "t")])
    assert c.lookup(URI, 3, "    return t", "") == ("t", [Suggestion(text="otal", score=0.0)])


def test_edits_elsewhere_or_new_lines_drop_it():
    for change in (edit(0, 0, "x"), edit(3, 4, ""), edit(3, 3, "\n"),
                   types.TextDocumentContentChangeWholeDocument(text="new")):
        c = TypeaheadCache()
        c.store(URI, 3, "    return ", "", SUGG)
        c.invalidate(URI, [change])
        assert c.lookup(URI, 3, "    return ", "") is None, change


def test_a_run_finishing_after_an_edit_stores_nothing():
    c = TypeaheadCache()
    gen = c.generation(URI)  # read when the request was prepared
    c.invalidate(URI, [edit(0, 0, "x")])  # the user edits another line while the model runs
    c.store(URI, 3, "    return ", "", SUGG, generation=gen)  # the run finishes
    assert c.lookup(URI, 3, "    return ", "") is None
    c.store(URI, 3, "    return ", "", SUGG, generation=c.generation(URI))  # a fresh run
    assert c.lookup(URI, 3, "    return ", "") is not None
    c.forget(URI)
    assert c.lookup(URI, 3, "    return ", "") is None
