"""Pure helpers of the language server module: a repeated request at the same spot is
answered from the typed-ahead cache."""

from __future__ import annotations

from diffill.lsp_server.completion.completer import Suggestion
from diffill.lsp_server.protocol.documents import Prepared
from diffill.lsp_server.protocol.server import DiffillServer


def test_asking_again_at_the_same_spot_is_answered_from_the_cache():
    """A run asked for 3 candidates that found 1 is not repeated for the same question (it
    would find the same one, or with a step count from measured timings, another)."""
    srv = DiffillServer()
    line = "    x = "
    prep = Prepared(uri="u", version=1, row=3, col=len(line), line=line, text=line, offset=len(line),
                    line_prefix=line, line_suffix="", start=len(line), end=len(line), lead="",
                    language="python", path=None)
    assert srv.cached(prep, 1) is None
    srv.cache.store("u", 3, line, "", [Suggestion("foo(bar)", 1.0)], asked=3)
    assert [s.text for s in srv.cached(prep, 3)] == ["foo(bar)"]
    assert [s.text for s in srv.cached(prep, 1)] == ["foo(bar)"]
    assert srv.cached(prep, 4) is None  # more than that run was asked for: run the model
    srv.cache.store("u", 3, line, "", [Suggestion("foo(bar)", 1.0)], asked=1)
    assert srv.cached(prep, 3) is None  # an automatic answer (1 candidate) for an invoked request
    assert srv.cache.asked("u") == 1 and srv.cache.asked("other") == 0
