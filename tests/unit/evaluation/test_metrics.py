"""Edit distance (fast vs reference), edit similarity, exact match, percentiles."""

from __future__ import annotations

import math

from diffill.evaluation.metrics import (
    edit_similarity,
    exact_match,
    exact_match_ws,
    levenshtein,
    levenshtein_reference,
    percentile,
)
from hypothesis import given, settings
from hypothesis import strategies as st

small = st.text(alphabet="ab c\n\t", max_size=40)
wide = st.text(max_size=60)


@settings(max_examples=300, deadline=None)
@given(small, small)
def test_levenshtein_matches_reference_small_alphabet(a, b):
    assert levenshtein(a, b) == levenshtein_reference(a, b)


@settings(max_examples=100, deadline=None)
@given(wide, wide)
def test_levenshtein_matches_reference_unicode(a, b):
    assert levenshtein(a, b) == levenshtein_reference(a, b)


def test_levenshtein_long_strings_and_word_boundaries():
    # > 64 characters: bit vectors wider than a machine word
    a = "x = foo(bar, baz)  # " * 20
    b = a.replace("bar", "qux").replace("baz", "bz")
    assert levenshtein(a, b) == levenshtein_reference(a, b)
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3 and levenshtein("abc", "") == 3


def test_edit_similarity():
    assert edit_similarity("", "") == 1.0
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("abc", "") == 0.0
    assert edit_similarity("abcd", "abcf") == 0.75
    assert math.isclose(edit_similarity("kitten", "sitting"), 1 - 3 / 7)


def test_exact_match_modes():
    assert exact_match("    return x", "    return x")
    assert not exact_match("  return x", "    return x")
    assert exact_match_ws("  return   x ", "    return x")
    assert not exact_match_ws("return y", "return x")


def test_percentile():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert math.isnan(percentile([], 50))
