"""The completer: token healing and what it passes to the backend (scripted backend:
control flow only)."""

from __future__ import annotations

from pathlib import Path

# -- token healing (mock backend: control flow only) ---------------------------------------------

class _ScriptedBackend:
    """Answers each infill with the next scripted list of raw middles; records contexts."""

    name = "scripted"

    def __init__(self, *answers: list[str]):
        self.answers = list(answers)
        self.seen = []
        self.asks = []

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens):
        return None

    def infill(self, ctx, ask):
        from diffill.lsp_server.backend.backends import Candidate, InfillResult

        self.seen.append((ctx.prefix, ctx.suffix))
        self.asks.append(ask)
        return InfillResult([Candidate(text=t, score=-float(i))
                             for i, t in enumerate(self.answers.pop(0))])

    def budget_ms(self, requested=None):
        return requested

    def describe(self):
        return {}


def test_partial_word_boundaries():
    from diffill.lsp_server.completion.completer import partial_word

    assert partial_word("    return to", 13) == " to"
    assert partial_word("    return ", 11) == " "
    assert partial_word("    ", 4) == ""  # indentation is not healed
    assert partial_word("f(a", 3) == "a"
    assert partial_word("abcd", 2) == ""  # inside a word
    assert partial_word("x = " + "y" * 40, 44) == ""  # too long


def test_token_healing_fills_from_the_word_start():
    from diffill.lsp_server.completion.completer import Completer, CompletionAsk

    text = "def f(a):\n    return to\n"
    b = _ScriptedBackend([" total", " other", " to"])
    res = Completer(b).run(text, text.index("to\n") + 2, CompletionAsk(n=3))
    assert b.seen == [("def f(a):\n    return", "\n")]  # the hole starts before " to"
    assert [s.text for s in res.suggestions] == ["tal"]  # " other" and a bare " to" dropped
    assert res.context.line_prefix == "    return to"


def test_token_healing_falls_back_when_nothing_matches():
    from diffill.lsp_server.completion.completer import Completer
    from diffill.lsp_server.completion.options import CompletionOptions

    text = "x = myna\n"
    b = _ScriptedBackend(["foo"], ["me = 1"])
    res = Completer(b).run(text, 8)
    assert b.seen == [("x =", "\n"), ("x = myna", "\n")]
    assert [s.text for s in res.suggestions] == ["me = 1"]
    off = Completer(b, CompletionOptions(token_healing=False))
    b.answers.append(["bar"])
    off.run(text, 8)
    assert b.seen[-1] == ("x = myna", "\n")


def test_run_passes_the_ask_to_the_backend():
    from diffill.lsp_server.completion.completer import Completer, CompletionAsk

    b = _ScriptedBackend(["1"])
    res = Completer(b).run("x = (\n", 5, CompletionAsk(steps=3, temperature=0.5, seed=7))
    (ask,) = b.asks
    assert (ask.steps, ask.temperature, ask.seed) == (3, 0.5, 7)
    assert res.model_calls == 1 and not res.planned and res.decision is None


# -- drafts (a backend that "verifies" what it is told to: control flow only) ---------------------

class _Verifier:
    """Verifies the drafts whose text is in ``accept`` (answering with them alone, as the
    engine does when a draft is verified); otherwise answers ``model``. Records the drafts
    each call was sent."""

    name = "verifier"

    def __init__(self, accept: set[str], model: list[str]):
        self.accept, self.model = accept, model
        self.sent: list[list[str]] = []

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens):
        return None

    def infill(self, ctx, ask):
        from diffill.lsp_server.backend.backends import Candidate, InfillResult

        self.sent.append(list(ask.drafts))
        ok = [Candidate(text=d, score=-0.5, steps=1, draft=i, accepted=len(d), verified=True)
              for i, d in enumerate(ask.drafts) if d in self.accept]
        return InfillResult(ok or [Candidate(text=t, score=-1.0 - i, steps=4)
                                   for i, t in enumerate(self.model)])

    def budget_ms(self, requested=None):
        return requested

    def describe(self):
        return {}


LADDER = ("def kind(x):\n    if x == 1:\n        return 'one'\n    elif x == 2:\n"
          "        return 'two'\n    elif x == 3:\n        return 'three'\n    elif x == 4:\n")


