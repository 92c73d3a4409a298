"""The language server's logging (lsp_server/protocol/server_log.py): log records never
carry buffers."""

from __future__ import annotations

from lsprotocol import types


def test_pygls_log_records_never_carry_buffers():
    import io
    import logging

    from diffill.lsp_server.protocol.server_log import RedactBuffers

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
