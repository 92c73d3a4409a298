"""Freshness: where model work runs and when it stops.

* :class:`Scheduler` runs model work off the event loop on ONE worker thread
  (the device does one forward at a time anyway). Each job gets a cancel
  callback, checked by the sampler between diffusion steps, that turns True when
  - the awaiting asyncio task is cancelled (``$/cancelRequest``),
  - a newer job for the same key (document) was submitted (latest wins), or
  - the caller's staleness check fires (the document version changed).
* :class:`TypeaheadCache`: when the user types the first characters of the last
  suggestion, the rest is answered without calling the model.
* :class:`LatencyStats`: recent latencies for ``diffill/status``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..backend.backends import Cancelled
from ..completion.completer import Suggestion

T = TypeVar("T")
CancelFn = Callable[[], bool]


class Superseded(Cancelled):
    """A newer request for the same document arrived (or the document changed)."""


class Scheduler:
    """Single-worker executor with latest-wins cancellation per key."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffill-model")
        self._latest: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def latest(self, key: str) -> int | None:
        return self._latest.get(key)

    async def run(
        self,
        key: str,
        fn: Callable[[CancelFn], T],
        *,
        stale: CancelFn | None = None,
    ) -> T:
        """Run ``fn(cancel)`` on the worker; supersedes earlier jobs with this ``key``.

        Raises :class:`Superseded` when a newer job or ``stale()`` stopped this one, and
        ``asyncio.CancelledError`` when the awaiting task was cancelled (the worker is
        told to stop at its next check).
        """
        with self._lock:
            ticket = next(self._ids)
            self._latest[key] = ticket
        aborted = threading.Event()

        def superseded() -> bool:
            return self._latest.get(key) != ticket or bool(stale and stale())

        def cancel() -> bool:
            return aborted.is_set() or superseded()

        def job() -> T:
            if cancel():
                raise Cancelled("cancelled while queued")
            return fn(cancel)

        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, job)
        except asyncio.CancelledError:
            aborted.set()
            raise
        except Cancelled as e:
            if aborted.is_set():
                raise
            raise Superseded(str(e)) from None

    async def call(self, fn: Callable[[], T]) -> T:
        """Run plain work (model loading) on the worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Entry:
    uri: str
    row: int
    line_prefix: str
    line_suffix: str
    suggestions: list[Suggestion]
    asked: int = 1  # candidates the model run was asked for (it may have found fewer)


def relative_block(text: str, line_prefix: str) -> str:
    """A suggestion shown after ``line_prefix`` with its second and later lines made relative to
    the depth of the line it starts on (their indentation less that depth), as
    :class:`~.drafts.Typeahead` re-indents a recalled suggestion for the line it lands on;
    only its first line when a later line sits left of that depth."""
    first, nl, rest = text.partition("\n")
    if not nl:
        return text
    depth = line_depth(line_prefix, first)
    lines = []
    for ln in rest.split("\n"):
        if ln.strip() and (len(ln) - len(ln.lstrip(" \t")) < depth):
            return first
        lines.append(ln[depth:] if ln.strip() else "")
    return first + "\n" + "\n".join(lines)


def line_depth(left: str, first: str) -> int:
    """Indentation of the line that holds ``left`` (the text left of the cursor) followed by
    ``first`` (a suggestion's first line)."""
    line = left + first
    return len(line) - len(line.lstrip(" \t"))


class TypeaheadCache:
    """The last suggestions per document, keyed by where they were made.

    :meth:`lookup` hits when the request is on the same document and line, the text
    right of the cursor is unchanged, and the text left of the cursor is the old one
    extended by exactly what was typed -- and that typed text starts a suggestion.
    The hit is the rest of each such suggestion (best first).

    Each document has a generation, bumped whenever its entry is invalidated; a store
    made with the generation read when the request was prepared is dropped if the
    generation moved meanwhile, so a model run that finishes after an edit elsewhere
    cannot plant suggestions made for the old text.
    """

    RECENT = 8
    """Suggestions per document kept for :meth:`recall`."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._gen: dict[str, int] = {}
        self._recent: dict[str, deque[str]] = {}
        self._lock = threading.Lock()

    def generation(self, uri: str) -> int:
        return self._gen.get(uri, 0)

    def store(self, uri: str, row: int, line_prefix: str, line_suffix: str,
              suggestions: list[Suggestion], generation: int | None = None, asked: int = 1) -> None:
        """Remember ``suggestions``, the answer of a model run asked for ``asked`` candidates."""
        if suggestions:
            with self._lock:
                if generation is not None and generation != self._gen.get(uri, 0):
                    return
                self._entries[uri] = _Entry(uri, row, line_prefix, line_suffix, list(suggestions),
                                            asked)
                recent = self._recent.setdefault(uri, deque(maxlen=self.RECENT))
                for s in reversed(suggestions):
                    block = relative_block(s.text, line_prefix)
                    if block in recent:
                        recent.remove(block)
                    recent.appendleft(block)

    def recall(self, uri: str) -> list[str]:
        """The texts of the last suggestions made for ``uri``, newest first -- kept across
        the edits that invalidate the typed-ahead entry (a draft source, ``drafts.py``),
        dropped when the document closes. A multi-line one is a block relative to the line
        it starts on (:func:`relative_block`): recalled elsewhere, it is re-indented there."""
        with self._lock:
            return list(self._recent.get(uri, ()))

    def asked(self, uri: str) -> int:
        """How many candidates the run behind ``uri``'s entry was asked for (0: no entry)."""
        e = self._entries.get(uri)
        return e.asked if e is not None else 0

    def forget(self, uri: str, *, closed: bool = False) -> None:
        """Drop ``uri``'s entry (and, for a closed document, what :meth:`recall` keeps)."""
        with self._lock:
            self._entries.pop(uri, None)
            self._gen[uri] = self._gen.get(uri, 0) + 1
            if closed:
                self._recent.pop(uri, None)

    def invalidate(self, uri: str, changes: Any) -> None:
        """Drop the entry of ``uri`` unless every change is an edit within its row that adds
        no line: an edit elsewhere changes the context the suggestions were made for."""
        e = self._entries.get(uri)
        for ch in changes:
            rng = getattr(ch, "range", None)
            if e is None or rng is None or rng.start.line != e.row or rng.end.line != e.row \
                    or "\n" in ch.text or "\r" in ch.text:
                self.forget(uri)
                return

    def lookup(
        self, uri: str, row: int, line_prefix: str, line_suffix: str
    ) -> tuple[str, list[Suggestion]] | None:
        """(typed text, the rest of each matching suggestion) or None on a miss."""
        e = self._entries.get(uri)
        if e is None or e.row != row or e.line_suffix != line_suffix:
            return None
        if not line_prefix.startswith(e.line_prefix):
            return None
        typed = line_prefix[len(e.line_prefix):]
        if "\n" in typed:
            return None
        hits = [
            replace(s, text=s.text[len(typed):])
            for s in e.suggestions
            if s.text.startswith(typed) and s.text[len(typed):].strip()
        ]
        return (typed, hits) if hits else None


COUNTERS = ("requests", "cache_hits", "model_requests", "superseded", "cancelled", "errors",
            "not_ready", "disabled", "draft_offered", "draft_accepted", "draft_partial")


@dataclass
class LatencyStats:
    """Recent latencies (ms) and counters."""

    history: int = 200
    model_ms: deque[float] = field(default_factory=deque)
    total_ms: deque[float] = field(default_factory=deque)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))

    def count(self, name: str, k: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + k

    def add(self, total_ms: float, model_ms: float | None = None) -> None:
        self.total_ms.append(total_ms)
        while len(self.total_ms) > self.history:
            self.total_ms.popleft()
        if model_ms is not None:
            self.model_ms.append(model_ms)
            while len(self.model_ms) > self.history:
                self.model_ms.popleft()

    def summary(self) -> dict[str, Any]:
        return {
            **self.counters,
            "last_ms": round(self.total_ms[-1], 3) if self.total_ms else None,
            "last_model_ms": round(self.model_ms[-1], 3) if self.model_ms else None,
            "p50_ms": percentile(self.total_ms, 50),
            "p95_ms": percentile(self.total_ms, 95),
            "model_p50_ms": percentile(self.model_ms, 50),
            "model_p95_ms": percentile(self.model_ms, 95),
        }


def percentile(values: Any, q: float) -> float | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    vs = sorted(values)
    if not vs:
        return None
    k = max(0, min(len(vs) - 1, math.ceil(q / 100.0 * len(vs)) - 1))
    return round(vs[k], 3)
