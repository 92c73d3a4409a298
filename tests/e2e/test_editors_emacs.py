"""Emacs 28 + eglot 1.9 (batch) with editors/emacs/diffill.el against the real ``diffill serve``
+ the scripted checkpoint (local engine).

One run of ``tests/e2e/editors/emacs_e2e.el``:
1. ``completion-at-point`` (eglot's capf) inserts the server's completion item: at
   ``    total = `` the line becomes ``    total = a + b``;
2. ``diffill-inline-mode`` shows the server's inline completion as an overlay after typing
   ``v`` at ``    result = [`` (`` * v for v in values]``), and TAB (through the mode's key
   map) inserts it.
The buffer must then hold exactly that, which is also what the server answers a plain
request of the script's own at the same spot.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e


def test_emacs_completion_at_point_and_inline_mode(scripted_model_dir: Path, tmp_path: Path) -> None:
    emacs = h.need_emacs()
    # One candidate: completion-at-point then inserts it (several would open *Completions*).
    cfg = h.sample_cfg(tmp_path, "emacs", scripted_model_dir, numCandidates=1)
    text = h.SAMPLE
    c_row, c_col = h.position_of(text, h.COMPLETION_SPOT)
    g_row, g_col = h.position_of(text, h.GHOST_SPOT)
    r = h.run_driver([emacs, "--batch", "-l", str(h.DRIVERS / "emacs_e2e.el")], tmp_path,
                     {**cfg, "completion": {"row": c_row, "col": c_col}, "ghost": h.ghost_cfg()},
                     timeout=240, cwd=tmp_path / "work")
    assert r["managed"] is True and r["inline_mode"] is True
    assert r["emacs"].startswith("28.") or r["emacs"] >= "28"

    # 1) completion-at-point inserted the server's item (its textEdit) at point.
    comp = r["completion"]
    raw = h.first_items(comp["raw"])
    assert len(raw) == 1, raw
    new_text = raw[0]["textEdit"]["newText"]
    h.expect(new_text, h.COMPLETION)
    assert comp["line_before"] == text.split("\n")[c_row]
    assert new_text in comp["candidates"] or raw[0]["label"] in comp["candidates"]
    assert comp["buffer_after"] == h.apply_edit(text, raw[0]["textEdit"]["range"], new_text)
    h.expect(comp["buffer_after"].split("\n")[c_row], h.COMPLETION_LINE)

    # 2) diffill-inline-mode: overlay with the server's inline item; TAB inserted exactly it.
    g = r["ghost"]
    g_typed = h.GHOST_TYPED
    item = h.ghost_item(g)
    assert g["line_typed"] == g["line_before"][:g_col] + g_typed + g["line_before"][g_col:]
    assert g["overlay_at"] == g["point_before_accept"]
    assert g["suggestion"] == item["insertText"]
    assert g["shown"].startswith(item["insertText"])  # then an "(i/n)" hint when n > 1
    before = g["buffer_before_accept"]
    after = h.apply_edit(before, item["range"], item["insertText"])
    assert g["buffer_after_accept"] == after
    assert g["point_after_accept"] == g["point_before_accept"] + len(item["insertText"])
    assert g["overlay_after_accept"] is False
    h.expect(after.split("\n")[g_row], h.GHOST_LINE)
    assert r["status"]["loaded"] is True
    assert r["toggled_off"] is True  # diffill-toggle -> didChangeConfiguration -> enabled false
