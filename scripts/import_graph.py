"""Print the import graph of diffill's folders, read from the code with grimp (the library
behind import-linter, a dev dependency): one line per folder -> folder edge with the
number of import statements behind it, type-only and function-level imports included,
then the same for the sub-packages of ``diffill.lsp_server`` (its own layers).

    python scripts/import_graph.py            # folder -> folder, then sub-package edges
    python scripts/import_graph.py --modules  # module -> module edges across either

The repository spreads the ``diffill`` package over several folders (the package-dir
mapping in pyproject.toml), which grimp cannot follow, so the folders are first copied
into a temporary folder laid out as a wheel installs them. ``diffill.cli`` reaches the
command modules by name (its table, so that ``diffill --help`` imports none of them);
those edges are not import statements and do not show.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
from pathlib import Path

import grimp
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def stage(dest: Path) -> None:
    """Copy the package folders into ``dest`` as the installed ``diffill`` package."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for pkg, folder in mapping.items():
        shutil.copytree(ROOT / folder, dest.joinpath(*pkg.split(".")), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.safetensors", "*.json"))


SUB_PACKAGES = "diffill.lsp_server"
"""The folder whose sub-packages get a section of their own."""


def folder_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def sub_package_of(module: str) -> str | None:
    """``diffill.lsp_server.text.context`` -> ``diffill.lsp_server.text``; None outside the
    folder and for the folder's own ``__init__``."""
    parts = module.split(".")
    if not module.startswith(SUB_PACKAGES + ".") or len(parts) < 3:
        return None
    return ".".join(parts[:3])


def print_edges(edges: collections.Counter[tuple[str, str]]) -> None:
    for (a, b), n in sorted(edges.items()):
        print(f"{a} -> {b}  ({n} import{'s' if n > 1 else ''})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", action="store_true", help="module -> module edges across folders")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stage(Path(tmp))
        sys.path.insert(0, tmp)
        graph = grimp.build_graph("diffill", cache_dir=None)
        edges: collections.Counter[tuple[str, str]] = collections.Counter()
        inner: collections.Counter[tuple[str, str]] = collections.Counter()
        for importer in graph.modules:
            for imported in graph.find_modules_directly_imported_by(importer):
                n = len(graph.get_import_details(importer=importer, imported=imported)) or 1
                a, b = folder_of(importer), folder_of(imported)
                if a != b:
                    edges[(importer, imported) if args.modules else (a, b)] += n
                    continue
                sa, sb = sub_package_of(importer), sub_package_of(imported)
                if sa and sb and sa != sb:
                    inner[(importer, imported) if args.modules else (sa, sb)] += n
    print_edges(edges)
    print(f"\n# inside {SUB_PACKAGES}: sub-package -> sub-package")
    print_edges(inner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
