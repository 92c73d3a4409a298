"""The workspace index: the text files under the LSP workspace folders, in memory, chunked
into line windows and searched by BM25 over identifier tokens.

Nothing leaves the machine: the files are read from the local disk and kept in this
process (no cache on disk, no network). What is read:

* **Walk** and **files**: what :func:`build_index` reads, chosen by :mod:`.workspace_files`
  (the ignore files, :data:`~.workspace_files.SKIP_DIRS`, text only, not generated).
* **Caps** (:class:`IndexLimits`): at most ``max_files`` files and ``max_chars`` characters
  of text in all; what is over a cap is left out and counted (``stats()``).

**Chunks**: ``CHUNK_LINES``-line windows (the last one shorter), not overlapping; a hit can
be read with lines of context around it (:meth:`WorkspaceIndex.text`).

**Search**: BM25 (k1 1.2, b 0.75) over identifier tokens (``[A-Za-z_][A-Za-z0-9_]+``,
case kept). Why BM25 and not the Jaccard similarity of token sets (both are
CrossCodeEval's lexical retrievers; Tabby's index is BM25): the names that matter at a
cursor are the rare ones (``parse_header``), and BM25's inverse document frequency weighs
them above ``self``/``return``, which Jaccard counts like any other; it also runs off an
inverted index, touching only chunks that share a token with the query, where Jaccard over
all chunks would compare the query with each one. The postings of a token are arrays
(``array('I')`` chunk ids and ``array('B')`` counts), read at query time as numpy views:
the query's tokens are visited rarest first, tokens in more than ``common`` of the chunks
are skipped (their idf is near zero), and at most ``postings_budget`` postings are scored,
so a query costs about a millisecond whatever the workspace size.

**Updates**: :meth:`WorkspaceIndex.put` (re)indexes one file's text (a save, a watched-file
change, an edited open document; a saved or watched file that the walk would leave out,
:func:`.workspace_files.excluded`, is not indexed), :meth:`~WorkspaceIndex.drop` removes one; the old chunks
become tombstones (skipped by search) and are reclaimed when they exceed half of all
chunks (:meth:`~WorkspaceIndex.compact`, from the stored texts).

Thread-safety: one lock; the build runs on its own thread (:func:`build_index`), one file
at a time under the lock; a search waits for it at most :data:`BUSY_WAIT_S` (20 ms) and
finds nothing this time past that (a compaction of a big index takes seconds).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .workspace_files import read_text_file, walk

CHUNK_LINES = 16
TEXT_CACHE = 32
BUSY_WAIT_S = 0.02
"""Longest a search waits for the index's lock (held while a file is indexed, or for a
compaction): past it the search finds nothing this time, so a completion never waits."""
"""Decompressed texts kept (the files of recent hits)."""
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")
DEAD = 0xFFFFFFFF


@dataclass(frozen=True)
class IndexLimits:
    max_files: int = 10_000
    max_file_bytes: int = 256_000
    max_chars: int = 100_000_000
    """Characters of text kept in all (the texts are most of the index's memory)."""


# ----------------------------------------------------------------------------- the index


def tokens(text: str) -> list[str]:
    return IDENT.findall(text)


@dataclass(frozen=True)
class Hit:
    path: str
    chunk: int  # the chunk's number in its file
    start_line: int
    end_line: int  # exclusive
    score: float


@dataclass
class _File:
    fid: int
    blobs: list[bytes]  # each chunk's text, UTF-8, zlib-compressed (code: about 3x smaller)
    chars: int
    crc: int
    first_chunk: int  # global id of its first chunk
    starts: array  # character offset of each chunk's first line (and the text's end)


@dataclass
class IndexStats:
    files: int = 0
    chunks: int = 0
    chars: int = 0
    terms: int = 0
    skipped_files: int = 0
    capped_files: int = 0
    build_s: float | None = None
    state: str = "empty"  # empty | building | ready | cancelled
    roots: list[str] = field(default_factory=list)


class WorkspaceIndex:
    """Files (path -> text) chunked and indexed for BM25 search (see the module doc)."""

    def __init__(self, limits: IndexLimits | None = None, *, common: float = 0.02,
                 postings_budget: int = 20_000) -> None:
        self.limits = limits or IndexLimits()
        self.common = common
        self.postings_budget = postings_budget
        self._lock = threading.RLock()
        self._files: dict[str, _File] = {}
        self._paths: list[str | None] = []  # fid -> path (None: dropped)
        self._chunk_file = array("I")  # chunk id -> fid (DEAD: a tombstone)
        self._chunk_len = array("H")  # tokens in the chunk (BM25's length)
        self._post: dict[str, array] = {}  # token -> ids of the chunks holding it
        self._norm_cache: tuple[tuple[int, int, int], np.ndarray] | None = None
        self._texts: OrderedDict[str, str] = OrderedDict()  # recently read texts
        self._modules: dict[str, set[str]] = {}  # module name -> paths of .py files it may be
        self._alive_chunks = 0
        self._total_len = 0
        self._chars = 0
        self.stats = IndexStats()

    # -- writing ------------------------------------------------------------------------------
    def put(self, path: str, text: str) -> bool:
        """Index ``text`` as the file ``path`` (replacing what was indexed for it); False when
        a cap leaves it out."""
        text = text.replace("\r\n", "\n")
        with self._lock:
            old = self._files.get(path)
            data = text.encode("utf-8", "surrogatepass")
            crc = zlib.crc32(data)
            if old is not None and (old.chars, old.crc) == (len(text), crc):
                return True
            grow = len(text) - (old.chars if old is not None else 0)
            if old is None and len(self._files) >= self.limits.max_files or (
                    self._chars + grow > self.limits.max_chars):
                self.stats.capped_files += 1
                return False
            if old is not None:
                self._kill(old)
            self._add(path, text, data, crc)
            if len(self._chunk_file) > 1024 and self._alive_chunks * 2 < len(self._chunk_file):
                self.compact()
            return True

    def drop(self, path: str) -> None:
        with self._lock:
            old = self._files.pop(path, None)
            if old is not None:
                self._kill(old)
                self._paths[old.fid] = None

    def _kill(self, f: _File) -> None:
        n = len(f.starts) - 1
        for c in range(f.first_chunk, f.first_chunk + n):
            if self._chunk_file[c] != DEAD:
                self._chunk_file[c] = DEAD
                self._alive_chunks -= 1
                self._total_len -= self._chunk_len[c]
        self._chars -= f.chars
        path = self._paths[f.fid] or ""
        self._texts.pop(path, None)
        mod = _module_key(path)
        if mod is not None:
            self._modules.get(mod, set()).discard(path)

    def _add(self, path: str, text: str, data: bytes, crc: int) -> None:
        old = self._files.get(path)
        fid = old.fid if old is not None else len(self._paths)
        if old is None:
            self._paths.append(path)
        first = len(self._chunk_file)
        starts = array("I", [0])
        blobs: list[bytes] = []
        pos, n = 0, len(text)
        while pos < n:
            end = pos
            for _ in range(CHUNK_LINES):
                nl = text.find("\n", end)
                end = n if nl < 0 else nl + 1
                if end >= n:
                    break
            cid = len(self._chunk_file)
            toks = IDENT.findall(text, pos, end)
            length = min(65535, len(toks))
            self._chunk_file.append(fid)
            self._chunk_len.append(length)
            self._total_len += length
            self._alive_chunks += 1
            post = self._post
            for tok in set(toks):
                try:
                    post[tok].append(cid)
                except KeyError:
                    post[tok] = array("I", (cid,))
            starts.append(end)
            blobs.append(zlib.compress(text[pos:end].encode("utf-8", "surrogatepass"), 1))
            pos = end
        self._files[path] = _File(fid, blobs, len(text), crc, first, starts)
        mod = _module_key(path)
        if mod is not None:
            self._modules.setdefault(mod, set()).add(path)
        self._chars += len(text)

    def compact(self) -> None:
        """Rebuild the postings from the stored texts (drops the tombstones)."""
        with self._lock:
            files = [(p, f) for p, f in self._files.items()]
            self._files.clear()
            self._paths = []
            self._chunk_file = array("I")
            self._chunk_len = array("H")
            self._post = {}
            self._modules = {}
            self._alive_chunks = self._total_len = self._chars = 0
            for p, f in files:
                text = _inflate(f.blobs)
                self._add(p, text, text.encode("utf-8", "surrogatepass"), f.crc)

    # -- reading ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, path: str) -> bool:
        return path in self._files

    @contextlib.contextmanager
    def _reading(self) -> Iterator[bool]:
        """The lock for a reader on a request's path: False when not had in ``BUSY_WAIT_S``."""
        ok = self._lock.acquire(timeout=BUSY_WAIT_S)
        try:
            yield ok
        finally:
            if ok:
                self._lock.release()

    def find_module(self, tail: str) -> str | None:
        """The indexed file of the module ``a/b`` (``.../a/b.py`` or ``.../a/b/__init__.py``):
        the shortest such path."""
        with self._reading() as ok:
            if not ok:
                return None
            cands = self._modules.get(tail.rsplit("/", 1)[-1], ())
            ends = ("/" + tail + ".py", "/" + tail + "/__init__.py")
            got = [p for p in cands if p.replace("\\", "/").endswith(ends)
                   or p in (tail + ".py", tail + "/__init__.py")]
        return min(got, key=len) if got else None

    def paths(self) -> list[str]:
        with self._lock:
            return list(self._files)

    def file_text(self, path: str) -> str | None:
        """The indexed text of ``path`` (None: not indexed); the last few read are kept."""
        with self._reading() as ok:
            if not ok:
                return None
            got = self._texts.get(path)
            if got is not None:
                self._texts.move_to_end(path)
                return got
            f = self._files.get(path)
            if f is None:
                return None
            text = _inflate(f.blobs)
            self._texts[path] = text
            while len(self._texts) > TEXT_CACHE:
                self._texts.popitem(last=False)
            return text

    def search(self, query: str | Iterable[str], *, k: int = 8, exclude: str | None = None
               ) -> list[Hit]:
        """The ``k`` chunks most similar to ``query`` (a text, or its tokens), best first;
        none of the file ``exclude``."""
        toks = set(IDENT.findall(query) if isinstance(query, str) else query)
        if not self._lock.acquire(timeout=BUSY_WAIT_S):
            return []  # a compaction (or a huge file) holds the index: no hits rather than a wait
        try:
            return self._search(toks, k, exclude)
        finally:
            self._lock.release()

    def _search(self, toks: set[str], k: int, exclude: str | None) -> list[Hit]:
        alive = self._alive_chunks
        if not toks or not alive:
            return []
        cap = max(8, int(alive * self.common))
        terms = []
        for t in toks:
            got = self._post.get(t)
            if got is not None and len(got) <= cap:
                terms.append((len(got), t, got))
        if not terms:
            return []
        terms.sort()
        norm = self._norm()
        scores = np.zeros(len(norm), dtype=np.float32)
        budget = self.postings_budget
        for df, _, ids in terms:
            if df > budget:
                break
            budget -= df
            idf = math.log(1.0 + (alive - df + 0.5) / (df + 0.5))
            c = np.frombuffer(ids, dtype=np.uint32)
            scores[c] += norm[c] * idf
        cand = np.flatnonzero(scores)
        want = min(len(cand), 4 * k + 8)
        if want <= 0:
            return []
        if want < len(cand):
            cand = cand[np.argpartition(-scores[cand], want - 1)[:want]]
        best = cand[np.argsort(-scores[cand], kind="stable")]
        out = []
        for c in best.tolist():
            fid = self._chunk_file[c]
            path = None if fid == DEAD else self._paths[fid]
            if path is None or path == exclude:
                continue
            f = self._files[path]
            j = c - f.first_chunk
            out.append(Hit(path, j, j * CHUNK_LINES, (j + 1) * CHUNK_LINES, float(scores[c])))
            if len(out) >= k:
                break
        return out

    def _norm(self) -> np.ndarray:
        """Per chunk, BM25's term weight for a token it holds (binary term frequency: the
        chunks are short, a repeated name says little more): ``(k1 + 1) / (1 + k1 * (1 - b +
        b * len / avg))``; cached until the chunks change."""
        key = (len(self._chunk_file), self._total_len, self._alive_chunks)
        if self._norm_cache is None or self._norm_cache[0] != key:
            lens = np.frombuffer(self._chunk_len, dtype=np.uint16).astype(np.float32)
            avg = max(1.0, self._total_len / max(1, self._alive_chunks))
            norm = 2.2 / (1.0 + 1.2 * (0.25 + 0.75 * lens / avg))
            self._norm_cache = (key, norm.astype(np.float32))
        return self._norm_cache[1]

    def version(self, path: str) -> int | None:
        """A checksum of the indexed text of ``path`` (None: not indexed)."""
        f = self._files.get(path)
        return None if f is None else f.crc

    def text(self, hit: Hit, *, before: int = 0, after: int = 0) -> str:
        """The hit's lines, with ``before`` lines above and ``after`` below it ("" when the
        file changed since); only the chunks these lines are in are decompressed."""
        with self._reading() as ok:
            if not ok:
                return ""
            f = self._files.get(hit.path)
            if f is None or hit.chunk >= len(f.blobs):
                return ""
            cached = self._texts.get(hit.path)
            lo_c = max(0, hit.chunk - (before + CHUNK_LINES - 1) // CHUNK_LINES)
            hi_c = min(len(f.blobs), hit.chunk + 1 + (after + CHUNK_LINES - 1) // CHUNK_LINES)
            base = f.starts[lo_c]
            if cached is not None:
                t = cached[base:f.starts[hi_c]]
            else:
                t = _inflate(f.blobs[lo_c:hi_c])
            lo, hi = f.starts[hit.chunk] - base, f.starts[hit.chunk + 1] - base
        for _ in range(before):
            if lo <= 0:
                break
            lo = t.rfind("\n", 0, lo - 1) + 1
        for _ in range(after):
            if hi >= len(t):
                break
            nl = t.find("\n", hi)
            hi = len(t) if nl < 0 else nl + 1
        return t[lo:hi]

    def snapshot_stats(self) -> IndexStats:
        with self._lock:
            s = self.stats
            s.files, s.chunks, s.chars, s.terms = (len(self._files), self._alive_chunks,
                                                   self._chars, len(self._post))
            return IndexStats(**vars(s))


def _inflate(blobs: Sequence[bytes]) -> str:
    return b"".join(zlib.decompress(b) for b in blobs).decode("utf-8", "surrogatepass")


def _module_key(path: str) -> str | None:
    """``a/b/mod.py`` and ``a/b/mod/__init__.py`` -> ``mod``; None for other files."""
    p = path.replace("\\", "/")
    if not p.endswith((".py", ".pyi")):
        return None
    head, _, name = p.rpartition("/")
    stem = name.rsplit(".", 1)[0]
    if stem == "__init__":
        return head.rpartition("/")[2] or None
    return stem


# ----------------------------------------------------------------------------- building


def build_index(index: WorkspaceIndex, roots: Sequence[str | Path], *,
                stop: Callable[[], bool] | None = None,
                progress: Callable[[int, str], None] | None = None,
                yield_every: int = 16) -> IndexStats:
    """Walk ``roots`` and index every usable file into ``index`` (call it on a thread of its
    own). Paths in the index are absolute. ``progress(files, path)`` is called every 100
    files; ``stop()`` ends the build early (state ``cancelled``). The thread yields the
    interpreter every ``yield_every`` files so the model's thread gets it."""
    t0 = time.perf_counter()
    st = index.stats
    st.state, st.roots = "building", [str(r) for r in roots]
    n = 0
    lim = index.limits
    for root in roots:
        for path, _rel in walk(root, stop=stop):
            if stop is not None and stop():
                st.state = "cancelled"
                return index.snapshot_stats()
            if len(index) >= lim.max_files:
                st.capped_files += 1
                continue
            text = read_text_file(path, lim.max_file_bytes)
            if text is None:
                st.skipped_files += 1
                continue
            index.put(str(path), text)
            n += 1
            if n % yield_every == 0:
                time.sleep(0)  # let the model's thread have the interpreter
            if progress is not None and n % 100 == 0:
                progress(n, str(path))
    st.state = "ready"
    st.build_s = time.perf_counter() - t0
    return index.snapshot_stats()
