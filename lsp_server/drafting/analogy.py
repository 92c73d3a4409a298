"""Continue by analogy: the non-neural baseline's rules, on the server side (a draft source,
:mod:`.drafts`, and the evaluation's baseline, :mod:`diffill.evaluation.baseline`).

Code repeats itself: the line after ``for x in xs:`` often looks like the line after an
earlier, similar ``for`` loop in the same file. For a hole at the start of a line the rules

1. takes the *anchor*: the last non-blank line before the cursor;
2. finds the line elsewhere in the visible file (a window of the prefix before the anchor, and
   of the suffix) most similar to the anchor (edit similarity of the stripped lines; ties go
   to the line nearest the hole) among lines followed by a non-blank line;
3. predicts that line's successor, re-indented by the anchor's indentation minus the matched
   line's indentation (so an analogous block at another depth still lines up);
4. for multi-line holes keeps copying the matched line's following lines until it reaches the
   first line of the suffix (the hole's end by analogy) or ``max_lines``.

For a hole inside a line (text left of the cursor) it completes the current line with the
remainder of the most recent earlier line that starts with the same text.

It uses only the document shown to the model (no training data, no task metadata), so it is
an honest floor for "copying from context"; it returns ``""`` when nothing applies.
"""

from __future__ import annotations

from .similarity import edit_similarity, levenshtein


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _reindent(line: str, matched: str, anchor: str) -> str:
    """``line`` shifted by (indent(anchor) - indent(matched)) columns."""
    shift = len(_indent(anchor)) - len(_indent(matched))
    width = max(0, len(_indent(line)) + shift)
    unit = "\t" if _indent(anchor).startswith("\t") else " "
    return unit * width + line.lstrip(" \t")


def analogy_completion(
    prefix: str,
    suffix: str,
    *,
    multiline: bool,
    max_lines: int = 4,
    window_before: int = 200,
    window_after: int = 100,
) -> str:
    before = prefix.split("\n")
    partial = before[-1]
    before_lines = before[:-1][-window_before:]
    after = suffix.split("\n")
    after_lines = after[1:][:window_after]

    if partial.strip():
        return _complete_partial(partial, before_lines)
    if after[0].strip():
        return ""  # text right of the cursor on the same line: nothing sensible to copy

    anchor_i = next((i for i in range(len(before_lines) - 1, -1, -1) if before_lines[i].strip()), None)
    if anchor_i is None:
        return ""
    anchor = before_lines[anchor_i]
    key = anchor.strip()
    stop = next((ln for ln in after_lines if ln.strip()), None)

    # (similarity, -distance to the hole) -> best, ties to the line before the hole; segments
    # never pair across the hole. Looked at nearest first (before the hole first at equal
    # distance), a later line wins only by a higher similarity: its edit distance is computed
    # only as far as it could still win (the outcome is that of the plain argmax).
    hole = len(before_lines)
    cands: list[tuple[int, int, list[str], int]] = []  # (distance, 0 before / 1 after, seg, j)
    for side, (seg, offset) in enumerate(((before_lines[:anchor_i], 0), (after_lines, hole + 1))):
        # candidates: non-blank lines followed (later in the segment) by a non-blank line
        last = next((k for k in range(len(seg) - 1, -1, -1) if seg[k].strip()), -1)
        cands.extend((abs(hole - (offset + j)), side, seg, j) for j in range(last) if seg[j].strip())
    cands.sort(key=lambda c: c[:2])
    best: tuple[float, list[str], int] | None = None
    seen: set[str] = set()  # a line repeated farther away cannot win where the nearer did not
    for _, _, seg, j in cands:
        s = seg[j].strip()
        if s in seen:
            continue
        seen.add(s)
        if best is None:
            best = (edit_similarity(s, key), seg, j)
            continue
        if best[0] == 1.0:
            break  # the rest are farther: none can beat an exact match
        width = max(len(s), len(key))
        bound = _winning_distance(width, best[0])
        if bound < 0:
            continue
        d = levenshtein(s, key, bound)
        if d <= bound:  # 1 - d / width > best: the same value edit_similarity gives
            best = (1.0 - d / width, seg, j)
    if best is None:
        return ""
    _, seg, j = best
    matched = seg[j]
    out: list[str] = []
    for k in range(j + 1, len(seg)):
        line = seg[k]
        if not out and not line.strip():
            continue
        if out and stop is not None and line.strip() == stop.strip():
            break
        out.append(_reindent(line, matched, anchor) if line.strip() else "")
        if not multiline or len(out) >= max_lines:
            break
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def _winning_distance(width: int, best: float) -> int:
    """The largest edit distance ``d`` with ``1.0 - d / width > best`` (-1: none), computed
    with the float expression :func:`.similarity.edit_similarity` uses."""
    d = int(width * (1.0 - best))
    while d >= 0 and not 1.0 - d / width > best:
        d -= 1
    while 1.0 - (d + 1) / width > best:
        d += 1
    return d


def _complete_partial(partial: str, before_lines: list[str]) -> str:
    head = partial.strip()
    for line in reversed(before_lines):
        s = line.strip()
        if s.startswith(head) and len(s) > len(head):
            return s[len(head) :]
    return ""
