"""The one table of per-language facts: LSP language ids and file extensions, the line-comment
marker (the context header's ``path:`` lines), the tree-sitter grammar (the syntax guard and
the multi-line policy for languages other than Python, :mod:`.treesitter`), what opens a
block at the end of a line, what closes one, and the characters editors auto-close.

A language without a grammar here (or whose grammar wheel is not installed) gets the text
rules only. Python is listed with its grammar too, but the syntax guard judges Python with
``ast`` (:mod:`.syntax`, the reference); the grammar serves the multi-line policy only where
the caller asks for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BRACE_PAIRS = ("()", "[]", "{}", '""', "''")
_BRACE_OPENER = re.compile(
    r"(\)|=>|\b(else|try|do|finally|loop|unsafe|async|move)|[=:(,\[]\s*[\w.:<>\[\]*&]*"
    r"|\breturn\s+[\w.:<>\[\]*&]*)\s*\{\s*$"
    r"|^\s*(\}\s*)?(\w+\s+){0,6}?(class|struct|enum|interface|namespace|impl|trait|mod|fn|func|function|type|"
    r"union|if|for|while|switch|match|select|module|object|record|extern)\b.*\{\s*$")
"""A line ending with ``{`` after a block header: a condition or parameter list, an arrow,
``else``/``try``/``do``..., a statement or declaration keyword (``if``, ``for``, ``class``,
``fn``...), or an
assignment or argument (a literal spread over lines); not after a comment or a bare name."""


@dataclass(frozen=True)
class Language:
    """One language. ``grammar``: (module, function) of the tree-sitter grammar wheel whose
    function returns the language pointer, or None. ``wrap``: text put before a segment
    parsed on its own (PHP's ``<?php``). ``opens``: a regular expression matched against the
    end of a line that opens a block with no body yet; ``closers``: what ends such a block
    (tried in order by the syntax guard's block-opener rule; brackets left open are closed by
    their own closers first). ``pairs``: opener+closer pairs editors auto-close. ``keywords``:
    reserved words the grammar reads as a plain name where the language's own parser rejects
    them (tree-sitter-ruby parses a stray ``end`` as a method call, with no error): the syntax
    guard counts such a name as an error (:func:`.treesitter_guard.strays`)."""

    name: str
    ids: tuple[str, ...]
    exts: tuple[str, ...]
    comment: str
    grammar: tuple[str, str] | None = None
    opens: re.Pattern[str] = _BRACE_OPENER
    closers: tuple[str, ...] = ()
    pairs: tuple[str, ...] = BRACE_PAIRS
    wrap: str = ""
    keywords: tuple[str, ...] = ()


_JS_PAIRS = (*BRACE_PAIRS, "``")

LANGUAGES: tuple[Language, ...] = (
    Language("python", ("python",), ("py", "pyi", "pyw"), "#", ("tree_sitter_python", "language"),
             opens=re.compile(r":\s*(#.*)?$"), closers=("pass",), pairs=BRACE_PAIRS),
    Language("javascript", ("javascript", "javascriptreact", "jsx", "js"), ("js", "jsx", "mjs", "cjs"), "//",
             ("tree_sitter_javascript", "language"), pairs=_JS_PAIRS),
    Language("typescript", ("typescript", "ts"), ("ts", "mts", "cts"), "//",
             ("tree_sitter_typescript", "language_typescript"), pairs=_JS_PAIRS),
    Language("tsx", ("typescriptreact", "tsx"), ("tsx",), "//",
             ("tree_sitter_typescript", "language_tsx"), pairs=_JS_PAIRS),
    Language("go", ("go",), ("go",), "//", ("tree_sitter_go", "language"),
             pairs=(*BRACE_PAIRS, "``")),
    Language("rust", ("rust", "rs"), ("rs",), "//", ("tree_sitter_rust", "language"),
             pairs=("()", "[]", "{}", '""')),
    Language("java", ("java",), ("java",), "//", ("tree_sitter_java", "language")),
    Language("c", ("c",), ("c", "h"), "//", ("tree_sitter_c", "language")),
    Language("cpp", ("cpp", "c++", "cuda-cpp"), ("cc", "cpp", "cxx", "c++", "hpp", "hh", "hxx", "cu"),
             "//", ("tree_sitter_cpp", "language")),
    Language("csharp", ("csharp", "c#", "cs"), ("cs",), "//", ("tree_sitter_c_sharp", "language")),
    Language("ruby", ("ruby", "rb"), ("rb", "rake", "gemspec"), "#", ("tree_sitter_ruby", "language"),
             opens=re.compile(r"(\bdo(\s*\|[^|]*\|)?|\{(\s*\|[^|]*\|)?|^\s*(def|class|module|if|unless|"
                              r"while|until|case|begin|for)\b.*)\s*$"),
             closers=("end", "}"),
             keywords=("end", "else", "elsif", "when", "rescue", "ensure", "then", "do", "in")),
    Language("php", ("php",), ("php", "phtml"), "//", ("tree_sitter_php", "language_php"),
             wrap="<?php\n"),
    Language("lua", ("lua",), ("lua",), "--", ("tree_sitter_lua", "language"),
             opens=re.compile(r"(\bthen|\bdo|\bfunction\b.*\)|\belse|\brepeat)\s*$"), closers=("end", "until x")),
    Language("bash", ("shellscript", "sh", "bash", "zsh"), ("sh", "bash", "zsh"), "#",
             ("tree_sitter_bash", "language"),
             opens=re.compile(r"(\bthen|\bdo|\belse|\{|\bin)\s*$"), closers=("fi", "done", "}", "esac")),
    # text rules only (no grammar wheel in the dependencies): the comment marker
    *(Language(n, (n,), exts, c) for n, exts, c in (
        ("perl", ("pl", "pm"), "#"), ("r", ("r",), "#"), ("yaml", ("yaml", "yml"), "#"),
        ("toml", ("toml",), "#"), ("makefile", ("mk",), "#"), ("dockerfile", (), "#"),
        ("elixir", ("ex", "exs"), "#"), ("julia", ("jl",), "#"), ("nim", ("nim",), "#"),
        ("powershell", ("ps1",), "#"), ("coffeescript", ("coffee",), "#"),
        ("swift", ("swift",), "//"), ("kotlin", ("kt", "kts"), "//"), ("scala", ("scala",), "//"),
        ("dart", ("dart",), "//"), ("objective-c", ("m",), "//"), ("zig", ("zig",), "//"),
        ("groovy", ("groovy",), "//"), ("jsonc", ("jsonc",), "//"), ("proto", ("proto",), "//"),
        ("sql", ("sql",), "--"), ("haskell", ("hs",), "--"), ("ada", ("adb", "ads"), "--"),
        ("elm", ("elm",), "--"), ("lisp", ("lisp",), ";;"), ("clojure", ("clj",), ";;"),
        ("scheme", ("scm",), ";;"), ("emacs-lisp", ("el",), ";;"), ("racket", ("rkt",), ";;"),
        ("commonlisp", (), ";;"), ("tex", ("tex",), "%"), ("latex", (), "%"),
        ("erlang", ("erl",), "%"), ("matlab", (), "%"), ("vim", ("vim",), '"'),
    )),
)

_BY_ID = {i: lang for lang in LANGUAGES for i in (lang.name, *lang.ids)}
_BY_EXT = {e: lang for lang in LANGUAGES for e in lang.exts}
GRAMMAR_LANGUAGES = tuple(lang.name for lang in LANGUAGES if lang.grammar)
"""Every language with a tree-sitter grammar in the table (Python's serves the policy only)."""


def lookup(language: str | None, path: str | None = None) -> Language | None:
    """The language of an LSP ``languageId`` (case-insensitive), else of the file's extension."""
    lang = _BY_ID.get((language or "").lower())
    if lang is None and path and "." in str(path).rsplit("/", 1)[-1]:
        lang = _BY_EXT.get(str(path).rsplit(".", 1)[-1].lower())
    return lang


def comment_prefix(language: str | None, path: str | None = None) -> str:
    """Line-comment marker for a language id or file extension ('#' when unknown)."""
    lang = lookup(language, path)
    return lang.comment if lang else "#"


def auto_closed(lang: Language) -> frozenset[str]:
    """The characters editors insert right of the cursor in this language (the closers of its
    pairs, and spaces between them): a suggestion ending with them replaces them."""
    return frozenset(p[1] for p in lang.pairs) | {" "}


def _scan(text: str, lang: Language) -> tuple[list[str], bool]:
    """``(closers, stray)``: the closers of the brackets ``text`` opens and leaves open, innermost
    last, and whether it closes a bracket it did not open or leaves a string open at a line's
    end (strings and line comments skipped, one line at a time, as in :mod:`.postprocess`;
    a backtick string may span lines)."""
    stack: list[str] = []
    closer_of = {p[0]: p[1] for p in ("()", "[]", "{}")}
    quote = None
    stray = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            if quote and quote != "`":
                stray, quote = True, None
        elif quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif text.startswith(lang.comment, i):
            j = text.find("\n", i)
            if j < 0:
                break
            i = j
            continue
        elif ch in closer_of:
            stack.append(closer_of[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
        elif ch in ")]}":
            stray = True
        i += 1
    return stack, stray or quote is not None


def unclosed(text: str, lang: Language) -> list[str]:
    """The closers of the brackets ``text`` opens and leaves open, innermost first (strings
    and line comments skipped, one line at a time, as in :mod:`.postprocess`)."""
    return _scan(text, lang)[0][::-1]


def balanced(text: str, lang: Language) -> bool:
    """Whether ``text`` closes every bracket it opens, no other, and every string it opens."""
    stack, stray = _scan(text, lang)
    return not stack and not stray
