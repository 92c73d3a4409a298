"""The gatherer: what a request gets from the index, the definitions and the ring."""

from __future__ import annotations

from diffill.lsp_server.project.gather import Gatherer, query_window
from diffill.lsp_server.project.recent import RecentRing
from diffill.lsp_server.project.workspace import WorkspaceIndex

SHAPES = "def rectangle_area(width, height):\n    return width * height\n"
MAIN = "from .shapes import rectangle_area\n\n\ndef total(items):\n    s = rectangle_area("


def make() -> Gatherer:
    idx = WorkspaceIndex()
    idx.put("/w/pkg/shapes.py", SHAPES)
    idx.put("/w/pkg/main.py", MAIN)
    idx.put("/w/pkg/noise.py", "def unrelated():\n    return 0\n")
    ring = RecentRing()
    ring.note("file:///w/pkg/notes.py", "/w/pkg/notes.py", 0, "python")
    return Gatherer(idx, ring, roots=["/w"])


def test_query_window_is_the_lines_around_the_cursor():
    text = "".join(f"l{i}\n" for i in range(30))
    off = text.index("l15")
    got = query_window(text, off, above=2, below=1)
    assert got.split() == ["l13", "l14", "l15", "l16"]


def test_everything_off_gives_nothing():
    ex = make().gather(MAIN, len(MAIN), path="/w/pkg/main.py")
    assert (ex.snippets, ex.workspace) == ([], [])


def test_definitions_first_then_chunks_then_recent_with_relative_paths():
    ex = make().gather(MAIN, len(MAIN), path="/w/pkg/main.py", language="python",
                       uri="file:///w/pkg/main.py", definitions=True, retrieved=True,
                       recent=True, drafts=True,
                       text_of={"file:///w/pkg/notes.py": "note = 1\n"}.get)
    assert [(s.kind, s.path) for s in ex.snippets] == [  # noise.py shares only "def"
        ("definition", "pkg/shapes.py"), ("workspace", "pkg/shapes.py"),
        ("workspace", "pkg/noise.py"), ("recent", "pkg/notes.py")]
    assert ex.snippets[0].text == "def rectangle_area(width, height): ...\n"
    assert ex.workspace[0] == SHAPES  # the current file is never searched
    assert all("def total" not in w for w in ex.workspace)
    assert ex.ms >= 0.0
