"""Exact match, percentiles; the edit distance the harness re-exports from the server side."""

from __future__ import annotations

import math

from diffill.evaluation import metrics
from diffill.evaluation.metrics import exact_match, exact_match_ws, percentile
from diffill.lsp_server.drafting import similarity


def test_edit_distance_is_the_server_sides():
    assert metrics.levenshtein is similarity.levenshtein
    assert metrics.levenshtein_reference is similarity.levenshtein_reference
    assert metrics.edit_similarity is similarity.edit_similarity


def test_exact_match_modes():
    assert exact_match("    return x", "    return x")
    assert not exact_match("  return x", "    return x")
    assert exact_match_ws("  return   x ", "    return x")
    assert not exact_match_ws("return y", "return x")


def test_percentile():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert math.isnan(percentile([], 50))
