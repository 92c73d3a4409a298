"""The language server's side of the workspace: the index built after ``initialized`` and
kept current, the ring of recent regions, and the extras each request gets.

* **Build**: on a thread of its own (never the model's worker, so a completion never waits
  for it; the build yields the interpreter every few files), over the workspace folders
  (``workspaceFolders``, else ``rootUri``), with ``$/progress`` when the client supports it
  (begin, a report every 100 files, end with the counts). Requests before it is done get the
  part indexed so far.
* **Kept current**: ``didSave`` re-reads the file; ``workspace/didChangeWatchedFiles``
  re-reads or drops the files it names (the watcher for ``**/*`` is registered dynamically
  when the client allows it: ``workspace.didChangeWatchedFiles.dynamicRegistration``), except
  those the build leaves out (``.gitignore``'d, vendored, generated: :func:`.workspace_files.excluded`,
  so an ``npm install`` or a build under the folder does not fill the index); an edited open
  document is re-indexed from its text half a second after its last change, on the index's
  thread; a file under no workspace folder, or one the build leaves out, is indexed while it
  is open.
* **Recent**: every opened document (its first lines), every edit and every completion
  request notes its place in the ring
  (:mod:`.recent`); a closed document's text is kept for its regions.
* **Per request** (:meth:`WorkspaceSync.extras`): :class:`~.gather.Gatherer` with what the
  options turn on (``workspaceDrafts``, ``workspaceContext``, ``definitionsContext``,
  ``recentContext``); nothing at all with ``workspaceIndex`` off.

Nothing here leaves the machine: files are read from the local disk, kept in memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import to_fs_path

from ..completion.options import CompletionOptions
from ..project.gather import DEFINITIONS_BUDGET_MS, Extras, Gatherer
from ..project.recent import RecentRing
from ..project.workspace import IndexLimits, WorkspaceIndex, build_index
from ..project.workspace_files import excluded, read_text_file

log = logging.getLogger("diffill.workspace")

REINDEX_DELAY_S = 0.5
WATCHER_ID = "diffill-watch-files"


def _limits(o: CompletionOptions) -> IndexLimits:
    return IndexLimits(max_files=o.workspace_max_files, max_chars=o.workspace_max_mb * 1_000_000)


class WorkspaceSync:
    """``options``: the server's options as they are now (read at each use)."""

    def __init__(self, options: Callable[[], CompletionOptions]) -> None:
        self._options = options
        self.index = WorkspaceIndex(_limits(options()))
        self.ring = RecentRing()
        self.roots: list[str] = []
        self.gatherer = Gatherer(self.index, self.ring)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffill-index")
        self._due: dict[str, float] = {}  # uri -> when its text is to be re-indexed
        self._lock = threading.Lock()
        self.gather_ms: list[float] = []
        self._last: dict[str, str | None] = {}  # uri -> its text at its last edit

    @property
    def options(self) -> CompletionOptions:
        return self._options()

    # -- lifecycle ---------------------------------------------------------------------------
    def workspace_roots(self, ls: Any) -> list[str]:
        roots = []
        for f in getattr(ls.workspace, "folders", {}).values():
            p = to_fs_path(f.uri)
            if p:
                roots.append(p)
        if not roots and ls.workspace.root_path:
            roots.append(ls.workspace.root_path)
        return [os.path.abspath(r) for r in dict.fromkeys(roots) if os.path.isdir(r)]

    async def start(self, ls: Any) -> None:
        """Register the file watcher and start the build (``initialized``)."""
        if not self.options.workspace_index:
            return
        self.roots = self.workspace_roots(ls)
        self.gatherer.roots = self.roots
        await self._register_watcher(ls)
        if not self.roots:
            return
        loop = asyncio.get_running_loop()
        token = await self._progress_begin(ls)

        def report(n: int, path: str) -> None:
            if token is not None:
                loop.call_soon_threadsafe(ls.work_done_progress.report, token,
                                          types.WorkDoneProgressReport(message=f"{n} files"))

        def work() -> None:
            st = build_index(self.index, self.roots, stop=self._stop.is_set, progress=report)
            log.info("workspace index: %d files, %d chunks in %.2f s (%d skipped, %d over the caps)",
                     st.files, st.chunks, st.build_s or 0.0, st.skipped_files, st.capped_files)
            if token is not None:
                msg = f"indexed {st.files} files" + (
                    f" ({st.capped_files} over the caps)" if st.capped_files else "")
                loop.call_soon_threadsafe(ls.work_done_progress.end, token,
                                          types.WorkDoneProgressEnd(message=msg))

        self._thread = threading.Thread(target=work, name="diffill-index-build", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _progress_begin(self, ls: Any) -> str | None:
        caps = ls.client_capabilities
        if not (caps and caps.window and caps.window.work_done_progress):
            return None
        token = f"diffill-index-{uuid.uuid4().hex[:8]}"
        try:
            await asyncio.wait_for(ls.work_done_progress.create_async(token), 5.0)
        except Exception:  # noqa: BLE001 - a client that refuses or is slow: no progress shown
            return None
        ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(
            title="diffill", message="indexing the workspace", cancellable=False))
        return token

    async def _register_watcher(self, ls: Any) -> None:
        caps = ls.client_capabilities
        ws = caps.workspace if caps else None
        dyn = ws.did_change_watched_files if ws else None
        if not (dyn and dyn.dynamic_registration):
            return
        reg = types.Registration(
            id=WATCHER_ID, method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=types.DidChangeWatchedFilesRegistrationOptions(
                watchers=[types.FileSystemWatcher(glob_pattern="**/*")]))
        try:
            await asyncio.wait_for(ls.client_register_capability_async(
                types.RegistrationParams(registrations=[reg])), 5.0)
        except Exception as e:  # noqa: BLE001 - without watchers the index follows saves only
            log.info("no file watcher: %s", e)

    # -- keeping it current ------------------------------------------------------------------
    def _in_roots(self, path: str) -> bool:
        return any(path.startswith(r + os.sep) for r in self.roots)

    def _excluded(self, path: str) -> bool:
        """Left out by the walk of every workspace folder holding it (:func:`.workspace_files.excluded`:
        its ignore files, vendored/generated folders, its name)."""
        return all(excluded(r, path) for r in self.roots if path.startswith(r + os.sep))

    def _reread(self, path: str) -> None:
        if self._excluded(path):
            return  # .gitignore'd, vendored, generated: what the build leaves out stays out
        text = read_text_file(Path(path), self.index.limits.max_file_bytes)
        if text is None:
            self.index.drop(path)
        else:
            self.index.put(path, text)

    def saved(self, path: str | None) -> None:
        if path and self.options.workspace_index and self._in_roots(path):
            self._pool.submit(self._reread, path)

    def watched(self, changes: list[types.FileEvent]) -> None:
        if not self.options.workspace_index:
            return
        for ch in changes:
            path = to_fs_path(ch.uri)
            if not path or not self._in_roots(path):
                continue
            if ch.type == types.FileChangeType.Deleted:
                self._pool.submit(self.index.drop, path)
            elif os.path.isfile(path):
                self._pool.submit(self._reread, path)

    def edited(self, uri: str, path: str | None, row: int, language: str | None,
               text_of: Callable[[str], str | None]) -> None:
        """An open document changed at ``row``: note it, re-index it soon."""
        if not path:
            return
        self.ring.note(uri, path, row, language)
        self._last[uri] = text_of(uri)  # a reference to the str: for the ring once it closes
        if not self.options.workspace_index:
            return
        with self._lock:
            first = uri not in self._due
            self._due[uri] = time.monotonic() + REINDEX_DELAY_S
        if first:
            self._pool.submit(self._reindex_later, uri, path, text_of)

    def _reindex_later(self, uri: str, path: str, text_of: Callable[[str], str | None]) -> None:
        while True:
            with self._lock:
                due = self._due.get(uri)
                if due is None:
                    return
                wait = due - time.monotonic()
                if wait <= 0:
                    del self._due[uri]
                    break
            if self._stop.wait(wait):
                return
        text = text_of(uri)
        if text is not None:
            self.index.put(path, text)

    def visited(self, uri: str, path: str | None, row: int, language: str | None) -> None:
        if path:
            self.ring.note(uri, path, row, language)

    def closed(self, uri: str, path: str | None) -> None:
        """Keep the last text seen for the ring (pygls has dropped the document when the
        close handler runs); a file outside the workspace folders leaves the index."""
        text = self._last.pop(uri, None)
        if text is not None:
            self.ring.closed(uri, text)
        if path and (not self._in_roots(path) or self._excluded(path)):
            self._pool.submit(self.index.drop, path)

    # -- per request -------------------------------------------------------------------------
    def extras(self, uri: str, path: str | None, text: str, offset: int, language: str | None,
               text_of: Callable[[str], str | None]) -> Extras:
        o = self.options
        if not o.workspace_index:
            return Extras()
        ex = self.gatherer.gather(
            text, offset, path=path, language=language, uri=uri,
            definitions=o.definitions_context, retrieved=o.workspace_context,
            recent=o.recent_context, drafts=o.drafts and o.workspace_drafts, text_of=text_of,
            budget_ms=DEFINITIONS_BUDGET_MS)
        finder = self.gatherer.finder
        for mod, name in ex.deferred if finder is not None else ():
            self._pool.submit(finder.outline_of, mod, name)  # ready for the next request
        self.gather_ms.append(ex.ms)
        del self.gather_ms[:-512]
        return ex

    def status(self) -> dict[str, Any]:
        st = self.index.snapshot_stats()
        g = sorted(self.gather_ms)
        return {
            "enabled": self.options.workspace_index, "roots": self.roots, "state": st.state,
            "files": st.files, "chunks": st.chunks, "skipped_files": st.skipped_files,
            "capped_files": st.capped_files, "build_s": st.build_s,
            "recent_regions": len(self.ring),
            "gather_p50_ms": round(g[len(g) // 2], 3) if g else None,
            "gather_p95_ms": round(g[int(len(g) * 0.95)], 3) if g else None,
        }
