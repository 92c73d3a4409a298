"""The syntax guard in a real editor (issue 27): Neovim 0.11 (headless) with editors/nvim
against the real ``diffill serve``, serving a constant checkpoint whose middle is certain (it
writes only ``w7``, fused: ``w7w7...``, one name; tests/support/constant_checkpoint.py), in a
TypeScript and a Go buffer. The same spots as tests/e2e/test_lsp_languages.py, typed in
Insert mode so that the plugin asks by itself (TextChangedI, ``textDocument/inlineCompletion``):

* where a name fits (TS ``return |``, Go ``x := |``) the ghost text is shown: an extmark in
  the plugin's ``diffill.ghost`` namespace at the cursor whose text starts with ``w7``, and
  it is what the accept key would insert;
* where it would break the file (TS ``return b |``, Go ``x := 1 |``: a name right after a
  complete expression) it is withheld: the plugin's own request for the typed buffer was
  sent and answered by the server (no error, and Neovim's LspRequest "complete" event came),
  the answer holds no item, the plugin's handler took it as fresh (not dropped as stale), and
  no ghost extmark exists, neither right after the handler ran nor a moment later.

So a withheld case cannot pass because nothing was asked, or because the answer came too late
to count. One run of ``tests/e2e/editors/nvim_guard_e2e.lua`` does the four cases. Skipped
where Neovim is missing (failed with ``DIFFILL_REQUIRE_EDITORS=1``) or where tree-sitter or a
grammar wheel is not installed (the guard would be text rules only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from diffill.lsp_server.text import treesitter
from support.constant_checkpoint import word_id, write_constant_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e

# The server options of tests/e2e/test_lsp_languages.py (camelCase: the plugin's `settings`).
SETTINGS = {"steps": 2, "maxTokens": 6, "numCandidates": 1, "drafts": False, "syntaxCheck": True}

TS = "function f(a: number): number {\n  const b = a * 2;\n  return %s\n}\n"
GO = "package main\n\nfunc main() {\n\tx := %s\n\tprintln(x)\n}\n"
# name, file, the document with the cursor at `|` once the character before it is typed, expect
CASES = [
    ("ts good", "app.ts", TS % "|", "shown"),  # `return w7w7...`: a name, fine
    ("ts breaking", "app.ts", TS % "b |", "withheld"),  # `return b w7w7...`: two names in a row
    ("go good", "main.go", GO % "|", "shown"),  # `x := w7w7...`
    ("go breaking", "main.go", GO % "1 |", "withheld"),  # `x := 1 w7w7...`
]


def _case(name: str, file: Path, doc: str, expect: str) -> dict[str, Any]:
    """The buffer before the keystroke (``doc`` without ``|`` and the character before it),
    where that character is typed, and the buffer once it is."""
    off = doc.index("|")
    typed = doc[off - 1]
    before = doc[:off - 1] + doc[off + 1:]
    at = off - 1  # where the character goes
    row, col = before.count("\n", 0, at), at - (before.rfind("\n", 0, at) + 1)
    lines = before.split("\n")
    if before.endswith("\n"):
        lines.pop()  # the buffer's last line ends with the file's newline
    return {"name": name, "file": str(file), "expect": expect, "lines": lines, "row": row, "col": col,
            "type": typed, "after": doc.replace("|", "", 1)}


def test_neovim_ghost_text_shown_where_it_fits_withheld_where_it_breaks_ts_and_go(tmp_path: Path) -> None:
    nvim = h.need_nvim()
    if not treesitter.available():
        pytest.skip("the tree-sitter package is not installed (text rules only)")
    for lang, wheel in (("typescript", "tree-sitter-typescript"), ("go", "tree-sitter-go")):
        if treesitter.grammar(lang) is None:
            pytest.skip(f"the grammar wheel {wheel} is not installed")
    model = write_constant_checkpoint(tmp_path / "w7-fused", word_id(7), fuse=True)
    work = tmp_path / "work"
    work.mkdir()
    cases = [_case(name, work / f, doc, expect) for name, f, doc, expect in CASES]
    for c in cases:
        Path(c["file"]).write_text(c["after"])
    r = h.run_driver(h.nvim_argv(nvim, "nvim_guard_e2e.lua"), tmp_path, {
        "plugin_dir": str(h.EDITORS / "nvim"),
        "cmd": h.serve_cmd(tmp_path),
        "settings": {"modelPath": str(model), "device": "cpu", **SETTINGS},
        "cases": cases,
        "quiet_ms": 500,
        "timeout_ms": 90_000,
    }, timeout=120, cwd=work)
    got = {c["name"]: c for c in r["cases"]}
    assert list(got) == [c["name"] for c in cases]
    filetypes = {"app.ts": "typescript", "main.go": "go"}
    for want in cases:
        c = got[want["name"]]
        why = json.dumps(c, indent=1)
        assert c["filetype"] == filetypes[Path(want["file"]).name], why
        assert c["clients"] == 1, why  # one server for both buffers
        # The keystroke made the document of the LSP test, cursor right after it.
        assert "\n".join(c["buffer"]) + "\n" == want["after"], why
        assert c["cursor"] == [want["row"], want["col"] + 1], why
        # The plugin's own request for that buffer was sent, answered and handled as fresh.
        a = c["answer"]
        assert a["position"] == {"line": want["row"], "character": want["col"] + 1}, why
        assert a["handled"] and a["fresh"] and a.get("err") is None, why
        assert a["trigger"] == 2, why  # automatic: the plugin asked after the keystroke
        assert c["completes"] >= 1, why  # Neovim's client saw the reply (LspRequest "complete")
        if want["expect"] == "shown":
            assert a["n_items"] >= 1 and a["texts"][0].startswith("w7"), why
            assert a["marks_after"] == 1, why
            assert c["marks"] == 1 and c["visible"], why
            assert c["shown"].startswith("w7"), why  # the ghost text on screen
            assert c["suggestion"] == c["shown"], why  # what <Tab> would insert
            assert c["extmark"]["row"] == want["row"] and c["extmark"]["col"] == want["col"] + 1, why
            assert c["extmark"]["virt_text_pos"] == "inline", why
        else:
            assert a["n_items"] == 0, why  # the server withheld the breaking suggestion
            assert a["marks_after"] == 0 and c["marks_at_answer"] == 0, why
            assert c["marks"] == 0 and c["shown"] is None and c["suggestion"] is None, why
            assert not c["visible"], why
            # No other answer for the typed buffer offered anything either.
            assert all(x.get("n_items", 0) == 0 for x in c["answers"]
                       if x["position"] == a["position"] and x["tick"] == a["tick"]), why
