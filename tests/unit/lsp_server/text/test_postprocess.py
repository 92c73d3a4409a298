"""Post-processing rules, one test (or a few) per rule."""

from __future__ import annotations

import pytest
from diffill.lsp_server.text.postprocess import (
    Processed,
    allow_multiline,
    closes_count,
    dedupe,
    detect_indent,
    open_brackets,
    postprocess,
    suffix_overlap,
)


def pp(raw: str, line_prefix: str, line_suffix: str = "", *, after: str = "", prefix: str | None = None,
       **kw) -> Processed | None:
    return postprocess(raw, line_prefix=line_prefix, line_suffix=line_suffix, after_line=after,
                       prefix=line_prefix if prefix is None else prefix, **kw)


# -- 1. whitespace, empty -------------------------------------------------------------------

def test_trailing_whitespace_stripped_on_every_line():
    out = pp("x = 1   \n    y = 2\t\n\n\n", "    ", prefix="def f():\n    ")
    assert out == Processed("x = 1\n    y = 2")


@pytest.mark.parametrize("raw", ["", "   ", "\n\n", " \t \n  "])
def test_empty_or_whitespace_only_dropped(raw):
    assert pp(raw, "x = ") is None


def test_broken_trailing_character_removed_and_inner_one_dropped():
    assert pp("foo\ufffd", "x = ") == Processed("foo")
    assert pp("fo\ufffdo", "x = ") is None


def test_crlf_document_gets_crlf():
    out = pp("a\r\n    b", "    ", eol="\r\n", prefix="def f():\r\n    ")
    assert out == Processed("a\r\n    b")


# -- 2. single vs multi-line policy ----------------------------------------------------------

def test_mid_line_is_single_line():
    assert pp("a, b\nfoo()", "f(", ")") == Processed("a, b")


def test_line_end_allows_multiline():
    out = pp("if x:\n        return 1", "    ", "", prefix="def f(x):\n    ")
    assert out == Processed("if x:\n        return 1")


def test_policy_overrides():
    assert pp("a\n    b", "    ", "", policy="always-single", prefix="def f():\n    ") == Processed("a")
    assert not allow_multiline("always-single", "")
    assert allow_multiline("always-multi", "foo)")
    assert allow_multiline("auto", "   ")
    assert not allow_multiline("auto", " x")
    # an explicit multiline argument wins over the policy
    assert pp("a\nb", "", "", multiline=False) == Processed("a")
    with pytest.raises(ValueError, match="multiline policy"):
        allow_multiline("sometimes", "")


# -- 3. indentation ---------------------------------------------------------------------------

def test_first_line_indent_not_doubled_on_blank_indented_line():
    assert pp("    return x", "    ", prefix="def f(x):\n    ") == Processed("return x")


@pytest.mark.parametrize("prefix, line, raw, want, unit", [
    ("def f(x):\n\tif x:\n\t\t", "\t\t", "y = 1\n        return y", "y = 1\n\t\treturn y", ("\t", 4)),
    ("def f(x):\n  if x:\n    ", "    ", "y = 1\n\t\treturn y", "y = 1\n    return y", (" ", 2)),
], ids=["tabs", "spaces"])
def test_continuation_lines_use_the_documents_indentation(prefix, line, raw, want, unit):
    assert pp(raw, line, prefix=prefix) == Processed(want)
    assert detect_indent(line, prefix) == unit


def test_stops_at_dedent_below_cursor_line():
    prefix = "def f(x):\n    y = "
    out = pp("x + 1\n    return y\n\ndef g():\n    pass", "    y = ", prefix=prefix)
    assert out == Processed("x + 1\n    return y")


def test_dedented_closer_is_kept():
    prefix = "int f() {\n    if (x) "
    out = pp("{\n        y();\n    }", "    if (x) ", prefix=prefix, comment="//")
    assert out == Processed("{\n        y();\n    }")


# -- 4. no repetition of what follows ----------------------------------------------------------

def test_multiline_stops_before_the_next_existing_line():
    after = "    return total\n"
    out = pp("total += x\n    return total\n", "    ", after=after, prefix="def f(xs):\n    ")
    assert out == Processed("total += x")


def test_tail_repeating_rest_of_line_is_cut():
    assert pp("a, b", "f(", ", b)") == Processed("a")
    assert suffix_overlap("name, y", ", y)") == 3


def test_single_identifier_char_overlap_is_not_cut():
    assert suffix_overlap("x + 1", "1]") == 0
    assert suffix_overlap("x)", ")") == 1


def test_auto_closed_tail_is_replaced_not_duplicated():
    assert pp('"hello")', "print(", ")") == Processed('"hello")', replace_right=1)
    assert pp('"a"]', "d[", "] = 1") == Processed('"a"]', replace_right=1)


# -- 5. brackets ------------------------------------------------------------------------------

def test_closer_without_opener_is_dropped_when_suffix_closes():
    # the suffix already closes the call: the suggestion must not close it again mid-line
    assert pp("b) + 1", "foo(a, ", ")") == Processed("b")


def test_extra_closer_stops_the_suggestion():
    assert pp("b))", "foo(a, ", ")") == Processed("b)", replace_right=1)
    assert pp("x]", "f(", ")") == Processed("x")


def test_closer_of_an_earlier_line_opener_is_kept_at_line_end():
    assert pp("c)", "    c,", "", prefix="foo(\n    a,\n    c,") == Processed("c)")


def test_brackets_inside_strings_and_comments_ignored():
    assert pp('")" + x', "print(", ")") == Processed('")" + x')
    sc = open_brackets("f(a, ')', b  # (\n")
    assert sc.stack == ["("]
    assert closes_count(["(", "["], "])", None, "#") == 2
    assert closes_count(["("], "x", None, "#") == 0


def test_balanced_inner_brackets_kept():
    assert pp("g(x), h[1]", "f(", ")") == Processed("g(x), h[1]")


# -- ranking helpers ---------------------------------------------------------------------------

def test_dedupe_keeps_first():
    a, b, c = Processed("x"), Processed("y"), Processed("x", 1)
    assert dedupe([a, b, c]) == [a, b]


# -- the scope cut (languages other than Python) ----------------------------------------------


def test_scope_cut_stops_before_leaving_the_enclosing_block():
    from diffill.lsp_server.text.postprocess import cut_at_scope

    pre = "function f() {\n  const a = 1;\n  "
    assert cut_at_scope("return a;\n}\n\nfunction g() {}", pre, "//") == "return a;"
    assert cut_at_scope("x = 1; }", pre, "//") == "x = 1;"
    # what the cursor's line opened may be closed, and the suggestion's own brackets
    assert cut_at_scope("a, b)", pre + "foo(", "//") == "a, b)"
    assert cut_at_scope("\n  return 1;\n}", "function f() {", "//") == "\n  return 1;\n}"
    assert cut_at_scope("if (a) {\n    b();\n  }", pre, "//") == "if (a) {\n    b();\n  }"
    assert cut_at_scope("s = '}'", pre, "//") == "s = '}'"  # in a string


def test_scope_cut_only_when_asked():
    pre = "function f() {\n  const a = 1;\n  "
    kw = dict(line_prefix="  ", line_suffix="", prefix=pre, comment="//")
    assert postprocess("return a;\n}\nfunction g() {}", scope=True, **kw).text == "return a;"
    assert postprocess("return a;\n}\nfunction g() {}", **kw).text != "return a;"
