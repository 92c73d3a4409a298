"""The repository's floor plan holds (docs/layout.md).

* Which way imports run between the folders, and no import cycle between folders or
  between the modules of a folder: the import-linter contracts in ``pyproject.toml``,
  checked on the package laid out as it is installed (``lint-imports``).
* Read from the files themselves (``ast``, imports inside functions included): imports
  between the project's folders are relative, an import inside a function says why on its
  line, and no module imports another module's private (``_name``) names.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
"""Top-level package name -> folder, e.g. ``diffill.model`` -> ``model``."""


@dataclass(frozen=True)
class Imported:
    file: Path
    line: int
    module: str  # absolute module name imported from
    names: tuple[str, ...]  # names imported (empty for ``import x``)
    relative: bool
    in_function: bool
    text: str  # the source line


def module_name(path: Path) -> str:
    """``lsp_server/backend/backends.py`` -> ``diffill.lsp_server.backend.backends``."""
    rel = path.relative_to(ROOT)
    for pkg, folder in sorted(PACKAGE_DIR.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[0] == folder:
            parts = [*pkg.split("."), *rel.parts[1:]]
            parts[-1] = parts[-1].removesuffix(".py")
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise ValueError(f"{path} is in no package folder")


def source_files() -> list[Path]:
    return sorted(p for folder in PACKAGE_DIR.values() for p in (ROOT / folder).rglob("*.py"))


def imports_of(path: Path) -> list[Imported]:
    src = path.read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    in_fn: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_fn |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(Imported(path, node.lineno, mod, tuple(a.name for a in node.names),
                                bool(node.level), id(node) in in_fn, lines[node.lineno - 1]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                out.append(Imported(path, node.lineno, a.name, (), False, id(node) in in_fn,
                                    lines[node.lineno - 1]))
    return out


def top_package(module: str) -> str | None:
    """The folder (top-level package of the mapping) a diffill module belongs to."""
    best = None
    for pkg in PACKAGE_DIR:
        if (module == pkg or module.startswith(pkg + ".")) and (best is None or len(pkg) > len(best)):
            best = pkg
    return best


ALL_IMPORTS = [imp for f in source_files() for imp in imports_of(f)]


def _where(imp: Imported) -> str:
    return f"{imp.file.relative_to(ROOT)}:{imp.line}: {imp.text.strip()}"


def test_imports_between_folders_are_relative():
    bad = [_where(i) for i in ALL_IMPORTS
           if not i.relative and (i.module == "diffill" or i.module.startswith("diffill."))]
    assert bad == []


def test_imports_inside_functions_say_why():
    bad = [_where(i) for i in ALL_IMPORTS if i.in_function and "#" not in i.text]
    assert bad == []


def test_no_private_names_across_modules():
    bad = []
    for i in ALL_IMPORTS:
        if not i.module.startswith("diffill"):
            continue
        private = [n for n in i.names if n.startswith("_") and not n.startswith("__")]
        if private:
            bad.append(_where(i))
    assert bad == []


def test_every_import_of_the_project_resolves_to_a_module_or_package():
    """Guards the checks above: each diffill import names something that exists."""
    known = {module_name(p) for p in source_files()}
    bad = []
    for i in ALL_IMPORTS:
        if i.module.startswith("diffill") and i.module not in known:
            bad.append(_where(i))
    assert bad == []


def staged_package(dest: Path) -> Path:
    """The ``diffill`` package laid out as a wheel installs it (the repository spreads it over
    several folders, which import-linter's graph builder cannot follow)."""
    for pkg, folder in PACKAGE_DIR.items():
        target = dest.joinpath(*pkg.split("."))
        shutil.copytree(ROOT / folder, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.safetensors", "*.json"))
    return dest


def test_import_contracts(tmp_path: Path):
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.is_file(), "import-linter is a dev dependency (pip install -e '.[dev]')"
    stage = staged_package(tmp_path / "stage")
    env = {**os.environ, "PYTHONPATH": str(stage)}
    out = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and "4 kept, 0 broken" in out.stdout
    analysed = re.search(r"Analyzed (\d+) files", out.stdout)
    assert analysed and int(analysed.group(1)) == len(source_files())  # the staged copy, whole


def test_unit_tests_mirror_the_modules():
    """``tests/unit/<folder>/[<sub>/]test_<module>[_<aspect>].py`` tests ``<folder>/[<sub>/]<module>.py``
    (``tests/unit/test_*.py``: the root package and the floor plan)."""
    unit = ROOT / "tests" / "unit"
    folders = {Path(folder).name: ROOT / folder for folder in PACKAGE_DIR.values()}
    bad = []
    for test in sorted(unit.rglob("test_*.py")):
        rel = test.relative_to(unit)
        if len(rel.parts) == 1:
            continue
        top, *sub = rel.parts[:-1]
        src = folders.get(top)
        if src is None:
            bad.append(str(rel))
            continue
        modules = {p.stem for p in src.joinpath(*sub).glob("*.py")} - {"__init__"}
        stem = test.stem.removeprefix("test_")
        if not any(stem == m or stem.startswith(m + "_") for m in modules):
            bad.append(str(rel))
    assert bad == []
