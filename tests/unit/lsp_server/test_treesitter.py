"""The tree-sitter parser layer (lsp_server/treesitter.py): grammars load offline, the syntax
guard for every covered language, incremental trees across keystrokes, the multi-line policy.

Skipped, with the reason, only where the ``tree-sitter`` package (or one grammar wheel) is not
installed; the import-safety test below runs everywhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from diffill.lsp_server import languages, treesitter
from diffill.lsp_server.syntax import SyntaxGuard

needs_ts = pytest.mark.skipif(not treesitter.available(),
                              reason="the tree-sitter package is not installed (text rules only)")


def _need(lang: str) -> None:
    if not treesitter.available():
        pytest.skip("the tree-sitter package is not installed (text rules only)")
    if treesitter.grammar(lang) is None:
        mod = languages.lookup(lang).grammar[0].replace("_", "-")
        pytest.skip(f"the grammar wheel {mod} is not installed")


# (language, buffer with | at the cursor, a good suggestion, breaking suggestions, a block opener)
CASES = [
    ("javascript", "function f(a) {\n  const b = a * 2;\n  |\n  return b;\n}\n",
     "const c = b + 1;", ["const c = (b + 1;", "}", "const c = b]"], "if (b > 2) {"),
    ("typescript", "function f(a: number): number {\n  const b = a * 2;\n  |\n  return b;\n}\n",
     "const c: number = b + 1;", ["const c = (b + 1;", "}", "}}"], "for (const x of [b]) {"),
    ("tsx", "export function App(): JSX.Element {\n  const n = 1;\n  |\n  return <div>{n}</div>;\n}\n",
     "const m = n + 1;", ["const m = (n + 1;", "}"], "if (n > 0) {"),
    ("go", "package main\n\nfunc main() {\n\tx := 1\n\t|\n\tprintln(x)\n}\n",
     "y := x + 1", ["y := (x + 1", "}", "y := x]"], "if x > 0 {"),
    ("rust", "fn main() {\n    let x = 1;\n    |\n    println!(\"{}\", x);\n}\n",
     "let y = x + 1;", ["let y = (x + 1;", "}", "let y = x];"], "if x > 0 {"),
    ("java", "class A {\n  int f(int a) {\n    int b = a * 2;\n    |\n    return b;\n  }\n}\n",
     "int c = b + 1;", ["int c = (b + 1;", "}", "int c = b];"], "if (b > 2) {"),
    ("c", "int f(int a) {\n  int b = a * 2;\n  |\n  return b;\n}\n",
     "int c = b + 1;", ["int c = (b + 1;", "}", "int c = b];"], "if (b > 2) {"),
    ("cpp", "namespace n {\nint f(int a) {\n  auto b = a * 2;\n  |\n  return b;\n}\n}\n",
     "auto c = b + 1;", ["auto c = (b + 1;", "}}", "auto c = b];"], "for (int i = 0; i < b; ++i) {"),
    ("csharp", "class A {\n  int F(int a) {\n    var b = a * 2;\n    |\n    return b;\n  }\n}\n",
     "var c = b + 1;", ["var c = (b + 1;", "}", "var c = b];"], "if (b > 2) {"),
    ("ruby", "class A\n  def f(a)\n    b = a * 2\n    |\n    b\n  end\nend\n",
     "c = b + 1", ["c = (b + 1", "c = [b", "c = b]", "end", "c = 1\n    end"], "if b > 2"),
    # (a stray `end` parses as a name with tree-sitter-ruby: the table's keywords catch it)
    ("php", "<?php\nfunction f($a) {\n  $b = $a * 2;\n  |\n  return $b;\n}\n",
     "$c = $b + 1;", ["$c = ($b + 1;", "}", "$c = $b];"], "if ($b > 2) {"),
    ("lua", "local function f(a)\n  local b = a * 2\n  |\n  return b\nend\n",
     "local c = b + 1", ["local c = (b + 1", "end", "local c = b]"], "if b > 2 then"),
    ("bash", "f() {\n  local b=$1\n  |\n  echo \"$b\"\n}\n",
     "echo \"$b\" >&2", ["echo $(date", "echo \"x", ")"], "if [ \"$b\" = x ]; then"),
    # (a stray `}`, `fi` or `done` parses with tree-sitter-bash: the grammar is lenient there)
]
IDS = [c[0] for c in CASES]


def _at(buf: str) -> tuple[str, int]:
    return buf.replace("|", "", 1), buf.index("|")


@pytest.mark.parametrize("lang,buf,good,bads,opener", CASES, ids=IDS)
def test_guard_keeps_good_drops_breaking_keeps_block_opener(lang, buf, good, bads, opener):
    _need(lang)
    text, off = _at(buf)
    g = SyntaxGuard(text, off, language=lang, path=f"/t/a.{lang}")
    assert g.tree_guard is not None and g.tree_guard.clean
    assert g.keeps(good) and g.keeps_whole(good)
    for bad in bads:
        assert not g.keeps(bad), bad
        assert not g.keeps_whole(bad), bad
    assert g.keeps(opener), opener  # a block started on purpose, no body yet
    assert g.keeps(good + "\n" + text[text.rfind("\n", 0, off) + 1:off] + opener)


@pytest.mark.parametrize("lang,buf,good,bads,opener", CASES, ids=IDS)
def test_mid_typing_buffer_keeps_working(lang, buf, good, bads, opener):
    """The code around the cursor has an error already (the user is typing): nothing to
    protect, suggestions are kept as for Python."""
    _need(lang)
    text, off = _at(buf)
    typed = "zz = ("  # an unclosed bracket the user is typing
    broken = text[:off] + typed + text[off:]
    g = SyntaxGuard(broken, off + len(typed), language=lang, path=f"/t/b.{lang}")
    assert not g.tree_guard.clean
    assert g.keeps("1") and g.keeps("1)") and g.keeps("1))")


def test_language_ids_and_extensions():
    _need("typescript")
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
    _need("go")
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


@needs_ts
def test_segment_rule_agrees_with_the_whole_buffer_rule():
    """On every line of a real-looking Go and TypeScript file, the candidates (the true line,
    and the line with a bracket dropped or added) get the same verdict from the segment rule
    as from re-parsing the whole buffer, but where tree-sitter's error recovery is more lenient
    in the whole file than in the segment (a rare stricter verdict); the true line always."""
    _need("go")
    _need("typescript")
    files = {
        "go": "package main\n\nimport \"fmt\"\n\ntype T struct {\n\tA int\n\tB []string\n}\n\n"
              "func (t *T) Sum(xs []int) int {\n\ts := 0\n\tfor _, x := range xs {\n\t\tif x > t.A {\n"
              "\t\t\ts += x\n\t\t}\n\t}\n\treturn s\n}\n\nfunc main() {\n\tt := &T{A: 1}\n"
              "\tfmt.Println(t.Sum([]int{1, 2, 3}))\n}\n",
        "typescript": "interface P { a: number; b: string[] }\n\nexport class C {\n  constructor(private p: P) {}\n"
                      "  sum(xs: number[]): number {\n    let s = 0;\n    for (const x of xs) {\n"
                      "      if (x > this.p.a) {\n        s += x;\n      }\n    }\n    return s;\n  }\n}\n\n"
                      "const c = new C({ a: 1, b: [] });\nconsole.log(c.sum([1, 2, 3]));\n",
    }
    verdicts = []
    for lang, text in files.items():
        start = 0
        for ln in text.split("\n"):
            body, c = ln.lstrip(), start + len(ln) - len(ln.lstrip())
            start += len(ln) + 1
            if not body:
                continue
            holed = text[:c] + text[c + len(body):]
            g1 = SyntaxGuard(holed, c, language=lang, path=f"/t/agree.{lang}")
            g2 = SyntaxGuard(holed, c, language=lang, path=f"/t/agree2.{lang}")
            assert g1.keeps(body) and g2.keeps_whole(body), (lang, ln)
            if not g2.tree_guard.clean:
                continue  # the whole-buffer rule keeps everything there (no baseline)
            for cand in {body + "(", body + "}", body.replace("(", "", 1), body.replace("{", "", 1)} - {body}:
                verdicts.append((g1.keeps(cand), g2.keeps_whole(cand), lang, cand))
    differ = [v for v in verdicts if v[0] != v[1]]
    assert len(differ) <= len(verdicts) // 20, differ
    assert all(not fast for fast, _, _, _ in differ), differ  # only ever stricter


def test_ruby_keywords_read_as_names_count_as_errors_but_method_names_do_not():
    """tree-sitter-ruby reads a stray ``end`` (``else``, ``rescue``...) as a method call with no
    error; ``ruby -c`` rejects it. A keyword read as a plain name is an error for the guard, a
    method called ``end`` on a receiver (``Range#end``, ``MatchData#end``) or defined so is not."""
    _need("ruby")
    text, off = _at("class A\n  def f(r, m)\n    b = 1\n    |\n    b\n  end\nend\n")
    g = SyntaxGuard(text, off, language="ruby", path="/t/kw.rb")
    for good in ("x = r.end", "y = m.end(0)", "h = {end: 1}", "s = :end", "z = r&.end", "w = m.end?"):
        assert g.keeps(good) and g.keeps_whole(good), good
    for bad in ("end", "x = 1\n    end", "a(end)", "x = [end]"):
        assert not g.keeps(bad) and not g.keeps_whole(bad), bad
    rb = languages.lookup("ruby")
    root = treesitter.parse("ruby", b"def end\n  1\nend\nx.end\n").root_node
    assert treesitter.strays(rb, root, b"def end\n  1\nend\nx.end\n", [(0, 22)]) == 0
    stray = b"def f\n  1\nend\nend\n"
    assert treesitter.strays(rb, treesitter.parse("ruby", stray).root_node, stray, [(0, len(stray))]) == 1


def test_buffer_broken_elsewhere_keeps_a_repair_and_drops_a_new_error_where_it_lands():
    """The hole broke the structure (a stray ``}``: the buffer has errors, every segment with
    the candidate fails): the true middle repairs it and is kept; one that repairs as much but
    leaves an error of its own where it lands is dropped (fewer errors, but a new one)."""
    _need("java")
    text, off = _at("class A {\n  void f(boolean c) {\n    if (c) |\n      g();\n    }\n    h();\n  }\n}\n")
    g = SyntaxGuard(text, off, language="java", path="/t/repair.java")
    assert not g.tree_guard.clean and g.tree_guard.segments(0)
    assert g.keeps("{") and g.keeps("{ // go")
    for bad in ("{(", "{[", "{ g("):
        assert not g.keeps(bad), bad


def test_balanced_edit_inside_a_long_literal_is_judged_not_over_budget():
    """A span typed inside a 25 KB table re-parses more than a candidate's budget: a balanced
    one gets its segment re-parsed as from scratch (kept), an unbalanced one stays broken."""
    _need("rust")
    rows = "".join("    " + ", ".join(f"0x{(i * 16 + k) * 37 % 256:02X}" for k in range(16)) + ",\n"
                   for i in range(250))
    data = "pub static T: [u8; 4000] = [\n" + rows + "];\n\nfn main() {}\n"
    off = data.index("0x", len(data) // 2)
    mid = data[off:off + 12]
    g = SyntaxGuard(data[:off] + data[off + 12:], off, language="rust", path="/t/table.rs")
    assert g.tree_guard.clean
    assert g.keeps(mid)
    for bad in ("(" + mid, mid + "]", mid[:5] + '"' + mid[5:]):
        assert not g.keeps(bad), bad


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
        from diffill.lsp_server import treesitter, languages
        from diffill.lsp_server.syntax import SyntaxGuard
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
from diffill.lsp_server import languages, treesitter
from diffill.lsp_server.syntax import SyntaxGuard
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
    _need(lang)
    text, off = _at(buf)
    assert treesitter.multiline_at(text, off, lang, f"/t/policy.{lang}") is want


class _Scripted:
    name = "scripted"

    def __init__(self, answers):
        self.answers = answers

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens):
        return None

    def infill(self, ctx, ask):
        from diffill.lsp_server.backends import Candidate, InfillResult

        return InfillResult([Candidate(text=t, score=-float(i)) for i, t in enumerate(self.answers)])

    def budget_ms(self, requested=None):
        return requested

    def describe(self):
        return {}


def _complete(answers, buf, lang):
    from diffill.lsp_server.completer import Completer, options_from_kwargs

    text, off = _at(buf)
    c = Completer(_Scripted(answers), options_from_kwargs(drafts=False))
    return c.complete(text, off, n=3, language=lang, path=f"/t/complete.{lang}")


def test_completer_empty_body_gets_lines_and_replaces_the_closer():
    _need("typescript")
    got = _complete(["\n  return a + 1;\n}"], "function f(a: number) {|}\n", "typescript")
    assert [(s.text, s.replace_right) for s in got] == [("\n  return a + 1;\n}", 1)]


def test_completer_argument_list_gets_one_line():
    _need("go")
    got = _complete(["a, b\n\tx := 2"], "package main\n\nfunc f() {\n\tg(|\n}\n", "go")
    assert [s.text for s in got] == ["a, b"]


def test_completer_cuts_where_the_suggestion_leaves_the_block_and_guards_go():
    _need("go")
    buf = "package main\n\nfunc f() int {\n\tx := 1\n\t|\n}\n"
    answers = ["y := (x + 1", "return x + 1\n}\n\nfunc g() {\n\tprintln(1)"]
    got = _complete(answers, buf, "go")
    assert [s.text for s in got] == ["return x + 1"]  # cut before the function's closer; the broken one withheld


def test_python_path_unchanged_by_the_layer():
    """Python: the ast guard, the text multi-line rule, no scope cut, the old auto-closed set
    (what the held-out Python evaluation measured before the layer)."""
    from diffill.lsp_server.postprocess import AUTO_CLOSED, postprocess

    buf = "def f(xs):\n    total = [\n        1,\n        |\n"
    text, off = _at(buf)
    assert treesitter.multiline_at(text, off, "python", "/t/p.py") is None
    assert SyntaxGuard(text, off, language="python").tree_guard is None
    got = _complete(["2,\n    ]\n    return total"], buf, "python")
    want = postprocess("2,\n    ]\n    return total", line_prefix="        ", line_suffix="",
                       prefix=text[:off], auto_closed=AUTO_CLOSED)
    assert [s.text for s in got] == [want.text]  # a closer on a continuation line is not cut
