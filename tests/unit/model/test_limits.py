"""The shared facts: importable without torch (the text side reads them at ``initialize``)."""

from __future__ import annotations

import subprocess
import sys

from diffill.model import limits, recipes


def test_limits_import_without_torch():
    code = "import sys, diffill.model.limits; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_recipe_names_are_the_tables():
    assert limits.RECIPE_NAMES is recipes.RECIPE_NAMES
