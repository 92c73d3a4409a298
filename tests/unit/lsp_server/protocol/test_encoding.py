"""Position encodings (utf-8 / utf-16 / utf-32 columns) and the line index."""

from __future__ import annotations

import pytest
from diffill.lsp_server.protocol.encoding import (
    LineIndex,
    PositionError,
    column_to_index,
    index_to_column,
)

LINE = 'x = "a😀é" + na'  # 😀: 4 utf-8 bytes, 2 utf-16 units; é: 2 utf-8 bytes


# -- encodings --------------------------------------------------------------------------------

@pytest.mark.parametrize("enc", ["utf-8", "utf-16", "utf-32"])
def test_column_round_trip(enc):
    for i in range(len(LINE) + 1):
        col = index_to_column(LINE, i, enc)
        assert column_to_index(LINE, col, enc) == i
        expected = {"utf-8": len(LINE[:i].encode()), "utf-16": len(LINE[:i].encode("utf-16-le")) // 2,
                    "utf-32": i}[enc]
        assert col == expected


def test_column_inside_a_character_rounds_down_and_past_end_clamps():
    emoji = LINE.index("😀")
    assert column_to_index(LINE, index_to_column(LINE, emoji, "utf-16") + 1, "utf-16") == emoji
    assert column_to_index(LINE, index_to_column(LINE, emoji, "utf-8") + 3, "utf-8") == emoji
    assert column_to_index(LINE, 999, "utf-16") == len(LINE)


def test_line_index_resolve():
    idx = LineIndex("ab\n" + LINE + "\r\nlast\n")
    cur = idx.resolve(1, index_to_column(LINE, len(LINE), "utf-8"), "utf-8")
    assert (cur.row, cur.col, cur.line) == (1, len(LINE), LINE)
    assert idx.source[cur.offset - 2: cur.offset] == "na"
    assert idx.resolve(3, 0, "utf-16").offset == len(idx.source)  # empty line after final newline
    with pytest.raises(PositionError):
        idx.resolve(4, 0, "utf-16")
    with pytest.raises(PositionError):
        LineIndex("no newline").resolve(1, 0, "utf-16")
    assert LineIndex("").resolve(0, 5, "utf-8").offset == 0
