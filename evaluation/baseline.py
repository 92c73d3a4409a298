"""A non-neural baseline: *continue by analogy*.

Code repeats itself: the line after ``for x in xs:`` often looks like the line after an
earlier, similar ``for`` loop in the same file. For a hole at the start of a line the baseline

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

from .metrics import edit_similarity


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

    # (similarity, -distance to the hole) -> best; segments never pair across the hole
    best: tuple[float, int, list[str], int] | None = None
    hole = len(before_lines)
    for seg, offset in ((before_lines[:anchor_i], 0), (after_lines, hole + 1)):
        for j, line in enumerate(seg):
            if not line.strip():
                continue
            nxt = next((k for k in range(j + 1, len(seg)) if seg[k].strip()), None)
            if nxt is None:
                continue
            sim = edit_similarity(line.strip(), key)
            dist = abs(hole - (offset + j))
            cand = (sim, -dist, seg, j)
            if best is None or cand[:2] > best[:2]:
                best = cand
    if best is None:
        return ""
    _, _, seg, j = best
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


def _complete_partial(partial: str, before_lines: list[str]) -> str:
    head = partial.strip()
    for line in reversed(before_lines):
        s = line.strip()
        if s.startswith(head) and len(s) > len(head):
            return s[len(head) :]
    return ""
