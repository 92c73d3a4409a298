"""The lookup draft sources (lsp_server/drafting/lookup.py): exact drafts for concrete buffers
(``|`` marks the cursor), before and after the cursor, in other documents and workspace chunks."""

from __future__ import annotations

from pathlib import Path

from diffill.lsp_server.drafting.drafts import Analogy, propose
from diffill.lsp_server.drafting.lookup import PromptLookup, SuffixLookup
from diffill.lsp_server.drafting.query import Draft, DraftQuery
from support.drafting import LOOK, SIBLINGS, SOURCES, query, texts


def lookup(marked: str, **kw) -> list[str]:
    return [d.text for d in LOOK.propose(query(marked, **kw))]


LADDER = '''def grade(score):
    if score >= 90:
        return "A"
    elif score >= 80:
        return "B"
    elif score >= 70:
CURSOR
    else:
        return "F"
'''


# --- lookup ---------------------------------------------------------------------------------


def test_if_elif_ladder_continues_like_the_branch_above():
    # in the indentation: the same key (":\n" + 8 spaces) follows every branch; equal
    # agreement -> before the cursor first, nearest first (the "else" below comes last)
    q = query(LADDER.replace("CURSOR", "        |"))
    assert [d.text for d in LOOK.propose(q)] == ['return "B"', 'return "A"', 'return "F"']
    # analogy says the same (the successor of the most similar line): deduplicated
    assert texts(propose(q, sources=SOURCES)) == [("lookup", 'return "B"')]
    # mid-line
    assert lookup(LADDER.replace("CURSOR", "        return |"))[0] == '"B"'
    # at column 0 of an empty line (the evaluation's line holes): the key ":\n" is too short
    # for a lookup; analogy re-indents the successor of "elif score >= 80:"
    q0 = query(LADDER.replace("CURSOR", "|"))
    assert texts(propose(q0, sources=SOURCES)) == [("analogy", '        return "B"')]


def test_repeated_call():
    src = 'log.info("start", user=user, n=3)\nx = 1\nlog.info("start", |'
    assert lookup(src + "\n") == ["user=user, n=3)"]
    # with the closing parenthesis right of the cursor: two-sided, the exact middle
    assert lookup(src + ")\n") == ["user=user, n=3"]
    # analogy (same start, mid-line) neither repeats the typed space nor the ")"
    assert texts(propose(query(src + ")\n"), sources=[Analogy()])) == [("analogy", "user=user, n=3")]


def test_sibling_test_function():
    assert lookup(SIBLINGS) == ["    assert calc.add(1, 2) == 3"]
    # a span: stops where the start of the text after the cursor ("\n    assert calc.") follows
    assert lookup(SIBLINGS, multiline=True) == ["    assert calc.add(1, 2) == 3"]
    # without that line after the cursor, the block up to the blank line
    one_sided = SIBLINGS.replace("    assert calc.total == -1\n", "")
    assert lookup(one_sided, multiline=True) == [
        "    assert calc.add(1, 2) == 3\n    assert calc.total == 3"
    ]


def test_two_sided_match_gives_the_exact_middle():
    src = "x = compute(alpha, beta, gamma)\ny = 2\nz = compute(|, gamma)\n"
    assert lookup(src) == ["alpha, beta"]
    # the right agreement also ranks: the nearer occurrence agrees only on the left
    src = "acc = fetch(x, y, z)\nb = 1\nacc = fetch(p, q)\nc = 2\nacc = fetch(|, z)\n"
    assert lookup(src) == ["x, y", "p, q)"]


