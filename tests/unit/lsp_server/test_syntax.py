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


def test_guard_is_off_when_the_buffer_does_not_parse_or_is_not_python():
    broken = "def f(xs):\n    total = (\n\n"
    assert not SyntaxGuard(broken, len(broken) - 1, language="python").active
    assert SyntaxGuard(broken, len(broken) - 1, language="python").keeps("    ((((")
    assert not SyntaxGuard(BUF, CUR, language="javascript").active
    assert not SyntaxGuard(BUF, CUR, language=None).active  # no language, no path
    assert SyntaxGuard(BUF, CUR, language=None, path="x.py").active
    huge = BUF + "x = 1\n" * (MAX_CHARS // 6 + 1)
    assert not SyntaxGuard(huge, CUR, language="python").active  # no whole-buffer parse


def test_a_huge_buffer_is_still_checked_around_the_cursor():
    """A 5 MB file got ``    return x x`` (the guard was off over MAX_CHARS characters); now
    the segment around the cursor is judged in any buffer size."""
    fn = "def f{i}(x):\n    y = x + {i}\n    return y\n\n\n"
    text = "".join(fn.format(i=i) for i in range(100_000))
    text += "def g(x):\n    y = 2\n\n\ndef h():\n    pass\n"
    assert len(text) > 10 * MAX_CHARS
    off = text.index("    y = 2\n") + len("    y = 2\n")
    g = SyntaxGuard(text, off, language="python")
    assert not g.keeps("    return x x")
    assert not g.keeps("    return (x")
    assert g.keeps("    return x")
    assert g.keeps("    for v in x:")  # a block opener, its body to come
    # a huge buffer that is broken around the cursor: no baseline, nothing filtered
    broken = text.replace("    y = 2\n", "    y = (\n")
    assert SyntaxGuard(broken, off, language="python").keeps("    return x x")


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

    def infill(self, ctx, ask):
        from diffill.lsp_server.backends import Candidate, InfillResult

        return InfillResult([Candidate(text=t, score=-float(i)) for i, t in enumerate(self.answers)])

    def budget_ms(self, requested=None):
        return requested

    def describe(self):
        return {}


def test_completer_falls_back_to_the_best_candidate_that_parses():
    from diffill.lsp_server.completer import Completer, options_from_kwargs

    answers = ["    total = (", "    total += 1"]  # the better-scored one breaks the file
    c = Completer(_Scripted(answers), options_from_kwargs(multiline="always-single"))
    assert [s.text for s in c.complete(BUF, CUR, n=2, language="python")] == ["    total += 1"]
    # a language with no grammar (text rules only), or the guard switched off: unchanged ranking
    assert [s.text for s in c.complete(BUF, CUR, n=2, language="kotlin")][0] == "    total = ("
    off = Completer(_Scripted(answers), options_from_kwargs(multiline="always-single",
                                                            syntax_check=False))
    assert [s.text for s in off.complete(BUF, CUR, n=2, language="python")][0] == "    total = ("
    # nothing parses: no suggestion rather than a broken file
    bad = Completer(_Scripted(["    total = (", "    ]"]), options_from_kwargs(multiline="always-single"))
    assert bad.complete(BUF, CUR, n=2, language="python") == []


# -- the statement-local fast path against the whole-buffer reference ------------------------

CLASSY = '''"""Module doc.

Example::

    class Fake(Base):
        x: int
"""
import os


@decorator
def top(a):
    return a


class Big:
    """A class with methods."""

    def first(self, x):
        if x:
            y = 1
        else:
            y = 2
        return y

    def second(self):
        values = [
            1,
        ]
        return values

'''


def _at(text, needle, delta=0):
    return text.index(needle) + delta


def test_a_method_edit_is_judged_on_the_method_alone():
    off = _at(CLASSY, "        return y")
    g = SyntaxGuard(CLASSY, off, language="python")
    a, b, col = g.segment()
    assert col == 4 and CLASSY[a:b].lstrip().startswith("def first") and "def second" not in CLASSY[a:b]
    assert g.keeps("        y += 1\n") and not g.keeps("        y = (\n")
    assert not g.keeps("else:\n")  # a class wrapper takes no else: a dedent below the method
    assert g.keeps_whole("else:\n") is False


def test_cases_where_the_edit_leaves_its_block_agree_with_the_reference():
    end = len(CLASSY)  # column 0 after the class: a new top-level function is fine
    blank = _at(CLASSY, "\n\n    def second") + 1  # between two methods
    for off, ins in [(end, "def main():"), (end, "main()"), (blank, "    def third(self):"),
                     (blank, "    @property"), (blank, "if x:"), (blank, "return"),
                     (_at(CLASSY, "@decorator"), "@other\n"), (_at(CLASSY, "import os"), "# c\n"),
                     (_at(CLASSY, "class Big"), "@dataclass\n"), (_at(CLASSY, "import os") - 1, "\\")]:
        g = SyntaxGuard(CLASSY, off, language="python")
        assert g.keeps(ins) == g.keeps_whole(ins), (off, ins)
    assert SyntaxGuard(CLASSY, end, language="python").keeps("def main():")
    # the method's header commented out / replaced: its body would be a deeper block of its own
    head = _at(CLASSY, "    def second")
    g = SyntaxGuard(CLASSY, head, language="python")
    for ins, rr in (("# gone ", 0), ("        x = 1", len("    def second(self):"))):
        assert g.keeps(ins, rr) == g.keeps_whole(ins, rr), ins


def test_code_in_a_docstring_is_not_cut_as_code():
    off = _at(CLASSY, "        x: int")  # inside the module docstring's example
    g = SyntaxGuard(CLASSY, off, language="python")
    assert g.segment() is None or g.segment()[1] > _at(CLASSY, 'import os')  # never the fake class
    assert g.keeps("        x = (unclosed prose")  # inside a string anything goes


def test_the_rest_of_the_buffer_is_parsed_once_across_keystrokes():
    from diffill.lsp_server.syntax import _rest_cut_ok

    _rest_cut_ok.cache_clear()
    line = "        return values\n"
    for k in range(1, 6):  # the user types a new line above `return values`, one key at a time
        typed = "        total = 1"[: 8 + k]
        text = CLASSY.replace(line, typed + "\n" + line)
        g = SyntaxGuard(text, text.index(typed) + len(typed), language="python")
        g.keeps("0")
    info = _rest_cut_ok.cache_info()
    assert info.misses == 1 and info.hits >= 4


def test_fast_path_matches_the_reference_on_library_code():
    """Cursors at line starts, indentation and mid-line in two standard-library modules, with
    lines of the same file and broken fragments as suggestions: both rules must agree."""
    import inspect
    import random
    import textwrap as tw
    from json import decoder

    rng = random.Random(7)
    frags = ["(", '"""', "else:", "    return x", "def g():", "x = [", ")", "'", "# note", "\\",
             "@dec", "elif y:", "    pass", "return", "if x:", 'f"{', "except:", "\n", "class K:"]
    checked = fast = 0
    for mod in (tw, decoder):
        src = inspect.getsource(mod)
        lines = src.splitlines(keepends=True)
        starts = [0]
        for ln in lines:
            starts.append(starts[-1] + len(ln))
        for _ in range(40):
            li = rng.randrange(len(lines))
            line = lines[li]
            r = rng.random()
            col = 0 if r < 0.4 else (len(line) - len(line.lstrip(" ")) if r < 0.7 else rng.randrange(len(line)))
            off = starts[li] + col
            g = SyntaxGuard(src, off, language="python")
            fast += g.segment() is not None
            for _ in range(4):
                ins = rng.choice(frags) if rng.random() < 0.5 else lines[rng.randrange(len(lines))].rstrip("\n")
                rr = rng.choice([0, 0, max(0, len(line.rstrip("\n")) - col)])
                assert g.keeps(ins, rr) == g.keeps_whole(ins, rr), (mod.__name__, li, col, ins, rr)
                checked += 1
    assert checked == 320 and fast > 60  # the fast path was taken for most cursors


def test_typing_a_block_header_is_judged_without_parsing_the_whole_buffer(monkeypatch):
    """The user types ``for v in values:`` above an indented body, one key at a time: the
    buffer does not parse on any keystroke (a name before an indented block), so nothing is
    withheld -- the reference rule's verdict -- and after the first keystroke no parse of the
    whole buffer is made (the rest around the method is remembered)."""
    from diffill.lsp_server import syntax
    from diffill.lsp_server.syntax import _rest_cut_ok

    body = "            print(v)\n"
    base = CLASSY.replace("        return values\n", "        \n" + body + "        return values\n")
    at = base.index("        \n" + body) + 8
    header = "for v in values:"
    texts = [(k, base[:at] + header[:k] + base[at:]) for k in range(1, len(header))]
    for k, text in texts:  # the verdicts: the reference rule's
        g = SyntaxGuard(text, at + k, language="python")
        assert not parses(text)
        for cand in (header[k:], header[k:] + "(", "x", ")"):
            assert g.keeps(cand) == g.keeps_whole(cand) is True, (k, cand)
    _rest_cut_ok.cache_clear()  # forget what the reference pass above parsed
    syntax._span_parses.cache_clear()
    syntax._GOOD_RESTS.clear()
    sizes: list[int] = []
    real = syntax.parse_tree
    monkeypatch.setattr(syntax, "parse_tree", lambda src: (sizes.append(len(src)), real(src))[1])
    for k, text in texts:  # the cost: only the fast path runs, as in the Completer
        if k == 2:
            sizes.clear()  # the first keystroke parses the rest of the buffer once
        g = SyntaxGuard(text, at + k, language="python")
        assert all(g.keeps(cand) for cand in (header[k:], header[k:] + "(", "x", ")"))
    assert sizes and max(sizes) < len(base), sizes  # the method, the class: never the whole buffer


def test_prepare_does_the_request_work_up_front_and_changes_no_verdict():
    off = _at(CLASSY, "        return y")
    cands = ["        y += 1\n", "        y = (\n", "else:\n", "return"]
    lazy = SyntaxGuard(CLASSY, off, language="python")
    ready = SyntaxGuard(CLASSY, off, language="python")
    ready.prepare()
    assert ready._segments  # the cut at the cursor's indentation is found
    assert [ready.keeps(c) for c in cands] == [lazy.keeps(c) for c in cands]


def test_typing_in_the_only_method_of_a_class_is_found_from_the_class_cut():
    """Cutting a class's only method out leaves a class with no body (that rest does not
    parse); the class's own cut decides: the user is typing, nothing is withheld, as the
    reference rule says."""
    text = "import os\n\n\nclass One:\n    def only(self):\n        x = 1\n        \n            y = 2\n\n\ndef after():\n    return 1\n"
    off = text.index("        \n            y") + 8
    g = SyntaxGuard(text, off, language="python")
    assert not parses(text) and g.segment(False, 8) is None
    assert g.typing_here
    for cand in ("if x:", "z = (", ")"):
        assert g.keeps(cand) == g.keeps_whole(cand) is True


def test_a_broken_candidate_in_a_large_class_is_not_judged_on_the_class(monkeypatch):
    """A candidate that breaks its method is judged on the method (and its sibling methods),
    not on the whole class around them once that is larger than WIDE_MAX and four times the
    method: no parse of a large class per candidate; the verdict is the reference rule's."""
    from diffill.lsp_server import syntax

    methods = "".join(f"    def m{i}(self, x):\n        y = x + {i}\n        return y\n\n" for i in range(800))
    text = "import os\n\n\nclass Big:\n" + methods + "\ndef after():\n    return 1\n"
    assert len(text) > 4 * syntax.WIDE_MAX
    off = text.index("        return y\n\n    def m200") + 8
    g = SyntaxGuard(text, off, language="python")
    g.prepare()
    sizes: list[int] = []
    real = syntax.parse_tree
    monkeypatch.setattr(syntax, "parse_tree", lambda src: (sizes.append(len(src)), real(src))[1])
    for cand in ("return y + (", "return y)", "return y\n    else:"):
        sizes.clear()
        assert g.keeps(cand) is False
        assert max(sizes) < syntax.WIDE_MAX, (cand, sizes)
    monkeypatch.setattr(syntax, "parse_tree", real)
    for cand in ("return y + (", "return y)", "return y\n    else:", "return y + 1"):
        assert g.keeps(cand) == g.keeps_whole(cand), cand
