"""A model hub on 127.0.0.1 speaking the few endpoints ``huggingface_hub`` uses.

* ``GET /api/models/{owner}/{name}[/revision/{rev}]`` -> model info (``sha``, ``siblings``);
* ``HEAD`` / ``GET /{owner}/{name}/resolve/{rev}/{file}`` -> the file, with ``X-Repo-Commit``,
  ``ETag`` (the content's sha256), ``Content-Length`` and ``Range`` support;
* unknown repositories answer 404 ``X-Error-Code: RepoNotFound``, unknown files 404
  ``EntryNotFound``.

Faults for tests: ``drop[file] = n`` makes the next ``n`` GETs of ``file`` send half of the
bytes asked for and close the connection. ``stall`` holds the kinds of request that are
accepted and then never answered (``"api"``: model info, ``"head"``: file metadata, ``"get"``:
file downloads), as a captive proxy or a stalled mirror does; ``stall_body[file] = n`` makes
GETs of ``file`` send the headers and ``n`` bytes of the body, then nothing more. A stalled
request waits until the hub is closed. Every request is logged (method, path, Range), and
``sent[file]`` counts the body bytes sent for each file. ``trickle[file] = (n, s)`` sends the
body ``n`` bytes at a time, ``s`` seconds apart (a slow link that keeps sending).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}  # repo_id -> {"sha": str, "files": {name: bytes}}
        self.drop: dict[str, int] = {}
        self.hidden: set[str] = set()  # listed in siblings but 404 on download
        self.stall: set[str] = set()  # "api", "head", "get": accepted, never answered
        self.stall_body: dict[str, int] = {}  # file -> body bytes sent before the stall
        self.sent: dict[str, int] = {}  # file -> body bytes sent
        self.trickle: dict[str, tuple[int, float]] = {}  # file -> (bytes a piece, seconds apart)
        self._closing = threading.Event()
        self.log: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo_id: str, files: dict[str, bytes], sha: str | None = None,
                 revision: str = "main") -> None:
        """Serve ``files`` as ``revision`` of ``repo_id`` (``main``, the default branch, unless
        told; other revisions are found by name or by their commit ``sha``)."""
        sha = sha or hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        if revision == "main":
            revs = self.repos.get(repo_id, {}).get("revs", {})
            self.repos[repo_id] = {"sha": sha, "files": files, "revs": revs}
        else:
            self.repos[repo_id]["revs"][revision] = {"sha": sha, "files": files}

    def pick(self, repo_id: str, revision: str | None) -> dict | None:
        """The revision of a repository named by branch/tag or commit; None if unknown."""
        r = self.repos[repo_id]
        if revision in (None, "main", r["sha"]):
            return r
        for name, other in r["revs"].items():
            if revision in (name, other["sha"]):
                return other
        return None

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()  # ends the stalled requests
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _error(self, code: int, kind: str) -> None:
                body = json.dumps({"error": kind}).encode()
                self.send_response(code)
                self.send_header("X-Error-Code", kind)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self) -> None:
                path = unquote(self.path.split("?")[0])
                hub.log.append((self.command, path, self.headers.get("Range")))
                parts = path.strip("/").split("/")
                kind = "api" if parts[:1] == ["api"] else self.command.lower()
                if kind in hub.stall:
                    hub._closing.wait()  # the connection is open; no answer ever comes
                    self.close_connection = True
                    return None
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo = "/".join(parts[2:4])
                    if repo not in hub.repos:
                        return self._error(404, "RepoNotFound")
                    r = hub.pick(repo, parts[5] if parts[4:5] == ["revision"] else None)
                    if r is None:
                        return self._error(404, "RevisionNotFound")
                    body = json.dumps({"id": repo, "modelId": repo, "sha": r["sha"], "private": False,
                                       "siblings": [{"rfilename": f} for f in r["files"]]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self.wfile.write(body)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                    if repo not in hub.repos:
                        return self._error(404, "RepoNotFound")
                    r = hub.pick(repo, parts[3])
                    if r is None:
                        return self._error(404, "RevisionNotFound")
                    if name not in r["files"] or name in hub.hidden:
                        return self._error(404, "EntryNotFound")
                    return self._file(r["sha"], name, r["files"][name])
                return self._error(404, "RepoNotFound")

            def _file(self, sha: str, name: str, data: bytes) -> None:
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                if start and start >= len(data):
                    return self._error(416, "RangeNotSatisfiable")
                part = data[start:]
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", sha)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(part)))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                if name in hub.stall_body:
                    n = hub.stall_body[name]
                    self.wfile.write(part[:n])
                    self.wfile.flush()
                    hub.sent[name] = hub.sent.get(name, 0) + len(part[:n])
                    hub._closing.wait()  # headers and n bytes, then silence
                    self.close_connection = True
                    return
                if hub.drop.get(name, 0) > 0:
                    hub.drop[name] -= 1
                    hub.sent[name] = hub.sent.get(name, 0) + max(1, len(part) // 2)
                    self.wfile.write(part[: max(1, len(part) // 2)])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if name in hub.trickle:
                    n, pause = hub.trickle[name]
                    for i in range(0, len(part), n):
                        self.wfile.write(part[i:i + n])
                        self.wfile.flush()
                        hub.sent[name] = hub.sent.get(name, 0) + len(part[i:i + n])
                        if hub._closing.wait(pause):
                            return
                    return
                hub.sent[name] = hub.sent.get(name, 0) + len(part)
                self.wfile.write(part)

            do_GET = _route
            do_HEAD = _route

        return Handler
