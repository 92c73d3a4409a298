"""Buffer + cursor -> the prefix and suffix the model sees (a :class:`FimContext`).

Windows are measured in REAL tokens of the model's tokenizer (``encode_batch``),
against a budget split between prefix and suffix (default 75% / 25%). Cuts
fall on line boundaries: a window never starts (prefix) or ends (suffix) in
the middle of a line, except the cursor line itself, which is cut by
characters only when it alone exceeds the budget.

Huge documents do not slow this down: only a bounded character window around
the cursor is ever looked at (at most ``budget * CHARS_PER_TOKEN_BOUND``
characters on each side), then trimmed to the token budget. The window starts
at half that (code averages 3-4 characters per token) and widens once when the
text in it ran out before the budget did; ``8 * budget`` characters hold the
budget for any text whose tokens average 8 characters or less.

Extra context
-------------
Other files' text (:class:`Snippet`: the definitions the code at the cursor uses, chunks of
the workspace like the code at the cursor, recent edits, other open documents, llama.vim's
``input_extra``) goes in front of the prefix as a *header*, each snippet with its path. One
policy decides what fits (:func:`build_context`):

1. The suffix window gets its share of the budget (``1 - prefix_fraction``), as without
   extras.
2. The prefix's share is split: the header may take ``extra_fraction`` of it, *or more* when
   the prefix window leaves room (near the top of a file, or in a short one): what the
   cursor's own prefix does not use goes to the header. So the prefix around the cursor
   always keeps ``1 - extra_fraction`` of its share -- extras never crowd it out.
3. Snippets are taken in the order given -- the caller's order is the priority, most
   relevant first -- each one whole when it fits, else its first lines that fit; a snippet
   whose lines all lie in the buffer's windows already, or that repeats an earlier one, is
   left out (deduplicated against the buffer).
4. The header is written with the most relevant snippet *last*, nearest the code (as
   RepoCoder orders retrieved code: the most similar next to the unfinished code), then a
   line naming the current file.

Formats (``header_format``, from the loaded family's recipe, ``model/recipes.py``
``Recipe.cross_file``): ``"comment"`` -- each snippet as a ``<comment> path: p`` line in the
file's line-comment syntax, then its text, and a last ``<comment> path: <current file>``
line (after Tabby's prompt builder, ``build_prefix`` in github.com/TabbyML/tabby
``crates/tabby/src/services/completion/completion_prompt.rs``: a ``<comment> Path: p`` line
before each snippet; Tabby comments out the snippet's lines as well, here they are left as
they are); ``"qwen-repo"`` -- the repository-level format Qwen2.5-Coder was pre-trained on
(Qwen2.5-Coder Technical Report, arXiv 2409.12186, section 3.1.2, and the README of
github.com/QwenLM/Qwen2.5-Coder, "repository level code completion"):
``<|repo_name|>{name}\n`` then ``<|file_sep|>{path}\n{text}\n`` per file, the current file
last as ``<|file_sep|>{path}\n`` followed by the prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import languages

EncodeBatch = Callable[[list[str]], list[list[int]]]
"""texts -> token ids of each text (no special tokens): the model's tokenizer."""

CHARS_PER_TOKEN_BOUND = 8
LINE_WINDOW_CHARS = 4000
"""How far the cursor line prefix/suffix is looked at for post-processing."""

def comment_prefix(language: str | None, path: str | None = None) -> str:
    """Line-comment marker for a language id (LSP ``languageId``) or file extension (the one
    table of per-language facts: :mod:`.languages`)."""
    return languages.comment_prefix(language, path)


@dataclass(frozen=True)
class Snippet:
    """Extra context: a piece of another file, with the path it is shown under.
    ``kind`` says where it came from (``"open"``: another open document, ``"definition"``,
    ``"workspace"``, ``"recent"``, ``"extra"``: a client's chunk); it does not change how
    it is written."""

    path: str
    text: str
    language: str | None = None
    kind: str = "open"


HEADER_FORMATS = ("comment", "qwen-repo")