def test_longest_match_first_then_before_after_nearest():
    # the nearer occurrence agrees on ".total = " only; the farther on the whole line start
    src = "self.counter.total = total + 1\nx = 1\nself.total = 0\nself.counter.total = |\n"
    assert lookup(src) == ["total + 1", "0"]
    # later in the buffer too
    src = "self.total = 0\nself.counter.total = |\nx = 1\nself.counter.total = total * 2\n"
    assert lookup(src) == ["total * 2", "0"]
    # equal agreement: before the cursor first, then after, nearest first within each
    src = "a.total = 1\nb.total = 2\nc.total = |\nd.total = 3\ne.total = 4\n"
    assert lookup(src) == ["2", "1", "3", "4"]


def test_other_document_match():
    others = ["a = 1\nvalue = other_module.make_thing(config, 3)\n"]
    assert lookup("value = other_module.make_thing(|)\n", others=others) == ["config, 3"]
    # this buffer first on equal agreement
    src = "y = 2\nvalue = other_module.make_thing(local, 4)\nvalue = other_module.make_thing(|)\n"
    assert lookup(src, others=others) == ["local, 4", "config, 3"]
    # CRLF other documents are read with "\n"
    crlf_others = [others[0].replace("\n", "\r\n")]
    assert lookup("value = other_module.make_thing(|\n", others=crlf_others) == ["config, 3)"]


def test_mid_line_completion():
    src = "    result = self.compute_total(items, tax=rate)\n    ...\n    result = self.comp|\n"
    assert lookup(src) == ["ute_total(items, tax=rate)"]


def test_column_zero_and_indentation():
    src = "x = load_data()\nprocess(x)\nsave(x)\n\nx = load_data()\n|\n"
    assert lookup(src) == ["process(x)"]
    assert lookup(src, multiline=True) == ["process(x)\nsave(x)"]
    # in the indentation: the draft starts where the cursor is (no indentation repeated)
    src = "if ok:\n    x = load_data()\n    process(x)\n\nif again:\n    x = load_data()\n    |\n"
    assert lookup(src) == ["process(x)"]
    # deeper indentation in the occurrence: the rest of it belongs to the draft
    src = "def f():\n    x = load_data()\n        process(x)\n\nx = load_data()\n    |\n"
    assert lookup(src) == ["    process(x)"]


def test_no_match_gives_nothing():
    assert lookup("import os\nprint(os.getcwd())\nvalue = 3|\n") == []
    # whitespace-only keys are not looked up
    assert lookup("a = 1\n        \n        |") == []
    # a shorter key than min_match is not looked up
    assert lookup("x = 1\nprint(x)\nx = 1\n|") == []
    # no match inside an identifier: "total_amount" is the end of "grand_total_amount"
    assert lookup("grand_total_amount = 5\ntotal_amount|\n") == []
    assert lookup("grand total_amount = 5\ntotal_amount|\n") == [" = 5"]


def test_text_already_right_of_the_cursor_is_not_proposed():
    # the only occurrence continues with exactly what follows the cursor (two-sided: nothing
    # goes in between)
    assert lookup("call_thing(alpha)\ncall_thing(|alpha)\n") == []
    # ... so it gives nothing; another occurrence does (one-sided: the rest of its line)
    assert lookup("call_thing(alpha)\ncall_thing(|alpha)\ncall_thing(beta)\n") == ["beta)"]


def test_cursor_at_the_ends_of_the_text():
    text = "value = compute(a, b)\nvalue = compute("
    for src in SOURCES:
        assert src.propose(DraftQuery(text, 0)) == []
        assert src.propose(DraftQuery("", 0)) == []
    assert propose(DraftQuery(text, len(text)), sources=SOURCES) == [
        Draft("a, b)", "lookup")
    ]
    # offsets out of range are clamped
    assert propose(DraftQuery(text, len(text) + 10), sources=SOURCES) == [Draft("a, b)", "lookup")]
    assert propose(DraftQuery(text, -3), sources=SOURCES) == []


