"""A minimal LSP client for ``diffill serve`` on stdio, for the benchmarks (``diffill bench
--lsp`` / ``--first``, :mod:`diffill.evaluation.keystroke`). The tests drive the server with
their own raw client (tests/e2e/_lsp_raw.py)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from queue import Empty, Queue
from typing import Any


class StdioClient:
    """A minimal JSON-RPC client for a language server subprocess on stdio
    (Content-Length framing). Server-to-client requests get a null result;
    notifications are dropped."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env)
        self._next = 0
        self._responses: Queue[dict[str, Any]] = Queue()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    def _send(self, msg: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **msg}).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _read_loop(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length is None:
                continue
            msg = json.loads(out.read(length))
            if "method" in msg and "id" in msg:  # a request from the server
                self._send({"id": msg["id"], "result": None})
            elif "id" in msg:
                self._responses.put(msg)

    def notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": params})

    def request(self, method: str, params: Any, timeout: float = 120.0) -> Any:
        self._next += 1
        rid = self._next
        self._send({"id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self._responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except Empty:
                raise TimeoutError(f"no answer to {method} within {timeout:g} s") from None
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result")

    def initialize(self) -> Any:
        """``initialize`` (UTF-16 positions), then ``initialized``; the server's answer."""
        res = self.request("initialize", {"processId": os.getpid(), "rootUri": None,
                                          "capabilities": {"general": {"positionEncodings": ["utf-16"]}}})
        self.notify("initialized", {})
        return res

    def wait_loaded(self, timeout: float, poll_s: float = 0.1) -> dict[str, Any]:
        """Poll ``diffill/status`` until the model is loaded; the last status. RuntimeError
        when the server reports a load error, or ``timeout`` seconds pass first."""
        end = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < end:
            status = self.request("diffill/status", None) or {}
            if status.get("loaded") or status.get("error"):
                break
            time.sleep(poll_s)
        if not status.get("loaded"):
            raise RuntimeError(f"server did not load the model: {status.get('error')}")
        return status

    def close(self) -> None:
        try:
            self.request("shutdown", None, timeout=10)
            self.notify("exit", None)
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