@dataclass(frozen=True)
class FimContext:
    """What the model gets, plus what post-processing needs to know about the cursor.

    ``prefix``/``suffix`` are the (header +) windows; ``prefix_ids``/``suffix_ids`` their
    token ids (exact, the same tokenizer), so a local backend does not re-encode.
    ``line_prefix``/``line_suffix`` are the cursor line before/after the cursor (at most
    ``LINE_WINDOW_CHARS`` each, no newline); ``after_line`` the suffix window's text after
    the cursor line (for overlap checks); ``prefix_start``/``suffix_end`` the document
    offsets the windows cover; ``prefix[:header_chars]`` is the extra-context header.
    """

    prefix: str
    suffix: str
    prefix_ids: list[int]
    suffix_ids: list[int]
    line_prefix: str
    line_suffix: str
    after_line: str
    prefix_start: int
    suffix_end: int
    header_tokens: int = 0
    header_chars: int = 0
    language: str | None = None
    extra_paths: list[str] = field(default_factory=list)
    #: the document's path (or URI) when the caller named it: the model side may keep its
    #: context for the document's next request (:mod:`diffill.model.reuse`)
    path: str | None = None

    @property
    def prefix_tokens(self) -> int:
        return len(self.prefix_ids)

    @property
    def suffix_tokens(self) -> int:
        return len(self.suffix_ids)

    @property
    def at_line_end(self) -> bool:
        """Nothing but whitespace right of the cursor on its line."""
        return not self.line_suffix.strip()


def split_budget(budget: int, prefix_fraction: float) -> tuple[int, int]:
    """Token budget -> (prefix tokens, suffix tokens)."""
    budget = max(0, int(budget))
    p = int(round(budget * prefix_fraction))
    return p, budget - p


def _lines_keepends(text: str) -> list[str]:
    """Split on ``\\n`` only (``\\r\\n`` stays inside the line), keeping the newline."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _fit_tail(text: str, budget: int, encode_batch: EncodeBatch) -> str:
    """Longest suffix of ``text`` (cut by characters) with at most ``budget`` tokens."""
    if budget <= 0 or not text:
        return ""
    lo, hi = 0, len(text)  # answer: smallest start with tokens(text[start:]) <= budget
    while lo < hi:
        mid = (lo + hi) // 2
        if len(encode_batch([text[mid:]])[0]) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return text[lo:]


def _fit_head(text: str, budget: int, encode_batch: EncodeBatch) -> str:
    """Longest prefix of ``text`` (cut by characters) with at most ``budget`` tokens."""
    if budget <= 0 or not text:
        return ""
    lo, hi = 0, len(text)  # answer: largest end with tokens(text[:end]) <= budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(encode_batch([text[:mid]])[0]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _take_lines(
    first: str, lines: Sequence[str], budget: int, encode_batch: EncodeBatch, *, reverse: bool
) -> tuple[str, list[int]]:
    """``first`` (the cursor-line part, always kept, cut by chars if it alone is over
    budget) plus as many whole ``lines`` as fit, in order away from the cursor.

    ``reverse``: the lines precede ``first`` (prefix side) and are given nearest-first.
    Returns (text, ids) with ``len(ids) <= budget`` for the joined text.
    """
    if budget <= 0:
        return "", []
    counts = encode_batch([first, *lines]) if (first or lines) else [[]]
    if len(counts[0]) > budget:
        first = (_fit_tail if reverse else _fit_head)(first, budget, encode_batch)
        lines = []
        used = budget
    else:
        used = len(counts[0])
    kept: list[str] = []
    for line, ids in zip(lines, counts[1:], strict=False):
        if used + len(ids) > budget:
            break
        used += len(ids)
        kept.append(line)
    # Per-line counts only estimate the joined count (BPE merges across newlines, e.g.
    # blank lines, make the joined text shorter). Refine on the exact joined count:
    # shrink while over budget, else search upwards for the largest line count that fits.
    def joined(k: int) -> tuple[str, list[int]]:
        part = lines[:k]
        text = "".join(reversed(part)) + first if reverse else first + "".join(part)
        return text, encode_batch([text])[0]

    k = len(kept)
    text, ids = joined(k)
    while len(ids) > budget and k > 0:
        k -= 1
        text, ids = joined(k)
    if len(ids) > budget:  # only the cursor-line part left and still over: cut it
        text = (_fit_tail if reverse else _fit_head)(text, budget, encode_batch)
        return text, encode_batch([text])[0]
    # Exponential search upwards from k (usually one probe: the next line does not fit).
    n, step = len(lines), 1
    while k + step <= n:
        t_probe, ids_probe = joined(k + step)
        if len(ids_probe) > budget:
            break
        k, text, ids = k + step, t_probe, ids_probe
        step *= 2
    lo, hi = k, min(n, k + step) - 1  # k fits, k + step does not (or is past the end)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t_mid, ids_mid = joined(mid)
        if len(ids_mid) <= budget:
            lo, text, ids = mid, t_mid, ids_mid
        else:
            hi = mid - 1
    return text, ids


def _block(sn: Snippet, body: str, fmt: str) -> str:
    if fmt == "qwen-repo":
        return f"<|file_sep|>{sn.path}\n{body}"
    return f"{comment_prefix(sn.language, sn.path)} path: {sn.path}\n{body}"


def _fit_lines(sn: Snippet, budget: int, fmt: str, encode_batch: EncodeBatch) -> str | None:
    """The block of ``sn``'s first lines that fits ``budget`` tokens (None: not one line)."""
    lines = _lines_keepends(sn.text if sn.text.endswith("\n") else sn.text + "\n")
    lo, hi = 0, len(lines)  # largest k whose block fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(encode_batch([_block(sn, "".join(lines[:mid]), fmt)])[0]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    body = "".join(lines[:lo])
    return _block(sn, body, fmt) if body.strip() else None


