"""Text metrics: exact match (strict and whitespace-normalised), Levenshtein distance and
edit similarity, percentiles.

The edit distance and similarity live on the server side (:mod:`diffill.lsp_server.drafting.similarity`:
the bit-parallel Levenshtein and its reference DP), which the draft sources use too; they are
re-exported here for the harness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..lsp_server.drafting.similarity import edit_similarity, levenshtein, levenshtein_reference

__all__ = [
    "edit_similarity",
    "exact_match",
    "exact_match_ws",
    "levenshtein",
    "levenshtein_reference",
    "mean",
    "normalize_ws",
    "percentile",
]


def normalize_ws(s: str) -> str:
    """Whitespace-insensitive form: runs of whitespace become one space, ends stripped."""
    return " ".join(s.split())


def exact_match(pred: str, target: str) -> bool:
    return pred == target


def exact_match_ws(pred: str, target: str) -> bool:
    return normalize_ws(pred) == normalize_ws(target)


def mean(xs: Sequence[float | bool]) -> float:
    return float(sum(xs)) / len(xs) if xs else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); nan for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
