"""The server's transport gate, error-answer logging and loop teardown (lsp_server/protocol/jsonrpc.py),
on a real DiffillServer with in-memory streams: control flow only, no model. The same
behaviour over a real subprocess is in tests/e2e/test_exit.py."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
from concurrent.futures import Future

import pytest
from diffill.lsp_server.protocol.jsonrpc import ClientWriter, run_loop
from diffill.lsp_server.protocol.server import create_server
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdoutWriter

LOGGER = "diffill.jsonrpc"


def bodies(raw: bytes) -> list[dict]:
    out = []
    for part in raw.split(b"Content-Length: ")[1:]:
        body = part.split(b"\r\n\r\n", 1)[1]
        out.append(json.loads(body))
    return out


@pytest.fixture()
def served():
    server = create_server()
    server._stop_event = threading.Event()
    out = io.BytesIO()
    server.protocol.set_writer(StdoutWriter(out))
    return server, out


def answer(server, future: Future, msg_id: int = 7, method: str = "textDocument/completion") -> None:
    server.protocol._methods[msg_id] = method
    server.protocol._send_handler_result(future, msg_id=msg_id)


def failed(exc: BaseException) -> Future:
    f: Future = Future()
    try:
        raise exc
    except BaseException as e:  # give it a traceback, as a raising handler does
        f.set_exception(e)
    return f


def test_expected_error_answer_is_one_warning_line(served, caplog):
    server, out = served
    caplog.set_level(logging.INFO, logger=LOGGER)
    answer(server, failed(JsonRpcInvalidParams("file:///a.py: line 40 is outside the document")))
    (msg,) = bodies(out.getvalue())
    assert msg["id"] == 7 and msg["error"]["code"] == -32602
    recs = [r for r in caplog.records if r.name == LOGGER]
    assert len(recs) == 1 and recs[0].levelno == logging.WARNING
    assert "textDocument/completion" in recs[0].getMessage() and "-32602" in recs[0].getMessage()
    assert recs[0].exc_info is None  # no traceback below DEBUG
    assert 7 not in server.protocol._methods


def test_internal_error_answer_is_one_error_line_and_the_trace_at_debug(served, caplog):
    server, out = served
    caplog.set_level(logging.INFO, logger=LOGGER)
    answer(server, failed(KeyError("boom")))
    (msg,) = bodies(out.getvalue())
    assert msg["error"]["code"] == -32603 and "KeyError" in msg["error"]["message"]
    recs = [r for r in caplog.records if r.name == LOGGER]
    assert len(recs) == 1 and recs[0].levelno == logging.ERROR and recs[0].exc_info is None
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    answer(server, failed(KeyError("boom")), msg_id=8)
    recs = [r for r in caplog.records if r.name == LOGGER]
    assert len(recs) == 1 and recs[0].exc_info is not None  # the traceback with --debug


def test_cancelled_and_successful_answers(served, caplog):
    server, out = served
    caplog.set_level(logging.INFO, logger=LOGGER)
    f: Future = Future()
    f.cancel()
    answer(server, f, msg_id=1)
    ok: Future = Future()
    ok.set_result(None)
    answer(server, ok, msg_id=2)
    got = bodies(out.getvalue())
    assert got[0]["id"] == 1 and got[0]["error"]["code"] == -32800
    assert got[1] == {"id": 2, "jsonrpc": "2.0", "result": None}
    assert not [r for r in caplog.records if r.name == LOGGER]  # routine: not logged


def test_exit_closes_the_gate_and_later_writes_are_dropped(served):
    server, out = served
    proto = server.protocol
    proto._shutdown = True
    proto.handle_exit()
    assert proto.exit_code == 0 and server._stop_event.is_set() and out.closed
    proto.notify("$/progress", {"token": "t", "value": {"kind": "end"}})  # a cancelled load
    proto.notify("window/showMessage", {"type": 1, "message": "late"})
    assert proto.writer.dropped == 2


def test_a_failed_write_logs_one_line_and_stops_reading(caplog):
    stream = io.BytesIO()
    stream.close()  # the client's end is gone
    lost = threading.Event()
    w = ClientWriter(StdoutWriter(stream), lost.set)
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(3):
        assert w.write(b"x") is None  # never raises into pygls
    assert lost.is_set() and w.closed and w.dropped == 2
    recs = [r for r in caplog.records if r.name == LOGGER]
    assert len(recs) == 1 and "connection to the client lost" in recs[0].getMessage()
    assert "ValueError" in recs[0].getMessage()


def test_run_loop_does_not_wait_for_a_task_that_outlives_its_cancel():
    held: dict = {}
    release = threading.Event()

    async def stubborn() -> None:  # swallows its cancellation, as wait_for can in 3.11
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    async def main() -> None:
        held["loop"] = asyncio.get_running_loop()
        held["task"] = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)

    t0 = time.monotonic()
    run_loop(main(), grace=0.2)
    took = time.monotonic() - t0
    assert not held["task"].done()  # abandoned, not waited for
    release.set()  # tidy up: let it end, close its loop
    held["loop"].run_until_complete(held["task"])
    held["loop"].close()
    assert took < 5.0  # asyncio.run would wait for it forever


class _ShortOfMemory(io.BufferedReader):
    """A real buffered stdin whose first ``fails`` reads raise MemoryError, as a read can
    under an address-space limit (the failing read consumes nothing)."""

    def __init__(self, data: bytes, fails: int) -> None:
        super().__init__(io.BytesIO(data))
        self.fails = fails

    def _maybe_fail(self) -> None:
        if self.fails > 0:
            self.fails -= 1
            raise MemoryError

    def readline(self, limit: int = -1) -> bytes:
        self._maybe_fail()
        return super().readline(limit)

    def read(self, n: int = -1) -> bytes:
        self._maybe_fail()
        return super().read(n)


def test_a_read_that_runs_out_of_memory_is_tried_again_and_loses_nothing(caplog):
    """The read loop waits out a MemoryError on stdin instead of ending the server
    (the CI failure of stop 34: the server closed its output under ``prlimit``)."""
    from concurrent.futures import ThreadPoolExecutor

    from diffill.lsp_server.protocol.jsonrpc import StdinReader, read_messages

    def frame(obj: dict) -> bytes:
        body = json.dumps(obj).encode()
        return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    server = create_server()
    out = io.BytesIO()
    server.protocol.set_writer(StdoutWriter(out))
    data = frame({"jsonrpc": "2.0", "id": 1, "method": "shutdown"}) + \
        frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
    stdin = _ShortOfMemory(data, fails=3)
    caplog.set_level(logging.INFO, logger=LOGGER)
    with ThreadPoolExecutor(max_workers=1) as pool:
        asyncio.run(asyncio.wait_for(
            read_messages(StdinReader(stdin, pool), server.protocol, threading.Event()), 20))
    assert stdin.fails == 0
    assert [m["id"] for m in bodies(out.getvalue())] == [1, 2]  # both answered, nothing lost
    recs = [r for r in caplog.records if r.name == LOGGER and "out of memory" in r.getMessage()]
    assert len(recs) == 3
