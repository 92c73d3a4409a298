"""LSP completion items and inline completion items built from suggestions."""

from __future__ import annotations

import pytest
from diffill.lsp_server.completion.completer import Suggestion
from diffill.lsp_server.protocol.encoding import (
    index_to_column,
)
from diffill.lsp_server.protocol.items import completion_items, inline_items, typed_word
from lsprotocol import types

LINE = 'x = "a😀é" + na'  # 😀: 4 utf-8 bytes, 2 utf-16 units; é: 2 utf-8 bytes


# -- items ------------------------------------------------------------------------------------

def test_typed_word():
    assert typed_word("    return tot") == "tot"
    assert typed_word("f(") == ""
    assert typed_word("é_x1") == "é_x1"


@pytest.mark.parametrize("enc", ["utf-8", "utf-16", "utf-32"])
def test_completion_item_ranges_and_fields(enc):
    col = len(LINE)
    items = completion_items(
        [Suggestion("me)", 1.0, replace_right=0), Suggestion("me\n    x", 0.5)],
        row=3, col=col, line=LINE, encoding=enc, markdown=True, language="python",
    )
    first = items[0]
    start = index_to_column(LINE, col - 2, enc)
    assert first.text_edit.range == types.Range(
        start=types.Position(line=3, character=start),
        end=types.Position(line=3, character=index_to_column(LINE, col, enc)),
    )
    assert first.text_edit.new_text == "name)" == first.filter_text == first.label
    assert first.documentation.value == "```python\nname)\n```"
    assert first.kind == types.CompletionItemKind.Text and first.sort_text == "0000"
    assert first.insert_text_format == types.InsertTextFormat.PlainText
    assert items[1].kind == types.CompletionItemKind.Snippet and items[1].label == "name \u2026"
    plain = completion_items([Suggestion("x", 0.0)], row=0, col=0, line="", encoding=enc, markdown=False)
    assert plain[0].documentation == "x"


def test_inline_items_extend_over_auto_closed_and_selected_range():
    line = 'print("a😀", )'
    cur = line.index(")")
    items = inline_items([Suggestion("x)", 0.0, replace_right=1)], row=0, start=cur, end=cur,
                         line=line, encoding="utf-16")
    assert items[0].insert_text == "x)"
    assert items[0].range.start.character == cur + 1  # the emoji counts 2 in utf-16
    assert items[0].range.end.character == cur + 2
    sel = inline_items([Suggestion("(1)", 0.0)], row=0, start=0, end=2, line="pr", encoding="utf-8",
                       lead="print")
    assert sel[0].insert_text == "print(1)"
    assert (sel[0].range.start.character, sel[0].range.end.character) == (0, 2)
