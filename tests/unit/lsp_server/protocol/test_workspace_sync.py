"""The server's side of the workspace: edits re-index, watched files, options that turn
each part off (the build and the watcher registration: tests/e2e/test_lsp_workspace.py)."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
from diffill.lsp_server.completion.options import CompletionOptions
from diffill.lsp_server.protocol.workspace_sync import WorkspaceSync
from lsprotocol import types

CHUNK = "def rectangle_area(width, height):\n    area = width * height\n"
HERE = "def rectangle_area(width, height):\n    area ="


def wait_for(cond, timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout
        time.sleep(0.02)


def test_edits_are_reindexed_and_feed_drafts_and_the_ring(tmp_path: Path):
    opts = CompletionOptions()
    ws = WorkspaceSync(lambda: opts)
    ws.roots = [str(tmp_path)]
    texts = {"file:///o.py": CHUNK}
    ws.edited("file:///o.py", "/o.py", 1, "python", texts.get)  # outside the roots: still indexed
    wait_for(lambda: "/o.py" in ws.index)
    ex = ws.extras("file:///h.py", "/h.py", HERE, len(HERE), "python", texts.get)
    assert ex.workspace == [CHUNK] and ex.snippets == []
    assert len(ws.ring) == 1
    ws.closed("file:///o.py", "/o.py")
    wait_for(lambda: "/o.py" not in ws.index)
    ws.shutdown()


def test_watched_files_and_saves(tmp_path: Path):
    opts = CompletionOptions()
    ws = WorkspaceSync(lambda: opts)
    ws.roots = [str(tmp_path)]
    f = tmp_path / "a.py"
    f.write_text(CHUNK)
    ws.watched([types.FileEvent(uri=f.as_uri(), type=types.FileChangeType.Created)])
    wait_for(lambda: str(f) in ws.index)
    f.write_text("x = 1\n")
    ws.saved(str(f))
    wait_for(lambda: ws.index.file_text(str(f)) == "x = 1\n")
    ws.watched([types.FileEvent(uri=f.as_uri(), type=types.FileChangeType.Deleted)])
    wait_for(lambda: str(f) not in ws.index)
    ws.watched([types.FileEvent(uri=(tmp_path.parent / "out.py").as_uri(),
                                type=types.FileChangeType.Created)])  # outside: ignored
    ws.shutdown()


def test_saved_and_watched_files_the_build_leaves_out_stay_out(tmp_path: Path):
    """An ``npm install``, a build or a virtual environment under the folder: the watcher's
    events and saves name files that ``.gitignore`` or the vendored folders exclude."""
    opts = CompletionOptions()
    ws = WorkspaceSync(lambda: opts)
    ws.roots = [str(tmp_path)]
    (tmp_path / ".gitignore").write_text("out/\n")
    rels = ["node_modules/x.js", "out/gen.py", ".venv/lib/y.py", "src/ok.py"]
    for rel in rels:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(CHUNK)
    ws.watched([types.FileEvent(uri=(tmp_path / r).as_uri(), type=types.FileChangeType.Created)
                for r in rels])
    ws.saved(str(tmp_path / "out" / "gen.py"))
    ws._pool.submit(lambda: None).result(timeout=10)  # the index's thread has done them all
    assert ws.index.paths() == [str(tmp_path / "src" / "ok.py")]
    ws.shutdown()


def test_options_turn_it_off():
    opts = msgspec.structs.replace(CompletionOptions(), workspace_index=False)
    ws = WorkspaceSync(lambda: opts)
    ws.index.put("/o.py", CHUNK)
    ex = ws.extras("file:///h.py", "/h.py", HERE, len(HERE), "python", {}.get)
    assert (ex.snippets, ex.workspace) == ([], [])
    opts = msgspec.structs.replace(CompletionOptions(), workspace_drafts=False)
    ws2 = WorkspaceSync(lambda: opts)
    ws2.index.put("/o.py", CHUNK)
    assert ws2.extras("file:///h.py", "/h.py", HERE, len(HERE), "python", {}.get).workspace == []
    assert ws2.status()["files"] == 1
    ws.shutdown()
    ws2.shutdown()