def build_header(snippets: Sequence[Snippet], language: str | None, path: str | None,
                 budget: int, encode_batch: EncodeBatch, *, fmt: str = "comment",
                 repo: str | None = None) -> tuple[str, list[str]]:
    """The extra-context header: the snippets that fit ``budget`` tokens, in the order given
    (the first is the most relevant: whole when it fits, else its first lines that do), then
    written most relevant last, then the line naming the current file (module doc, *Extra
    context*). Returns (header, the paths used, most relevant first); empty when nothing
    fits."""
    if budget <= 0 or not snippets:
        return "", []
    if fmt == "qwen-repo":
        lead = f"<|repo_name|>{repo or 'workspace'}\n"
        trailer = f"<|file_sep|>{path or 'current'}\n"
    else:
        lead = ""
        trailer = f"{comment_prefix(language, path)} path: {path}\n" if path else ""
    blocks: list[str] = []
    used_paths: list[str] = []
    total = len(encode_batch([lead + trailer])[0]) if lead or trailer else 0
    for sn in snippets:
        body = sn.text if sn.text.endswith("\n") else sn.text + "\n"
        block = _block(sn, body, fmt)
        n = len(encode_batch([block])[0])
        if total + n > budget:
            cut = _fit_lines(sn, budget - total, fmt, encode_batch) if budget - total > 8 else None
            if cut is None:
                continue
            block, n = cut, len(encode_batch([cut])[0])
        total += n
        blocks.append(block)
        used_paths.append(sn.path)
    if not blocks:
        return "", []
    return lead + "".join(reversed(blocks)) + trailer, used_paths


def dedupe_snippets(snippets: Sequence[Snippet], window: str) -> list[Snippet]:
    """``snippets`` without those whose non-blank lines all occur in ``window`` (the buffer
    around the cursor) and without repeats of an earlier snippet's text."""
    have = {ln.strip() for ln in window.split("\n")}
    out: list[Snippet] = []
    seen: set[str] = set()
    for sn in snippets:
        lines = {ln.strip() for ln in sn.text.split("\n") if ln.strip()}
        key = sn.text.strip()
        if not lines or lines <= have or key in seen:
            continue
        seen.add(key)
        out.append(sn)
    return out


