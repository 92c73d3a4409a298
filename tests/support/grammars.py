"""What the tree-sitter tests share: skipping, with the reason, where the ``tree-sitter``
package or a language's grammar wheel is not installed, and buffers written with ``|`` at
the cursor."""

from __future__ import annotations

import pytest
from diffill.lsp_server.text import languages, treesitter

needs_ts = pytest.mark.skipif(not treesitter.available(),
                              reason="the tree-sitter package is not installed (text rules only)")


def need_grammar(lang: str) -> None:
    """Skip the test unless ``lang``'s grammar loads here."""
    if not treesitter.available():
        pytest.skip("the tree-sitter package is not installed (text rules only)")
    if treesitter.grammar(lang) is None:
        mod = languages.lookup(lang).grammar[0].replace("_", "-")
        pytest.skip(f"the grammar wheel {mod} is not installed")


def at_cursor(buf: str) -> tuple[str, int]:
    """``buf`` without its first ``|``, and the offset where it was."""
    return buf.replace("|", "", 1), buf.index("|")
