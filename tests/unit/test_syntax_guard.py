"""The Python syntax guard (lsp_server/syntax.py) and its use by the Completer."""

from __future__ import annotations

from diffill.lsp_server.syntax import MAX_CHARS, SyntaxGuard, is_python, parses

BUF = "def f(xs):\n    total = 0\n\n    return total\n"
CUR = BUF.index("\n\n") + 1  # column 0 of the empty line


def test_parses_and_language_detection():
    assert parses(BUF) and not parses("def f(:\n")
    assert not parses("x = (\n")
    assert is_python("python", None) and is_python(None, "a/b.py") and is_python("Python")
    assert not is_python("rust", "a.py") and not is_python(None, "a.rs") and not is_python(None, None)


def test_guard_drops_suggestions_that_break_a_parsing_buffer():
    g = SyntaxGuard(BUF, CUR, language="python")
    assert g.active
    assert g.keeps("    total += 1")
    assert not g.keeps("    total = (")  # unclosed bracket
    assert not g.keeps("        else:")  # a stray else
    assert not g.keeps("  return")  # dedent that matches no level
    assert g.keeps("")  # nothing to judge


def test_block_openers_are_allowed_when_a_body_would_follow():
    g = SyntaxGuard(BUF, CUR, language="python")
    assert g.keeps("    for x in xs:")  # the user is starting a loop: its body comes next
    assert g.keeps("    if total > 3:  # big")  # a comment after the colon is not the last char
    assert not g.keeps("    for x in xs")  # no colon: broken either way
    assert not g.keeps("    for x in (xs:")


def test_guard_is_off_when_the_buffer_does_not_parse_or_is_not_python_or_huge():
    broken = "def f(xs):\n    total = (\n\n"
    assert not SyntaxGuard(broken, len(broken) - 1, language="python").active
    assert SyntaxGuard(broken, len(broken) - 1, language="python").keeps("    ((((")
    assert not SyntaxGuard(BUF, CUR, language="javascript").active
    assert not SyntaxGuard(BUF, CUR, language=None).active  # no language, no path
    assert SyntaxGuard(BUF, CUR, language=None, path="x.py").active
    huge = BUF + "x = 1\n" * (MAX_CHARS // 6 + 1)
    assert not SyntaxGuard(huge, CUR, language="python").active


def test_replace_right_is_honoured():
    text = "def f(a):\n    return g(a)\n"
    off = text.index("(a)") + 1
    g = SyntaxGuard(text, off, language="python")
    assert g.keeps("b", replace_right=1)  # g(b)
    assert not g.keeps("b,", replace_right=2)  # g(b,  -- the ')' replaced away


class _Scripted:
    name = "scripted"

    def __init__(self, answers):
        self.answers = answers

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens):
        return None

    def infill(self, ctx, *, n, max_tokens, steps=None, latency_budget_ms=None, cancel=None, **kw):
        from diffill.lsp_server.backends import Candidate

        return [Candidate(text=t, score=-float(i)) for i, t in enumerate(self.answers)]

    def describe(self):
        return {}


def test_completer_falls_back_to_the_best_candidate_that_parses():
    from diffill.lsp_server.completer import Completer, options_from_kwargs

    answers = ["    total = (", "    total += 1"]  # the better-scored one breaks the file
    c = Completer(_Scripted(answers), options_from_kwargs(multiline="always-single"))
    assert [s.text for s in c.complete(BUF, CUR, n=2, language="python")] == ["    total += 1"]
    # other languages, or the guard switched off: unchanged ranking
    assert [s.text for s in c.complete(BUF, CUR, n=2, language="go")][0] == "    total = ("
    off = Completer(_Scripted(answers), options_from_kwargs(multiline="always-single",
                                                            syntax_check=False))
    assert [s.text for s in off.complete(BUF, CUR, n=2, language="python")][0] == "    total = ("
    # nothing parses: no suggestion rather than a broken file
    bad = Completer(_Scripted(["    total = (", "    ]"]), options_from_kwargs(multiline="always-single"))
    assert bad.complete(BUF, CUR, n=2, language="python") == []
