"""The tree-sitter syntax guard (lsp_server/text/treesitter_guard.py) for every covered language:
good suggestions kept, breaking ones dropped, a block opener kept, mid-typing buffers left alone,
the segment rule against the whole-buffer rule, Ruby's keywords read as names, repairs, budgets.

Skipped, with the reason, only where the ``tree-sitter`` package (or one grammar wheel) is not
installed."""

from __future__ import annotations

import pytest
from diffill.lsp_server.text import languages, treesitter, treesitter_guard
from diffill.lsp_server.text.syntax import SyntaxGuard
from support.grammars import at_cursor, need_grammar, needs_ts

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


@pytest.mark.parametrize("lang,buf,good,bads,opener", CASES, ids=IDS)
def test_guard_keeps_good_drops_breaking_keeps_block_opener(lang, buf, good, bads, opener):
    need_grammar(lang)
    text, off = at_cursor(buf)
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
    need_grammar(lang)
    text, off = at_cursor(buf)
    typed = "zz = ("  # an unclosed bracket the user is typing
    broken = text[:off] + typed + text[off:]
    g = SyntaxGuard(broken, off + len(typed), language=lang, path=f"/t/b.{lang}")
    assert not g.tree_guard.clean
    assert g.keeps("1") and g.keeps("1)") and g.keeps("1))")


@needs_ts
def test_segment_rule_agrees_with_the_whole_buffer_rule():
    """On every line of a real-looking Go and TypeScript file, the candidates (the true line,
    and the line with a bracket dropped or added) get the same verdict from the segment rule
    as from re-parsing the whole buffer, but where tree-sitter's error recovery is more lenient
    in the whole file than in the segment (a rare stricter verdict); the true line always."""
    need_grammar("go")
    need_grammar("typescript")
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
    need_grammar("ruby")
    text, off = at_cursor("class A\n  def f(r, m)\n    b = 1\n    |\n    b\n  end\nend\n")
    g = SyntaxGuard(text, off, language="ruby", path="/t/kw.rb")
    for good in ("x = r.end", "y = m.end(0)", "h = {end: 1}", "s = :end", "z = r&.end", "w = m.end?"):
        assert g.keeps(good) and g.keeps_whole(good), good
    for bad in ("end", "x = 1\n    end", "a(end)", "x = [end]"):
        assert not g.keeps(bad) and not g.keeps_whole(bad), bad
    rb = languages.lookup("ruby")
    root = treesitter.parse("ruby", b"def end\n  1\nend\nx.end\n").root_node
    assert treesitter_guard.strays(rb, root, b"def end\n  1\nend\nx.end\n", [(0, 22)]) == 0
    stray = b"def f\n  1\nend\nend\n"
    assert treesitter_guard.strays(rb, treesitter.parse("ruby", stray).root_node, stray, [(0, len(stray))]) == 1


def test_buffer_broken_elsewhere_keeps_a_repair_and_drops_a_new_error_where_it_lands():
    """The hole broke the structure (a stray ``}``: the buffer has errors, every segment with
    the candidate fails): the true middle repairs it and is kept; one that repairs as much but
    leaves an error of its own where it lands is dropped (fewer errors, but a new one)."""
    need_grammar("java")
    text, off = at_cursor("class A {\n  void f(boolean c) {\n    if (c) |\n      g();\n    }\n    h();\n  }\n}\n")
    g = SyntaxGuard(text, off, language="java", path="/t/repair.java")
    assert not g.tree_guard.clean and g.tree_guard.segments(0)
    assert g.keeps("{") and g.keeps("{ // go")
    for bad in ("{(", "{[", "{ g("):
        assert not g.keeps(bad), bad


def test_balanced_edit_inside_a_long_literal_is_judged_not_over_budget():
    """A span typed inside a 25 KB table re-parses more than a candidate's budget: a balanced
    one gets its segment re-parsed as from scratch (kept), an unbalanced one stays broken."""
    need_grammar("rust")
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
