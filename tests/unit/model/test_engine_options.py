"""The engine's options: a bad one is refused when built."""

from __future__ import annotations

import pytest
from diffill.model.engine_options import EngineOptions


def test_bad_options():
    with pytest.raises(ValueError):
        EngineOptions(refresh_every=0)
    with pytest.raises(ValueError):
        EngineOptions(select_impl="cuda")
    with pytest.raises(ValueError):
        EngineOptions(max_batch_rows=0)
