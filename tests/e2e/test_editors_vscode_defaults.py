"""VS Code (code-server + headless chromium) with VS Code's default editor settings and the
editors/vscode extension (issue 31, point 1): the suggestion list opens by itself on
trigger characters and as you type, with its first item selected, and Enter accepts it
(``editor.acceptSuggestionOnEnter``). Typing ``[`` at ``    result = `` and then Enter, or
one more character, must leave none of diffill's suggestion in the document: only Tab
(ghost text) or an explicitly asked list (``diffill.suggest``) put it in.

``tests/e2e/editors/vscode_defaults_driver.js`` types and reads the document back through the
extension's trace (``$DIFFILL_VSCODE_TRACE``); the scripted checkpoint's suggestion there is
``v * v for v in values]`` (tests/support/scripted_model.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402
import test_editors_vscode as vs  # noqa: E402

vsix = vs.vsix  # the module-scoped fixture that packages the extension
pytestmark = pytest.mark.e2e

SPOT = "    result = "
SUGGESTION_PART = "for v in values"


def test_vscode_defaults_trigger_character_then_enter_or_typing_inserts_nothing(
    vsix: Path, scripted_model_dir: Path, tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    text = h.SAMPLE.replace(h.GHOST_SPOT + "\n", SPOT + "\n", 1)
    (ws / "demo.py").write_text(text)
    row, col = h.position_of(text, SPOT)
    # no editor.* setting: VS Code's defaults
    r = vs.run_vscode(vsix, scripted_model_dir, tmp_path, ws, {}, {
        "driver": "vscode_defaults_driver.js",
        "fileName": "demo.py",
        "original": text,
        "spot": {"line": row, "col": col, "typeText": "["},
        "keys": ["Enter", "x"],
    })

    def squash(s: str) -> str:
        return re.sub(r"\s+", "", s)

    for s in r["steps"]:
        # diffill's suggestion was on screen: the check proves something
        assert SUGGESTION_PART in s["ghost"] or any(SUGGESTION_PART in w for w in s["suggestWidget"]), s
        before, after = s["textBeforeKey"], s["textAfterKey"]
        line = before.split("\n")[row]
        assert line in (SPOT + "[", SPOT + "[]"), s  # typing "[" put only "[" (and its "]")
        assert SUGGESTION_PART not in after, s
        if s["key"] == "Enter":
            assert squash(after) == squash(before), s  # a line break, nothing else
        else:
            assert after.split("\n")[row] == line[: col + 1] + s["key"] + line[col + 1:], s
