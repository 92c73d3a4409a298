"""Edit distance and edit similarity of two texts, for the server side (the draft sources, the
"continue by analogy" rules) and the evaluation's metrics alike.

``levenshtein`` is the fast path: the bit-parallel algorithm of Myers (1999) in the global
(edit distance, not search) form given by Hyyrö (2001), with Python integers as bit vectors of
unbounded width, so its cost is ``len(a)`` big-integer operations on ``len(b)``-bit words.
``levenshtein_reference`` is the textbook dynamic programme; tests compare the two.
"""

from __future__ import annotations


def levenshtein_reference(a: str, b: str) -> int:
    """Unit-cost insert/delete/substitute distance, O(len(a) * len(b)) DP."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def levenshtein(a: str, b: str, bound: int | None = None) -> int:
    """Same value as :func:`levenshtein_reference`, bit-parallel over the characters of ``b``;
    with ``bound``, ``min(distance, bound + 1)`` (a distance above ``bound`` is given up on as
    soon as it is certain: the length difference, or the column's score less the characters
    of ``a`` still to read, exceeds it).

    Vertical deltas of one DP column are kept as two bit vectors ``pv`` (+1) and ``mv`` (-1);
    each character of ``a`` updates them in O(1) word operations; ``score`` tracks the last
    cell of the column (distance of ``b`` against the prefix of ``a`` read so far).
    """
    if a == b:
        return 0
    over = len(a) + len(b) if bound is None else bound
    if abs(len(a) - len(b)) > over:
        return over + 1
    # common prefix / suffix do not change the distance and shorten the work
    i = 0
    n = min(len(a), len(b))
    while i < n and a[i] == b[i]:
        i += 1
    a, b = a[i:], b[i:]
    j = 0
    n = min(len(a), len(b))
    while j < n and a[-1 - j] == b[-1 - j]:
        j += 1
    if j:
        a, b = a[:-j], b[:-j]
    if not a or not b:
        return min(len(a) + len(b), over + 1)
    m = len(b)
    full = (1 << m) - 1
    top = 1 << (m - 1)
    peq: dict[str, int] = {}
    for k, c in enumerate(b):
        peq[c] = peq.get(c, 0) | (1 << k)
    pv, mv, score = full, 0, m
    # the distance is at least score - (characters of a still to read): give up past `over`
    give_up = over + len(a)
    for c in a:
        give_up -= 1
        eq = peq.get(c, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & top:
            score += 1
        elif mh & top:
            score -= 1
        if score > give_up:
            return over + 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return min(score, over + 1)


def edit_similarity(a: str, b: str) -> float:
    """``1 - levenshtein(a, b) / max(len(a), len(b))``; 1.0 for two empty strings."""
    if not a and not b:
        return 1.0
    return 1.0 - levenshtein(a, b) / max(len(a), len(b))
