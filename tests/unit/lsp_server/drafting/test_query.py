"""What every draft source shares (lsp_server/drafting/query.py)."""

from __future__ import annotations

import pytest
from diffill.lsp_server.drafting.query import Draft


def test_draft_is_never_empty():
    with pytest.raises(ValueError):
        Draft("", "lookup")
