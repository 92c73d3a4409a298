"""The "continue by analogy" rules (the non-neural baseline, and a draft source)."""

from __future__ import annotations

from diffill.lsp_server.drafting.analogy import analogy_completion
from diffill.lsp_server.drafting.similarity import edit_similarity
from hypothesis import given, settings
from hypothesis import strategies as st


def test_analogy_copies_the_successor_of_the_most_similar_line():
    pre = "def f(xs):\n    for x in xs:\n        print(x)\n    total = 0\n    for y in xs:\n"
    suf = "\n    return total\n"
    assert analogy_completion(pre, suf, multiline=False) == "        print(x)"
    # multi-line copies until the line the suffix starts with
    assert analogy_completion(pre, suf, multiline=True) == "        print(x)\n    total = 0"


def test_analogy_reindents_to_the_anchor():
    pre = "class A:\n    def a(self):\n        return 1\n\ndef b():\n"
    assert analogy_completion(pre, "\n", multiline=False) == "    return 1"


def test_analogy_uses_the_suffix_too_and_prefers_nearer_ties():
    pre = "a = 1\nb = 2\nc = 3\n"
    suf = "\nc = 3\nd = 9\n"
    # anchor "c = 3": exact matches exist only in the suffix -> its successor
    assert analogy_completion(pre, suf, multiline=False) == "d = 9"


def test_analogy_without_context_or_mid_line():
    assert analogy_completion("", "\n", multiline=False) == ""
    assert analogy_completion("x = 1\n", "\n", multiline=False) == ""  # no other line to copy from
    # inside a line: remainder of an earlier line with the same start
    assert analogy_completion("result = compute(a, b)\nres", "\n", multiline=False) == "ult = compute(a, b)"


def _plain_argmax(prefix: str, suffix: str, *, multiline: bool, max_lines: int = 4,
                  window_before: int = 200, window_after: int = 100) -> str:
    """The rules as first written: every candidate line measured, in file order, the plain
    argmax of (similarity, -distance) (the module looks nearest first and stops measuring a
    line once it cannot win)."""
    def indent(line: str) -> str:
        return line[: len(line) - len(line.lstrip(" \t"))]

    before = prefix.split("\n")
    partial = before[-1]
    before_lines = before[:-1][-window_before:]
    after = suffix.split("\n")
    after_lines = after[1:][:window_after]
    if partial.strip():
        head = partial.strip()
        for line in reversed(before_lines):
            s = line.strip()
            if s.startswith(head) and len(s) > len(head):
                return s[len(head) :]
        return ""
    if after[0].strip():
        return ""
    anchor_i = next((i for i in range(len(before_lines) - 1, -1, -1) if before_lines[i].strip()), None)
    if anchor_i is None:
        return ""
    anchor = before_lines[anchor_i]
    stop = next((ln for ln in after_lines if ln.strip()), None)
    best = None
    hole = len(before_lines)
    for seg, offset in ((before_lines[:anchor_i], 0), (after_lines, hole + 1)):
        for j, line in enumerate(seg):
            if not line.strip() or not any(x.strip() for x in seg[j + 1 :]):
                continue
            cand = (edit_similarity(line.strip(), anchor.strip()), -abs(hole - (offset + j)), seg, j)
            if best is None or cand[:2] > best[:2]:
                best = cand
    if best is None:
        return ""
    _, _, seg, j = best
    shift = len(indent(anchor)) - len(indent(seg[j]))
    unit = "\t" if indent(anchor).startswith("\t") else " "
    out: list[str] = []
    for line in seg[j + 1 :]:
        if not out and not line.strip():
            continue
        if out and stop is not None and line.strip() == stop.strip():
            break
        width = max(0, len(indent(line)) + shift)
        out.append(unit * width + line.lstrip(" \t") if line.strip() else "")
        if not multiline or len(out) >= max_lines:
            break
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


LINES = ["x = 1", "    x = 1", "y = 2", "    for x in xs:", "        print(x)", "", "  ",
         "return x", "    return x", "if a:", "elif b:", "    pass", "x = 12", "xx = 1", "\tz",
         "ab", "ba", "abc", "x  = 1"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(LINES), max_size=16), st.integers(0, 16),
       st.sampled_from(["", "   ", "x"]), st.booleans(), st.sampled_from([(200, 100), (3, 2)]))
def test_analogy_picks_what_the_plain_argmax_picks(lines, cut, partial, multiline, windows):
    cut = min(cut, len(lines))
    pre = "".join(ln + "\n" for ln in lines[:cut]) + partial
    suf = "\n" + "\n".join(lines[cut:])
    wb, wa = windows
    kw = {"multiline": multiline, "window_before": wb, "window_after": wa}
    assert analogy_completion(pre, suf, **kw) == _plain_argmax(pre, suf, **kw)
