"""The tree-sitter parser layer (lsp_server/text/treesitter.py): grammars load offline,
incremental trees across keystrokes, the multi-line policy (the guard: test_treesitter_guard.py).

Skipped, with the reason, only where the ``tree-sitter`` package (or one grammar wheel) is not
installed; the import-safety test below runs everywhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from diffill.lsp_server.text import languages, treesitter
from diffill.lsp_server.text.syntax import SyntaxGuard
from support.fixed_backend import FixedBackend
from support.grammars import at_cursor, need_grammar, needs_ts


def test_language_ids_and_extensions():
    need_grammar("typescript")
    assert treesitter.language_for("typescriptreact").name == "tsx"
    assert treesitter.language_for(None, "/x/y.tsx").name == "tsx"
    assert treesitter.language_for(None, "/x/y.go").name == "go"
    assert treesitter.language_for("shellscript").name == "bash"
    assert treesitter.language_for("python") is None  # Python: ast judges it
    assert treesitter.language_for("kotlin") is None  # no grammar: text rules
    assert SyntaxGuard("x", 0, language="kotlin").tree_guard is None


@needs_ts
def test_every_grammar_of_the_table_loads():
    missing = [n for n in languages.GRAMMAR_LANGUAGES if treesitter.grammar(n) is None]
    if missing:
        pytest.skip(f"grammar wheels not installed: {missing}")
    assert set(treesitter.supported()) == set(languages.GRAMMAR_LANGUAGES)
    for need in ("python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp",
                 "csharp", "ruby", "php", "lua", "bash"):
        assert need in treesitter.supported()


@needs_ts
def test_python_keeps_the_ast_path():
    text = "def f(x):\n    y = 1\n    \n    return y\n"
    off = text.index("    \n") + 4
    g = SyntaxGuard(text, off, language="python", path="/t/a.py")
    assert g.tree_guard is None and g.applies
    assert g.keeps("z = y") and not g.keeps("z = (y") and g.keeps("if y:")


@needs_ts
def test_incremental_tree_equals_a_fresh_parse():
    need_grammar("go")
    key = "/t/incremental.go"
    text = "package main\n\nfunc main() {\n\tx := 1\n\tprintln(x)\n}\n"
    treesitter.document_tree("go", key, text.encode())
    for edit in ("\ty := 2\n", "\tif x > 0 {\n", "\t}\n", "func g() {}\n"):
        at = text.index("\tprintln")
        text = text[:at] + edit + text[at:]
        inc = treesitter.document_tree("go", key, text.encode())
        fresh = treesitter.parse("go", text.encode())
        assert str(inc.root_node) == str(fresh.root_node)
        assert inc.root_node.has_error == fresh.root_node.has_error


def test_import_safe_without_tree_sitter():
    """With tree-sitter absent, the server side imports and every other language gets the text
    rules only (nothing dropped), the table still answers."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "tree_sitter" or name.startswith("tree_sitter"):
                    raise ImportError("blocked by the test")
        sys.meta_path.insert(0, Block())
        from diffill.lsp_server.text import languages, treesitter
        from diffill.lsp_server.text.syntax import SyntaxGuard
        assert not treesitter.available() and treesitter.supported() == ()
        g = SyntaxGuard("func main() {\\n\\t\\n}\\n", 14, language="go")
        assert g.tree_guard is None and g.keeps("}}}")
        assert languages.comment_prefix("go") == "//"
        assert SyntaxGuard("x = 1\\n", 6, language="python").keeps("(")  is False
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


OFFLINE = r"""
import sys
BLOCK = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
         "socket.getnameinfo", "socket.sendto", "socket.sendmsg", "socket.bind", "http.client.connect",
         "urllib.Request"}
def guard(event, args):
    if event in BLOCK:
        raise PermissionError(f"network access refused by the test guard: {event}")
sys.addaudithook(guard)
from diffill.lsp_server.text import languages, treesitter
from diffill.lsp_server.text.syntax import SyntaxGuard
samples = {
    "python": "def f():\n    return 1\n", "javascript": "function f() { return 1; }\n",
    "typescript": "function f(): number { return 1; }\n", "tsx": "const a = <div>{1}</div>;\n",
    "go": "package main\nfunc f() int { return 1 }\n", "rust": "fn f() -> i32 { 1 }\n",
    "java": "class A { int f() { return 1; } }\n", "c": "int f(void) { return 1; }\n",
    "cpp": "namespace n { int f() { return 1; } }\n", "csharp": "class A { int F() { return 1; } }\n",
    "ruby": "def f\n  1\nend\n", "php": "<?php\nfunction f() { return 1; }\n",
    "lua": "local function f() return 1 end\n", "bash": "f() { echo 1; }\n",
}
loaded = []
for name in languages.GRAMMAR_LANGUAGES:
    if treesitter.grammar(name) is None:
        continue
    tree = treesitter.parse(name, samples[name].encode())
    assert not tree.root_node.has_error, name
    text = samples[name]
    g = SyntaxGuard(text, len(text), language=name, path="/t/offline")
    assert g.keeps("\n") is True
    loaded.append(name)
print(",".join(loaded))
"""


