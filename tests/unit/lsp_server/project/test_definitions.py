"""Definitions of the imported names used near the cursor, outlined with ast."""

from __future__ import annotations

from diffill.lsp_server.project.definitions import DefinitionFinder, imports, near_names, outline
from diffill.lsp_server.project.workspace import WorkspaceIndex

SHAPES = '''"""Shapes."""

import math

RATIO: float = 1.5


def area(width: int, height: int = 2) -> int:
    """Area of a rectangle.

    More text.
    """
    return width * height


class Box(Base, metaclass=Meta):
    """A box with sides."""

    kind = "box"

    def __init__(self, side):
        self.side = side

    async def grow(self, by: int = 1) -> "Box":
        return Box(self.side + by)
'''


def test_imports_reads_every_form():
    text = ("import os, numpy as np\nimport a.b\nfrom .shapes import area, Box as B\n"
            "from pkg import (\n    one,\n    two as deux,\n)\nfrom .. import up\n")
    got = imports(text)
    assert (got["np"].module, got["np"].symbol) == ("numpy", None)
    assert (got["a"].module, got["os"].module) == ("a", "os")
    assert (got["area"].module, got["area"].level, got["area"].symbol) == ("shapes", 1, "area")
    assert got["B"].symbol == "Box"
    assert got["one"].module == "pkg" and got["deux"].symbol == "two"
    assert (got["up"].module, got["up"].level) == ("", 2)


def test_near_names_nearest_first():
    text = "far = 1\nx = near(y)\n"
    assert near_names(text, text.index("near"))[:1] == ["near"]


def test_outline_of_a_function_a_class_and_an_assignment():
    f = outline(SHAPES[SHAPES.index("def area"):SHAPES.index("class Box")])
    assert f == 'def area(width: int, height: int=2) -> int:\n    """Area of a rectangle."""\n'
    c = outline(SHAPES[SHAPES.index("class Box"):])
    assert c == ('class Box(Base, metaclass=Meta):\n    """A box with sides."""\n'
                 "    kind = 'box'\n    def __init__(self, side): ...\n"
                 "    async def grow(self, by: int=1) -> 'Box': ...\n")
    assert outline("RATIO: float = 1.5\n") == "RATIO: float = 1.5\n"
    assert outline("def broken(:\n") is None


def finder() -> DefinitionFinder:
    idx = WorkspaceIndex()
    idx.put("/w/pkg/shapes.py", SHAPES)
    idx.put("/w/pkg/__init__.py", "")
    return DefinitionFinder(idx)


def test_finds_relative_absolute_and_module_attribute_uses():
    f = finder()
    rel = "from .shapes import area, Box\n\n\ndef main():\n    b = Box(3)\n    return area("
    got = f.find(rel, len(rel), "/w/pkg/main.py")
    assert [(d.path, d.name) for d in got] == [("/w/pkg/shapes.py", "area"), ("/w/pkg/shapes.py", "Box")]
    mod = "from pkg import shapes\n\nx = shapes.RATIO * "
    assert [d.name for d in f.find(mod, len(mod), "/w/app.py")] == ["RATIO"]
    whole = "import pkg.shapes\n\ny = pkg.shapes.area(1, "
    assert [d.name for d in f.find(whole, len(whole), "/w/app.py")] == ["area"]
    alias = "import pkg.shapes as sh\n\ny = sh.Box("
    assert [d.name for d in f.find(alias, len(alias), "/w/app.py")] == ["Box"]


def test_nothing_unresolved_or_unused():
    f = finder()
    text = "from .shapes import area\nimport json\n\n" + "x = 1\n" * 40 + "json.dumps("
    assert f.find(text, len(text), "/w/pkg/main.py") == []  # area is not used near the cursor
    assert f.find("print(1)", 8, "/w/pkg/main.py") == []
