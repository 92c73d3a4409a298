"""The request scheduler (latest wins per document, cancellation, off-loop work), the
typed-ahead cache -- which never outlives an edit elsewhere in the document
(TypeaheadCache.invalidate / generation), including a model run that finishes after
the edit: the soak test found a stale entry answering the next document version -- and
the latency statistics."""

from __future__ import annotations

import asyncio
import threading

import pytest
from diffill.lsp_server.backend.backends import Cancelled
from diffill.lsp_server.completion.completer import Suggestion
from diffill.lsp_server.protocol.scheduler import (
    LatencyStats,
    Scheduler,
    Superseded,
    TypeaheadCache,
    percentile,
)
from lsprotocol import types

URI = "file:///a.py"
SUGG = [Suggestion(text="total", score=0.0)]


def edit(line0: int, line1: int, text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(line=line0, character=0),
                          end=types.Position(line=line1, character=0)), text=text)


def test_typing_on_the_row_keeps_the_entry():
    c = TypeaheadCache()
    c.store(URI, 3, "    return ", "", SUGG)
    c.invalidate(URI, [edit(3, 3, "t")])
    assert c.lookup(URI, 3, "    return t", "") == ("t", [Suggestion(text="otal", score=0.0)])


def test_edits_elsewhere_or_new_lines_drop_it():
    for change in (edit(0, 0, "x"), edit(3, 4, ""), edit(3, 3, "\n"),
                   types.TextDocumentContentChangeWholeDocument(text="new")):
        c = TypeaheadCache()
        c.store(URI, 3, "    return ", "", SUGG)
        c.invalidate(URI, [change])
        assert c.lookup(URI, 3, "    return ", "") is None, change


def test_a_run_finishing_after_an_edit_stores_nothing():
    c = TypeaheadCache()
    gen = c.generation(URI)  # read when the request was prepared
    c.invalidate(URI, [edit(0, 0, "x")])  # the user edits another line while the model runs
    c.store(URI, 3, "    return ", "", SUGG, generation=gen)  # the run finishes
    assert c.lookup(URI, 3, "    return ", "") is None
    c.store(URI, 3, "    return ", "", SUGG, generation=c.generation(URI))  # a fresh run
    assert c.lookup(URI, 3, "    return ", "") is not None
    c.forget(URI)
    assert c.lookup(URI, 3, "    return ", "") is None


# -- typed-ahead cache ------------------------------------------------------------------------

def test_typeahead_cache_hits_and_misses():
    c = TypeaheadCache()
    c.store("u", 3, "    x = ", "", [Suggestion("foo(bar)", 1.0), Suggestion("fizz", 0.5)])
    assert c.lookup("u", 3, "    x = ", "")[1] == [Suggestion("foo(bar)", 1.0), Suggestion("fizz", 0.5)]
    typed, hits = c.lookup("u", 3, "    x = fo", "")
    assert typed == "fo" and [h.text for h in hits] == ["o(bar)"]
    assert [h.text for h in c.lookup("u", 3, "    x = f", "")[1]] == ["oo(bar)", "izz"]
    assert c.lookup("u", 3, "    x = fox", "") is None       # typed text diverges
    assert c.lookup("u", 3, "    x = foo(bar)", "") is None  # nothing left
    assert c.lookup("u", 4, "    x = fo", "") is None        # other line
    assert c.lookup("v", 3, "    x = fo", "") is None        # other document
    assert c.lookup("u", 3, "    x = fo", ")") is None       # text right of the cursor changed
    assert c.lookup("u", 3, "    y = ", "") is None          # not an extension
    c.forget("u")
    assert c.lookup("u", 3, "    x = ", "") is None


# -- scheduler --------------------------------------------------------------------------------

async def running_job(s: Scheduler, seen: dict) -> asyncio.Future:
    """``s.run("doc", job)`` once the job runs: it runs until ``cancel()`` says stop (5 s at
    most, then answers "finished"); ``seen`` gets the thread it ran on and ``stopped``."""
    started = threading.Event()

    def job(cancel):
        seen["thread"] = threading.get_ident()
        started.set()
        for _ in range(500):
            if cancel():
                seen["stopped"] = True
                raise Cancelled("stop")
            threading.Event().wait(0.01)
        return "finished"

    task = asyncio.ensure_future(s.run("doc", job))
    while not started.is_set():
        await asyncio.sleep(0.01)
    return task


async def test_scheduler_runs_off_loop_and_supersedes():
    s = Scheduler()
    seen = {}
    first = await running_job(s, seen)
    assert seen["thread"] != threading.get_ident()
    second = asyncio.ensure_future(s.run("doc", lambda cancel: "second"))
    with pytest.raises(Superseded):
        await first
    assert await second == "second"
    # other keys do not supersede each other
    assert await s.run("a", lambda c: c()) is False
    s.shutdown()


async def test_scheduler_task_cancellation_stops_worker_and_stale_check():
    s = Scheduler()
    seen = {}
    task = await running_job(s, seen)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await s.run("other", lambda c: "after") == "after"  # worker free again: job stopped
    assert seen["stopped"] is True
    version = {"v": 1}

    def edited_meanwhile(cancel):
        version["v"] = 2  # the document changes while the job runs
        if cancel():
            raise Cancelled("stale")
        return "ran"

    with pytest.raises(Superseded):
        await s.run("doc", edited_meanwhile, stale=lambda: version["v"] != 1)
    s.shutdown()


# -- stats, lengths ---------------------------------------------------------------------------

def test_percentiles_and_stats():
    assert percentile([], 50) is None
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile(range(1, 101), 95) == 95
    st = LatencyStats()
    st.count("requests")
    st.add(10.0, 8.0)
    st.add(20.0)
    summary = st.summary()
    assert summary["requests"] == 1 and summary["p50_ms"] == 10.0 and summary["model_p50_ms"] == 8.0
    assert (summary["last_ms"], summary["last_model_ms"], summary["cache_hits"]) == (20.0, 8.0, 0)
