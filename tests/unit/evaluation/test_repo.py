"""The repository-level held-out set: tasks, workspaces (the task's file excluded), the
non-neural systems, and the cost measurement on a small folder."""

from __future__ import annotations

import json
from pathlib import Path

from diffill.evaluation.repo import (
    Workspaces,
    in_workspace,
    index_cost,
    repo_tasks,
    run_nonneural,
)

UTIL = "def scale(values, factor):\n    out = [v * factor for v in values]\n    return out\n"
MAIN = ("from .util import scale\n\n\ndef scale(values, factor):\n"
        "    out = [v * factor for v in values]\n    return out\n")


def corpus(tmp_path: Path) -> Path:
    rows = [{"package": "p", "path": "util.py", "text": UTIL},
            {"package": "p", "path": "main.py", "text": MAIN},
            {"package": "solo", "path": "only.py", "text": UTIL}]
    f = tmp_path / "heldout.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_tasks_come_from_packages_with_two_files_and_exclude_their_own_file(tmp_path: Path):
    lines, spans, by_pkg = repo_tasks(corpus(tmp_path), 6, 2, seed=1)
    assert set(by_pkg) == {"p"} and lines and spans
    assert all(t.task.task_id.startswith("repo-line/p/") for t in lines)
    assert all(t.package == "p" and t.path in ("p/util.py", "p/main.py") for t in lines)
    spaces = Workspaces(by_pkg)
    for rt in lines:  # the workspace is the other file, never the task's own
        other = UTIL if rt.path == "p/main.py" else MAIN
        assert spaces.extras(rt).workspace == [other]


def test_drafts_only_with_the_workspace_copies_the_other_file(tmp_path: Path):
    lines, _, by_pkg = repo_tasks(corpus(tmp_path), 6, 0, seed=1)
    spaces = Workspaces(by_pkg)
    rt = next(r for r in lines if r.task.canonical_solution.startswith("    out ="))
    assert in_workspace(rt, spaces)
    target = rt.task.editor_view().target
    assert run_nonneural([rt], spaces, "drafts-only+ws")[0].insert == target
    assert run_nonneural([rt], spaces, "drafts-only")[0].insert == (
        target if rt.path == "p/main.py" else "")  # main.py repeats it; util.py alone does not


def test_index_cost_on_a_small_folder(tmp_path: Path):
    (tmp_path / "a.py").write_text(UTIL)
    (tmp_path / "b.py").write_text(MAIN)
    calls = []
    got = index_cost([tmp_path], max_files=10, queries=20, complete=lambda: calls.append(1))
    assert got["files"] == 2 and got["build_s"] >= 0 and len(calls) == 3
    assert got["gather_p95_ms"] >= got["gather_p50_ms"] >= 0
    assert "completion_while_building_ms" in got
