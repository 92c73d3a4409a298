"""Emacs 28 + eglot 1.9 (batch) with editors/emacs/diffill.el, issue 27: the major modes
``diffill-setup`` hands to diffill. Eglot gives a buffer one server, so by default
(``diffill-major-modes`` = ``auto``) diffill takes the Python modes and, of the other
languages the server parses, those with no other eglot server that can start (entry missing
or program not found); gopls, clangd, a user's own entry keep their modes; a list is used as
it is. The checks are the ert tests of ``tests/e2e/editors/emacs_modes_test.el`` (programs
"installed" in a temporary ``exec-path``); no server is started.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

pytestmark = pytest.mark.e2e


def test_default_modes_are_the_parsed_languages_without_another_server(tmp_path: Path) -> None:
    emacs = h.need_emacs()
    with h.isolated_env(tmp_path) as env:
        p = subprocess.run(
            [emacs, "--batch", "-L", str(h.EDITORS / "emacs"),
             "-l", str(h.DRIVERS / "emacs_modes_test.el"), "-f", "ert-run-tests-batch-and-exit"],
            capture_output=True, text=True, timeout=120, env=env,
        )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    ran = re.search(r"Ran (\d+) tests, (\d+) results as expected, 0 unexpected", out)
    assert ran and int(ran.group(1)) == int(ran.group(2)) >= 6, out[-4000:]
