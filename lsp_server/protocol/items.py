"""Suggestions -> LSP result objects. Pure functions (no server state).

Coordinates inside are code points on the cursor line; they are converted to
the negotiated position encoding only when an LSP ``Range`` is built.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lsprotocol import types

from ..completion.completer import Suggestion
from .encoding import index_to_column

WORD_RE = re.compile(r"\w*$")


def typed_word(line_prefix: str) -> str:
    """The identifier characters right before the cursor (what the client filters on)."""
    m = WORD_RE.search(line_prefix)
    return m.group(0) if m else ""


def line_range(row: int, line: str, start: int, end: int, encoding: str) -> types.Range:
    """A range on one line given code-point columns."""
    return types.Range(
        start=types.Position(line=row, character=index_to_column(line, start, encoding)),
        end=types.Position(line=row, character=index_to_column(line, end, encoding)),
    )


def _label(text: str, limit: int = 80) -> str:
    first = text.split("\n", 1)[0].rstrip("\r")
    if len(first) > limit:
        first = first[: limit - 1] + "\u2026"
    elif "\n" in text:
        first += " \u2026"
    return first


def completion_items(
    suggestions: Sequence[Suggestion],
    *,
    row: int,
    col: int,
    line: str,
    encoding: str,
    markdown: bool = True,
    language: str | None = None,
) -> list[types.CompletionItem]:
    """One CompletionItem per suggestion. The textEdit replaces the word being typed
    (so the client's filtering keeps the item while typing) plus any auto-closed
    characters the suggestion reproduces; ``filterText`` and ``label`` start with that
    word; ``documentation`` shows the whole suggestion."""
    word = typed_word(line[:col])
    start = col - len(word)
    items = []
    for rank, s in enumerate(suggestions):
        full = word + s.text
        end = min(len(line), col + s.replace_right)
        fence = "```" + (language or "") + "\n" + full + "\n```"
        doc: types.MarkupContent | str = (
            types.MarkupContent(kind=types.MarkupKind.Markdown, value=fence) if markdown else full
        )
        items.append(
            types.CompletionItem(
                label=_label(full),
                kind=types.CompletionItemKind.Snippet if "\n" in s.text else types.CompletionItemKind.Text,
                detail="diffill",
                documentation=doc,
                sort_text=f"{rank:04d}",
                filter_text=full,
                insert_text_format=types.InsertTextFormat.PlainText,
                text_edit=types.TextEdit(range=line_range(row, line, start, end, encoding), new_text=full),
                preselect=rank == 0 or None,
            )
        )
    return items


def inline_items(
    suggestions: Sequence[Suggestion],
    *,
    row: int,
    start: int,
    end: int,
    line: str,
    encoding: str,
    lead: str = "",
) -> list[types.InlineCompletionItem]:
    """One InlineCompletionItem per suggestion: ``lead + text`` replacing the line range
    [start, end + replace_right) (code points). Without a selected completion item,
    start = end = the cursor and ``lead`` is empty; with one, [start, end) is its range
    and ``lead`` its text."""
    out = []
    for s in suggestions:
        stop = min(len(line), end + s.replace_right)
        out.append(
            types.InlineCompletionItem(
                insert_text=lead + s.text,
                range=line_range(row, line, start, stop, encoding),
            )
        )
    return out
