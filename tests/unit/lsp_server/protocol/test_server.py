"""Pure helpers of the language server module: log records never carry buffers; a repeated
request at the same spot is answered from the typed-ahead cache."""

from __future__ import annotations

from diffill.lsp_server.completion.completer import Suggestion
from diffill.lsp_server.protocol.server import DiffillServer, Prepared
from lsprotocol import types

# -- logging ----------------------------------------------------------------------------------

def test_pygls_log_records_never_carry_buffers():
    import io
    import logging

    from diffill.lsp_server.protocol.server import RedactBuffers

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(RedactBuffers())
    logger = logging.getLogger("pygls.protocol.test_redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        params = types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri="file:///a.py", language_id="python", version=1, text="SECRET_BUFFER"))
        logger.warning('Unknown message "%s"', params)
        logger.warning("raw %s", '{"text": "SECRET_BUFFER"}')
        logger.warning("id %s method %s", 7, "textDocument/completion")
    finally:
        logger.removeHandler(handler)
    out = buf.getvalue()
    assert "SECRET_BUFFER" not in out
    assert "<DidOpenTextDocumentParams redacted>" in out and "id 7 method textDocument/completion" in out


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
