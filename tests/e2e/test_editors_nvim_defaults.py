"""Neovim 0.11 (headless) with editors/nvim under Neovim's default settings (issue 31):
what a new user hits. One run of ``tests/e2e/editors/nvim_defaults_e2e.lua`` against the
real ``diffill serve`` + the scripted checkpoint, its model load held 3 s by the test hook
``DIFFILL_DEBUG_LOAD_DELAY_MS`` so that typing starts while it loads:

* ghost text typed right after opening (``v`` at ``    result = [``) comes without a second
  keystroke (the server holds the request until the model is loaded);
* the terminal cursor is drawn at the insertion point, not after the ghost text, and the
  ghost's highlight has a terminal colour with 'notermguicolors';
* with the default 'completeopt' (``menu,popup``) and the default autotrigger, typing the
  trigger character ``[`` and then <CR>, or another character, leaves no text of the menu's
  items in the buffer;
* ``:DiffillStatus`` is a few lines naming the model; ``:DiffillStatus!`` has all of it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    nvim = h.need_nvim()
    tmp = tmp_path_factory.mktemp("nvim-defaults")
    cfg = h.sample_cfg(tmp, "nvim", scripted_model_dir)
    r = h.run_driver(h.nvim_argv(nvim, "nvim_defaults_e2e.lua"), tmp, {
        **cfg, "ghost": h.ghost_cfg(), "trigger": h.trigger_cfg(),
        "ghost_timeout_ms": h.LOAD_DELAY_MS + 20_000, "timeout_ms": 200_000,
    }, timeout=240, cwd=tmp / "work", DIFFILL_DEBUG_LOAD_DELAY_MS=str(h.LOAD_DELAY_MS))
    r["server_log"] = h.tail(tmp / "server.log")
    return r


def test_ghost_text_typed_while_the_model_loads_comes_without_another_key(run: dict[str, Any]) -> None:
    g = run["ghost"]
    assert g["loading_when_typed"] is True  # the keystroke came before the model was ready
    assert g["shown"], f"no ghost text {g['ms']} ms after the only keystroke\n{run['server_log']}"
    h.expect(g["suggestion"], h.GHOST)
    assert g["ms"] >= h.LOAD_DELAY_MS * 0.5, g["ms"]


def test_ghost_text_cursor_is_drawn_at_the_insertion_point(run: dict[str, Any]) -> None:
    g = run["ghost"]
    assert g["shown"]
    assert g["extmark"]["virt_text_pos"] == "inline"
    assert [g["extmark"]["row"], g["extmark"]["col"]] == g["cursor"]
    # the cursor is drawn where text goes in, before the ghost text (was after it: 17 vs 8)
    assert g["wincol"] == g["insert_col"] == g["cursor"][1] + 1, g
    assert g["curscol"] == g["insert_col"], g


def test_ghost_text_has_a_terminal_colour_without_termguicolors(run: dict[str, Any]) -> None:
    g = run["ghost"]
    assert g["shown"]
    assert g["termguicolors"] is False
    # visible without truecolor: a terminal colour of its own, not the text's
    assert isinstance(g["hl"].get("ctermfg"), int), g["hl"]
    assert g["hl"].get("ctermfg") != g["normal_hl"].get("ctermfg")
    assert isinstance(g["hint_hl"].get("ctermfg"), int), g["hint_hl"]
    assert g["hl"].get("fg") is not None  # and a GUI colour with 'termguicolors'


@pytest.mark.parametrize("step, key_result", [("enter", ""), ("typing", "x")])
def test_trigger_character_menu_inserts_nothing_unaccepted(run: dict[str, Any], step: str, key_result: str) -> None:
    s = run[step]
    assert run["completeopt_global"] == "menu,popup"  # Neovim's default, left alone
    assert s["answered"], "the trigger character sent no completion request"
    assert s["items"], "the server offered nothing here: the check would prove nothing"
    # nothing went in when the menu opened ...
    assert s["line_with_menu"] == "    result = [", s
    # ... nor with <CR> (a line break) or the next character
    if step == "enter":
        assert s["lines"][0] == "    result = [", s
        assert s["lines"][1].strip() == "", s
    else:
        assert s["lines"][0] == "    result = [" + key_result, s


def test_status_is_a_short_summary_and_the_full_one_is_a_bang_away(run: dict[str, Any]) -> None:
    st = run["status"]
    summary = st["summary"].strip().split("\n")
    assert 2 <= len(summary) <= 6, st["summary"]
    assert all(len(x) <= 160 for x in summary), st["summary"]
    model = run["status"]["raw"]["model"]
    assert model and model in summary[0], (model, summary)
    assert "cpu" in summary[0]
    assert any("p50" in x and "p95" in x for x in summary), summary
    assert any("drafts accepted" in x for x in summary), summary
    assert any("last request" in x for x in summary), summary
    assert "DiffillStatus!" in summary[-1]
    full = st["full"]
    assert '"position_encoding"' in full or "position_encoding" in full
    assert len(full.split("\n")) > 20
