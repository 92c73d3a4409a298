"""What a request to the engine is: the candidate-length policy."""

from __future__ import annotations

import pytest
from diffill.model.asks import default_lengths


def test_default_lengths():
    assert default_lengths(32) == (8, 16, 32)
    assert default_lengths(3) == (1, 3)
    assert default_lengths(1) == (1,)
    assert default_lengths(5) == (1, 2, 5)
    # the number of distinct middles wanted: at least three lengths, more for more
    assert default_lengths(32, 1) == default_lengths(32, 2) == default_lengths(32, 3) == (8, 16, 32)
    assert default_lengths(32, 5) == (2, 4, 8, 16, 32)
    assert default_lengths(32, 16) == (1, 2, 4, 8, 16, 32)  # max_tokens runs out first
    assert default_lengths(3, 3) == (1, 3)
    with pytest.raises(ValueError):
        default_lengths(0)
