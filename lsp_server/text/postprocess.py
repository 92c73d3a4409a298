"""Turn a raw model middle into what the editor should insert. Pure functions.

Rules, applied in this order by :func:`postprocess`:

1. newlines normalised, trailing whitespace stripped on every line, trailing
   blank lines dropped; a middle that decodes to a broken character (U+FFFD, a
   multi-byte character cut by the hole's end) loses it when trailing and is
   dropped otherwise;
2. line policy: mid-line -> one line (cut at the first newline); at the end of
   the line -> several lines allowed (``auto``; or ``always-single`` /
   ``always-multi``);
3. indentation: when the cursor line holds only indentation, the suggestion's
   own leading indentation on its first line is dropped (it would double);
   continuation lines use the document's indent character (tabs vs spaces);
   a multi-line suggestion stops at the first line that dedents below the
   cursor line (it left the block), unless that line starts with a closer;
4. no repetition of what follows: a multi-line suggestion stops before a line
   equal to the next non-blank line after the cursor line; a suggestion that
   ends with the beginning of the rest of the cursor line loses that tail --
   unless the tail is only auto-closed characters (``)]}"'`` ...), in which case
   it is kept and the edit range extends over them (``replace_right``), so they
   are replaced, not duplicated;
5. brackets: scanning with the openers left open by the prefix, the suggestion
   stops before a closer that has no matching opener, and before a closer that
   would take an opener the rest of the line still closes; with ``scope`` (the
   languages of :mod:`.languages` other than Python), it also stops where it
   would leave the enclosing block: before the line of a closer that takes an
   opener left open before the cursor's line (it closes more than the cursor's
   line opened; on the cursor's line itself, before that closer);
6. empty or whitespace-only results are dropped (``None``).

Bracket and quote scanning is line-based and approximate (strings on one line,
line comments in the language's syntax), good for the decision it serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}
AUTO_CLOSED = frozenset(")]}>\"'` ")
"""Characters editors insert automatically right of the cursor (plus spaces between them)."""
QUOTES = "\"'`"

MULTILINE_POLICIES = ("auto", "always-single", "always-multi")


@dataclass(frozen=True)
class Processed:
    """``text`` replaces the range [cursor, cursor + replace_right) of the cursor line."""

    text: str
    replace_right: int = 0


# ----------------------------------------------------------------------------- helpers


def allow_multiline(policy: str, line_suffix: str) -> bool:
    """Whether a suggestion may span several lines under ``policy`` ("auto": only at
    the end of the line, i.e. nothing but whitespace right of the cursor)."""
    if policy == "always-single":
        return False
    if policy == "always-multi":
        return True
    if policy != "auto":
        raise ValueError(f"multiline policy must be one of {MULTILINE_POLICIES}, got {policy!r}")
    return not line_suffix.strip()


def strip_trailing_whitespace(text: str) -> str:
    """Normalise newlines, strip each line's trailing whitespace and trailing blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def leading_ws(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_width(ws: str, tab: int = 4) -> int:
    return sum(tab if c == "\t" else 1 for c in ws)


def detect_indent(line_prefix: str, prefix: str) -> tuple[str, int]:
    """The document's indentation: ('\\t' | ' ', unit width). From the cursor line,
    else from the prefix's indented lines; default 4 spaces."""
    ws = leading_ws(line_prefix)
    if "\t" in ws:
        return "\t", 4
    widths = []
    uses_tab = False
    for line in prefix.split("\n")[-200:]:
        lw = leading_ws(line)
        if lw and line.strip():
            if lw.startswith("\t"):
                uses_tab = True
            else:
                widths.append(len(lw))
    if uses_tab and not widths and not ws:
        return "\t", 4
    unit = min((w for w in widths if w > 0), default=4)
    return " ", unit if unit in (2, 3, 4, 8) else 4


