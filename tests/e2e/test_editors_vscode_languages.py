"""editors/vscode, issue 27: the extension completes, by default, the languages the server
guards with a tree-sitter parser (lsp_server/text/languages.py), through the `diffill.languages`
setting, ``["*"]`` meaning every language.

* the setting's default in package.json and ``DEFAULT_LANGUAGES`` in src/options.ts are the
  same list, each id one the server's table maps to a language with a grammar, and together
  they cover every such language;
* the document selector built from the setting (src/options.ts compiled with the extension's
  own ``tsc`` and run with node): the default list, ``*``, duplicates, an empty list.

No editor is started; the compile step needs node and ``npm ci`` in editors/vscode.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

EXT_DIR = h.EDITORS / "vscode"
TSC = EXT_DIR / "node_modules" / ".bin" / "tsc"


def _default_languages() -> list[str]:
    props = json.loads((EXT_DIR / "package.json").read_text())["contributes"]["configuration"]["properties"]
    setting = props["diffill.languages"]
    assert setting["type"] == "array" and setting["items"] == {"type": "string"}
    return setting["default"]


def test_default_languages_are_the_languages_the_server_parses() -> None:
    from diffill.lsp_server.text.languages import GRAMMAR_LANGUAGES, lookup

    default = _default_languages()
    assert len(default) == len(set(default)), default
    covered = set()
    for lsp_id in default:
        lang = lookup(lsp_id)
        assert lang is not None and lang.grammar is not None, lsp_id
        assert lsp_id in lang.ids, (lsp_id, lang.ids)  # an LSP id, not a name or an extension
        covered.add(lang.name)
    assert covered == set(GRAMMAR_LANGUAGES), set(GRAMMAR_LANGUAGES) ^ covered
    # the ids VS Code itself uses for the ones with several
    for vscode_id in ("javascriptreact", "typescriptreact", "cpp", "csharp", "shellscript"):
        assert vscode_id in default
    src = (EXT_DIR / "src" / "options.ts").read_text()
    block = re.search(r"DEFAULT_LANGUAGES = \[(.*?)\] as const", src, re.S)
    assert block is not None
    assert re.findall(r"'([\w*]+)'", block.group(1)) == default


def _node() -> str | None:
    local = h.NODE_BIN / "node"
    return str(local) if local.exists() else shutil.which("node")


def test_document_selector_follows_the_setting(tmp_path: Path) -> None:
    node = _node()
    h.need(node is not None, f"node not installed ({h.INSTALL_HINT})")
    h.need(TSC.exists(), f"editors/vscode dependencies not installed ({h.INSTALL_HINT})")
    assert node is not None
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    p = subprocess.run([str(TSC), "-p", str(EXT_DIR), "--outDir", str(out)],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stdout + p.stderr  # the whole extension still compiles
    script = """
const o = require(process.argv[1]);
const reader = (v) => ({ get: (name) => (name === 'languages' ? v : undefined) });
const cases = { unset: undefined, star: ['python', '*'], some: ['go', 'go', ' rust ', '', 3],
                none: [], bad: 'python' };
const res = { defaults: o.DEFAULT_LANGUAGES };
for (const [k, v] of Object.entries(cases)) res[k] = o.documentSelector(reader(v));
console.log(JSON.stringify(res));
"""
    p = subprocess.run([node, "-e", script, str(out / "options.js")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    default = _default_languages()
    assert r["defaults"] == default

    def by_scheme(sel: list[dict], scheme: str) -> list[str]:
        return [f["language"] for f in sel if f["scheme"] == scheme]

    for key in ("unset", "bad"):  # no (or a malformed) setting: the default list
        assert by_scheme(r[key], "file") == default and by_scheme(r[key], "untitled") == default
        assert len(r[key]) == 2 * len(default)
    assert r["star"] == [{"scheme": "file"}, {"scheme": "untitled"}]  # every language
    assert r["some"] == [{"scheme": "file", "language": "go"}, {"scheme": "untitled", "language": "go"},
                         {"scheme": "file", "language": "rust"}, {"scheme": "untitled", "language": "rust"}]
    assert r["none"] == []
