"""Requests that arrive while the real ``diffill serve`` loads its model (issue 31, point 5),
and what a completion writes to stderr (point 6).

The editor opens a file and the user types at once: the server is still loading the model
(2.4-4 s for the shipped one). Such a request used to be answered empty, and the editor was
never told to ask again, so the first suggestion came only after another keystroke. Now it
waits for the load -- bounded by ``server.LOAD_WAIT_S``, cancelled by ``$/cancelRequest``,
and superseded by a newer request of the same kind on the same document (latest wins: the
older one is answered empty at once).

The load is held with the test hook ``DIFFILL_DEBUG_LOAD_DELAY_MS`` (the worker sleeps before
it loads), so "still loading" holds on any machine. The scripted checkpoint answers
``v * v for v in values]`` after ``    result = [`` (tests/support/scripted_model.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _lsp_raw import SERVE, RawClient, server_env
from _lsp_status import status, wait_status
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = [pytest.mark.e2e]

SERVER = [sys.executable, "-m", "diffill.cli", "serve"]
DELAY_MS = 2500
HOLD = {"DIFFILL_DEBUG_LOAD_DELAY_MS": str(DELAY_MS)}
OPTS = {"diffill": {"steps": 2, "maxTokens": 16, "numCandidates": 1, "syntaxCheck": False}}
DOC = "def square_list(values):\n    result = [\n    return result\n"
POS = types.Position(line=1, character=len("    result = ["))
ANSWER = "v * v for v in values]"
URI = "file:///tmp/diffill_loading/doc.py"


@contextlib.asynccontextmanager
async def loading(model: Path) -> AsyncIterator[LanguageClient]:
    """A server whose model load is held ``DELAY_MS``, initialized, ``DOC`` open; shut down
    after the test."""
    cfg = ClientServerConfig(
        server_command=[*SERVER, "--model", str(model)], server_env={**os.environ, **HOLD},
    )
    client = await cfg.start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("neovim@v0.11.0"), initialization_options=OPTS))
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=URI, language_id="python", version=1, text=DOC)))
    try:
        yield client
    finally:
        await client.shutdown_session()


def inline(client: LanguageClient) -> asyncio.Future:
    return asyncio.ensure_future(client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=URI), position=POS,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))))


def texts(result) -> list[str]:
    items = result.items if hasattr(result, "items") else (result or [])
    return [i.insert_text if isinstance(i.insert_text, str) else i.insert_text.value for i in items]


@pytest.mark.asyncio
async def test_a_request_while_the_model_loads_waits_for_it(scripted_model_dir: Path) -> None:
    async with loading(scripted_model_dir) as client:
        t0 = time.monotonic()
        fut = inline(client)
        await asyncio.sleep(0.3)
        st = await status(client)
        assert st.loading is True and st.loaded is False, st
        assert not fut.done(), "answered before the model loaded"
        result = await asyncio.wait_for(fut, 60)
        took = time.monotonic() - t0
        assert texts(result) == [ANSWER], result
        assert took >= DELAY_MS / 1000 * 0.8, took  # it did wait for the load
        st = await status(client)
        assert st.loaded is True and st.waited_for_load == 1 and st.not_ready == 0, st
        assert st.p95_ms < DELAY_MS, st  # latencies count the completion, not the wait


@pytest.mark.asyncio
async def test_a_newer_request_supersedes_the_waiting_one(scripted_model_dir: Path) -> None:
    async with loading(scripted_model_dir) as client:
        first = inline(client)
        await asyncio.sleep(0.3)
        second = inline(client)
        # latest wins: the first is answered empty at once, long before the load ends
        r1 = await asyncio.wait_for(first, 1.5)
        assert texts(r1) == [], r1
        assert not second.done()
        r2 = await asyncio.wait_for(second, 60)
        assert texts(r2) == [ANSWER], r2


@pytest.mark.asyncio
async def test_cancel_request_stops_the_wait_not_the_load(scripted_model_dir: Path) -> None:
    async with loading(scripted_model_dir) as client:
        fut = inline(client)
        await asyncio.sleep(0.3)
        rid = max(client.protocol._request_futures)  # the inline request's id
        client.protocol.notify("$/cancelRequest", types.CancelParams(id=rid))
        with pytest.raises(JsonRpcException) as exc:
            await asyncio.wait_for(fut, 1.5)
        assert exc.value.code == -32800  # RequestCancelled, before the load ends
        await wait_status(client, lambda st: st.loaded, "the load did not go on", 60)
        assert texts(await asyncio.wait_for(inline(client), 30)) == [ANSWER]


def test_completion_requests_write_nothing_at_info_to_stderr(scripted_model_dir: Path, tmp_path: Path) -> None:
    err_path = tmp_path / "server.err"
    c = RawClient([*SERVE, "--model", str(scripted_model_dir)], env=server_env(), stderr_path=err_path)
    try:
        c.initialize(OPTS)
        assert c.wait_loaded()["loaded"]
        c.open(URI, DOC)
        time.sleep(0.5)  # lifecycle lines (model loaded) are written by now
        before = err_path.read_text(errors="replace")
        for _ in range(3):
            res = c.wait_for(c.inline_async(URI, POS.line, POS.character), 60)
            assert [i["insertText"] for i in res["result"]["items"]] == [ANSWER], res
            res = c.wait_for(c.completion_async(URI, POS.line, POS.character), 60)
            assert res["result"]["items"], res
        time.sleep(0.3)
        after = err_path.read_text(errors="replace")
        assert "model loaded" in before, before  # lifecycle lines stay at INFO
        assert after[len(before):] == "", after[len(before):]
    finally:
        assert c.shutdown() == 0
