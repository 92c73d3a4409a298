"""Neovim (0.11+, headless) with editors/nvim against the real ``diffill serve`` + the
scripted checkpoint (local engine).

One run of ``tests/e2e/editors/nvim_e2e.lua`` through the plugin's ``setup{}``:
1. a completion item from ``vim.lsp.completion`` accepted with <C-y>: at ``    total = `` the
   menu holds exactly ``a + b`` and the line becomes ``    total = a + b``;
2. ghost text (an extmark) after typing ``v`` at ``    result = [``: it shows exactly
   `` * v for v in values]`` and the plugin's accept key (<Tab>) makes the line
   ``    result = [v * v for v in values]``.
The script also asks the server itself at both spots: the editor must show what it answers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

NVIM = h.find_nvim()


def _nvim_version() -> tuple[int, ...]:
    if not NVIM:
        return (0,)
    out = subprocess.run([NVIM, "--version"], capture_output=True, text=True, timeout=30).stdout
    return h.version_tuple(out.splitlines()[0] if out else "")


pytestmark = pytest.mark.e2e


def test_neovim_completion_and_ghost_text(scripted_model_dir: Path, tmp_path: Path) -> None:
    nvim = h.need_nvim()
    h.need(_nvim_version() >= (0, 11), f"needs Neovim >= 0.11, found {NVIM} ({h.INSTALL_HINT})")
    cfg = h.sample_cfg(tmp_path, "nvim", scripted_model_dir)
    text = h.SAMPLE
    c_row, c_col = h.position_of(text, h.COMPLETION_SPOT)
    g_row, g_col = h.position_of(text, h.GHOST_SPOT)
    r = h.run_driver(h.nvim_argv(nvim, "nvim_e2e.lua"), tmp_path, {
        **cfg, "completion": {"row": c_row, "col": c_col}, "ghost": h.ghost_cfg(), "timeout_ms": 200_000,
    }, timeout=240, cwd=tmp_path / "work")
    assert r["capabilities"] == {"completion": True, "inline": True}

    # 1) completion: the menu holds the server's items; <C-y> put the first one's textEdit in.
    comp = r["completion"]
    raw = h.first_items(comp["raw"])
    assert raw, "no completion items"
    first = raw[0]
    h.expect(first["textEdit"]["newText"], h.COMPLETION)
    assert [m["newText"] for m in comp["menu"]] == [i["textEdit"]["newText"] for i in raw]
    lines_before = text.split("\n")
    assert comp["line_before"] == lines_before[c_row]
    expected = h.apply_edit(text, first["textEdit"]["range"], first["textEdit"]["newText"])
    assert "\n".join(comp["buffer_after"]) == expected.rstrip("\n")
    h.expect(comp["buffer_after"][c_row], h.COMPLETION_LINE)

    # 2) ghost text: the extmark shows the server's inline item; <Tab> inserts exactly it.
    g = r["ghost"]
    g_typed = h.GHOST_TYPED
    item = h.ghost_item(g)
    assert g["cursor"] == [g_row, g_col + len(g_typed)]
    assert g["extmark"]["row"] == g["cursor"][0] and g["extmark"]["col"] == g["cursor"][1]
    assert g["extmark"]["virt_text_pos"] == "inline"
    assert item["range"]["start"] == {"line": g["cursor"][0], "character": g["cursor"][1]}
    assert g["shown"] == g["suggestion"] == item["insertText"]
    before = "\n".join(g["buffer_before_accept"])
    assert g["line_typed"] == g["line_before"][:g_col] + g_typed + g["line_before"][g_col:]
    after = h.apply_edit(before, item["range"], item["insertText"])
    assert "\n".join(g["buffer_after_accept"]) == after
    inserted = item["insertText"].split("\n")
    end_row = g["cursor"][0] + len(inserted) - 1
    end_col = (g["cursor"][1] if len(inserted) == 1 else 0) + len(inserted[-1])
    assert g["cursor_after_accept"] == [end_row, end_col]
    h.expect(g["buffer_after_accept"][g_row], h.GHOST_LINE)
    assert r["status"]["loaded"] is True
    assert r["toggled_off"] is True  # :DiffillToggle -> didChangeConfiguration -> enabled false
