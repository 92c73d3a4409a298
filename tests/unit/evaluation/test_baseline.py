"""The non-neural "continue by analogy" baseline."""

from __future__ import annotations

from diffill.evaluation.baseline import analogy_completion


def test_baseline_copies_the_successor_of_the_most_similar_line():
    pre = "def f(xs):\n    for x in xs:\n        print(x)\n    total = 0\n    for y in xs:\n"
    suf = "\n    return total\n"
    assert analogy_completion(pre, suf, multiline=False) == "        print(x)"
    # multi-line copies until the line the suffix starts with
    assert analogy_completion(pre, suf, multiline=True) == "        print(x)\n    total = 0"


def test_baseline_reindents_to_the_anchor():
    pre = "class A:\n    def a(self):\n        return 1\n\ndef b():\n"
    assert analogy_completion(pre, "\n", multiline=False) == "    return 1"


def test_baseline_uses_the_suffix_too_and_prefers_nearer_ties():
    pre = "a = 1\nb = 2\nc = 3\n"
    suf = "\nc = 3\nd = 9\n"
    # anchor "c = 3": exact matches exist only in the suffix -> its successor
    assert analogy_completion(pre, suf, multiline=False) == "d = 9"


def test_baseline_without_context_or_mid_line():
    assert analogy_completion("", "\n", multiline=False) == ""
    assert analogy_completion("x = 1\n", "\n", multiline=False) == ""  # no other line to copy from
    # inside a line: remainder of an earlier line with the same start
    assert analogy_completion("result = compute(a, b)\nres", "\n", multiline=False) == "ult = compute(a, b)"
