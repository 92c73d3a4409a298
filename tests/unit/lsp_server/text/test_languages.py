"""The per-language table (lsp_server/text/languages.py): ids, extensions, comment markers, block
openers, the brackets a suggestion leaves open. No tree-sitter needed."""

from __future__ import annotations

import pytest
from diffill.lsp_server.text import languages
from diffill.lsp_server.text.context import comment_prefix

# the comment markers the context header used before the table (lsp_server/text/context.py)
BEFORE = {
    **dict.fromkeys(("python", "shellscript", "sh", "bash", "ruby", "perl", "r", "yaml", "toml",
                     "makefile", "dockerfile", "elixir", "julia", "nim", "powershell", "coffeescript"), "#"),
    **dict.fromkeys(("c", "cpp", "csharp", "java", "javascript", "javascriptreact", "typescript",
                     "typescriptreact", "go", "rust", "swift", "kotlin", "scala", "dart", "php",
                     "objective-c", "zig", "groovy", "jsonc", "proto"), "//"),
    **dict.fromkeys(("lua", "sql", "haskell", "ada", "elm"), "--"),
    **dict.fromkeys(("lisp", "clojure", "scheme", "emacs-lisp", "racket", "commonlisp"), ";;"),
    **dict.fromkeys(("tex", "latex", "erlang", "matlab"), "%"),
    "vim": '"',
}
EXT_BEFORE = {
    "py": "#", "sh": "#", "bash": "#", "rb": "#", "pl": "#", "yaml": "#", "yml": "#", "toml": "#",
    "c": "//", "h": "//", "cc": "//", "cpp": "//", "hpp": "//", "cs": "//", "java": "//", "js": "//",
    "jsx": "//", "mjs": "//", "ts": "//", "tsx": "//", "go": "//", "rs": "//", "swift": "//",
    "kt": "//", "scala": "//", "dart": "//", "php": "//", "lua": "--", "sql": "--", "hs": "--",
    "el": ";;", "clj": ";;", "lisp": ";;", "scm": ";;", "tex": "%", "erl": "%", "vim": '"',
    "zig": "//", "jl": "#", "r": "#", "ex": "#", "exs": "#",
}


@pytest.mark.parametrize("lang", sorted(BEFORE))
def test_comment_marker_per_language_id_unchanged(lang):
    assert comment_prefix(lang) == BEFORE[lang]
    assert comment_prefix(lang.upper()) == BEFORE[lang]


def test_comment_marker_per_extension_unchanged():
    for ext, marker in EXT_BEFORE.items():
        assert comment_prefix(None, f"/src/file.{ext}") == marker, ext
    assert comment_prefix(None, None) == "#" and comment_prefix("nope", "/x/Makefile") == "#"


def test_lookup_by_id_then_extension():
    assert languages.lookup("typescriptreact").name == "tsx"
    assert languages.lookup("javascriptreact").name == "javascript"
    assert languages.lookup("shellscript").name == "bash"
    assert languages.lookup(None, "/a/b.tsx").name == "tsx"
    assert languages.lookup("plaintext", "/a/b.go").name == "go"  # unknown id: the extension
    assert languages.lookup(None, "/a.b/README") is None


def test_the_covered_languages_have_grammars():
    need = {"python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp", "csharp",
            "ruby", "php", "lua", "bash"}
    assert need <= set(languages.GRAMMAR_LANGUAGES)


def test_block_openers():
    go = languages.lookup("go")
    assert go.opens.search("\tif x > 0 {") and go.opens.search("func main() {")
    assert not go.opens.search("\tx := f();{") and not go.opens.search("{")
    rb = languages.lookup("ruby")
    assert rb.opens.search("  items.each do |x|") and rb.opens.search("  def f(a)")
    assert not rb.opens.search("  x = 1")
    lua = languages.lookup("lua")
    assert lua.opens.search("if x then") and lua.opens.search("local function f(a)")
    sh = languages.lookup("bash")
    assert sh.opens.search("if [ -f x ]; then") and sh.opens.search("for f in *; do")


def test_unclosed_brackets_innermost_first():
    js = languages.lookup("javascript")
    assert languages.unclosed("describe('x', () => {", js) == ["}", ")"]
    assert languages.unclosed("f(a) { g('{'); // {", js) == ["}"]  # strings, comments skipped
    assert languages.unclosed("x = [1, 2]", js) == []


def test_balanced_closes_what_it_opens_and_nothing_else():
    rs = languages.lookup("rust")
    assert languages.balanced("0xFF, 0x2", rs) and languages.balanced('f("(", [1])', rs)
    for text in ("f(a", "a)", "[1)", 'x = "ab', "(\n", "a // )\n)"):
        assert not languages.balanced(text, rs), text
    assert languages.balanced("a // (", rs)  # a comment
