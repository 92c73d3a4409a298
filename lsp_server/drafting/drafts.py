"""Draft sources: candidate middles drawn from the code around the cursor, for the diffusion
model to verify in one forward pass ("draft and verify").

Pure text, deterministic, no model. A :class:`~.query.DraftQuery` is the document, the cursor and
what else is at hand (the other open documents, the suggestions recently shown for this
document); a :class:`~.query.DraftSource` turns it into ranked :class:`~.query.Draft` s, each a text to insert
at the cursor; :func:`propose` asks the sources in a fixed order and keeps each one's best
draft (more than the top draft per source hurt exact match: the model cannot tell a right
from a wrong draft, so a source's second guess mostly adds a wrong one to choose from).

The sources:

* :class:`~.lookup.PromptLookup` (``"lookup"``): the text just before the cursor looked up in
  the buffer, the other open documents and the workspace's chunks, and what followed it there
  (prompt lookup decoding; :mod:`.lookup`).
* :class:`~.lookup.SuffixLookup` (``"suffix"``): the same from the other side of the hole: the
  lines that come before the text just *after* the cursor where it occurs elsewhere.
* :class:`Analogy` (``"analogy"``): the "continue by analogy" rules of :mod:`.analogy` (the
  successor of the most similar line, re-indented).
* :class:`Typeahead` (``"typeahead"``): the rest of a suggestion shown earlier, after what the
  user has typed of it since.

Workspace chunks rank after the buffer's own matches (:mod:`.lookup`). The shared types and
helpers, and how line ends are read: :mod:`.query`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...model.limits import MAX_DRAFTS
from .analogy import analogy_completion
from .lookup import PromptLookup, SuffixLookup
from .query import (
    ANALOGY,
    TYPEAHEAD,
    Draft,
    DraftQuery,
    DraftSource,
    as_lf,
    at_boundary,
    before_rest,
    cursor_of,
    fit,
    line_around,
    restore_crlf,
    usable,
)

# --- analogy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Analogy:
    """:func:`.analogy.analogy_completion` on the lines it looks at (``window_before`` lines
    before the cursor line, ``window_after`` after it: only those are cut out of the
    document). The draft starts where the cursor is (the indentation typed, or the space
    after a word, is not repeated) and, on one line, stops where the line's rest right of the
    cursor begins when it ends with that rest."""

    name = ANALOGY
    max_lines: int = 4
    window_before: int = 200
    window_after: int = 100

    def propose(self, q: DraftQuery) -> list[Draft]:
        q, crlf = as_lf(q)
        text, off = q.text, cursor_of(q)
        start = off
        for _ in range(self.window_before + 1):
            start = text.rfind("\n", 0, start)
            if start < 0:
                break
        start += 1  # 0 when the text ran out
        end = off - 1
        for _ in range(self.window_after + 1):
            end = text.find("\n", end + 1)
            if end < 0:
                end = len(text)
                break
        got = analogy_completion(text[start:off], text[off:end], multiline=q.multiline,
                                 max_lines=self.max_lines, window_before=self.window_before,
                                 window_after=self.window_after)
        left, right = line_around(text, off)
        typed = left[len(left.rstrip()) :]  # the indentation, or the spaces after a word, typed
        if typed:  # the draft starts where the cursor is: not repeating them
            got = got[len(typed) :] if got.startswith(typed) else got.lstrip(" \t")
        got = fit(before_rest(got, right), q.max_chars)
        return restore_crlf([Draft(got, self.name)], crlf) if usable(got, q) else []


# --- typeahead -------------------------------------------------------------------------------


def rebased(block: str, left: str) -> str:
    """A recalled multi-line suggestion (its later lines relative to the depth of the line it
    starts on: ``scheduler.relative_block``) re-indented for the line where ``left`` is the
    text left of the cursor: its later lines at that line's depth plus their own."""
    first, nl, rest = block.partition("\n")
    if not nl:
        return block
    pad = left[: len(left) - len(left.lstrip(" \t"))]
    if not left.strip():
        pad = left + first[: len(first) - len(first.lstrip(" \t"))]
    return first + "\n" + "\n".join(pad + ln if ln.strip() else "" for ln in rest.split("\n"))


@dataclass(frozen=True)
class Typeahead:
    """The rest of a suggestion shown earlier for this document (``q.recalled``, best/newest
    first), after the longest overlap between the end of the text before the cursor and the
    suggestion's start (``"total += x"`` with ``"tot"`` typed: ``"al += x"``). The overlap
    starts on a token boundary and holds a non-blank character, or is the indentation typed
    on an otherwise blank line; with the line left of the cursor blank and no overlap the
    whole suggestion is proposed (the cursor is where it was shown); otherwise nothing. A
    multi-line one comes as a block relative to its first line's depth (what the server's
    cache keeps) and is re-indented as a block for the line it lands on (:func:`rebased`)."""

    name = TYPEAHEAD
    candidates: int = 4

    def propose(self, q: DraftQuery) -> list[Draft]:
        q, crlf = as_lf(q)
        text, off = q.text, cursor_of(q)
        left, right = line_around(text, off)
        out: list[Draft] = []
        seen: set[str] = set()
        for rec in q.recalled:
            rest = self._rest(text, off, left, rec)
            if rest is None:
                continue
            if not q.multiline:
                rest = rest.split("\n", 1)[0].rstrip()
            rest = fit(before_rest(rest, right), q.max_chars)
            if rest not in seen and usable(rest, q):
                seen.add(rest)
                out.append(Draft(rest, self.name))
                if len(out) >= self.candidates:
                    break
        return restore_crlf(out, crlf)

    @staticmethod
    def _rest(text: str, off: int, left: str, rec: str) -> str | None:
        if not rec.strip():
            return None
        lo = max(0, off - len(rec) - 120 * rec.count("\n"))  # rebased lines gain a pad
        first = rec[0]
        i = text.find(first, lo, off)
        while i >= 0:  # the longest overlap first
            typed = text[i:off]
            # the suggestion as it reads where it would start (the line holding i)
            here = rebased(rec, text[text.rfind("\n", 0, i) + 1 : i])
            if len(typed) < len(here) and here.startswith(typed):
                if typed.strip() and at_boundary(text, i):
                    return here[len(typed) :]
                if not typed.strip() and "\n" not in typed and not left.strip():
                    return here[len(typed) :]  # the indentation typed since it was shown
            i = text.find(first, i + 1, off)
        return rebased(rec, left) if not left.strip() else None


DEFAULT_SOURCES: tuple[DraftSource, ...] = (PromptLookup(), SuffixLookup(), Analogy(), Typeahead())
"""The fixed order: lookup, suffix, analogy, typeahead."""


def propose(
    q: DraftQuery,
    sources: Sequence[DraftSource] = DEFAULT_SOURCES,
    limit: int = MAX_DRAFTS,
    per_source: int = 1,
) -> list[Draft]:
    """At most ``limit`` distinct drafts: each source's first ``per_source`` proposals, in the
    order of ``sources``; a text already proposed by an earlier source is dropped (the first
    source wins) and does not make room for that source's next guess."""
    lf, crlf = as_lf(q)
    out: list[Draft] = []
    seen: set[str] = set()
    for src in sources:
        if len(out) >= limit:
            break
        for d in src.propose(lf)[:per_source]:
            if d.text not in seen and len(out) < limit:
                seen.add(d.text)
                out.append(d)
    return restore_crlf(out, crlf)
