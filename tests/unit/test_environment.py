"""The test process imports installed packages, never the repository's folders of the same name.

The repository's top-level folders (``kernels/``, ``model/``, ``training/``, ...) install as
``diffill.kernels``, ``diffill.model``, ...; with the repository root on ``sys.path`` they
would also be importable as top-level packages and shadow installed ones. ``kernels`` is a
real PyPI package that transformers 5 imports (``transformers.integrations.hub_kernels``):
``python -m pytest`` put the root first on ``sys.path`` and every parity test against
transformers failed with ``cannot import name 'CUDAProperties' from 'kernels'``. The test
command is ``python -P -m pytest`` (README, ``.ci/run``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())


def _on_path(entry: str) -> Path:
    return Path(entry or os.getcwd()).resolve()


def test_repository_root_is_not_on_sys_path() -> None:
    assert "kernels" in FOLDERS  # the folder whose name collides with a PyPI package
    shadowing = [e for e in sys.path if _on_path(e) == ROOT]
    assert not shadowing, (
        f"the repository root {ROOT} is on sys.path ({shadowing!r}): its folders {FOLDERS} "
        "shadow installed packages of the same names; run the tests as `python -P -m pytest`"
    )


@pytest.mark.parametrize("name", FOLDERS)
def test_top_level_name_is_not_the_repository_folder(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return  # nothing of that name importable: nothing shadowed
    origin = Path(spec.origin).resolve()
    assert ROOT / name not in origin.parents, (
        f"`import {name}` resolves to the repository folder {origin}, not to an installed "
        "package: run the tests as `python -P -m pytest`"
    )


def test_installed_kernels_package_is_the_one_imported() -> None:
    """Where Hugging Face's ``kernels`` is installed (transformers 5 depends on it), ``import
    kernels`` gives that distribution's files -- what transformers needs."""
    try:
        dist = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's `kernels` is not installed (transformers 4.x)")
    import kernels

    where = Path(kernels.__file__).resolve()
    installed = {Path(dist.locate_file(f)).resolve() for f in dist.files or ()}
    assert where in installed, f"`import kernels` gave {where}, not the installed {dist.name}"
    # and the diffill folder is still there under its own name
    from diffill import kernels as ours

    assert Path(ours.__file__).resolve().parent == ROOT / "kernels"
