"""Neovim 0.11 (headless) with editors/nvim, issue 27: without a ``filetypes`` option of the
user's, the diffill client attaches to the languages the server guards with a parser (Go,
TypeScript, ... as well as Python) and not to other buffers; ``filetypes = '*'`` attaches to
every filetype, and a list of the user's replaces the default. Each case is one run of
``tests/e2e/editors/nvim_languages_e2e.lua`` against the real ``diffill serve`` + the
scripted checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e

FILES = {
    "main.go": "package main\n\nfunc add(a, b int) int {\n\treturn a + b\n}\n",
    "app.ts": "function add(a: number, b: number): number {\n  return a + b;\n}\n",
    "demo.py": h.SAMPLE,
    "notes.txt": "plain text, no language\n",
}


def _run(scripted_model_dir: Path, tmp: Path, attach: list[str], skip: list[str],
         **filetypes: Any) -> dict[str, Any]:
    nvim = h.need_nvim()
    work = tmp / "work"
    work.mkdir()
    for name, text in FILES.items():
        (work / name).write_text(text)
    r = h.run_driver(h.nvim_argv(nvim, "nvim_languages_e2e.lua"), tmp, {
        "plugin_dir": str(h.EDITORS / "nvim"),
        "cmd": h.serve_cmd(tmp),
        "settings": {"modelPath": h.model_path(scripted_model_dir), "device": "cpu"},
        "attach": [str(work / f) for f in attach],
        "skip": [str(work / f) for f in skip],
        "timeout_ms": 150_000,
        **filetypes,
    }, timeout=200, cwd=work)
    r["by_name"] = {Path(f["path"]).name: f for f in r["files"]}
    return r


def test_default_filetypes_are_the_parsed_languages_and_a_go_buffer_gets_diffill(
    scripted_model_dir: Path, tmp_path: Path,
) -> None:
    r = _run(scripted_model_dir, tmp_path, attach=["main.go", "app.ts"], skip=["notes.txt"])
    want = {"python", "javascript", "javascriptreact", "typescript", "typescriptreact", "go", "rust",
            "java", "c", "cpp", "cs", "ruby", "php", "lua", "sh", "bash", "zsh"}
    assert set(r["resolved"]) == want, r["resolved"]  # what vim.lsp.config resolved
    assert r["module"] == r["resolved"]
    go, ts, txt = (r["by_name"][n] for n in ("main.go", "app.ts", "notes.txt"))
    assert go["filetype"] == "go" and go["attached"] and go["inline"], go
    assert ts["filetype"] == "typescript" and ts["attached"], ts
    assert go["clients"] == 1 and ts["clients"] == 1  # one server for both
    assert txt["filetype"] == "text" and not txt["attached"], txt


def test_star_attaches_to_every_filetype(scripted_model_dir: Path, tmp_path: Path) -> None:
    r = _run(scripted_model_dir, tmp_path, attach=["notes.txt"], skip=[], filetypes="*")
    assert r["resolved"] is None and r["module"] is None
    txt = r["by_name"]["notes.txt"]
    assert txt["filetype"] == "text" and txt["attached"], txt


def test_a_list_of_the_users_replaces_the_default(scripted_model_dir: Path, tmp_path: Path) -> None:
    r = _run(scripted_model_dir, tmp_path, attach=["demo.py"], skip=["main.go"], filetypes=["python"])
    assert r["resolved"] == ["python"]
    assert r["by_name"]["demo.py"]["attached"]
    assert not r["by_name"]["main.go"]["attached"], r["by_name"]["main.go"]
