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

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    emacs = h.need_emacs()
    tmp = tmp_path_factory.mktemp("emacs-defaults")
    cfg = h.sample_cfg(tmp, "emacs", scripted_model_dir)
    r = h.run_driver([emacs, "--batch", "-l", str(h.DRIVERS / "emacs_defaults_e2e.el")], tmp,
                     {**cfg, "ghost": h.ghost_cfg(), "trigger": h.trigger_cfg()},
                     timeout=240, cwd=tmp / "work", DIFFILL_DEBUG_LOAD_DELAY_MS=str(h.LOAD_DELAY_MS))
    assert r["inline_mode"] is True
    return r


def test_ghost_text_typed_while_the_model_loads_comes_without_another_key(run: dict[str, Any]) -> None:
    assert run["loading_when_typed"] is True
    g = run["ghost"]
    assert g["shown"], g
    h.expect(g["shown"], h.GHOST)
    assert g["ms"] >= h.LOAD_DELAY_MS * 0.5, g


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
