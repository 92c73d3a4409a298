"""The connection layer of ``diffill serve-http``: its limits (:class:`HttpConfig`), the
connections (:class:`Connection`: header and idle timeouts, the connection cap and who
makes room, aiohttp's own errors as JSON), the bearer token (:class:`BearerToken`), the
access log (:class:`AccessLog`) and the listener (:class:`Listener`, :func:`serve`). What a
request asks is :mod:`.http_server`'s; this module sees bytes, sockets and headers only.

* **Connections**: the request line and headers must arrive within ``header_timeout_s`` of
  the connection opening (or of the first byte of a later request on a kept-alive
  connection), else 408 and the connection is closed; a kept-alive connection idle for
  ``idle_timeout_s`` is closed. At ``max_connections`` open connections a new one makes
  room (:func:`make_room`): connections whose peer already left are dropped, then the
  longest-waiting connection with no request in progress is closed, never-authenticated
  ones first; only when every connection is busy is the newcomer refused with 503. Each is
  counted (``closed_header_timeout``, ``closed_idle``, ``closed_peer_gone``,
  ``evicted_connections``, ``rejected_connections``).
* With a token configured, ``/v1/*`` needs ``Authorization: Bearer <token>`` (401
  otherwise; the SHA-256 digests are compared in constant time, so neither the comparison
  nor an error message depends on the token's length).
* **Logs**: every request is one access-log line (status, request id, the error code and
  message, no traceback). The log never holds the token: query values and keys (but the
  usual credential names) and path segments other than the routes' words are redacted
  (:func:`.http_wire.log_target`), header values are never logged; aiohttp's own errors
  and tracebacks are one line, never the raw bytes (which may hold a token).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from .http_wire import RequestError, error_response, log_target, raw_error

log = logging.getLogger("diffill.http")
access_log = logging.getLogger("diffill.http.access")

HEALTH_PATHS = frozenset({"/health", "/healthz", "/v1/health"})


class AccessLog(AbstractAccessLogger):
    """One line per request: peer, method, redacted target, status, size, time,
    request id and the response's note (the error or what the completion took).
    Health checks and /infill warm-ups at DEBUG (also health's 503 while loading), other
    5xx at ERROR, the rest at INFO."""

    served: frozenset[str] = frozenset()
    """Model names the log may show in ``/v1/models/<name>`` (set per listener)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        status = response.status
        if request.path in HEALTH_PATHS or getattr(response, "quiet", False):
            level = logging.DEBUG  # load-balancer probes (503 while loading), idle warm-ups
        elif status >= 500:
            level = logging.ERROR
        else:
            level = logging.INFO
        if not self.logger.isEnabledFor(level):
            return
        note = getattr(response, "note", "")
        v = request.version
        self.logger.log(level, '%s "%s %s HTTP/%d.%d" %d %d %.1f ms rid=%s%s',
                        request.remote, request.method, log_target(request.raw_path, self.served),
                        v.major, v.minor, status, response.body_length, time * 1000.0,
                        response.headers.get("X-Request-Id", "-"), f" {note}" if note else "")


@dataclass
class HttpConfig:
    """Serving limits and identity."""

    token: str | None = None
    """Bearer token required on /v1/* (None: no auth)."""
    max_queue: int = 32
    """Requests admitted at once (reading their body + waiting + running); more get 429."""
    workers: int = 4
    """Threads running requests (the engine batches the ones that meet)."""
    max_body_bytes: int = 1024 * 1024
    request_timeout_s: float = 60.0
    """From admission to the answer: later, 504 (the worker stops at its next step)."""
    header_timeout_s: float = 10.0
    """Request line + headers must arrive within this (from the connection opening or a
    later request's first byte), else 408 and close."""
    body_timeout_s: float = 30.0
    """The whole body must arrive within this once the headers did, else 408 and close."""
    idle_timeout_s: float = 30.0
    """A kept-alive connection with no request for this long is closed."""
    max_connections: int = 256
    """Open connections at once; a new one beyond gets 503 and is closed."""
    max_request_steps: int = 64
    """Largest ``steps`` a request may ask for (400 above)."""
    max_request_tokens: int = 256
    """Largest ``max_tokens`` (400 above); lowered at load to what the model can hold."""
    max_request_ms: float | None = None
    """Largest predicted model time of one request (400 above; priced from the step plan,
    :mod:`.http_cost`); None: the device's default."""
    model_names: list[str] = field(default_factory=lambda: ["diffill"])
    """Names ``model`` may take; the first is reported. Empty: any name accepted."""
    debug_log_buffers: bool = False

    def check(self) -> None:
        """Raises ValueError naming the first limit out of range."""
        for name in ("max_queue", "workers", "max_connections", "max_request_steps",
                     "max_request_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("request_timeout_s", "header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_request_ms is not None and not self.max_request_ms > 0:
            raise ValueError("max_request_ms must be > 0")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")


class Front(Protocol):
    """What the connection layer needs of the server (:class:`.http_server.HttpFront`,
    which imports this module)."""

    config: HttpConfig
    connections: set[Connection]

    def count(self, name: str) -> None: ...

    def make_app(self) -> web.Application: ...


# ----------------------------------------------------------------------------- connections


class Connection(web.RequestHandler):
    """aiohttp's HTTP/1.1 protocol with the connection discipline of :class:`.http_server.HttpFront`:
    header / idle timeouts, the connection cap, and aiohttp's own errors as JSON with a
    one-line log (never the raw bytes, which may hold a token).

    Phases: ``header`` (waiting for a complete request head, ``header_timeout_s``),
    ``busy`` (a handler runs; the body has its own timeout in :meth:`.http_server.HttpFront.read_body`),
    ``idle`` (kept alive between requests, ``idle_timeout_s``)."""

    def __init__(self, manager: web.Server, front: Front, **kw: Any) -> None:
        super().__init__(manager, **kw)
        self.front = front
        self.phase = "new"
        self._timer: asyncio.TimerHandle | None = None
        self._body_done = True
        self._pipelined = False
        self.since = 0.0
        """When the current phase began (loop time)."""
        self.authed = False
        """A request on this connection presented the right token (a token is configured)."""
        self.got_bytes = False

    # -- the connection cap --------------------------------------------------------------------
    def evictable(self) -> bool:
        """Idle between requests, or not one byte of a request yet: closing it loses no
        work (a client reopens a closed kept-alive connection)."""
        return self.phase == "idle" or (self.phase == "header" and not self.got_bytes)

    def peer_gone(self) -> bool:
        """The peer closed (or reset) a connection whose end the loop has not read yet: a
        burst of connect-then-close leaves many such in the accept queue, counted as open
        until their EOF is read. A non-blocking peek on a duplicate of the socket."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return True
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            fd = os.dup(sock.fileno())
        except OSError:
            return False
        try:
            dup = socket.socket(fileno=fd)  # closing the duplicate leaves the connection be
        except OSError:
            os.close(fd)
            return False
        try:
            return dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:  # reset by the peer
            return True
        finally:
            dup.close()

    # -- phases ------------------------------------------------------------------------------
    def _arm(self, phase: str, seconds: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.phase = phase
        self.since = self._loop.time()
        if seconds is not None:
            self._timer = self._loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        f = self.front
        peer = self.transport.get_extra_info("peername")
        who = peer[0] if isinstance(peer, tuple) and peer else "?"
        if self.phase == "header":
            t = f.config.header_timeout_s
            f.count("closed_header_timeout")
            log.info("%s: closed, no complete request head within %g s (header timeout)", who, t)
            self.refuse(RequestError(408, f"request line and headers not received within {t:g} s",
                                      code="header_timeout"))
        elif self.phase == "idle":
            f.count("closed_idle")
            log.debug("%s: closed, idle for %g s", who, f.config.idle_timeout_s)
            self.force_close()

    def refuse(self, err: RequestError) -> None:
        """The error written straight to the socket, then the connection closed."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(raw_error(err))
        self.force_close()

    def begin(self, has_body: bool) -> None:
        """A handler starts (the request head is complete)."""
        self._arm("busy", None)
        self._body_done = not has_body
        self._pipelined = False

    def body_read(self) -> None:
        self._body_done = True

    # -- protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        f = self.front
        if len(f.connections) >= f.config.max_connections:
            make_room(f)
        if len(f.connections) >= f.config.max_connections:
            f.count("rejected_connections")
            log.info("connection refused: %d open (max_connections)", len(f.connections))
            self.refuse(RequestError(503, f"too many open connections (limit "
                                      f"{f.config.max_connections}); retry later",
                                      kind="server_error", code="too_many_connections",
                                      headers={"Retry-After": "1"}))
            return
        f.connections.add(self)
        self._arm("header", f.config.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if data:
            self.got_bytes = True
            if self.phase == "idle":
                self._arm("header", self.front.config.header_timeout_s)
            elif self.phase == "busy" and self._body_done:
                self._pipelined = True  # the next request's head, behind this one
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.front.connections.discard(self)
        super().connection_lost(exc)

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            if self.transport is not None and self.phase == "busy":
                if self._pipelined:
                    self._arm("header", self.front.config.header_timeout_s)
                else:
                    self._arm("idle", self.front.config.idle_timeout_s)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None
                     ) -> web.StreamResponse:
        """aiohttp's own errors (a request it cannot parse: 400; 5xx) as JSON. The
        exception's text is neither logged nor sent: aiohttp quotes the raw header line."""
        if request.writer.output_size > 0:
            raise ConnectionError("response already started, cannot send an error")
        if status >= 500:
            log.debug("internal error", exc_info=exc)
            err = RequestError(status, HTTPStatus(status).phrase.lower(), kind="server_error",
                               code="internal_error")
        else:
            what = type(exc).__name__ if exc is not None else "bad request"
            err = RequestError(status, f"malformed HTTP request ({what})", code="bad_http_request")
        self.front.count(f"http_{status}")
        resp = error_response(err, uuid.uuid4().hex)
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's tracebacks as one line (the exception type, never its text)."""
        exc = kw.get("exc_info")
        try:
            msg = str(args[0]) % args[1:] if args else "error"
        except (TypeError, ValueError):
            msg = str(args[0])
        log.error("%s (%s)", msg, type(exc).__name__ if isinstance(exc, BaseException) else "-")


def make_room(front: Front) -> None:
    """At the connection cap, before a new connection is refused: connections whose
    peer has already gone are dropped (the count then is the real one), then one
    connection that is waiting rather than working is closed for the newcomer -- a
    never-authenticated one first, the longest waiting first; with a token configured,
    a stranger's kept-alive connections never lock out the team, and without one a
    client that holds connections open idle only ever holds the oldest slots. Busy
    connections (a request being read or run) are never closed; only when all are
    busy is the newcomer refused (503)."""
    for conn in [c for c in front.connections if c.evictable() and c.peer_gone()]:
        front.connections.discard(conn)
        front.count("closed_peer_gone")
        conn.force_close()
    if len(front.connections) < front.config.max_connections:
        return
    waiting = [c for c in front.connections if c.evictable()]
    if not waiting:
        return
    victim = min(waiting, key=lambda c: (c.authed, c.since))
    front.connections.discard(victim)
    front.count("evicted_connections")
    log.info("connection cap: closed a %s %s connection for a new one",
             "authenticated" if victim.authed else "unauthenticated", victim.phase)
    if victim.phase == "header":
        victim.refuse(RequestError(503, "connection closed to make room for another: "
                                    "send the request right after connecting",
                                    kind="server_error", code="too_many_connections",
                                    headers={"Retry-After": "1"}))
    else:
        victim.force_close()


class BearerToken:
    """The token ``/v1/*`` needs (``Authorization: Bearer <token>``); None: no auth. The
    SHA-256 digests are compared in constant time, so neither the comparison nor an error
    message depends on the token's length."""

    def __init__(self, token: str | None) -> None:
        self._digest = hashlib.sha256(token.encode()).digest() if token else None

    def check(self, request: web.Request) -> None:
        """401 unless the request presents the token; marks its connection authenticated."""
        if self._digest is None:
            return
        got = request.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        # header values arrive as str with undecodable bytes as surrogates: encode them
        # back losslessly; digests make the comparison independent of the token's length
        presented = hashlib.sha256(value.strip().encode("utf-8", "surrogateescape")).digest()
        if not (hmac.compare_digest(presented, self._digest) and scheme.lower() == "bearer"):
            raise RequestError(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        conn = request.protocol
        if isinstance(conn, Connection):
            conn.authed = True


# ----------------------------------------------------------------------------- listening


class Listener:
    """A running server: :meth:`start` binds, :attr:`url` names the real port,
    :meth:`close` stops accepting, closes the connections and cleans the app up."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.runner: web.AppRunner | None = None
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    def handler_kwargs(self) -> dict[str, Any]:
        c = self.front.config
        served = frozenset(c.model_names)
        return {
            "access_log_class": type("AccessLogOfThisServer", (AccessLog,), {"served": served}),
            "access_log": access_log,
            # aiohttp's own keep-alive timer only backs up ours (Connection)
            "keepalive_timeout": c.idle_timeout_s + c.header_timeout_s + 1.0,
            "lingering_time": 0,  # an unread body closes the connection, never read on
        }

    async def start(self, host: str, port: int) -> str:
        kw = self.handler_kwargs()
        self.runner = web.AppRunner(self.front.make_app(), handle_signals=False, **kw)
        await self.runner.setup()
        manager = self.runner.server
        assert manager is not None
        loop = asyncio.get_running_loop()
        front = self.front
        self.server = await loop.create_server(
            lambda: Connection(manager, front, loop=loop, **kw), host, port)
        sock = self.server.sockets[0].getsockname()
        h = sock[0]
        self.url = f"http://[{h}]:{sock[1]}" if ":" in h else f"http://{h}:{sock[1]}"
        return self.url

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)


class ListenError(Exception):
    """The address cannot be bound (in use, not this machine's, no permission)."""


async def serve(front: Front, host: str, port: int,
                ready: Callable[[str], None] | None = None) -> None:
    """Listen on ``host:port`` until SIGINT/SIGTERM/SIGHUP (each drains: no new
    connection, the requests in flight answered, then exit); ``ready(url)`` once bound (port 0
    picks a free port; the URL names the real one). Logs "listening on URL"."""
    listener = Listener(front)
    try:
        url = await listener.start(host, port)
    except OSError as e:
        await listener.close()
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    log.info("listening on %s", url)
    if ready is not None:
        ready(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await listener.close()


__all__ = [
    "AccessLog",
    "BearerToken",
    "Connection",
    "Front",
    "HttpConfig",
    "ListenError",
    "Listener",
    "make_room",
    "serve",
]
