"""The open documents as the language server's requests see them: a request resolved
against one document version (:class:`Prepared`, :meth:`OpenDocuments.prepare`), the line
index of each version, and what a request borrows from the other open documents -- the
ones edited most recently first: their texts for prompt lookup (:mod:`.drafts`) and the
lines around their last edit as extra context. pygls keeps the texts (its workspace, with
incremental sync); this module reads them and keeps which was edited where."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import Workspace

from ..completion.options import CompletionOptions
from ..text.context import Snippet
from .encoding import LineIndex, PositionError

EXTRA_SNIPPET_LINES = 12
EXTRA_MAX_DOCS = 3
DRAFT_MAX_DOCS = 8
DRAFT_MAX_CHARS = 200_000
RECENT_MAX_DOCS = 32
"""Documents whose last edit is remembered (the most recent ones)."""


def encoding_name(enc: Any) -> str:
    """The negotiated position encoding's name (``utf-16`` when none was)."""
    return str(getattr(enc, "value", enc) or "utf-16")


@dataclass
class Prepared:
    """A request resolved against one document version (code-point coordinates).

    ``text``/``offset`` are what the model completes: the document, or, with a selected
    completion item, the document with that item's text in place of its range.
    ``start``/``end`` is the line range the answer replaces (both the cursor column
    unless an item is selected) and ``lead`` the selected item's text."""

    uri: str
    version: int | None
    row: int
    col: int
    line: str
    text: str
    offset: int
    line_prefix: str
    line_suffix: str
    start: int
    end: int
    lead: str
    language: str | None
    path: str | None



class OpenDocuments:
    """The open documents of one server: pygls's workspace (read through ``workspace``,
    which exists once the client initialized) and the row each document was last edited
    at; ``options`` gives the options in force (whether drafts and extra context are on)."""

    def __init__(self, workspace: Callable[[], Workspace],
                 options: Callable[[], CompletionOptions]) -> None:
        self.workspace = workspace
        self.options = options
        self.recent: OrderedDict[str, int] = OrderedDict()  # uri -> row of its last edit
        self._index: dict[str, tuple[int | None, LineIndex]] = {}

    def line_index(self, uri: str) -> tuple[Any, LineIndex] | None:
        """(document, LineIndex) for an open document, cached per version; None if unknown."""
        doc = self.workspace().text_documents.get(uri)
        if doc is None:
            return None
        cached = self._index.get(uri)
        if cached is None or cached[0] != doc.version or cached[1].source is not doc.source:
            cached = (doc.version, LineIndex(doc.source))
            self._index[uri] = cached
        return doc, cached[1]

    def doc_version(self, uri: str) -> int | None:
        doc = self.workspace().text_documents.get(uri)
        return None if doc is None else doc.version

    def note_edit(self, uri: str, row: int) -> None:
        self.recent[uri] = row
        self.recent.move_to_end(uri)
        while len(self.recent) > RECENT_MAX_DOCS:
            self.recent.popitem(last=False)

    def forget(self, uri: str) -> None:
        self.recent.pop(uri, None)
        self._index.pop(uri, None)

    def other_documents(self, uri: str) -> list[str]:
        """Texts of the other open documents for prompt lookup (:mod:`.drafts`): the most
        recently edited first, at most ``DRAFT_MAX_DOCS`` of them and ``DRAFT_MAX_CHARS``
        characters each (the end of a longer one is left out)."""
        if not self.options().drafts:
            return []
        docs = self.workspace().text_documents
        order = [u for u in reversed(self.recent) if u != uri and u in docs]
        order += [u for u in docs if u != uri and u not in order]
        return [docs[u].source[:DRAFT_MAX_CHARS] for u in order[:DRAFT_MAX_DOCS]]

    def snippets(self, uri: str) -> list[Snippet]:
        """Extra context: lines around the last edit of other recently edited open documents."""
        if not self.options().extra_context:
            return []
        out = []
        for other in reversed(self.recent):
            if other == uri or len(out) >= EXTRA_MAX_DOCS:
                continue
            got = self.line_index(other)
            if got is None:
                continue
            doc, idx = got
            row = self.recent[other]
            lo = max(0, row - EXTRA_SNIPPET_LINES)
            text = "".join(idx.lines[lo: row + EXTRA_SNIPPET_LINES])[:4000]
            if text.strip():
                out.append(Snippet(path=doc.filename or other, text=text, language=doc.language_id))
        return out

    def prepare(
        self,
        uri: str,
        position: types.Position,
        selected: types.SelectedCompletionInfo | None = None,
    ) -> Prepared | None:
        """Resolve a request; None for an unknown document. Raises JsonRpcInvalidParams
        for a position outside the document."""
        got = self.line_index(uri)
        if got is None:
            return None
        doc, idx = got
        enc = encoding_name(self.workspace().position_encoding)
        try:
            cur = idx.resolve(position.line, position.character, enc)
            start = end = cur.col
            lead = ""
            text, offset = idx.source, cur.offset
            if selected is not None and selected.range.start.line == selected.range.end.line == cur.row:
                a = idx.resolve(cur.row, selected.range.start.character, enc)
                b = idx.resolve(cur.row, selected.range.end.character, enc)
                if a.offset <= b.offset:
                    start, end, lead = a.col, b.col, selected.text
                    text = idx.source[: a.offset] + lead + idx.source[b.offset:]
                    offset = a.offset + len(lead)
        except PositionError as e:
            raise JsonRpcInvalidParams(f"{uri}: {e}") from None
        eff_line = cur.line[:start] + lead + cur.line[end:]
        cut = start + len(lead)
        return Prepared(
            uri=uri, version=doc.version, row=cur.row, col=cur.col, line=cur.line,
            text=text, offset=offset, line_prefix=eff_line[:cut], line_suffix=eff_line[cut:],
            start=start, end=end, lead=lead, language=doc.language_id, path=doc.filename,
        )

    def open_text(self, uri: str) -> str | None:
        """An open document's text (None when it is not open); any thread may call it."""
        doc = self.workspace().text_documents.get(uri)
        return None if doc is None else doc.source


__all__ = ["OpenDocuments", "Prepared", "encoding_name"]
