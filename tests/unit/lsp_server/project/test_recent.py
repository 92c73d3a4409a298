"""The ring of recent regions across documents."""

from __future__ import annotations

from diffill.lsp_server.project.recent import RecentRing, line_similarity


def doc(n: int, tag: str) -> str:
    return "".join(f"{tag}_{i} = {i}\n" for i in range(n))


def test_regions_newest_first_merged_and_bounded():
    texts = {"a": doc(200, "a"), "b": doc(200, "b"), "c": doc(200, "c")}
    ring = RecentRing(size=3, lines=8)
    ring.note("a", "/a.py", 10)
    ring.note("b", "/b.py", 50)
    ring.note("a", "/a.py", 12)  # near the first region of a: it moves to the front
    assert len(ring) == 2
    ring.note("c", "/c.py", 0)
    ring.note("a", "/a.py", 150)
    ring.note("b", "/b.py", 100)  # the ring holds 3: the oldest (b @ 50) is out
    got = ring.chunks(texts.get)
    assert [(c.uri, c.row) for c in got] == [("b", 100), ("a", 150), ("c", 0)]
    assert got[0].text == "".join(f"b_{i} = {i}\n" for i in range(96, 104))
    assert [c.uri for c in ring.chunks(texts.get, exclude="a", limit=1)] == ["b"]


def test_closed_documents_keep_their_text_and_similar_chunks_are_left_out():
    ring = RecentRing(size=4, lines=8)
    same = doc(20, "s")
    ring.note("x", "/x.py", 5)
    ring.note("y", "/y.py", 5)
    ring.closed("x", same)
    got = ring.chunks({"y": same}.get)  # y open with the same text: x's chunk repeats it
    assert [c.uri for c in got] == ["y"]
    ring.note("z", "/z.py", 5)
    assert [c.uri for c in ring.chunks({"z": doc(20, "z")}.get)] == ["z", "x"]


def test_line_similarity():
    assert line_similarity("a\nb\n", "b\na\n") == 1.0
    assert line_similarity("a\n", "b\n") == 0.0
