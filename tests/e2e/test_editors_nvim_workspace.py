"""Neovim (0.11+, headless) with editors/nvim opened on a project folder: the plugin finds
the root (``.git``), the server indexes the folder, and a suggestion comes from the file of
the project that the editor never opened.

The model is the scripted checkpoint with its draft bar at 0 (as in
``test_lsp_workspace.py``): alone it writes nothing for this document and it verifies any
draft, so the suggestion can only be the copy that prompt lookup found in ``geometry.py``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e

GEOMETRY = ("def rectangle_area(width, height):\n"
            "    area = width * height + border_margin(width)\n\n    return area\n")
MAIN = "import geometry\n\n\ndef rectangle_area(width, height):\n    area =\n"
ANSWER = " width * height + border_margin(width)"


def test_neovim_gets_a_suggestion_from_the_other_file(scripted_model_dir: Path, tmp_path: Path):
    nvim = h.need_nvim()
    model = tmp_path / "model"
    shutil.copytree(scripted_model_dir, model)
    conf = json.loads((model / "config.json").read_text())
    conf["draft_ratio"] = 0.0
    (model / "config.json").write_text(json.dumps(conf))
    work = tmp_path / "project"
    (work / ".git").mkdir(parents=True)
    (work / "geometry.py").write_text(GEOMETRY)
    (work / "src").mkdir()
    doc = work / "src" / "main.py"
    doc.write_text(MAIN)
    r = h.run_driver(h.nvim_argv(nvim, "nvim_workspace_e2e.lua"), tmp_path, {
        "plugin_dir": str(h.EDITORS / "nvim"),
        "cmd": h.serve_cmd(tmp_path),
        "settings": {"modelPath": str(model), "device": "cpu", "steps": 2, "maxTokens": 32,
                     "numCandidates": 1, "syntaxCheck": False},
        "file": str(doc), "row": 4, "timeout_ms": 200_000,
    }, timeout=240, cwd=work / "src")
    assert Path(r["root_dir"]) == work
    assert r["workspace"]["files"] == 2 and r["workspace"]["roots"] == [str(work)]
    assert [i["insertText"] for i in r["inline"]["items"]] == [ANSWER]
    assert [i["textEdit"]["newText"] for i in r["completion"]["items"]] == [ANSWER]
    assert (r["last_context"]["source"], r["last_context"]["steps"]) == ("lookup", 1)