def test_a_repeated_line_goes_as_a_draft_and_a_verified_one_answers():
    from diffill.lsp_server.completion.completer import Completer

    text = LADDER + "        \n"
    b = _Verifier({"return 'four'"}, ["pass"])
    res = Completer(b).run(text, len(LADDER) + 8)
    assert b.sent and b.sent[0]  # drafts were sent with the one model call
    assert len(b.sent) == 1
    assert {d.source for d in res.drafts} <= {"lookup", "suffix", "analogy", "typeahead"}
    if "return 'four'" in b.sent[0]:  # the analogy rule proposes the next line's shape
        assert res.suggestions[0].verified and res.suggestions[0].source != "model"
    # a draft the model does not verify: the model's own answer
    b2 = _Verifier(set(), ["return 'four'"])
    res2 = Completer(b2).run(text, len(LADDER) + 8)
    assert [(s.text, s.source, s.verified) for s in res2.suggestions] == [("return 'four'", "model", False)]


def test_verified_draft_is_marked_with_its_source():
    from diffill.lsp_server.completion.completer import Completer

    text = "total = compute(alpha, beta)\nx = 1\ntotal = compute(\n"
    b = _Verifier({"alpha, beta)"}, ["gamma)"])
    res = Completer(b).run(text, text.rindex("(") + 1)
    assert "alpha, beta)" in b.sent[0]
    assert [(s.text, s.verified) for s in res.suggestions] == [("alpha, beta)", True)]
    assert res.suggestions[0].source in ("lookup", "analogy")  # both copy the earlier line


def test_drafts_off_sends_none():
    from diffill.lsp_server.completion.completer import Completer
    from diffill.lsp_server.completion.options import CompletionOptions

    text = "total = compute(alpha, beta)\nx = 1\ntotal = compute(\n"
    b = _Verifier({"alpha, beta)"}, ["gamma)"])
    res = Completer(b, CompletionOptions(drafts=False)).run(text, text.rindex("(") + 1)
    assert b.sent == [[]] and res.drafts == []
    assert [s.text for s in res.suggestions] == ["gamma)"]


def test_token_healing_sends_the_word_and_the_draft():
    from diffill.lsp_server.completion.completer import Completer

    text = "result = compute_total(items)\nx = 1\nresult = comp\n"
    b = _Verifier({" compute_total(items)"}, [" nothing"])
    res = Completer(b).run(text, text.rindex("comp") + 4)
    assert " compute_total(items)" in b.sent[0]  # the hole starts at the word: " comp" + draft
    assert [(s.text, s.verified) for s in res.suggestions] == [("ute_total(items)", True)]


def test_a_verified_draft_that_post_processing_drops_runs_the_model_again():
    from diffill.lsp_server.backend.backends import Candidate, InfillResult
    from diffill.lsp_server.completion.completer import Completer

    class Mangles(_Verifier):  # "verifies" a draft but its text comes back empty
        def infill(self, ctx, ask):
            self.sent.append(list(ask.drafts))
            if ask.drafts:
                return InfillResult([Candidate(text="", score=0.0, steps=1, draft=0, accepted=0,
                                               verified=True)])
            return InfillResult([Candidate(text="gamma)", score=-1.0, steps=4)])

    text = "total = compute(alpha, beta)\nx = 1\ntotal = compute(\n"
    b = Mangles(set(), [])
    res = Completer(b).run(text, text.rindex("(") + 1)
    assert len(b.sent) == 2 and b.sent[1] == []
    assert [s.text for s in res.suggestions] == ["gamma)"]


# -- one budget per editor request ------------------------------------------------------------


class _Clocked(_ScriptedBackend):
    """Answers from a script, taking ``ms`` per call; keeps a 200 ms budget by default and
    records the budget each call was given."""

    def __init__(self, *answers, ms: float):
        super().__init__(*answers)
        self.ms = ms

    def budget_ms(self, requested=None):
        return 200.0 if requested is None else requested

    def infill(self, ctx, ask):
        import time

        time.sleep(self.ms / 1000.0)
        return super().infill(ctx, ask)


def test_a_later_model_call_gets_what_is_left_of_the_budget():
    from diffill.lsp_server.completion.completer import Completer

    text = "x = myna\n"  # token healing finds nothing: a second, plain call
    b = _Clocked(["foo"], ["me = 1"], ms=50.0)
    res = Completer(b).run(text, 8)
    first, second = (a.budget_ms for a in b.asks)
    assert first == 200.0 and second <= 150.0  # the request's budget, not each call's
    assert second == int(second)  # whole ms: few distinct budgets for the step plan
    assert res.model_calls == 2 and res.budget_ms == 200.0 and res.suggestions[0].text == "me = 1"
    slow = _Clocked(["foo"], ["me = 1"], ms=250.0)  # the first call spent it all
    Completer(slow).run(text, 8)
    assert [a.budget_ms for a in slow.asks] == [200.0, 200.0 / 16]  # one step's share at least