@needs_ts
def test_every_language_parses_with_all_network_refused():
    """Grammars come from their wheels: loading and parsing every supported language with every
    socket connection, DNS lookup and HTTP request refused (an audit hook, fresh interpreter)."""
    out = subprocess.run([sys.executable, "-P", "-c", OFFLINE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.strip().split(",")) == set(treesitter.supported())


# -- the multi-line policy and the scope cut, through the Completer ----------------------------

POLICY = [
    ("typescript", "function f() {|}\n", True),  # an empty block body
    ("typescript", "function f() {|\n}\n", True),  # the end of a block opener
    ("typescript", "function f() {\n  |\n}\n", True),  # the line after it
    ("typescript", "function f() {\n  foo(a, |\n}\n", False),  # an argument list
    ("typescript", "function f() {\n  const x = a +|\n}\n", False),  # an expression
    ("typescript", "function f() {\n  const x = 1;\n  |\n}\n", None),  # the text rule
    ("go", "package main\n\nfunc f() {\n\tx := g(|)\n}\n", False),
    ("go", "package main\n\nfunc f() {\n\tif x > 0 {|}\n}\n", True),
    ("rust", "fn main() {\n    let v = vec![1, |];\n}\n", False),
    ("ruby", "def f(a)\n  |\nend\n", True),
    ("lua", "if x then\n  |\nend\n", True),
    ("typescript", 'const s = "(|";\n', None),  # in a string: the text rule
    ("python", "def f():\n    |\n", None),  # Python: its text rule, unchanged
]


@pytest.mark.parametrize("lang,buf,want", POLICY)
def test_multiline_policy_from_the_tree(lang, buf, want):
    need_grammar(lang)
    text, off = at_cursor(buf)
    assert treesitter.multiline_at(text, off, lang, f"/t/policy.{lang}") is want


def _complete(answers, buf, lang):
    from diffill.lsp_server.completion.completer import Completer, options_from_kwargs

    text, off = at_cursor(buf)
    c = Completer(FixedBackend(answers), options_from_kwargs(drafts=False))
    return c.complete(text, off, n=3, language=lang, path=f"/t/complete.{lang}")


def test_completer_empty_body_gets_lines_and_replaces_the_closer():
    need_grammar("typescript")
    got = _complete(["\n  return a + 1;\n}"], "function f(a: number) {|}\n", "typescript")
    assert [(s.text, s.replace_right) for s in got] == [("\n  return a + 1;\n}", 1)]


def test_completer_argument_list_gets_one_line():
    need_grammar("go")
    got = _complete(["a, b\n\tx := 2"], "package main\n\nfunc f() {\n\tg(|\n}\n", "go")
    assert [s.text for s in got] == ["a, b"]


def test_completer_cuts_where_the_suggestion_leaves_the_block_and_guards_go():
    need_grammar("go")
    buf = "package main\n\nfunc f() int {\n\tx := 1\n\t|\n}\n"
    answers = ["y := (x + 1", "return x + 1\n}\n\nfunc g() {\n\tprintln(1)"]
    got = _complete(answers, buf, "go")
    assert [s.text for s in got] == ["return x + 1"]  # cut before the function's closer; the broken one withheld


def test_python_path_unchanged_by_the_layer():
    """Python: the ast guard, the text multi-line rule, no scope cut, the old auto-closed set
    (what the held-out Python evaluation measured before the layer)."""
    from diffill.lsp_server.text.postprocess import AUTO_CLOSED, postprocess

    buf = "def f(xs):\n    total = [\n        1,\n        |\n"
    text, off = at_cursor(buf)
    assert treesitter.multiline_at(text, off, "python", "/t/p.py") is None
    assert SyntaxGuard(text, off, language="python").tree_guard is None
    got = _complete(["2,\n    ]\n    return total"], buf, "python")
    want = postprocess("2,\n    ]\n    return total", line_prefix="        ", line_suffix="",
                       prefix=text[:off], auto_closed=AUTO_CLOSED)
    assert [s.text for s in got] == [want.text]  # a closer on a continuation line is not cut
