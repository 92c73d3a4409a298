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

import json
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
    h.need(NVIM is not None, f"Neovim not installed ({h.INSTALL_HINT})")
    h.need(_nvim_version() >= (0, 11), f"needs Neovim >= 0.11, found {NVIM} ({h.INSTALL_HINT})")
    assert NVIM is not None
    work = tmp_path / "work"
    work.mkdir()
    doc = work / "demo.py"
    text = h.SAMPLE
    doc.write_text(text)
    c_row, c_col = h.position_of(text, h.COMPLETION_SPOT)
    g_row, g_col = h.position_of(text, h.GHOST_SPOT)
    result = tmp_path / "result.json"
    cfg = {
        "plugin_dir": str(h.EDITORS / "nvim"),
        "cmd": [*h.diffill_serve_cmd(), "--log-file", str(tmp_path / "server.log")],
        "settings": {"modelPath": h.model_path(scripted_model_dir), "device": "cpu"},
        "file": str(doc),
        "result": str(result),
        "completion": {"row": c_row, "col": c_col},
        "ghost": {"row": g_row, "col": g_col, "type": h.GHOST_TYPED},
        "timeout_ms": 200_000,
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with h.isolated_env(tmp_path, DIFFILL_E2E_CONFIG=str(tmp_path / "cfg.json")) as env:
        p = subprocess.run(
            [NVIM, "--headless", "--clean", "-u", str(h.DRIVERS / "nvim_e2e.lua")],
            capture_output=True, text=True, timeout=240, env=env, cwd=work,
        )
    assert result.exists(), f"no result (rc={p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    r = json.loads(result.read_text())
    assert r["ok"], f"{r.get('error')}\n{p.stderr[-3000:]}\n{h.tail(tmp_path / 'server.log')}"
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
    items = h.first_items(g["raw"])
    assert items, "no inline items"
    item = items[0]
    h.expect(item["insertText"], h.GHOST)
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