def test_crlf_text():
    src = "x = load_data()\r\nprocess(x)\r\nsave(x)\r\n\r\nx = load_data()\r\n|\r\n"
    assert lookup(src) == ["process(x)"]
    assert lookup(src, multiline=True) == ["process(x)\r\nsave(x)"]
    # analogy says the same: one draft
    assert texts(propose(query(src, multiline=True), sources=SOURCES)) == [("lookup", "process(x)\r\nsave(x)")]
    # the cursor between "\r" and "\n" counts as at the line end
    q = query("value = compute(a, b)\r\nvalue = compute(|\r\n")
    q = DraftQuery(q.text, q.offset + 1)
    assert [d.text for d in LOOK.propose(q)] == ["a, b)"]


def test_large_buffer():
    block = "def f{i}(x):\n    y = x * {i}\n    return helper_{i}(y)\n\n"
    text = "".join(block.format(i=i) for i in range(2500))  # 10 000 lines
    text += "def g(x):\n    y = x * 7\n    return helper_7(|"
    q = query(text + "\n")
    assert [d.text for d in LOOK.propose(q)][0] == "y)"
    drafts = propose(q, limit=3, sources=SOURCES)
    assert drafts[0] == Draft("y)", "lookup") and len(drafts) <= 3
    # a key with thousands of occurrences: only longer agreements are searched after `hits`
    q = query(text.rsplit("\n", 1)[0] + "\n    return |\n")
    assert LOOK.propose(q)[0].text == "helper_7(y)"


# --- lookup of the text after the cursor -------------------------------------------------------

MEMBERS = """def test_contains(D):
    assert 10 in D
    assert 40 not in D
    assert 20 in D
    assert 21 not in D


def test_contains_again(D):
    assert 10 in D
|
    assert 20 in D
"""


def after(marked: str, **kw) -> list[str]:
    return [d.text for d in SuffixLookup().propose(query(marked, **kw))]


def test_suffix_lookup_proposes_what_precedes_the_text_after_the_cursor():
    # "    assert 20 in D" follows the cursor here and "    assert 40 not in D" there; the
    # prefix lookup has nothing (the text before the cursor, "...10 in D\n", leads to "40")
    assert after(MEMBERS) == ["    assert 40 not in D"]
    # indentation typed at the cursor is not repeated
    assert after(MEMBERS.replace("\n|\n", "\n    |\n")) == ["assert 40 not in D"]
    # a span stops where the two sides meet: the line equal to the one above the cursor
    assert after(MEMBERS, multiline=True) == ["    assert 40 not in D"]
    # with nothing above in common, the lines before the occurrence up to a blank line
    assert after(MEMBERS.replace("    assert 10 in D\n|", "    x = 1\n|"), multiline=True) == [
        "    assert 10 in D\n    assert 40 not in D"]
    assert [(d.source, d.text) for d in propose(query(MEMBERS), sources=[SuffixLookup()])] == [
        ("suffix", "    assert 40 not in D")]


def test_suffix_lookup_needs_an_empty_cursor_line_and_an_occurrence_elsewhere():
    assert after(MEMBERS.replace("\n|\n", "\nx|\n")) == []  # text left of the cursor
    assert after(MEMBERS.replace("\n|\n", "\n|x\n")) == []  # text right of it
    alone = "def f():\n    x = 1\n|\n    return compute(x, y)\n"
    assert after(alone) == []  # the text after the cursor occurs only there
    # an occurrence at another depth, or not at a line start, is no match
    deeper = "        assert 20 in D\n" + MEMBERS.split("\n\n\n")[1]
    assert after(deeper) == []
    inline = "y = [assert_20(D)]\n\nx = 1\n|\nassert_20(D)\n"
    assert after(inline.replace("assert_20(D)", "assert_twenty(D)")) == []
    # the lines between the cursor and a later occurrence are proposed, never the cursor line
    later = "def g():\n|\n    setup_the_database()\n    run_the_thing(1)\n    setup_the_database()\n"
    assert after(later) == ["    run_the_thing(1)"]