def _prefix_window(text: str, offset: int, budget: int, encode_batch: EncodeBatch
                   ) -> tuple[str, list[int]]:
    """The cursor line part, then whole lines going up, within ``budget`` tokens. The
    character window starts at ~4 chars/token (code averages 3-4) and widens once when it
    ran out before the budget did."""
    for cpt in (CHARS_PER_TOKEN_BOUND // 2, CHARS_PER_TOKEN_BOUND):
        p_lo = max(0, offset - max(budget, 1) * cpt)
        raw = text[p_lo:offset]
        nl = raw.rfind("\n")
        cursor_part = raw[nl + 1:]
        above = _lines_keepends(raw[: nl + 1]) if nl >= 0 else []
        if p_lo > 0 and above:
            above = above[1:]  # the window's first line may start mid-line: drop it
        body, ids = _take_lines(cursor_part, above[::-1], budget, encode_batch, reverse=True)
        if p_lo == 0 or len(body) < len(cursor_part) + sum(map(len, above)):
            break
    return body, ids


def build_context(
    text: str,
    offset: int,
    encode_batch: EncodeBatch,
    *,
    budget: int = 1024,
    prefix_fraction: float = 0.75,
    language: str | None = None,
    path: str | None = None,
    snippets: Sequence[Snippet] = (),
    extra_fraction: float = 0.15,
    header_format: str = "comment",
    repo: str | None = None,
) -> FimContext:
    """Cut the prefix/suffix windows around character ``offset`` of ``text``, with the
    ``snippets`` that fit as a header in front of the prefix (module doc, *Extra context*:
    the policy; ``snippets`` most relevant first; ``header_format`` ``"comment"`` or
    ``"qwen-repo"``, ``repo`` the repository name the latter writes).

    Token counts are exact for the returned windows: ``len(prefix_ids) <= prefix budget``
    (header included) and ``len(suffix_ids) <= suffix budget``. Work is bounded by the
    budget, not by the document size.
    """
    if not 0 <= offset <= len(text):
        raise ValueError(f"offset {offset} outside the text (length {len(text)})")
    p_budget, s_budget = split_budget(budget, prefix_fraction)

    prefix_body, prefix_body_ids = _prefix_window(text, offset, p_budget, encode_batch)
    header, used_paths = "", []
    if snippets and p_budget > 0:
        reach = CHARS_PER_TOKEN_BOUND * max(p_budget, s_budget)
        kept = dedupe_snippets(snippets, text[max(0, offset - reach): offset + reach])
        room = p_budget - len(prefix_body_ids)
        header, used_paths = build_header(
            kept, language, path, max(room, int(p_budget * extra_fraction)), encode_batch,
            fmt=header_format, repo=repo,
        )
    header_ids = encode_batch([header])[0] if header else []
    if header and len(header_ids) > p_budget - len(prefix_body_ids):
        prefix_body, prefix_body_ids = _prefix_window(
            text, offset, p_budget - len(header_ids), encode_batch)
    prefix_start = offset - len(prefix_body)
    if header:
        prefix = header + prefix_body
        prefix_ids = encode_batch([prefix])[0]
        if len(prefix_ids) > p_budget:  # joined header tokenised longer: drop the header
            header, used_paths = "", []
            prefix_body, prefix_body_ids = _prefix_window(text, offset, p_budget, encode_batch)
            prefix_start = offset - len(prefix_body)
            prefix, prefix_ids = prefix_body, prefix_body_ids
    else:
        prefix, prefix_ids = prefix_body, prefix_body_ids
    # -- suffix: the rest of the cursor line (with its newline), then whole lines going down
    for cpt in (CHARS_PER_TOKEN_BOUND // 2, CHARS_PER_TOKEN_BOUND):
        s_hi = min(len(text), offset + max(s_budget, 1) * cpt)
        raw = text[offset:s_hi]
        nl = raw.find("\n")
        rest_part = raw if nl < 0 else raw[: nl + 1]
        below = _lines_keepends(raw[nl + 1:]) if nl >= 0 else []
        if s_hi < len(text) and below and not below[-1].endswith("\n"):
            below = below[:-1]  # the window's last line may end mid-line: drop it
        suffix, suffix_ids = _take_lines(rest_part, below, s_budget, encode_batch, reverse=False)
        if s_hi == len(text) or len(suffix) < len(rest_part) + sum(map(len, below)):
            break

    # -- the cursor line and what follows it, for post-processing (bounded)
    lo = max(0, offset - LINE_WINDOW_CHARS)
    before = text[lo:offset]
    line_prefix = before[before.rfind("\n") + 1:]
    after = text[offset: offset + LINE_WINDOW_CHARS]
    nl = after.find("\n")
    line_suffix = (after if nl < 0 else after[:nl]).rstrip("\r")
    after_line = suffix[len(rest_part):] if len(suffix) >= len(rest_part) else ""

    return FimContext(
        prefix=prefix,
        suffix=suffix,
        prefix_ids=list(prefix_ids),
        suffix_ids=list(suffix_ids),
        line_prefix=line_prefix,
        line_suffix=line_suffix,
        after_line=after_line,
        prefix_start=prefix_start,
        suffix_end=offset + len(suffix),
        header_tokens=len(header_ids) if header else 0,
        header_chars=len(header),
        language=language,
        extra_paths=used_paths,
        path=path,
    )