def test_a_spent_budget_skips_the_rerun_without_drafts():
    from diffill.lsp_server.backend.backends import Candidate, InfillResult
    from diffill.lsp_server.completion.completer import Completer, CompletionAsk

    class Mangles(_Clocked):  # "verifies" a draft but its text comes back empty
        def infill(self, ctx, ask):
            super().infill(ctx, ask)
            if ask.drafts:
                return InfillResult([Candidate(text="", score=0.0, steps=1, draft=0, verified=True)])
            return InfillResult([Candidate(text="gamma)", score=-1.0, steps=4)])

    text = "total = compute(alpha, beta)\nx = 1\ntotal = compute(\n"
    for budget, calls in ((20.0, 1), (5000.0, 2)):
        b = Mangles([""], [""], ms=30.0)
        res = Completer(b).run(text, text.rindex("(") + 1, CompletionAsk(budget_ms=budget))
        assert [bool(a.drafts) for a in b.asks] == [True, False][:calls]
        assert res.model_calls == calls and res.budget_ms == budget
    assert [s.text for s in res.suggestions] == ["gamma)"]  # with the budget left: the rerun's


# -- drafts at another depth ------------------------------------------------------------------

DEPTHS = """def a():
    if ready:
        x = prepare_the_input()
        check_the_input(x)


def b():
    x = prepare_the_input()
|
    return x
"""


def _cursor(marked: str) -> tuple[str, int]:
    return marked.replace("|", ""), marked.index("|")


def test_reindented_lines_a_draft_up_with_the_code_around_the_cursor():
    from diffill.lsp_server.completion.completer import Completer, reindented

    text, off = _cursor(DEPTHS)
    ctx = Completer(_Verifier(set(), [])).build(text, off)
    # the next line's depth first, then the line above's (its depth: it opens no block)
    assert reindented("        check_the_input(x)\n        if x:\n            go(x)", ctx) == [
        "    check_the_input(x)\n    if x:\n        go(x)"]
    assert reindented("    check_the_input(x)", ctx) == []  # already there
    assert reindented("      a\nb", ctx) == []  # shifting left would cut into "b"
    assert reindented("  a\nb", ctx) == ["    a\n  b"]  # shifting right loses nothing
    opened = DEPTHS.replace("    x = prepare_the_input()\n|\n    return x\n", "    for x in xs:\n|\n")
    text2, off2 = _cursor(opened)
    ctx2 = Completer(_Verifier(set(), [])).build(text2, off2)
    assert reindented("check(x)", ctx2) == ["        check(x)"]  # one level into the block
    typed = DEPTHS.replace("\n|\n", "\n    |\n")  # indentation typed at the cursor
    text3, off3 = _cursor(typed)
    ctx3 = Completer(_Verifier(set(), [])).build(text3, off3)
    assert reindented("    check_the_input(x)", ctx3) == ["check_the_input(x)"]
    code = DEPTHS.replace("\n|\n", "\n    y = 1|\n")
    text4, off4 = _cursor(code)
    assert reindented("        z = 2", Completer(_Verifier(set(), [])).build(text4, off4)) == []


def test_drafts_at_another_depth_are_shifted_only_when_nothing_else_is_kept(monkeypatch):
    from diffill.lsp_server.completion import completer as mod
    from diffill.lsp_server.drafting.query import Draft
    from diffill.lsp_server.text.syntax import SyntaxGuard

    text, off = _cursor(DEPTHS)
    c = mod.Completer(_Verifier(set(), []))
    ctx = c.build(text, off, language="python")
    guard = SyntaxGuard(text, off, language="python")
    deep = Draft("        check_the_input(x)", "lookup")  # as found: an unexpected indent
    monkeypatch.setattr(mod, "propose", lambda q: [deep])
    assert c.drafts_for(text, off, ctx, multiline=False, guard=guard) == [
        Draft("    check_the_input(x)", "lookup")]
    right = Draft("    print(x)", "analogy")
    monkeypatch.setattr(mod, "propose", lambda q: [deep, right])
    assert c.drafts_for(text, off, ctx, multiline=False, guard=guard) == [right]


STATS = Path(__file__).resolve().parents[4] / "examples" / "stats.py"
MEAN_BODY = "    total = 0\n    for v in values:\n        total += v\n    return total / len(values)"