def reindent(text: str, char: str, unit: int) -> str:
    """Continuation lines (not the first) re-expressed in the document's indent char."""
    lines = text.split("\n")
    out = [lines[0]]
    for line in lines[1:]:
        ws = leading_ws(line)
        body = line[len(ws):]
        if char == "\t" and " " in ws:
            width = indent_width(ws, unit)
            ws = "\t" * (width // unit) + " " * (width % unit)
        elif char == " " and "\t" in ws:
            ws = ws.replace("\t", " " * unit)
        out.append(ws + body)
    return "\n".join(out)


def cut_at_dedent(text: str, line_prefix: str) -> str:
    """Stop a multi-line suggestion at the first non-blank continuation line indented
    less than the cursor line (it has left the cursor's block), unless the line starts
    with a closing bracket (it closes something the suggestion may have opened)."""
    base = indent_width(leading_ws(line_prefix))
    if base == 0:
        return text
    lines = text.split("\n")
    for i in range(1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        if indent_width(leading_ws(line)) < base and line.lstrip()[0] not in CLOSERS:
            return "\n".join(lines[:i]).rstrip()
    return text


def cut_repeated_line(text: str, after_line: str) -> str:
    """Stop before a continuation line equal to the next non-blank line that already
    follows the cursor line (the suggestion would repeat it)."""
    nxt = next((ln.rstrip() for ln in after_line.split("\n") if ln.strip()), None)
    if nxt is None:
        return text
    lines = text.split("\n")
    for i in range(1, len(lines)):
        if lines[i].rstrip() == nxt:
            return "\n".join(lines[:i]).rstrip()
    return text


def suffix_overlap(text: str, line_suffix: str) -> int:
    """Length k of the longest ``line_suffix[:k]`` that ``text`` ends with.

    A single identifier character is not taken as overlap (too likely a coincidence);
    any longer overlap, or a single non-identifier character (``)``, ``"``), is.
    """
    for k in range(min(len(text), len(line_suffix)), 0, -1):
        head = line_suffix[:k]
        if not head.strip():
            continue
        if text.endswith(head):
            if k == 1 and (head.isalnum() or head == "_"):
                return 0
            return k
    return 0


class BracketScanner:
    """Line-based bracket scanner that skips string literals and line comments."""

    def __init__(self, comment: str = "#") -> None:
        self.comment = comment
        self.stack: list[str] = []
        self.quote: str | None = None

    def newline(self) -> None:
        if self.quote != "`":  # template literals span lines; other strings do not
            self.quote = None

    def feed(self, text: str, on_closer=None) -> int | None:
        """Scan ``text``. For each closer outside strings call ``on_closer(scanner, ch, i)``;
        if it returns True the scan stops and ``i`` is returned. Returns None otherwise."""
        i, n = 0, len(text)
        cm = self.comment
        while i < n:
            ch = text[i]
            if ch == "\n":
                self.newline()
            elif self.quote is not None:
                if ch == "\\":
                    i += 1
                elif ch == self.quote:
                    self.quote = None
            elif ch in QUOTES:
                self.quote = ch
            elif cm and text.startswith(cm, i):
                j = text.find("\n", i)
                if j < 0:
                    return None
                i = j
                continue
            elif ch in OPENERS:
                self.stack.append(ch)
            elif ch in CLOSERS:
                if on_closer is not None and on_closer(self, ch, i):
                    return i
                if self.stack and self.stack[-1] == CLOSERS[ch]:
                    self.stack.pop()
            i += 1
        return None


def open_brackets(prefix: str, comment: str = "#") -> BracketScanner:
    """Scanner state after the prefix: openers still open, quote state at the cursor."""
    sc = BracketScanner(comment)
    sc.feed(prefix)
    return sc


def closes_count(stack: Sequence[str], rest: str, quote: str | None, comment: str) -> int:
    """How many openers at the top of ``stack`` the text ``rest`` closes (in order)."""
    sc = BracketScanner(comment)
    sc.stack = list(stack)
    sc.quote = quote
    depth0 = len(stack)
    low = depth0

    def watch(s: BracketScanner, ch: str, i: int) -> bool:
        nonlocal low
        if s.stack and s.stack[-1] == CLOSERS[ch]:
            low = min(low, len(s.stack) - 1)
        return False

    sc.feed(rest, watch)
    return depth0 - low


def first_unbalanced(
    text: str, stack: Sequence[str], quote: str | None, comment: str, *, reserved: int
) -> int | None:
    """Index of the first closer in ``text`` that has no matching opener, or that would
    close an opener of the prefix (``stack``) while the rest of the line still closes
    ``reserved`` > 0 of them (they are needed there, innermost first)."""
    sc = BracketScanner(comment)
    sc.stack = list(stack)
    sc.quote = quote
    from_prefix = len(stack)  # stack entries [0, from_prefix) came from the prefix

    def check(s: BracketScanner, ch: str, i: int) -> bool:
        nonlocal from_prefix
        if not s.stack or s.stack[-1] != CLOSERS[ch]:
            return True
        if len(s.stack) <= from_prefix:  # would close a prefix opener
            if reserved > 0:
                return True
            from_prefix -= 1
        return False

    return sc.feed(text, check)


def cut_at_scope(text: str, prefix: str, comment: str) -> str:
    """Stop before a closer that takes an opener left open before the cursor's line (the
    suggestion would leave the enclosing block): before its line when that is a continuation
    line, else before the closer."""
    line_start = prefix.rfind("\n") + 1
    floor = len(open_brackets(prefix[:line_start], comment).stack)
    base = open_brackets(prefix, comment)
    sc = BracketScanner(comment)
    sc.stack, sc.quote = list(base.stack), base.quote

    def leaves(s: BracketScanner, ch: str, i: int) -> bool:
        return bool(s.stack) and s.stack[-1] == CLOSERS[ch] and len(s.stack) <= floor

    cut = sc.feed(text, leaves)
    if cut is None:
        return text
    ls = text.rfind("\n", 0, cut) + 1
    return (text[:ls] if ls else text[:cut]).rstrip()


def balance_and_overlap(
    text: str, line_suffix: str, prefix: str, comment: str,
    auto_closed: frozenset[str] = AUTO_CLOSED,
) -> tuple[str, int]:
    """Rules 4 (same-line overlap) and 5 (brackets), iterated until stable.

    Returns (text, k): the tail ``line_suffix[:k]`` that ``text`` reproduces (k > 0 only
    when it is auto-closed characters, kept in ``text`` and replaced in the buffer)."""
    base = open_brackets(prefix, comment)
    while True:
        k = suffix_overlap(text, line_suffix)
        if k and not set(line_suffix[:k]) <= auto_closed:
            text = text[:-k].rstrip()  # tail repeats real text that follows: cut it
            continue
        reserved = closes_count(base.stack, line_suffix[k:], base.quote, comment)
        cut = first_unbalanced(text, base.stack, base.quote, comment, reserved=reserved)
        if cut is None:
            return text, k
        text = text[:cut].rstrip()


# ----------------------------------------------------------------------------- pipeline


def postprocess(
    raw: str,
    *,
    line_prefix: str,
    line_suffix: str,
    after_line: str = "",
    prefix: str = "",
    multiline: bool | None = None,
    policy: str = "auto",
    comment: str = "#",
    eol: str = "\n",
    scope: bool = False,
    auto_closed: frozenset[str] = AUTO_CLOSED,
) -> Processed | None:
    """Apply every rule (module doc) to a raw middle. ``prefix`` is the text before the
    cursor (the context window, for brackets and indentation); ``multiline`` overrides
    ``policy`` when given; ``scope``: the scope cut of rule 5; ``auto_closed``: the
    characters the editor closes by itself in this language (rule 4). Returns None when
    nothing useful is left."""
    text = strip_trailing_whitespace(raw.rstrip("\ufffd"))
    if "\ufffd" in text:
        return None
    multi = allow_multiline(policy, line_suffix) if multiline is None else multiline
    if not multi:
        text = first_line(text).rstrip()
    if line_prefix and not line_prefix.strip():
        lines = text.split("\n")
        lines[0] = lines[0].lstrip(" \t")
        text = "\n".join(lines)
    if "\n" in text:
        char, unit = detect_indent(line_prefix, prefix)
        text = reindent(text, char, unit)
        text = cut_at_dedent(text, line_prefix)
        text = cut_repeated_line(text, after_line)
    if scope:
        text = cut_at_scope(text, prefix, comment)
    text, k = balance_and_overlap(text, line_suffix, prefix, comment, auto_closed)
    text = strip_trailing_whitespace(text)
    if not text.strip():
        return None
    if k and not text.endswith(line_suffix[:k]):  # stripping removed part of the tail
        k = 0
    if eol != "\n":
        text = text.replace("\n", eol)
    return Processed(text=text, replace_right=k)


def dedupe(items: Sequence[Processed]) -> list[Processed]:
    """Drop repeated texts, keeping the first (best) occurrence."""
    seen: set[str] = set()
    out = []
    for it in items:
        if it.text not in seen:
            seen.add(it.text)
            out.append(it)
    return out
