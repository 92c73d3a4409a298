"""The completer: token healing and what it passes to the backend (scripted backend:
control flow only)."""

from __future__ import annotations

# -- token healing (mock backend: control flow only) ---------------------------------------------

class _ScriptedBackend:
    """Answers each infill with the next scripted list of raw middles; records contexts."""

    name = "scripted"

    def __init__(self, *answers: list[str]):
        self.answers = list(answers)
        self.seen = []

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens):
        return None

    def infill(self, ctx, *, n, max_tokens, steps=None, latency_budget_ms=None, cancel=None, **kw):
        from diffill.lsp_server.backends import Candidate

        self.seen.append((ctx.prefix, ctx.suffix))
        self.kwargs = {"steps": steps, **kw}
        return [Candidate(text=t, score=-float(i)) for i, t in enumerate(self.answers.pop(0))]

    def describe(self):
        return {}


def test_partial_word_boundaries():
    from diffill.lsp_server.completer import partial_word

    assert partial_word("    return to", 13) == " to"
    assert partial_word("    return ", 11) == " "
    assert partial_word("    ", 4) == ""  # indentation is not healed
    assert partial_word("f(a", 3) == "a"
    assert partial_word("abcd", 2) == ""  # inside a word
    assert partial_word("x = " + "y" * 40, 44) == ""  # too long


def test_token_healing_fills_from_the_word_start():
    from diffill.lsp_server.completer import Completer

    text = "def f(a):\n    return to\n"
    b = _ScriptedBackend([" total", " other", " to"])
    res = Completer(b).run(text, text.index("to\n") + 2, n=3)
    assert b.seen == [("def f(a):\n    return", "\n")]  # the hole starts before " to"
    assert [s.text for s in res.suggestions] == ["tal"]  # " other" and a bare " to" dropped
    assert res.context.line_prefix == "    return to"


def test_token_healing_falls_back_when_nothing_matches():
    from diffill.lsp_server.completer import Completer
    from diffill.lsp_server.options import CompletionOptions

    text = "x = myna\n"
    b = _ScriptedBackend(["foo"], ["me = 1"])
    res = Completer(b).run(text, 8, n=1)
    assert b.seen == [("x =", "\n"), ("x = myna", "\n")]
    assert [s.text for s in res.suggestions] == ["me = 1"]
    off = Completer(b, CompletionOptions(token_healing=False))
    b.answers.append(["bar"])
    off.run(text, 8)
    assert b.seen[-1] == ("x = myna", "\n")


def test_run_passes_steps_and_backend_kwargs():
    from diffill.lsp_server.completer import Completer

    b = _ScriptedBackend(["1"])
    Completer(b).run("x = (\n", 5, steps=3, backend_kwargs={"temperature": 0.5, "seed": 7})
    assert b.kwargs == {"steps": 3, "temperature": 0.5, "seed": 7}
