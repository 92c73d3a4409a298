"""The workspace index end to end: a real ``diffill serve`` over stdio (pytest-lsp) opened on a
two-file workspace folder.

The model is the scripted checkpoint (``scripted_model_dir``) with its draft verification bar
at 0 (``draft_ratio`` in its config.json): the script has no rule for these documents, so the
model alone writes nothing at all, and every draft it is sent is verified. A suggestion can
then only be a draft -- and the only text the right draft can be copied from is the other
file of the workspace, which the editor never opened.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _lsp_status import status, wait_status
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SERVER = [sys.executable, "-m", "diffill.cli", "serve"]
OPTIONS = {"diffill": {"steps": 2, "maxTokens": 32, "numCandidates": 1, "syntaxCheck": False}}
GEOMETRY = (
    "def rectangle_area(width, height):\n"
    "    area = width * height + border_margin(width)\n"
    "\n"
    "    return area\n"
)
MAIN = "import geometry\n\n\ndef rectangle_area(width, height):\n    area ="


@pytest.fixture(scope="module")
def any_draft_model(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted checkpoint with ``draft_ratio`` 0: it verifies whatever draft it gets."""
    folder = tmp_path_factory.mktemp("any-draft-model") / "model"
    shutil.copytree(scripted_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["draft_ratio"] = 0.0
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws")
    (root / "geometry.py").write_text(GEOMETRY)
    (root / "main.py").write_text(MAIN)
    (root / ".gitignore").write_text("ignored/\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "copy.py").write_text(GEOMETRY.replace("border_margin", "WRONG"))
    return root


async def start(model: Path, root: Path, options: dict[str, Any]) -> LanguageClient:
    cfg = ClientServerConfig(server_command=[*SERVER, "--model", str(model)],
                             server_env=dict(os.environ))
    client = await cfg.start()
    client.registrations = []

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register(params: types.RegistrationParams) -> None:
        client.registrations.extend(r.method for r in params.registrations)

    caps = client_capabilities("visual-studio-code")
    await client.initialize_session(types.InitializeParams(
        capabilities=caps, initialization_options=options, root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)]))
    return client


async def ready(client: LanguageClient, timeout: float = 90.0) -> Any:
    return await wait_status(client, lambda st: (st.loaded or st.error) and st.workspace.state == "ready",
                             "model or workspace index not ready", timeout)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(any_draft_model: Path, workspace: Path):
    on = await start(any_draft_model, workspace, OPTIONS)
    off = await start(any_draft_model, workspace,
                      {"diffill": {**OPTIONS["diffill"], "workspaceDrafts": False}})
    yield on, off
    for c in (on, off):
        await c.shutdown_session()


async def ask(client: LanguageClient, root: Path) -> list[str]:
    uri = (root / "main.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=MAIN)))
    last = MAIN.split("\n")
    pos = types.Position(line=len(last) - 1, character=len(last[-1]))
    res = await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=pos,
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    return [i.insert_text for i in res.items]


async def test_a_suggestion_copied_from_the_other_file(clients, workspace: Path):
    on, _ = clients
    st = await ready(on)
    assert st.workspace.files == 2  # geometry.py, main.py; ignored/ is .gitignore'd
    assert st.workspace.roots == [str(workspace)]
    got = await ask(on, workspace)
    assert got == [" width * height + border_margin(width)"]
    st = await status(on)
    assert (st.last_context.source, st.last_context.steps) == ("lookup", 1)
    assert types.WORKSPACE_DID_CHANGE_WATCHED_FILES in on.registrations
    assert any(p.get("kind") == "end" if isinstance(p, dict) else getattr(p, "kind", "") == "end"
               for reports in on.progress_reports.values() for p in reports)


async def test_without_workspace_drafts_the_model_alone_has_nothing(clients, workspace: Path):
    _, off = clients
    await ready(off)
    assert await ask(off, workspace) == []
