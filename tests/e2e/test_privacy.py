"""Privacy: no outbound network by default, and buffer contents never in the logs
unless a debug option says so.

* A full LSP session (initialize, didOpen, didChange, completion, inline completion,
  diffill/status, shutdown, exit) runs in a server process whose interpreter has an
  audit hook (installed before diffill is imported) that records and refuses every
  ``socket.connect``, DNS lookup and datagram send. Nothing may be recorded. As a
  positive control the same guard catches the connection a server configured with
  ``backend = "openai"`` tries to make. The same over a session on a workspace folder, the
  index built and every extra on; nothing is written into the folder either.
* ``diffill serve --log-level debug`` and ``diffill serve-http --log-level debug``:
  a unique secret typed into the buffer / sent in a prompt never reaches the log
  file; with ``--debug-log-buffers`` it does (the check can fail).
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from _lsp_raw import RawClient, end_position, server_env

pytestmark = [pytest.mark.e2e]

GUARD = r"""
import json, os, socket, sys
_LOG = os.environ["DIFFILL_NET_GUARD_LOG"]
_BLOCK = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
          "socket.getnameinfo", "socket.sendto", "socket.sendmsg", "http.client.connect",
          "urllib.Request"}
def _guard(event, args):
    if event in _BLOCK:
        with open(_LOG, "a") as f:
            f.write(json.dumps([event, repr(args)[:200]]) + "\n")
        raise PermissionError(f"network access refused by the test guard: {event}")
