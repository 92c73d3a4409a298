"""The real ``diffill serve`` subprocess driven over stdio by pytest-lsp.

Servers started (module scope, one event loop):

* ``client``: one per client capability set (Neovim 0.11, VS Code, Emacs), which
  negotiate utf-8, utf-16 and utf-32 positions respectively;
* ``slow``: VS Code capabilities with the test hook ``DIFFILL_DEBUG_STEP_DELAY_MS``
  (a sleep in every per-step cancel check) so that cancellation and supersession are
  deterministic;
* ``broken``: a model path that does not exist.

All of them serve the scripted checkpoint (``scripted_model_dir``,
tests/support/scripted_model.py), whose answers are certain: the documents are
functions of the micro corpus whose prompts its script answers, and the tests
state the suggestions they expect.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _lsp_status import status, wait_status
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SERVER = [sys.executable, "-m", "diffill.cli", "serve"]
CLIENTS = {
    "neovim@v0.11.0": "utf-8",
    "visual-studio-code": "utf-16",
    "emacs": "utf-32",
}
# Protocol mechanics; the syntax guard has its own tests (tests/unit/lsp_server/text/test_syntax.py).
FAST = {"diffill": {"steps": 2, "maxTokens": 16, "numCandidates": 3, "syntaxCheck": False}}
STEP_DELAY_MS = 100
SLOW = {"diffill": {"steps": 4, "maxTokens": 16, "numCandidates": 1, "syntaxCheck": False}}

CORPUS = (Path(__file__).resolve().parents[1] / "fixtures" / "micro_corpus.py").read_text()


def block(name: str) -> str:
    """The micro corpus function ``name``, text up to the next blank line."""
    start = CORPUS.index(f"def {name}(")
    end = CORPUS.find("\n\n", start)
    return CORPUS[start:] if end < 0 else CORPUS[start:end + 1]


def cut(text: str, line: str, keep: str) -> str:
    """``text`` with the line whose content is ``line`` replaced by ``keep`` (the cursor
    goes at its end), indentation kept."""
    whole = next(ln for ln in text.split("\n") if ln.strip() == line)
    return text.replace(whole, whole[: whole.index(line)] + keep, 1)


GREET = block("greet_user")
ADD = block("add_numbers")
SQUARE = block("square_list")


# ----------------------------------------------------------------------------- helpers


async def start(model: Path | str, spec: str, init: dict | None, env: dict[str, str] | None = None,
                args: tuple[str, ...] = ()) -> LanguageClient:
    cfg = ClientServerConfig(
        server_command=[*SERVER, "--model", str(model), *args],
        server_env={**os.environ, **(env or {})},
    )
    client = await cfg.start()
    client.init_result = await client.initialize_session(
        types.InitializeParams(capabilities=client_capabilities(spec), initialization_options=init)
    )
    client.spec = spec
    client.encoding = CLIENTS[spec]
    client.docs = 0
    return client


async def wait_loaded(client: LanguageClient, timeout: float = 90.0) -> Any:
    return await wait_status(client, lambda st: st.loaded or st.error, "model did not load", timeout)


def open_doc(client: LanguageClient, text: str, name: str = "") -> str:
    client.docs += 1
    uri = f"file:///tmp/diffill_e2e/{client.docs}{name or '_doc'}.py"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    return uri


def change(client: LanguageClient, uri: str, version: int, start: types.Position,
           end: types.Position, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=start, end=end), text=text)]))


def units(s: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(s.encode("utf-8"))
    if encoding == "utf-16":
        return len(s.encode("utf-16-le")) // 2
    return len(s)


def end_of(text: str, line: int, encoding: str) -> types.Position:
    return types.Position(line=line, character=units(text.split("\n")[line], encoding))


def completion(client: LanguageClient, uri: str, pos: types.Position):
    return client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=pos))


def inline(client: LanguageClient, uri: str, pos: types.Position, invoked: bool = False,
           selected: types.SelectedCompletionInfo | None = None):
    kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
    return client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=pos,
        context=types.InlineCompletionContext(trigger_kind=kind, selected_completion_info=selected)))


# ----------------------------------------------------------------------------- servers


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """All five servers, started concurrently (start-up is mostly imports and model loading)."""
    log = tmp_path_factory.mktemp("slowlog") / "server.log"
    bad = tmp_path_factory.mktemp("nomodel") / "does-not-exist"
    starts = {spec: start(model_dir, spec, FAST) for spec in CLIENTS}
    starts["slow"] = start(model_dir, "visual-studio-code", SLOW,
                           {"DIFFILL_DEBUG_STEP_DELAY_MS": str(STEP_DELAY_MS)}, args=("--log-file", str(log), "--log-level", "debug"))
    starts["broken"] = start(bad, "neovim@v0.11.0", None)
    clients = dict(zip(starts, await asyncio.gather(*starts.values()), strict=True))
    clients["slow"].log_file = log
    loaded = await asyncio.gather(*(wait_loaded(c) for c in clients.values()))
    for name, st in zip(clients, loaded, strict=True):
        assert st.loaded or name == "broken", (name, st.error)
    yield clients
    for c in clients.values():
        await c.shutdown_session()
        await c.stop()
    for name, c in clients.items():
        assert c._server.returncode == 0, name  # shutdown + exit -> 0


@pytest.fixture(params=list(CLIENTS))
def client(request: pytest.FixtureRequest, servers: dict[str, LanguageClient]) -> LanguageClient:
    """One server per client capability set (utf-8 / utf-16 / utf-32 positions)."""
    return servers[request.param]


@pytest.fixture()
def slow(servers: dict[str, LanguageClient]) -> LanguageClient:
    """VS Code capabilities, DIFFILL_DEBUG_STEP_DELAY_MS per step, --log-file at DEBUG."""
    return servers["slow"]


@pytest.fixture()
def broken(servers: dict[str, LanguageClient]) -> LanguageClient:
    """A model path that does not exist."""
    return servers["broken"]


# ----------------------------------------------------------------------------- every client


async def test_initialize_capabilities_and_progress(client: LanguageClient):
    caps = client.init_result.capabilities
    assert caps.position_encoding == client.encoding
    assert caps.completion_provider is not None and "." in caps.completion_provider.trigger_characters
    assert caps.inline_completion_provider is not None
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    # model loading was reported with $/progress begin ... end
    kinds = [[v.kind for v in vals] for vals in client.progress_reports.values()]
    assert ["begin", "end"] in kinds
    st = await status(client)
    assert st.position_encoding == client.encoding
    assert (st.family, st.device, st.error) == ("diffill", "cpu", None)


async def test_completion_item_shape(client: LanguageClient):
    text = cut(ADD, "return total", "return to")
    uri = open_doc(client, text)
    pos = end_of(text, 2, client.encoding)
    res = await completion(client, uri, pos)
    # token healing: the model filled the hole from "return" (script: " total"), the item
    # replaces the typed word "to" with "total"
    [item] = res.items
    edit = item.text_edit
    assert edit.new_text == "total"
    assert edit.range == types.Range(start=types.Position(line=2, character=pos.character - 2), end=pos)
    assert item.filter_text == item.label == "total"
    doc = item.documentation if isinstance(item.documentation, str) else item.documentation.value
    assert "total" in doc
    assert item.insert_text_format == types.InsertTextFormat.PlainText
    assert item.kind == types.CompletionItemKind.Text
    assert item.sort_text == "0000" and item.preselect
    # asked again at the same spot (Neovim's menu after a plain request): the same answer,
    # from the typed-ahead cache although the run asked for 3 candidates found 1
    before = await status(client)
    again = await completion(client, uri, pos)
    st = await status(client)
    assert [i.text_edit.new_text for i in again.items] == ["total"]
    assert st.model_calls == before.model_calls and st.cache_hits == before.cache_hits + 1


async def test_a_repeated_line_is_a_draft_verified_in_one_step(client: LanguageClient):
    """Draft and verify: the second copy of a function asks for the line the first one
    holds; prompt lookup proposes it, the model (the script writes " a + b" there) verifies
    it in its first step, and the answer takes that one step."""
    second = cut(ADD, "total = a + b", "total =")
    text = ADD + "\n" + second
    row = ADD.count("\n") + 2  # the "    total =" line of the second copy
    uri = open_doc(client, text)
    before = await status(client)
    res = await inline(client, uri, end_of(text, row, client.encoding))
    st = await status(client)
    assert [i.insert_text for i in res.items] == [" a + b"]
    assert st.model_calls == before.model_calls + 1
    assert st.drafts.accepted == before.drafts.accepted + 1
    assert st.drafts.accepted_by_source.lookup == getattr(
        before.drafts.accepted_by_source, "lookup", 0) + 1
    assert (st.last_context.steps, st.last_context.source) == (1, "lookup")
    assert "lookup" in st.last_context.drafts


async def test_positions_with_emoji_in_each_encoding(client: LanguageClient):
    enc = client.encoding
    text = cut(GREET, 'message = "hello " + name', 'message = "hello 😀" + na')
    uri = open_doc(client, text)
    line = text.split("\n")[1]
    res = await completion(client, uri, end_of(text, 1, enc))
    word_start = units(line[: line.rindex("na")], enc)
    assert [i.text_edit.new_text for i in res.items] == ["name"]
    assert res.items[0].text_edit.range == types.Range(
        start=types.Position(line=1, character=word_start), end=end_of(text, 1, enc))
    # positions in: an incremental edit right after the emoji, in client units
    after_emoji = units(line[: line.index("😀") + 1], enc)
    change(client, uri, 2, types.Position(line=1, character=after_emoji),
           types.Position(line=1, character=after_emoji), "!")
    line2 = line.replace("😀", "😀!")
    got = await inline(client, uri, types.Position(line=1, character=units(line2, enc)))
    assert [i.insert_text for i in got.items] == ["me"]  # "na" typed, " name" written
    cursor = types.Position(line=1, character=units(line2, enc))
    assert got.items[0].range == types.Range(start=cursor, end=cursor)
    st = await status(client)
    assert st.requests >= 2


async def test_inline_invoked_vs_automatic(client: LanguageClient):
    # The script writes 'message = "hello " + name' (7 tokens) after the indentation. With
    # numCandidates 3 and maxTokens 16 the holes are 4, 8 and 16 tokens: the 4-token hole is
    # too short and holds the start of it, ranked after the whole line.
    text = cut(GREET, 'message = "hello " + name', "")
    uri_a = open_doc(client, text)
    uri_b = open_doc(client, text)
    pos = end_of(text, 1, client.encoding)
    auto = await inline(client, uri_a, pos, invoked=False)
    invoked = await inline(client, uri_b, pos, invoked=True)
    assert [i.insert_text for i in auto.items] == ['message = "hello " + name']
    assert [i.insert_text for i in invoked.items] == ['message = "hello " + name', 'message = "hello']
    for item in auto.items + invoked.items:
        assert item.range == types.Range(start=pos, end=pos)


async def test_selected_completion_info(client: LanguageClient):
    text = cut(GREET, 'message = "hello " + name', "mess")
    uri = open_doc(client, text)
    pos = end_of(text, 1, client.encoding)
    sel = types.SelectedCompletionInfo(
        range=types.Range(start=types.Position(line=1, character=4), end=pos), text="message")
    res = await inline(client, uri, pos, invoked=True, selected=sel)
    # the model completes the line with the selected item's text in place (healed from its
    # start: ' message = "hello " + name'); the answer replaces the selected range
    assert [i.insert_text for i in res.items] == ['message = "hello " + name', 'message = "hello']
    for item in res.items:
        assert item.range == types.Range(start=sel.range.start, end=pos)


# ----------------------------------------------------------------------------- freshness


async def test_cancel_request_answers_request_cancelled(slow: LanguageClient):
    uri = open_doc(slow, GREET)
    before = await status(slow)
    fut = asyncio.ensure_future(slow.protocol.send_request_async(
        types.TEXT_DOCUMENT_COMPLETION,
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri),
                               position=types.Position(line=2, character=4)),
        msg_id="cancel-me"))
    await asyncio.sleep(STEP_DELAY_MS * 2 / 1000)
    slow.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="cancel-me"))
    with pytest.raises(JsonRpcException) as exc:
        await asyncio.wait_for(fut, 10)
    assert exc.value.code == -32800
    for _ in range(50):  # the worker stops at its next step check
        st = await status(slow)
        if st.engine_cancelled == (before.engine_cancelled or 0) + 1:
            break
        await asyncio.sleep(0.05)
    assert st.engine_cancelled == (before.engine_cancelled or 0) + 1
    assert st.cancelled == getattr(before, "cancelled", 0) + 1


async def test_newer_request_supersedes_older(slow: LanguageClient):
    uri = open_doc(slow, GREET)
    before = await status(slow)
    first = asyncio.ensure_future(completion(slow, uri, types.Position(line=2, character=4)))
    await asyncio.sleep(STEP_DELAY_MS * 1.5 / 1000)
    second = asyncio.ensure_future(completion(slow, uri, types.Position(line=3, character=4)))
    r1, r2 = await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert len(r1.items) == 0 and r1.is_incomplete  # superseded: empty, never silent
    st = await status(slow)
    assert st.superseded == getattr(before, "superseded", 0) + 1
    assert st.model_requests == getattr(before, "model_requests", 0) + 1  # the second one ran
    assert isinstance(r2, types.CompletionList)


async def test_document_change_cancels_running_request(slow: LanguageClient):
    uri = open_doc(slow, GREET)
    before = await status(slow)
    fut = asyncio.ensure_future(inline(slow, uri, types.Position(line=2, character=4)))
    await asyncio.sleep(STEP_DELAY_MS * 1.5 / 1000)
    change(slow, uri, 2, types.Position(line=0, character=0), types.Position(line=0, character=0), "# hi\n")
    res = await asyncio.wait_for(fut, 10)
    assert len(res.items) == 0
    st = await status(slow)
    assert st.superseded == getattr(before, "superseded", 0) + 1


async def test_typed_ahead_answers_without_model_call(slow: LanguageClient):
    text = cut(GREET, 'message = "hello " + name', "")
    uri = open_doc(slow, text)
    pos = end_of(text, 1, "utf-16")
    first = await inline(slow, uri, pos)
    assert [i.insert_text for i in first.items] == ['message = "hello " + name']
    before = await status(slow)
    change(slow, uri, 2, pos, pos, "me")
    t0 = time.monotonic()
    second = await inline(slow, uri, types.Position(line=1, character=pos.character + 2))
    took = time.monotonic() - t0
    st = await status(slow)
    assert st.model_calls == before.model_calls  # no model call
    assert st.cache_hits == getattr(before, "cache_hits", 0) + 1
    assert [i.insert_text for i in second.items] == ['ssage = "hello " + name']
    assert second.items[0].range.start.character == pos.character + 2
    print(f"typed-ahead answer in {took * 1000:.1f} ms")


async def test_completion_and_inline_together_one_model_call(slow: LanguageClient):
    # VS Code asks for both on a keystroke: neither cancels the other, one model call serves both
    text = cut(GREET, 'message = "hello " + name', "message = ")
    uri = open_doc(slow, text)
    pos = end_of(text, 1, "utf-16")
    before = await status(slow)
    comp, inl = await asyncio.wait_for(asyncio.gather(
        completion(slow, uri, pos), inline(slow, uri, pos)), 20)
    st = await status(slow)
    assert st.model_calls == before.model_calls + 1 and st.superseded == before.superseded
    assert st.cache_hits == before.cache_hits + 1
    assert [i.text_edit.new_text for i in comp.items] == [i.insert_text for i in inl.items] == [
        '"hello " + name']


# ----------------------------------------------------------------------------- robustness


async def test_bad_params_and_server_stays_up(slow: LanguageClient):
    unknown = await completion(slow, "file:///nowhere/unknown.py", types.Position(line=0, character=0))
    assert len(unknown.items) == 0
    uri = open_doc(slow, ADD)
    with pytest.raises(JsonRpcException) as exc:
        await completion(slow, uri, types.Position(line=99, character=0))
    assert exc.value.code == -32602 and "outside the document" in exc.value.message
    # a character past the end of a line means the end of the line (LSP), not an error
    res = await inline(slow, uri, types.Position(line=1, character=500))
    assert isinstance(res, types.InlineCompletionList)
    st = await status(slow)
    assert st.loaded


async def test_did_change_configuration_bad_value(slow: LanguageClient):
    n_msgs = len(slow.messages)
    slow.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"diffill": {"maxTokens": "lots", "numCandidates": 2}}))
    for _ in range(50):
        if len(slow.messages) > n_msgs:
            break
        await asyncio.sleep(0.05)
    msg = slow.messages[n_msgs]
    assert msg.type == types.MessageType.Error and "maxTokens" in msg.message
    st = await status(slow)
    assert st.options.numCandidates == 2 and st.options.maxTokens == SLOW["diffill"]["maxTokens"]


async def test_status_fields(slow: LanguageClient):
    st = await status(slow)
    for key in ("model", "family", "device", "loaded", "error", "requests", "p50_ms", "p95_ms",
                "model_p50_ms", "model_p95_ms", "model_calls", "cache_hits"):
        assert hasattr(st, key), key
    assert st.p50_ms is not None and st.p95_ms >= st.p50_ms


async def test_log_never_holds_buffer_contents(slow: LanguageClient):
    uri = open_doc(slow, "SECRET_MARKER = 1\n" + GREET)
    await completion(slow, uri, types.Position(line=1, character=0))
    await status(slow)
    log = slow.log_file.read_text()
    # the server logs each request (at DEBUG since issue 31.6: --log-level debug here)...
    assert " DEBUG diffill.server: complete " in log
    assert "SECRET_MARKER" not in log and 'message = "hello "' not in log  # ...never buffers


async def test_load_failure_shows_message_and_answers_empty(broken: LanguageClient):
    st = await wait_loaded(broken)
    assert not st.loaded and "does-not-exist" in st.error
    errors = [m for m in broken.messages if m.type == types.MessageType.Error]
    assert errors and "cannot load model" in errors[0].message
    uri = open_doc(broken, ADD)
    res = await completion(broken, uri, types.Position(line=2, character=4))
    assert len(res.items) == 0
    res2 = await inline(broken, uri, types.Position(line=2, character=4), invoked=True)
    assert len(res2.items) == 0
