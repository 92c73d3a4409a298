"""Emacs 28 + eglot (batch) with editors/emacs/diffill.el under their default settings
(issue 31). One run of ``tests/e2e/editors/emacs_defaults_e2e.el`` against the real
``diffill serve`` + the scripted checkpoint, the model load held 3 s by the test hook
``DIFFILL_DEBUG_LOAD_DELAY_MS``:

* the keystroke typed while the model loads gets its ghost text without another key;
* typing the trigger character ``[`` (ghost text shown) then RET, or another character,
  leaves no suggestion text in the buffer: only TAB accepts;
* ``M-x diffill-status`` shows a few lines naming the model; ``C-u M-x diffill-status``
  shows all of ``diffill/status``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

EMACS = shutil.which("emacs")
LOAD_DELAY_MS = 3000

pytestmark = pytest.mark.e2e


def _has_eglot() -> bool:
    if not EMACS:
        return False
    p = subprocess.run(
        [EMACS, "--batch", "--eval", "(progn (require 'package) (package-activate-all) (require 'eglot))"],
        capture_output=True, text=True, timeout=60,
    )
    return p.returncode == 0


@pytest.fixture(scope="module")
def run(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    h.need(EMACS is not None, f"Emacs not installed ({h.INSTALL_HINT})")
    h.need(_has_eglot(), f"eglot not installed ({h.INSTALL_HINT})")
    assert EMACS is not None
    tmp = tmp_path_factory.mktemp("emacs-defaults")
    work = tmp / "work"
    work.mkdir()
    doc = work / "demo.py"
    doc.write_text(h.SAMPLE)
    g_row, g_col = h.position_of(h.SAMPLE, h.GHOST_SPOT)
    result = tmp / "result.json"
    cfg = {
        "plugin_dir": str(h.EDITORS / "emacs"),
        "cmd": [*h.diffill_serve_cmd(), "--log-file", str(tmp / "server.log")],
        "settings": {"modelPath": h.model_path(scripted_model_dir), "device": "cpu"},
        "file": str(doc),
        "result": str(result),
        "ghost": {"row": g_row, "col": g_col, "type": h.GHOST_TYPED},
        "trigger": {"row": g_row, "line": h.GHOST_SPOT[:-1], "type": "["},
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    with h.isolated_env(tmp, DIFFILL_E2E_CONFIG=str(tmp / "cfg.json"),
                        DIFFILL_DEBUG_LOAD_DELAY_MS=str(LOAD_DELAY_MS)) as env:
        p = subprocess.run(
            [EMACS, "--batch", "-l", str(h.DRIVERS / "emacs_defaults_e2e.el")],
            capture_output=True, text=True, timeout=240, env=env, cwd=work,
        )
    assert result.exists(), f"no result (rc={p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    r = json.loads(result.read_text())
    assert r["ok"], f"{r.get('error')}\n{p.stderr[-3000:]}\n{h.tail(tmp / 'server.log')}"
    assert r["inline_mode"] is True
    return r


def test_ghost_text_typed_while_the_model_loads_comes_without_another_key(run: dict[str, Any]) -> None:
    assert run["loading_when_typed"] is True
    g = run["ghost"]
    assert g["shown"], g
    h.expect(g["shown"], h.GHOST)
    assert g["ms"] >= LOAD_DELAY_MS * 0.5, g


@pytest.mark.parametrize("step", ["enter", "typing"])
def test_trigger_character_then_a_key_inserts_nothing_unaccepted(run: dict[str, Any], step: str) -> None:
    s = run[step]
    assert s["shown"], "no ghost text after the trigger character: the check would prove nothing"
    assert s["line_shown"] == "    result = [", s
    if step == "enter":
        assert s["lines"][0] == "    result = [", s
        assert s["lines"][1].strip() == "", s
    else:
        assert s["lines"][0] == "    result = [x", s


def test_status_is_a_short_summary_and_the_full_one_is_a_prefix_away(run: dict[str, Any]) -> None:
    st = run["status"]
    summary = st["summary"].split("\n")
    assert 2 <= len(summary) <= 6, st["summary"]
    assert all(len(x) <= 160 for x in summary), st["summary"]
    model = st["raw"]["model"]
    assert model and model in summary[0] and "cpu" in summary[0], summary
    assert any("p50" in x and "p95" in x for x in summary), summary
    assert any("drafts accepted" in x for x in summary), summary
    assert "C-u M-x diffill-status" in summary[-1]
    assert '"position_encoding"' in st["full"] and len(st["full"]) > 500