def test_suffix_lookup_looks_at_the_nearest_occurrences_first():
    block = "    step_one()\n    common_tail_call()\n"
    far = "def far():\n" + block.replace("one", "far") * 3
    near = "def near():\n    step_near()\n    common_tail_call()\n"
    here = far + near + "def here():\n|\n    common_tail_call()\n"
    # equal agreement everywhere: the nearest wins; with one look on each side, that is all
    assert after(here) == ["    step_near()"]
    assert [d.text for d in SuffixLookup(hits=1).propose(query(here))] == ["    step_near()"]


def test_suffix_lookup_in_other_documents_and_ranking():
    other = "def test_contains(D):\n    assert 11 in D\n    assert 41 not in D\n    assert 20 in D\n"
    here = "def test_contains_again(D):\n    assert 10 in D\n|\n    assert 20 in D\n"
    assert after(here, others=[other]) == ["    assert 41 not in D"]
    # this buffer first on equal agreement; the longest agreement first of all
    assert after(MEMBERS, others=[other]) == ["    assert 40 not in D"]
    here = ("def a(D):\n    assert 10 in D\n    assert 40 not in D\n    assert 20 in D\n\n\n"
            "def b(D):\n    assert 10 in D\n|\n    assert 20 in D\n    assert 21 not in D\n")
    assert after(here) == ["    assert 40 not in D"]
    longer = other + "    assert 21 not in D\n"  # agrees on two lines after the key, here one
    assert after(here, others=[longer]) == ["    assert 41 not in D"]
    # CRLF
    crlf = MEMBERS.replace("\n", "\r\n")
    assert after(crlf) == ["    assert 40 not in D"]


def test_the_default_lookup_wants_a_16_character_key():
    """The README's example: the body of ``variance`` after ``m = mean(values)``. The longest
    earlier match of the text before the cursor is ``(values)\n`` (the end of ``mean``'s
    return line), 9 characters: what followed it there (a blank line and the next def) is
    no draft for the body."""
    text = (Path(__file__).resolve().parents[4] / "examples" / "stats.py").read_text()
    offset = sum(len(ln) for ln in text.splitlines(keepends=True)[:14])  # line 15, column 1
    q = DraftQuery(text, offset, multiline=True)
    assert PromptLookup().propose(q) == []
    assert [d.text.split("\n")[2] for d in LOOK.propose(q)] == ["def variance(values):"]


# --- the workspace's chunks ------------------------------------------------------------------


def test_prompt_lookup_finds_a_workspace_chunk_when_the_buffer_has_nothing():
    chunk = "def rectangle_area(width, height):\n    area = width * height\n"
    q = query("def rectangle_area(width, height):\n    area =|\n", workspace=[chunk])
    assert PromptLookup().propose(q)[0] == Draft(" width * height", "lookup")
    assert PromptLookup().propose(query("def rectangle_area(width, height):\n    area =|\n")) == []


def test_workspace_chunks_rank_after_the_buffer_at_an_equal_match():
    here = "def scale(values):\n    out = [v * 2 for v in values]\n\n"
    chunk = "def scale(values):\n    out = [v * 3 for v in values]\n"
    q = query(here + "def scale(values):\n    out =|\n", workspace=[chunk])
    assert PromptLookup().propose(q)[0].text == " [v * 2 for v in values]"
    # a longer agreement in the workspace still wins
    longer = "import x\n\n\ndef scale(values):\n    out = [v * 3 for v in values]\n"
    q = query("import x\n\n\ndef scale(values):\n    out =|\n\n" + here, workspace=[longer])
    assert PromptLookup().propose(q)[0].text == " [v * 3 for v in values]"


def test_suffix_lookup_reads_workspace_chunks_and_crlf_chunks():
    chunk = "    first_step(data)\r\n    second_step(data, verbose=True)\r\n"
    q = query("def run(data):\n|\n    second_step(data, verbose=True)\n", workspace=[chunk])
    assert SuffixLookup().propose(q) == [Draft("    first_step(data)", "suffix")]