def _stats_cursor() -> tuple[str, int]:
    text = STATS.read_text()
    return text, text.index("    m = mean(values)\n") + len("    m = mean(values)\n")


def test_shifted_drafts_stay_in_the_function_holding_the_cursor():
    """The README example (examples/stats.py line 15, column 1, inside ``variance``): the
    next line is ``def main():`` at column 0, and a block shifted there parses between the
    two functions -- it used to be tried first and was the example's suggestion."""
    from diffill.lsp_server.completion.completer import Completer, reindented

    text, off = _stats_cursor()
    ctx = Completer(_Verifier(set(), [])).build(text, off)
    assert reindented(MEAN_BODY.replace("\n    ", "\n        ").replace("    t", "        t", 1),
                      ctx) == [MEAN_BODY]  # into variance's body, never to column 0
    assert reindented(MEAN_BODY, ctx) == []  # already at that depth: nothing to shift
    # a dedent that stays inside the function is still tried, after the line above's depth
    nested, noff = _cursor("def f(xs):\n    for x in xs:\n        go(x)\n|\n    return xs\n")
    nctx = Completer(_Verifier(set(), [])).build(nested, noff)
    assert reindented("done(xs)", nctx) == ["        done(xs)", "    done(xs)"]


def test_a_copied_block_that_reads_names_unbound_where_it_lands_is_not_offered(monkeypatch):
    from diffill.lsp_server.completion import completer as mod
    from diffill.lsp_server.drafting.query import Draft
    from diffill.lsp_server.text.syntax import SyntaxGuard

    text, off = _stats_cursor()
    c = mod.Completer(_Verifier(set(), []))
    ctx = c.build(text, off, language="python")
    guard = SyntaxGuard(text, off, language="python")
    at_zero = Draft(MEAN_BODY.replace("\n    ", "\n")[4:], "analogy")  # mean's body at column 0
    monkeypatch.setattr(mod, "propose", lambda q: [at_zero])
    # as found it parses at column 0 (a block between the two functions) but reads `values`,
    # which only variance's parameters bind; shifted into variance it reads only its names
    assert guard.keeps(at_zero.text)
    assert c.drafts_for(text, off, ctx, multiline=True, guard=guard) == [
        Draft(MEAN_BODY, "analogy")]
    helper = Draft("    return spread(values, m)", "lookup")  # `spread` is bound nowhere
    monkeypatch.setattr(mod, "propose", lambda q: [helper])
    assert c.drafts_for(text, off, ctx, multiline=True, guard=guard) == []
    # without the syntax guard (option syntaxCheck off) nothing is judged
    assert c.drafts_for(text, off, ctx, multiline=True, guard=None) == [helper]


def test_extras_reach_the_header_only_when_their_option_is_on_in_the_familys_format():
    from diffill.lsp_server.completion.completer import Completer
    from diffill.lsp_server.completion.options import CompletionOptions
    from diffill.lsp_server.text.context import Snippet

    text = "x = 1\ny = "
    sn = [Snippet("defs.py", "def f(): ...\n", "python", "definition"),
          Snippet("near.py", "z = 3\n", "python", "workspace")]
    b = _ScriptedBackend(["2"], ["2"], ["2"])
    off = Completer(b, CompletionOptions(token_healing=False, drafts=False))
    off.run(text, len(text), snippets=sn, path="m.py")
    assert b.seen[-1][0] == text
    on = Completer(b, CompletionOptions(token_healing=False, drafts=False,
                                        definitions_context=True))
    on.run(text, len(text), snippets=sn, path="m.py")
    assert b.seen[-1][0] == "# path: defs.py\ndef f(): ...\n# path: m.py\n" + text
    b.cross_file = "qwen-repo"
    on.run(text, len(text), snippets=sn, path="m.py", repo="r")
    assert b.seen[-1][0] == "<|repo_name|>r\n<|file_sep|>defs.py\ndef f(): ...\n<|file_sep|>m.py\n" + text


def test_workspace_chunks_become_drafts():
    from diffill.lsp_server.completion.completer import Completer
    from diffill.lsp_server.completion.options import CompletionOptions

    text = "def rectangle_area(width, height):\n    area ="
    chunk = "def rectangle_area(width, height):\n    area = width * height\n"
    b = _ScriptedBackend([" width * height"])
    res = Completer(b, CompletionOptions(token_healing=False, syntax_check=False)).run(
        text, len(text), workspace=[chunk])
    assert [d.text for d in res.drafts] == [" width * height"]
    assert b.asks[0].drafts == (" width * height",)
