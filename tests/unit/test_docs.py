"""The documentation sends users the right way (issue 31, point 8).

* No tracked doc tells users to ``pip install diffill``: diffill is not on PyPI, the
  commands that work start from a clone (README, *Set up*).
* ``docs/options.md`` holds the one table of every server option, generated from
  ``lsp_server/completion/options.py`` by ``scripts/options_table.py``; it is up to date, the README
  and docs/editors.md link it (that every VS Code setting is a server option is
  ``tests/unit/lsp_server/completion/test_options.py::test_vscode_settings_are_server_options``).
* Nothing cites a ``DESIGN.md``: there is none in the repository.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from diffill.lsp_server.completion.options import WIRE_NAMES

ROOT = Path(__file__).resolve().parents[2]
DOC_GLOBS = ("*.md", "*.txt", "*.el", "*.lua")


def tracked(*globs: str) -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (git ls-files)")
    out = subprocess.run(["git", "ls-files", "-z", "--", *globs], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()]


# One pip command: from "pip install" up to the end of that shell command.
_PIP = re.compile(r"\bpip[x3]?\s+install\b([^\n`&;|)]*)")
_FROM_PYPI = re.compile(r"""^['"]?diffill(\[[^\]]*\])?['"]?$""")


def pypi_installs(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each command that installs diffill from an index by name."""
    hits = []
    for m in _PIP.finditer(text):
        if any(_FROM_PYPI.match(tok) for tok in m.group(1).split()):
            line = text.count("\n", 0, m.start()) + 1
            hits.append((line, text.splitlines()[line - 1].strip()))
    return hits


def test_pypi_install_pattern():
    assert pypi_installs("`diffill` on $PATH (`pip install diffill`)")
    assert pypi_installs("pip install 'diffill[http,gpu]'   # aiohttp")
    assert pypi_installs('pip3 install -U "diffill[hub]"')
    assert pypi_installs("pipx install diffill")
    for fine in ("pip install torch==2.13.0 && pip install -e . && diffill complete x.py",
                 "pip install -e '.[http,gpu]'", 'pip install -e ".[hub]"',
                 "pip install --no-deps -e . && python -P -m pytest", "pip install diffill-tools",
                 "cd diffill && pip install -e ."):
        assert not pypi_installs(fine), fine


def test_no_doc_installs_diffill_from_pypi():
    """diffill is not on PyPI: a doc that says ``pip install diffill`` fails for everyone.
    The install from a clone is in README.md (*Set up*)."""
    offending = [f"{p.relative_to(ROOT)}:{n}: {line}"
                 for p in tracked(*DOC_GLOBS)
                 for n, line in pypi_installs(p.read_text(encoding="utf-8", errors="replace"))]
    assert not offending, "these docs install diffill from PyPI (it is not there):\n" + "\n".join(
        offending)


def _options_table_script():
    spec = importlib.util.spec_from_file_location("options_table", ROOT / "scripts/options_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_options_table_is_up_to_date():
    script = _options_table_script()
    current = (ROOT / "docs/options.md").read_text(encoding="utf-8")
    assert script.splice(current, script.render_table()) == current, (
        "docs/options.md is out of date with lsp_server/completion/options.py: "
        "run python scripts/options_table.py")


def test_options_table_has_every_option_with_a_description():
    table = _options_table_script().render_table()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|.*\| ([^|]*) \|$",
                                                        table, re.M)}
    assert set(rows) == set(WIRE_NAMES)
    assert all(desc.strip() for desc in rows.values()), [k for k, d in rows.items() if not d.strip()]


@pytest.mark.parametrize("doc", ["README.md", "docs/editors.md"])
def test_docs_link_the_options_table(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert re.search(r"\]\((docs/)?options\.md\)", text), f"{doc} does not link docs/options.md"


def test_nothing_cites_a_missing_design_md():
    if (ROOT / "DESIGN.md").exists():
        pytest.skip("DESIGN.md is in the repository")
    me = Path(__file__).resolve()
    citing = [str(p.relative_to(ROOT)) for p in tracked("*.md", "*.py", "*.txt", "*.el", "*.lua")
              if p.resolve() != me and "DESIGN.md" in p.read_text(encoding="utf-8", errors="replace")]
    assert not citing, f"these files cite DESIGN.md, which is not in the repository: {citing}"
