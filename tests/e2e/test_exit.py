"""Leaving the real ``diffill serve`` subprocess (stdio), and what it writes to stderr.

An editor closed right after opening a file sends ``shutdown`` and ``exit`` while the
model still loads; a crashed editor just closes the pipe. Each time the process must
end at once with the LSP exit code (0 after ``shutdown``, 1 without), write nothing to
the closed stdout, and leave stderr quiet -- editors keep it (Neovim's ``lsp.log``,
VS Code's output channel). Before the fix an exit during the load took 6-10 s and wrote
~9.8 MB of chained ``I/O operation on closed file`` tracebacks (issue 14).

The load is held with the test hook ``DIFFILL_DEBUG_LOAD_DELAY_MS`` (the worker waits
before it loads), so "still loading" holds on any machine however fast the load is.
The time bounds are functional (an exit that waits for the load or floods the log
takes many seconds), not a benchmark.

Error answers: a request answered with an error (a position outside the document,
which editors send during fast edits) logs one WARNING line; the traceback only with
``--debug``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _lsp_raw import SERVE, RawClient, server_env

pytestmark = [pytest.mark.e2e]

HOLD_LOAD = {"DIFFILL_DEBUG_LOAD_DELAY_MS": "120000"}  # far longer than any test here
DOC = "def add(a, b):\n    return \n"
URI = "file:///exit/doc.py"
EXIT_BOUND_S = 5.0
QUIET_BYTES = 2000
REQUEST_CANCELLED, INVALID_PARAMS = -32800, -32602


def start(tmp: Path, *args: str, env: dict[str, str] | None = None) -> RawClient:
    return RawClient([*SERVE, *args], env=server_env(env), stderr_path=tmp / "server.err")


def wait_exit(c: RawClient, t0: float) -> tuple[int, float]:
    """(exit code, seconds from ``t0``); kills the server if it outlives the bound x4."""
    try:
        rc = c.proc.wait(EXIT_BOUND_S * 4)
    finally:
        c.kill()
    return rc, time.monotonic() - t0


def assert_quiet(c: RawClient) -> str:
    assert c.stderr_path is not None
    err = c.stderr_path.read_text(errors="replace")
    assert "Traceback" not in err, err[:3000]
    assert "closed file" not in err and "Error sending data" not in err, err[:3000]
    assert len(err.encode()) < QUIET_BYTES, err[:3000]
    return err


def loading_with_a_waiting_request(tmp: Path) -> tuple[RawClient, int]:
    """A server whose model load is held, initialized with a progress token (the load holds
    it: its end must not be sent), and a completion waiting for the load; the request's id."""
    c = start(tmp, env=HOLD_LOAD)
    c.initialize(progress=True)
    return c, open_and_complete(c)


def assert_exits_quietly(c: RawClient, t0: float, want_rc: int) -> None:
    """The server exits with ``want_rc`` within ``EXIT_BOUND_S`` of ``t0``, its stderr quiet."""
    rc, took = wait_exit(c, t0)
    assert rc == want_rc
    assert took < EXIT_BOUND_S, took
    assert_quiet(c)


def open_and_complete(c: RawClient) -> int:
    """Open a document and ask for a completion while the model loads: the request waits
    for the load (``loading.ModelLoad.wait``), so it is not answered yet. Its id."""
    c.open(URI, DOC)
    rid = c.completion_async(URI, 1, 11)
    with pytest.raises(AssertionError, match="no answer"):
        c.wait_for(rid, 0.5)
    return rid


def test_shutdown_and_exit_while_the_model_loads(tmp_path: Path):
    c, rid = loading_with_a_waiting_request(tmp_path)
    assert c.request("diffill/status")["result"]["loading"]
    assert c.request("shutdown")["result"] is None
    res = c.wait_for(rid, 5)  # the waiting request is answered at the shutdown
    assert res.get("error", {}).get("code") == REQUEST_CANCELLED, res
    t0 = time.monotonic()
    c.notify("exit")
    assert_exits_quietly(c, t0, 0)


def test_exit_without_shutdown_while_the_model_loads(tmp_path: Path):
    c, _ = loading_with_a_waiting_request(tmp_path)
    t0 = time.monotonic()
    c.notify("exit")
    assert_exits_quietly(c, t0, 1)


def test_end_of_input_while_the_model_loads(tmp_path: Path):
    c, _ = loading_with_a_waiting_request(tmp_path)
    t0 = time.monotonic()
    c.proc.stdin.close()  # the editor died: no shutdown, no exit
    assert_exits_quietly(c, t0, 1)


def test_shutdown_during_a_running_completion(tmp_path: Path):
    # the shipped model, every diffusion step held 1.5 s: even one step outlasts the test's
    # 0.3 s wait, whatever the machine
    c = start(tmp_path, env={"DIFFILL_DEBUG_STEP_DELAY_MS": "1500"})
    c.initialize({"diffill": {"steps": 8, "maxTokens": 8, "numCandidates": 1}})
    st = c.wait_loaded()
    assert st["loaded"], st
    c.open(URI, DOC)
    rid = c.completion_async(URI, 1, 11)
    end = time.monotonic() + 30
    while c.request("diffill/status")["result"]["in_flight"] == 0:  # the request is running
        assert time.monotonic() < end, "the completion never started"
        time.sleep(0.05)
    time.sleep(0.3)  # inside the model call
    t0 = time.monotonic()
    sid = c.request_async("shutdown")
    assert c.wait_for(sid, 30)["result"] is None
    res = c.wait_for(rid, 30)  # answered, not dropped: RequestCancelled
    assert res.get("error", {}).get("code") == REQUEST_CANCELLED, res
    assert time.monotonic() - t0 < EXIT_BOUND_S  # did not wait for the model call
    c.notify("exit")
    assert_exits_quietly(c, t0, 0)


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug"])
def test_error_answer_logs_one_warning_line(tmp_path: Path, debug: bool):
    c = start(tmp_path, *(["--debug"] if debug else []), env=HOLD_LOAD)
    c.initialize()
    c.open(URI, DOC)
    res = c.wait_for(c.completion_async(URI, 40, 3), 60)  # line 40 of a 2-line document
    assert res["error"]["code"] == INVALID_PARAMS, res
    assert "outside the document" in res["error"]["message"]
    assert c.shutdown() == 0
    err = c.stderr_path.read_text(errors="replace")
    lines = [ln for ln in err.splitlines() if "-32602" in ln and "textDocument/completion" in ln]
    assert len(lines) == 1 and " WARNING " in lines[0], err[:3000]
    assert " ERROR " not in err, err[:3000]
    if debug:
        assert "Traceback" in err and "JsonRpcInvalidParams" in err, err[:3000]
    else:
        assert "Traceback" not in err, err[:3000]
        assert len(err.encode()) < QUIET_BYTES, err[:3000]