sys.addaudithook(_guard)
from diffill.cli import main
sys.exit(main())
"""

OPTIONS = {"diffill": {"steps": 2, "maxTokens": 8, "numCandidates": 2}}


def guarded(args: list[str], tmp: Path) -> tuple[RawClient, Path]:
    log = tmp / "net.log"
    env = server_env({"DIFFILL_NET_GUARD_LOG": str(log)})
    return RawClient([sys.executable, "-c", GUARD, *args], env=env,
                     stderr_path=tmp / "server.err"), log


def session(c: RawClient, text: str, options: dict | None = None) -> dict:
    """initialize ... exit: every kind of request once. Returns the final status."""
    c.initialize(options or OPTIONS)
    c.wait_loaded()
    uri = "file:///private/doc.py"
    c.open(uri, text)
    line, char = end_position(text)
    c.change(uri, 2, [{"range": {"start": {"line": line, "character": char},
                                 "end": {"line": line, "character": char}}, "text": "t"}])
    char += 1
    for send in (c.completion_async, c.inline_async):
        res = c.wait_for(send(uri, line, char), 120)
        assert "result" in res, res
    st = c.request("diffill/status")["result"]
    c.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert c.shutdown() == 0
    return st


def test_no_network_in_a_full_session(model_dir: Path, tmp_path: Path):
    c, log = guarded(["serve", "--model", str(model_dir)], tmp_path)
    try:
        st = session(c, "def add_numbers(a, b):\n    total = a + b\n    return ")
    finally:
        c.kill()
    assert st["loaded"] and st["model_requests"] >= 1
    assert not log.exists() or log.read_text() == "", log.read_text()


def test_no_network_and_nothing_written_with_the_workspace_and_every_extra(model_dir: Path,
                                                                          tmp_path: Path):
    """The same guard over a session on a workspace folder: the index built, kept current on
    an edit and a save, and every extra on (definitions, retrieved chunks, recent regions,
    workspace drafts); nothing goes out and nothing is written into the folder."""
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "geometry.py").write_text(
        'def border_margin(width):\n    """The margin."""\n    return width // 10\n')
    main = "from pkg.geometry import border_margin\n\n\ndef area(width, height):\n    m = border_margin("
    (root / "main.py").write_text(main)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    c, log = guarded(["serve", "--model", str(model_dir)], tmp_path)
    try:
        opts = {"diffill": {**OPTIONS["diffill"], "workspaceContext": True,
                            "definitionsContext": True, "recentContext": True}}
        res = c.request("initialize", {"processId": None, "rootUri": root.as_uri(),
                                       "workspaceFolders": [{"uri": root.as_uri(), "name": "project"}],
                                       "capabilities": {}, "initializationOptions": opts})
        assert "result" in res, res
        c.notify("initialized", {})
        c.wait_loaded()
        t0 = time.monotonic()
        while c.request("diffill/status")["result"]["workspace"]["state"] != "ready":
            assert time.monotonic() - t0 < 60, "workspace index not ready"
            time.sleep(0.1)
        uri = (root / "main.py").as_uri()
        c.open(uri, main)
        line, char = end_position(main)
        c.change(uri, 2, [{"range": {"start": {"line": line, "character": char},
                                     "end": {"line": line, "character": char}}, "text": "w"}])
        c.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
        for send in (c.completion_async, c.inline_async):
            assert "result" in c.wait_for(send(uri, line, char + 1), 120)
        st = c.request("diffill/status")["result"]["workspace"]
        assert st["files"] == 2 and st["gather_p95_ms"] is not None, st
        assert c.shutdown() == 0
    finally:
        c.kill()
    assert not log.exists() or log.read_text() == "", log.read_text()
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_the_guard_catches_a_remote_backend(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c, log = guarded(["serve"], tmp_path)
    try:
        c.initialize({"diffill": {"backend": "openai", "remoteUrl": f"http://127.0.0.1:{port}/v1",
                                  "remoteRetries": 0}})
        c.wait_loaded()
        uri = "file:///private/remote.py"
        c.open(uri, "x = ")
        for _ in range(2):
            res = c.wait_for(c.completion_async(uri, 0, 4), 60)
            assert res["result"]["items"] == []  # the backend failed; the request got an answer
        c.drain(0.1)
        shown = [n["params"]["message"] for n in c.notifications if n["method"] == "window/showMessage"]
        assert len(shown) == 1 and "backend error" in shown[0], shown  # once, not per keystroke
        assert c.shutdown() == 0
    finally:
        c.kill()
    events = [json.loads(line)[0] for line in log.read_text().splitlines()]
    assert {"http.client.connect", "socket.connect"} & set(events), events


@pytest.mark.parametrize("debug", [False, True])
def test_lsp_log_holds_no_buffer_text(model_dir: Path, tmp_path: Path, debug: bool):
    secret = f"SECRET_{uuid.uuid4().hex}"
    log = tmp_path / "lsp.log"
    flags = ["--debug-log-buffers"] if debug else ["--log-level", "debug"]
    c = RawClient([sys.executable, "-m", "diffill.cli", "serve", "--model",
                   str(model_dir), "--log-file", str(log), *flags], stderr_path=tmp_path / "err")
    try:
        # the secret sits right before the cursor: it is in the context and in every item
        session(c, f"def add_numbers(a, b):\n    {secret} = a + b\n    return {secret}")
    finally:
        c.kill()
    text = log.read_text()
    assert "DEBUG" in text, "the log was not at DEBUG level"
    assert (secret in text) == debug


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("debug", [False, True])
def test_serve_http_log_holds_no_prompt_text(model_dir: Path, tmp_path: Path, debug: bool):
    import subprocess

    secret = f"SECRET_{uuid.uuid4().hex}"
    log = tmp_path / "http.log"
    port = _free_port()
    flags = ["--debug-log-buffers"] if debug else ["--log-level", "debug"]
    proc = subprocess.Popen([sys.executable, "-m", "diffill.cli", "serve-http",
                             "--model", str(model_dir), "--port", str(port), "--steps", "2",
                             "--log-file", str(log), *flags],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "err", "wb"),  # noqa: SIM115
                            env=server_env())
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if json.load(r)["status"] == "ok":
                        break
            except OSError:
                pass
            time.sleep(0.1)
        body = json.dumps({"prompt": f"def f():\n    {secret} = 1\n    return {secret}",
                           "suffix": f"\n# {secret}\n", "max_tokens": 8}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert "DEBUG" in text or debug, "the log was not at DEBUG level"
    assert (secret in text) == debug
