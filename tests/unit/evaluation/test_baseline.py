"""The baseline is the server side's "continue by analogy" rules (tested in
tests/unit/lsp_server/drafting/test_analogy.py)."""

from __future__ import annotations

from diffill.evaluation import baseline
from diffill.lsp_server.drafting import analogy


def test_baseline_is_the_analogy_rules():
    assert baseline.analogy_completion is analogy.analogy_completion
    pre = "def f(xs):\n    for x in xs:\n        print(x)\n    for y in xs:\n"
    assert baseline.analogy_completion(pre, "\n", multiline=False) == "        print(x)"
