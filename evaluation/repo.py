"""Repository-level held-out tasks (the CrossCodeEval setting) and what the workspace costs.

Tasks: masked lines and 2-4 line spans (:func:`.heldout.sample_tasks`, the same sampler and
cursor convention as the held-out corpus set) cut from the files of held-out packages (not in
the training manifest) that have at least two files; the *workspace* of a task is the rest of
its package -- every other file, indexed by :class:`~diffill.lsp_server.project.workspace.
WorkspaceIndex` as the server indexes a workspace folder. The task's own file is never in
its workspace (it holds the answer). The extras are gathered as the server gathers them
(:class:`~diffill.lsp_server.project.gather.Gatherer`): the definitions of the imported names used
near the cursor, the most similar chunks, and the chunks for the draft sources.

Systems (one model, side by side): the model with drafts on the buffer alone
(``model+drafts``), with workspace drafts (``+ws.drafts``), with workspace context -- the
definitions and the retrieved chunks in the header (``+ws.context``) -- and with both
(``+ws.both``); the non-neural systems: the analogy baseline (buffer only: it has no use for
a workspace) and the draft sources alone, their first proposal inserted as it is, on the
buffer (``drafts-only``) and with the workspace (``drafts-only+ws``).

Cost (:func:`index_cost`): the index of a folder set built on a thread of its own, as the
server builds it (time, resident memory before and after), the context gathering per request
(p50/p95 over cursors in the indexed files), and the first completion's latency while the
index builds against the same completion with the index idle.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..lsp_server.drafting.drafts import propose
from ..lsp_server.drafting.query import DraftQuery
from ..lsp_server.project.gather import DEFINITIONS_BUDGET_MS, Extras, Gatherer
from ..lsp_server.project.workspace import IndexLimits, WorkspaceIndex, build_index
from .baseline import analogy_completion
from .heldout import Document, read_documents, sample_tasks
from .metrics import percentile
from .runner import Output
from .tasks import InfillTask


@dataclasses.dataclass(frozen=True)
class RepoTask:
    task: InfillTask
    package: str
    path: str  # package/path of the task's file (its name in the workspace)


def _package(doc: Document) -> str:
    return doc.name.split("/", 1)[0]


def repo_tasks(path: str | Path, n_lines: int, n_spans: int, *, seed: int = 0
               ) -> tuple[list[RepoTask], list[RepoTask], dict[str, list[Document]]]:
    """(line tasks, span tasks, package -> its documents) of the packages with >= 2 files."""
    docs = read_documents(path)
    by_pkg: dict[str, list[Document]] = defaultdict(list)
    for d in docs:
        by_pkg[_package(d)].append(d)
    by_pkg = {k: v for k, v in by_pkg.items() if len(v) >= 2}
    pool = [d for v in by_pkg.values() for d in v]
    out = []
    for n, span, kind in ((n_lines, None, "line"), (n_spans, (2, 4), "span")):
        ts = sample_tasks(pool, n, span=span, seed=seed) if n > 0 else []
        got = []
        for t in ts:
            name = t.task_id.split("/", 1)[1].rsplit("/", 1)[0]  # package/path
            got.append(RepoTask(dataclasses.replace(t, task_id=f"repo-{kind}/" + t.task_id.split("/", 1)[1]),
                                name.split("/", 1)[0], name))
        out.append(got)
    return out[0], out[1], by_pkg


class Workspaces:
    """One index per package (every file; a task's own file is excluded at search time)."""

    def __init__(self, by_pkg: dict[str, list[Document]]) -> None:
        self.by_pkg = by_pkg
        self._gatherers: dict[str, Gatherer] = {}

    def gatherer(self, package: str) -> Gatherer:
        g = self._gatherers.get(package)
        if g is None:
            idx = WorkspaceIndex()
            for d in self.by_pkg[package]:
                idx.put(d.name, "".join(d.lines))
            g = self._gatherers[package] = Gatherer(idx)
        return g

    def extras(self, rt: RepoTask) -> Extras:
        """What the server would gather for the task's cursor (the task's file excluded)."""
        g = self.gatherer(rt.package)
        v = rt.task.editor_view()
        return g.gather(v.text, v.offset, path=rt.path, language="python", definitions=True,
                        retrieved=True, drafts=True, exclude=rt.path)


def run_system(gen: Any, tasks: Sequence[RepoTask], spaces: Workspaces, *, context: bool,
               drafts: bool, progress: Callable[[], None] | None = None) -> list[Output]:
    """The model generator ``gen`` on every task, given the workspace's header snippets
    (``context``) and draft chunks (``drafts``)."""
    out = []
    for rt in tasks:
        t = rt.task
        v = t.editor_view()
        ex = spaces.extras(rt)
        t0 = time.perf_counter()
        err, info = "", {}
        try:
            got = gen.generate(v.text, v.offset, multiline=t.multiline, path=rt.path,
                               snippets=ex.snippets if context else (),
                               workspace=ex.workspace if drafts else ())
            text, info = got.text, dict(got.info)
        except Exception as e:  # noqa: BLE001 - a failed completion is a data point
            text, err = "", f"{type(e).__name__}: {e}"
        info["gather_ms"] = round(ex.ms, 3)
        out.append(Output(t.task_id, text, time.perf_counter() - t0, err, info))
        if progress is not None:
            progress()
    return out


def run_nonneural(tasks: Sequence[RepoTask], spaces: Workspaces, kind: str) -> list[Output]:
    """``kind``: ``baseline`` (analogy, buffer only), ``drafts-only`` (the draft sources'
    first proposal, buffer only) or ``drafts-only+ws`` (with the workspace chunks)."""
    out = []
    for rt in tasks:
        t = rt.task
        v = t.editor_view()
        t0 = time.perf_counter()
        if kind == "baseline":
            got = analogy_completion(v.prefix, v.suffix, multiline=t.multiline)
        else:
            ws = spaces.extras(rt).workspace if kind.endswith("+ws") else ()
            ds = propose(DraftQuery(text=v.text, offset=v.offset, workspace=tuple(ws),
                                    multiline=t.multiline))
            got = ds[0].text if ds else ""
            if not t.multiline:
                got = got.split("\n", 1)[0]
        out.append(Output(t.task_id, got, time.perf_counter() - t0))
    return out


def in_workspace(rt: RepoTask, spaces: Workspaces) -> bool:
    """Whether every non-blank line of the middle occurs (stripped) in another file of the
    package: the tasks a copy from the workspace can solve."""
    have: set[str] = set()
    for d in spaces.by_pkg[rt.package]:
        if d.name != rt.path:
            have.update(ln.strip() for ln in d.lines)
    middle = [ln.strip() for ln in rt.task.canonical_solution.split("\n") if ln.strip()]
    return bool(middle) and all(ln in have for ln in middle)


# ----------------------------------------------------------------------------- cost


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")


def index_cost(roots: Sequence[str | Path], *, max_files: int = 5000, queries: int = 300,
               complete: Callable[[], Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Build the index of ``roots`` (at most ``max_files`` files) on a thread, as the server
    does, and measure it (module doc). ``complete``: one completion, timed idle and while the
    index builds."""
    res: dict[str, Any] = {"roots": [str(r) for r in roots], "max_files": max_files}
    if complete is not None:
        complete()  # warm
        t0 = time.perf_counter()
        complete()
        res["completion_idle_ms"] = (time.perf_counter() - t0) * 1000.0
    idx = WorkspaceIndex(IndexLimits(max_files=max_files))
    rss0 = _rss_mb()
    done: dict[str, Any] = {}
    t0 = time.perf_counter()

    def work() -> None:
        done["stats"] = build_index(idx, [str(r) for r in roots])
        done["s"] = time.perf_counter() - t0

    th = threading.Thread(target=work, daemon=True)
    th.start()
    if complete is not None:
        time.sleep(0.5)  # the walk has begun
        t1 = time.perf_counter()
        complete()
        res["completion_while_building_ms"] = (time.perf_counter() - t1) * 1000.0
        res["completion_while_building_index_files"] = len(idx)
    th.join()
    st = done["stats"]
    res.update({"build_s": done["s"], "files": st.files, "chunks": st.chunks,
                "chars": st.chars, "terms": st.terms, "skipped_files": st.skipped_files,
                "capped_files": st.capped_files, "rss_before_mb": rss0,
                "rss_after_mb": _rss_mb()})
    res["rss_delta_mb"] = res["rss_after_mb"] - rss0
    g = Gatherer(idx, roots=[str(r) for r in roots])
    rng = random.Random(seed)
    paths = [p for p in idx.paths() if p.endswith(".py")] or idx.paths()
    times = []
    for _ in range(queries if paths else 0):
        p = rng.choice(paths)
        text = idx.file_text(p) or ""
        off = rng.randrange(len(text) + 1)
        ex = g.gather(text, off, path=p, language="python", definitions=True, retrieved=True,
                      drafts=True, budget_ms=DEFINITIONS_BUDGET_MS)
        times.append(ex.ms)
        for mod, name in ex.deferred:  # as the server's index thread does, between requests
            if g.finder is not None:
                g.finder.outline_of(mod, name)
    res["gather_p50_ms"] = percentile(times, 50)
    res["gather_p95_ms"] = percentile(times, 95)
    res["gather_max_ms"] = max(times) if times else None
    return res
