"""A raw JSON-RPC client for the real ``diffill serve`` subprocess: writes arbitrary
bytes (malformed frames included) and reads framed messages with a timeout.

Shared by the robustness e2e tests (fuzz, soak, faults, privacy). Plain blocking
I/O with ``select``: tests stay synchronous, and hypothesis drives them directly.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SERVE = [sys.executable, "-m", "diffill.cli", "serve"]


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test servers' environment: ours plus ONE torch intra-op thread. On a small CI box
    shared with other jobs, torch's default pool (one thread per core) spins against the
    other load: a micro-model completion then takes ~1.3 s instead of ~15 ms (measured on
    the 2-core dev box under a training run)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def encode(obj: Any) -> bytes:
    return json.dumps(obj).encode("utf-8")


class ServerGone(AssertionError):
    pass


class RawClient:
    """One server subprocess on pipes. ``stderr`` goes to a file (never a pipe that
    could fill up and block the server)."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None,
                 stderr_path: Path | None = None, cwd: str | None = None) -> None:
        self.stderr_path = stderr_path
        err = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=err, env=server_env() if env is None else env, cwd=cwd)
        if stderr_path:
            err.close()
        self.buf = b""
        self.ids = itertools.count(1)
        self.backlog: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _last_words(self, wait: float = 3.0) -> str:
        """The exit code (waited for a moment) and the end of the server's stderr: what a
        failing test needs to say why the server went away."""
        try:
            code = self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            code = None
        tail = ""
        if self.stderr_path is not None and Path(self.stderr_path).exists():
            tail = Path(self.stderr_path).read_bytes()[-4000:].decode("utf-8", "replace")
        return f"exit code {code}; stderr ends:\n{tail}" if tail else f"exit code {code}"

    # -- writing -------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ServerGone(f"server exited with {self.proc.poll()}") from None

    def send(self, obj: Any) -> None:
        self.write(frame(encode(obj)))

    def notify(self, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def request_async(self, method: str, params: Any = None) -> int:
        rid = next(self.ids)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return rid

    def request(self, method: str, params: Any = None, timeout: float = 60.0) -> dict[str, Any]:
        return self.wait_for(self.request_async(method, params), timeout)

    # -- reading -------------------------------------------------------------------------
    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next framed message, None on timeout; raises ServerGone at end of output."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                header = self.buf[:i].decode("ascii")
                n = int(next(line for line in header.split("\r\n")
                             if line.lower().startswith("content-length")).split(":")[1])
                if len(self.buf) >= i + 4 + n:
                    body, self.buf = self.buf[i + 4: i + 4 + n], self.buf[i + 4 + n:]
                    return json.loads(body)
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise ServerGone(f"server closed stdout ({self._last_words()})")
            self.buf += chunk

    def next_message(self, timeout: float) -> dict[str, Any] | None:
        """Next response or server-to-client request/notification (notifications are also
        recorded; server requests such as workDoneProgress/create are answered)."""
        msg = self.read(timeout)
        if msg is None:
            return None
        if "method" in msg:
            self.notifications.append(msg)
            if "id" in msg:  # a request from the server: accept it
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
        return msg

    def wait_for(self, rid: Any, timeout: float = 60.0) -> dict[str, Any]:
        """The response to request ``rid``; other responses are kept in ``backlog``."""
        for i, m in enumerate(self.backlog):
            if m.get("id") == rid:
                return self.backlog.pop(i)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            msg = self.next_message(max(left, 0.0))
            if msg is None:
                if self.proc.poll() is not None:
                    raise ServerGone(f"server exited with {self.proc.returncode}")
                raise AssertionError(f"no answer to request {rid!r} within {timeout} s")
            if "method" in msg:
                continue
            if msg.get("id") == rid:
                return msg
            self.backlog.append(msg)

    def drain(self, quiet: float = 0.2) -> list[dict[str, Any]]:
        """Every message until ``quiet`` seconds pass without one (backlog first)."""
        out, self.backlog = self.backlog, []
        while True:
            msg = self.next_message(quiet)
            if msg is None:
                return out
            out.append(msg)

    # -- LSP helpers ---------------------------------------------------------------------
    def initialize(self, options: dict[str, Any] | None = None, encoding: str = "utf-16",
                   progress: bool = False) -> dict[str, Any]:
        caps: dict[str, Any] = {"general": {"positionEncodings": [encoding]},
                                "window": {"workDoneProgress": progress}}
        res = self.request("initialize", {"processId": os.getpid(), "rootUri": None,
                                          "capabilities": caps,
                                          "initializationOptions": options})
        assert "result" in res, res
        self.notify("initialized", {})
        return res["result"]

    def wait_loaded(self, timeout: float = 120.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            st = self.request("diffill/status")["result"]
            if st["loaded"] or st["error"]:
                return st
            assert time.monotonic() < end, "model did not load"
            time.sleep(0.1)

    def open(self, uri: str, text: str, version: int = 1, language: str = "python") -> None:
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": language, "version": version, "text": text}})

    def change(self, uri: str, version: int, changes: list[dict[str, Any]]) -> None:
        self.notify("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": version}, "contentChanges": changes})

    def completion_async(self, uri: str, line: int, character: int) -> int:
        return self.request_async("textDocument/completion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character}})

    def inline_async(self, uri: str, line: int, character: int) -> int:
        return self.request_async("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 2}})

    def shutdown(self, timeout: float = 30.0) -> int:
        """shutdown + exit; the exit code."""
        if self.proc.poll() is None:
            try:
                self.request("shutdown", timeout=timeout)
                self.notify("exit")
            except (ServerGone, AssertionError):
                pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rss_kib(pid: int) -> int:
    """Resident set size of a process (Linux /proc), KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def end_position(text: str) -> tuple[int, int]:
    """(line, utf-16 character) of the end of ``text``."""
    lines = text.split("\n")
    return len(lines) - 1, len(lines[-1].encode("utf-16-le")) // 2
