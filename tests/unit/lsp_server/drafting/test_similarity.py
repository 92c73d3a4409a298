"""Edit distance (fast vs reference) and edit similarity."""

from __future__ import annotations

import math

from diffill.lsp_server.drafting.similarity import (
    edit_similarity,
    levenshtein,
    levenshtein_reference,
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


@settings(max_examples=300, deadline=None)
@given(small, small, st.integers(0, 45))
def test_levenshtein_with_a_bound_gives_up_above_it(a, b, bound):
    assert levenshtein(a, b, bound) == min(levenshtein_reference(a, b), bound + 1)


def test_edit_similarity():
    assert edit_similarity("", "") == 1.0
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("abc", "") == 0.0
    assert edit_similarity("abcd", "abcf") == 0.75
    assert math.isclose(edit_similarity("kitten", "sitting"), 1 - 3 / 7)
