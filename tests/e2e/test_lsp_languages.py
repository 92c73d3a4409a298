"""The syntax guard for languages other than Python, end to end: the real ``diffill serve``
(pytest-lsp), a constant checkpoint whose middle is certain (it writes only ``w7``, fused:
``w7w7...``, one name), a TypeScript and a Go buffer. Where a name fits, the suggestion is
shown; where it would break the file (a name right after a complete expression), it is
withheld.

Skipped, with the reason, where tree-sitter or the grammar wheel is not installed."""

from __future__ import annotations

import os
import sys

import pytest
import pytest_asyncio
from diffill.lsp_server.text import treesitter
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities
from support.constant_checkpoint import word_id, write_constant_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

if not treesitter.available():
    pytest.skip("the tree-sitter package is not installed (text rules only)", allow_module_level=True)
for _lang, _wheel in (("typescript", "tree-sitter-typescript"), ("go", "tree-sitter-go")):
    if treesitter.grammar(_lang) is None:
        pytest.skip(f"the grammar wheel {_wheel} is not installed", allow_module_level=True)

SERVER = [sys.executable, "-m", "diffill.cli", "serve"]
OPTIONS = {"diffill": {"steps": 2, "maxTokens": 6, "numCandidates": 1, "drafts": False,
                       "syntaxCheck": True}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory):
    model = write_constant_checkpoint(tmp_path_factory.mktemp("w7-fused"), word_id(7), fuse=True)
    cfg = ClientServerConfig(server_command=[*SERVER, "--model", str(model)], server_env=dict(os.environ))
    c = await cfg.start()
    await c.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=OPTIONS))
    for _ in range(900):
        st = await c.protocol.send_request_async("diffill/status", None)
        if st.loaded or st.error:
            break
        await __import__("asyncio").sleep(0.1)
    assert st.loaded, st.error
    c.docs = 0
    yield c
    await c.shutdown_session()
    await c.stop()


async def suggest(c, text: str, language: str, ext: str) -> list[str]:
    """The inline suggestions at the ``|`` in ``text``."""
    off = text.index("|")
    text = text.replace("|", "", 1)
    line = text.count("\n", 0, off)
    col = off - (text.rfind("\n", 0, off) + 1)  # ASCII: utf-16 units are characters
    c.docs += 1
    uri = f"file:///tmp/diffill_e2e_lang/{c.docs}.{ext}"
    c.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id=language, version=1, text=text)))
    res = await c.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=col),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    items = res.items if hasattr(res, "items") else (res or [])
    return [it.insert_text if isinstance(it.insert_text, str) else it.insert_text.value for it in items]


TS = "function f(a: number): number {\n  const b = a * 2;\n  return %s\n}\n"
GO = "package main\n\nfunc main() {\n\tx := %s\n\tprintln(x)\n}\n%s"


async def test_typescript_good_suggestion_shown_breaking_one_withheld(client):
    good = await suggest(client, TS % "|", "typescript", "ts")
    assert good and good[0].startswith("w7"), good  # `return w7w7...`: a name, fine
    bad = await suggest(client, TS % "b |", "typescript", "ts")
    assert bad == []  # `return b w7w7...`: two names in a row break the file


async def test_go_good_suggestion_shown_breaking_one_withheld(client):
    good = await suggest(client, GO % ("|", ""), "go", "go")
    assert good and good[0].startswith("w7"), good  # `x := w7w7...`
    bad = await suggest(client, GO % ("1 |", ""), "go", "go")
    assert bad == []  # `x := 1 w7w7...`: a name after a complete expression


async def test_language_without_grammar_is_not_guarded(client):
    got = await suggest(client, TS % "b |", "kotlin", "kt")  # text rules only
    assert got and got[0].startswith("w7"), got
