"""Recent edits and visits across files: a ring of regions, as llama.vim keeps its ring of
chunks (16 chunks of 64 lines, gathered on yank, buffer enter/leave and save, a chunk
evicted when a new one is more than 0.9 similar to it).

Here a *region* is a place the user edited (``didChange``), opened (``didOpen``: the first
lines) or asked for a completion at (a visit), in any document: its document and row (LSP
says nothing of yanks or of the cursor moving between documents, two of llama.vim's events). A new note within ``lines // 2`` rows of a
region of the same document moves that region to the front (and to the new row); otherwise
it is a new region, and the oldest one falls out past ``size``. The text of a region is read
when the context is gathered (:meth:`RecentRing.chunks`), from the document as it is then --
an open document's live text, or the copy kept when it was closed -- ``lines`` lines
centred on its row; a chunk more than ``similar`` like a newer one (the Jaccard similarity
of their sets of lines, llama.vim's measure) is left out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Region:
    uri: str
    path: str
    row: int
    language: str | None = None


@dataclass(frozen=True)
class Chunk:
    uri: str
    path: str
    row: int
    text: str
    language: str | None = None


def line_similarity(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' sets of (stripped, non-blank) lines."""
    sa = {ln.strip() for ln in a.split("\n") if ln.strip()}
    sb = {ln.strip() for ln in b.split("\n") if ln.strip()}
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


class RecentRing:
    def __init__(self, size: int = 16, lines: int = 32, similar: float = 0.9) -> None:
        self.size = size
        self.lines = lines
        self.similar = similar
        self._regions: list[Region] = []  # newest first
        self._closed: OrderedDict[str, str] = OrderedDict()  # uri -> its text when closed
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._regions)

    def note(self, uri: str, path: str, row: int, language: str | None = None) -> None:
        with self._lock:
            for i, r in enumerate(self._regions):
                if r.uri == uri and abs(r.row - row) <= self.lines // 2:
                    del self._regions[i]
                    break
            self._regions.insert(0, Region(uri, path, row, language))
            del self._regions[self.size:]
            self._closed.pop(uri, None)

    def closed(self, uri: str, text: str) -> None:
        """``uri`` was closed: keep its text for its regions (dropped with the last one)."""
        with self._lock:
            if any(r.uri == uri for r in self._regions):
                self._closed[uri] = text
                while len(self._closed) > self.size:
                    self._closed.popitem(last=False)

    def chunks(self, text_of: Callable[[str], str | None], *, exclude: str | None = None,
               limit: int | None = None) -> list[Chunk]:
        """The regions' texts, newest first, none of the document ``exclude`` (``text_of``:
        uri -> an open document's text, None when it is not open)."""
        with self._lock:
            regions = list(self._regions)
            closed = dict(self._closed)
        out: list[Chunk] = []
        lines_cache: dict[str, list[str]] = {}
        for r in regions:
            if r.uri == exclude:
                continue
            lines = lines_cache.get(r.uri)
            if lines is None:
                text = text_of(r.uri)
                if text is None:
                    text = closed.get(r.uri)
                if text is None:
                    continue
                lines = lines_cache[r.uri] = text.split("\n")
            half = self.lines // 2
            lo = max(0, min(r.row, len(lines)) - half)
            body = "\n".join(lines[lo: lo + self.lines]).strip("\n")
            if not body.strip():
                continue
            if any(line_similarity(body, c.text) > self.similar for c in out):
                continue
            out.append(Chunk(r.uri, r.path, r.row, body + "\n", r.language))
            if limit is not None and len(out) >= limit:
                break
        return out
