"""A hardened JSON-RPC layer under pygls: framing that survives garbage, and the
error answers the LSP and JSON-RPC specifications ask for.

pygls 2.1 left alone drops a request with a malformed envelope or bad params
without an answer (only a ``window/showMessage``), answers nothing to bad JSON,
loses its framing for good after one bad ``Content-Length`` header (every later
message is read as a header line), and answers a request sent before
``initialize`` with an internal error. Here:

=====================================================  =================================
input                                                  answer
=====================================================  =================================
body that is not UTF-8 or not JSON                     -32700 ParseError, ``id: null``
header block without a valid ``Content-Length``        -32700, ``id: null``; resync
``Content-Length`` over :data:`MAX_MESSAGE_BYTES`      body skipped, -32700
JSON that is not an object (array, number, ...)        -32600 InvalidRequest, ``id: null``
bad ``jsonrpc``/``method``/``id``/``params`` types      -32600 (with the id when usable;
                                                       ``params: null`` counts as absent)
params that do not fit the method's type               -32602 InvalidParams (requests)
any request before ``initialize``                      -32002 ServerNotInitialized
a second ``initialize``                                -32600
any request after ``shutdown``                         -32600 InvalidRequest
notifications that cannot be handled                   dropped (logged by method name)
=====================================================  =================================

Framing: header lines are read with a length limit; a header block ends at an empty
line; the ``Content-Length`` header is looked for anywhere in a line (case
insensitive), so a header glued to the tail of a short body -- what a too-small
``Content-Length`` leaves behind -- is still found and the stream resynchronises
on the next message. Bodies are read in chunks (no up-front allocation of a
claimed size). A too-large ``Content-Length`` swallows the following bytes until
it is satisfied: nothing in a byte stream can tell where a message really ends.

Strings with lone surrogates (``"\\ud800"``, legal JSON, impossible in UTF-8) get
U+FFFD in their place: one UTF-16 unit for one, so positions stay where the client
put them.

Exit: ``exit`` is handled here, not by pygls (whose handler closes stdout and raises
SystemExit from inside a message callback). It closes the gate of :class:`ClientWriter`
and stops the read loop; every later write -- a model load cancelled at exit sending its
``$/progress`` end, a cancelled request's answer -- is dropped, never written to a
closed stream. A write that fails (closed file, broken pipe) logs one line and stops the
read loop too.

Error answers to requests (a handler raised) are logged here, in one place
(:meth:`DiffillProtocol._send_handler_result`): one WARNING line for an error the
handler chose (InvalidParams, ...), one ERROR line for an internal error; the traceback
only when DEBUG is enabled (``diffill serve --debug``). RequestCancelled answers (latest
wins, ``$/cancelRequest``, shutdown) are routine and not logged.

Nothing here logs message contents (they hold buffer text).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, BinaryIO, Protocol

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcRequestCancelled
from pygls.io_ import StdoutWriter
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger("diffill.jsonrpc")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
SERVER_NOT_INITIALIZED = -32002

MAX_HEADER_LINE = 8192
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Bodies claiming more are skipped (a 10 MB document fits many times over)."""
CHUNK = 1 << 20
EXIT_GRACE_S = 0.25
"""After ``exit`` or end of input, how long tasks left get to finish their cancellation."""

_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _fix_surrogates(obj: Any) -> Any:
    """Replace lone surrogates in every string of a decoded JSON value by U+FFFD."""
    if isinstance(obj, str):
        return _LONE_SURROGATE.sub("\ufffd", obj) if _LONE_SURROGATE.search(obj) else obj
    if isinstance(obj, dict):
        return {_fix_surrogates(k): _fix_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fix_surrogates(v) for v in obj]
    return obj


def _valid_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


class ClientWriter:
    """The gate every message to the client passes (pygls calls ``write`` and ``close``).

    Closed by ``exit`` or by the first failed write (closed file, broken pipe, a TCP
    transport that is closing); from then on writes are dropped. pygls answers a failed
    write by logging its traceback and reporting the error to the client -- another
    write, which fails again, recursively: a flood of chained tracebacks (issue 14).
    Here a failed write logs one line and calls ``on_lost`` (which stops the read loop)."""

    def __init__(self, inner: Any, on_lost: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.on_lost = on_lost
        self.closed = False
        self.dropped = 0
        """Messages dropped because the gate was closed."""
        self._lock = threading.Lock()

    def write(self, data: bytes) -> Any:
        with self._lock:
            if self.closed:
                self.dropped += 1
                return None
            closing = getattr(self.inner, "is_closing", None)
            try:
                if closing is not None and closing():
                    raise ConnectionResetError("the transport is closing")
                return self.inner.write(data)
            except (OSError, ValueError) as e:  # ValueError: I/O operation on closed file
                self.closed = True
                err = e
        log.warning("connection to the client lost (%s: %s); no more messages are sent",
                    type(err).__name__, err)
        if self.on_lost is not None:
            self.on_lost()
        return None

    def close(self) -> None:
        """Close the gate and the stream (the client sees end of output)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            with contextlib.suppress(OSError, ValueError):
                self.inner.close()


class DiffillProtocol(LanguageServerProtocol):
    """pygls's LanguageServerProtocol behind an envelope and lifecycle gate."""

    def __init__(self, server: Any, converter: Any) -> None:
        super().__init__(server, converter)
        self.initialize_seen = False
        self.exited = False
        self.rejected: dict[int, int] = {}
        """error code -> how many messages got it (diffill/status, tests)."""
        self._methods: dict[Any, str] = {}
        """request id -> method, for the log line of an error answer."""

    # -- transport --------------------------------------------------------------------------
    def set_writer(self, writer: Any, include_headers: bool = True) -> None:
        if not isinstance(writer, ClientWriter):
            writer = ClientWriter(writer, self._stop_reading)
        super().set_writer(writer, include_headers)

    def _stop_reading(self) -> None:
        stop = getattr(self._server, "_stop_event", None)
        if stop is not None:
            stop.set()

    def handle_exit(self) -> None:
        """The ``exit`` notification: nothing is sent after it, and the read loop ends;
        the caller (``diffill serve``) ends the process with :attr:`exit_code`."""
        self.exited = True
        log.info("exit (code %d)", self.exit_code)
        if self.writer is not None:
            self.writer.close()
        self._stop_reading()

    @property
    def exit_code(self) -> int:
        """0 after a shutdown request, 1 otherwise (LSP ``exit`` semantics)."""
        return 0 if self._shutdown else 1

    # -- pygls bookkeeping --------------------------------------------------------------------
    def _execute_handler(self, msg_id: Any, handler: Any, callback: Any,
                         args: Any = None, kwargs: Any = None) -> None:
        """pygls keeps the future of every notification handled by a generator or a
        coroutine (``didOpen``/``didChange``/``didClose`` go through generators) in
        ``_request_futures`` under a fresh uuid and never removes it: one future per
        keystroke, forever (found by the soak test: RSS +4 MiB per 1000 requests). Drop
        the entry when the future is done, whatever pygls's callback does."""

        def done(future: Any) -> None:
            if self._request_futures.get(msg_id) is future:
                del self._request_futures[msg_id]
            callback(future)

        super()._execute_handler(msg_id, handler, done, args, kwargs)

    def _send_handler_result(self, future: Any, *, msg_id: Any) -> None:
        """Answer a request from its handler's future (pygls's callback, with one log line
        per error answer instead of pygls's ERROR traceback for each)."""
        self._request_futures.pop(msg_id, None)
        method = self._methods.pop(msg_id, "request")
        if future.cancelled():
            self._send_response(msg_id, error=JsonRpcRequestCancelled(
                f'Request with id "{msg_id}" is canceled').to_response_error())
            return
        exc = future.exception()
        if exc is None:
            self._send_response(msg_id, result=future.result())
            return
        if isinstance(exc, JsonRpcException):  # an answer the handler chose (InvalidParams, ...)
            error, level = exc, logging.WARNING
        else:  # a bug or a fault: -32603, with the traceback in ``data`` as pygls sends it
            error, level = JsonRpcInternalError.of((type(exc), exc, exc.__traceback__)), logging.ERROR
        log_error(log, level, f"{method} (id {msg_id!r}) answered with error {error.code}: "
                  f"{type(exc).__name__}: {exc}", exc)
        self._send_response(msg_id, error=error.to_response_error())

    # -- answers ----------------------------------------------------------------------------
    def send_error(self, msg_id: Any, code: int, message: str) -> None:
        self.rejected[code] = self.rejected.get(code, 0) + 1
        self._send_data({"jsonrpc": "2.0", "id": msg_id if _valid_id(msg_id) else None,
                         "error": {"code": code, "message": message}})

    # -- entry point ------------------------------------------------------------------------
    def handle_body(self, body: bytes) -> None:
        """One framed message body: decode, check, then hand over to pygls."""
        try:
            text = body.decode("utf-8")
            data = json.loads(text)
        except (UnicodeDecodeError, ValueError) as e:
            self.send_error(None, PARSE_ERROR, f"Parse error: {type(e).__name__} at byte "
                            f"{getattr(e, 'start', getattr(e, 'pos', '?'))}")
            return
        except RecursionError:
            self.send_error(None, PARSE_ERROR, "Parse error: nesting too deep")
            return
        if _SURROGATE_ESCAPE.search(body):
            data = _fix_surrogates(data)
        self.handle_object(data)

    def handle_object(self, data: Any) -> None:
        if not isinstance(data, dict):
            self.send_error(None, INVALID_REQUEST,
                            "Invalid Request: a message must be a JSON object (no batches)")
            return
        msg_id = data.get("id")
        has_id = "id" in data
        method = data.get("method")
        if data.get("jsonrpc") != "2.0":
            self.send_error(msg_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
            return
        if "method" not in data:
            if has_id and ("result" in data or "error" in data) and _valid_id(msg_id):
                self._response(data)  # a response to one of our requests
            else:
                self.send_error(msg_id, INVALID_REQUEST, 'Invalid Request: no "method"')
            return
        if not isinstance(method, str):
            self.send_error(msg_id, INVALID_REQUEST, 'Invalid Request: "method" must be a string')
            return
        if has_id and not _valid_id(msg_id):
            self.send_error(None, INVALID_REQUEST,
                            'Invalid Request: "id" must be an integer or a string')
            return
        if data.get("params") is not None and not isinstance(data["params"], (dict, list)):
            if has_id:
                self.send_error(msg_id, INVALID_REQUEST,
                                'Invalid Request: "params" must be an object or an array')
            return
        if has_id:
            self._request(data, msg_id, method)
        else:
            self._notification(data, method)

    # -- lifecycle gate ---------------------------------------------------------------------
    def _request(self, data: dict[str, Any], msg_id: Any, method: str) -> None:
        data.setdefault("params", None)  # JSON-RPC lets a request leave params out
        if method == types.INITIALIZE:
            if self.initialize_seen:
                self.send_error(msg_id, INVALID_REQUEST, "Invalid Request: initialize was already sent")
                return
        elif not self.initialize_seen:
            self.send_error(msg_id, SERVER_NOT_INITIALIZED,
                            f"Server not initialized: {method} before initialize")
            return
        if self._shutdown:
            self.send_error(msg_id, INVALID_REQUEST,
                            f"Invalid Request: {method} after shutdown")
            return
        try:
            message = self.structure_message(data)
        except Exception:
            self.send_error(msg_id, INVALID_PARAMS, f"Invalid params for {method}")
            return
        if method == types.INITIALIZE:
            self.initialize_seen = True
        self._methods[msg_id] = method
        self._dispatch(message)

    def _notification(self, data: dict[str, Any], method: str) -> None:
        data.setdefault("params", None)
        if method == types.EXIT:
            self.handle_exit()
            return
        if not self.initialize_seen or self._shutdown:
            log.info("dropped notification %s (%s)", method,
                     "before initialize" if not self.initialize_seen else "after shutdown")
            return
        try:
            message = self.structure_message(data)
        except Exception:
            log.warning("dropped notification %s: its params do not fit the method", method)
            return
        self._dispatch(message)

    def _response(self, data: dict[str, Any]) -> None:
        try:
            message = self.structure_message(data)
        except Exception:
            log.warning("dropped a response to request %r: it does not fit the request's type",
                        data.get("id"))
            return
        self._dispatch(message)

    def _dispatch(self, message: Any) -> None:
        try:
            self.handle_message(message)
        except Exception as e:  # pygls answers requests itself; this is a last resort
            log_error(log, logging.ERROR, f"cannot handle a message: {type(e).__name__}: {e}", e)
        msg_id = getattr(message, "id", None)
        if msg_id is not None and msg_id not in self._request_futures:
            self._methods.pop(msg_id, None)  # answered at once (or never handled): forget it


def log_error(logger: logging.Logger, level: int, message: str, exc: BaseException) -> None:
    """One log line for an exception; its traceback only when ``logger`` logs DEBUG
    (``diffill serve --debug``)."""
    logger.log(level, "%s", message, exc_info=exc if logger.isEnabledFor(logging.DEBUG) else None)


# ----------------------------------------------------------------------------- framing


class LineReader(Protocol):
    def readline(self, limit: int) -> Awaitable[bytes]: ...
    def read(self, n: int) -> Awaitable[bytes]: ...


class StdinReader:
    """Blocking stdin reads on an executor thread."""

    def __init__(self, stdin: BinaryIO, executor: Executor) -> None:
        self.stdin = stdin
        self.executor = executor

    def readline(self, limit: int) -> Awaitable[bytes]:
        return asyncio.get_running_loop().run_in_executor(self.executor, self.stdin.readline, limit)

    def read(self, n: int) -> Awaitable[bytes]:
        return asyncio.get_running_loop().run_in_executor(self.executor, self.stdin.read, n)


class StreamLineReader:
    """An asyncio StreamReader (TCP) with the same interface."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    async def readline(self, limit: int) -> bytes:
        try:
            return await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as e:
            return e.partial
        except asyncio.LimitOverrunError as e:
            return await self.reader.read(min(e.consumed, limit) or limit)

    async def read(self, n: int) -> bytes:
        return await self.reader.read(n)


async def _patient(read: Callable[[int], Awaitable[bytes]], n: int) -> bytes:
    """``read(n)``, waited out through a MemoryError. Under a memory limit (a container,
    ``ulimit -v``) the read that fails is as likely to be the next message's as a model
    load's; ending the read loop there would end the server. A buffered read that cannot
    allocate its result consumes nothing, so the same read is tried again, at growing
    intervals (at most 1 s apart), until memory is back."""
    wait = 0.01
    while True:
        try:
            return await read(n)
        except MemoryError:
            log.warning("out of memory reading from the client; trying again in %.2f s", wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 1.0)


async def _read_exactly(reader: LineReader, n: int) -> bytes | None:
    """``n`` bytes (read in chunks), or None at end of input."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        chunk = await _patient(reader.read, min(left, CHUNK))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


async def read_messages(
    reader: LineReader,
    protocol: DiffillProtocol,
    stop: threading.Event,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> None:
    """The main loop: frames -> :meth:`DiffillProtocol.handle_body` until end of input."""
    while not stop.is_set():
        length: int | None = None
        bad: str | None = None
        seen_header = False
        while True:  # one header block
            line = await _patient(reader.readline, MAX_HEADER_LINE)
            if not line:
                return
            if line.strip() == b"":
                if seen_header:
                    break
                continue  # blank lines between messages
            seen_header = True
            m = _CONTENT_LENGTH.search(line)
            if m is not None:
                value = m.group(1).strip()
                if value.isdigit():
                    length, bad = int(value), None
                else:
                    length, bad = None, f"invalid Content-Length {value[:20].decode('latin-1')!r}"
        if length is None:
            protocol.send_error(None, PARSE_ERROR,
                                f"Parse error: {bad or 'header block without Content-Length'}")
            continue
        if length > max_bytes:
            skipped = await _read_exactly(reader, length)
            protocol.send_error(None, PARSE_ERROR,
                                f"Parse error: message of {length} bytes exceeds {max_bytes}")
            if skipped is None:
                return
            continue
        body = await _read_exactly(reader, length) if length else b""
        if body is None:
            return
        try:
            protocol.handle_body(body)
        except Exception as e:  # e.g. MemoryError under a memory limit: drop it, keep serving
            log.error("cannot handle a message: %s: %s", type(e).__name__, e)


def run_loop(main: Coroutine[Any, Any, None], grace: float = EXIT_GRACE_S) -> None:
    """Run ``main`` on a new event loop; when it ends, cancel the tasks left (a model
    load, requests in flight) and give them ``grace`` seconds to finish -- not forever,
    as ``asyncio.run`` does. A task can outlive its cancellation: Python 3.11's
    ``asyncio.wait_for`` drops a cancel that arrives as its future completes, which kept
    a model load awaiting its progress token running until the model had loaded. Tasks
    still pending are abandoned with the loop left open: the caller ends the process."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main)
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            done, pending = loop.run_until_complete(asyncio.wait(pending, timeout=grace))
            for task in done:  # retrieve the outcome: no "exception never retrieved" noise
                if not task.cancelled():
                    task.exception()
        if pending:
            log.info("%d task(s) still running at exit, not waited for", len(pending))
        else:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def start_io(server: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """Serve one client on stdio (pygls's ``start_io`` with this framing)."""
    server._stop_event = stop = threading.Event()
    reader = StdinReader(stdin or sys.stdin.buffer, server.thread_pool)
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    try:
        run_loop(read_messages(reader, server.protocol, stop))
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


def start_tcp(server: Any, host: str, port: int,
              ready: Callable[[str, int], None] | None = None) -> None:
    """Serve clients on TCP, one connection at a time (pygls's ``start_tcp`` semantics)."""
    server._stop_event = stop = threading.Event()

    async def connection(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        server.protocol.set_writer(w)
        await read_messages(StreamLineReader(r), server.protocol, stop)
        server.shutdown()  # end of input or ``exit``: end serve_forever, not just this task

    async def main() -> None:
        srv = await asyncio.start_server(connection, host, port, limit=MAX_HEADER_LINE * 2)
        server._server = srv
        if ready is not None:
            sock = srv.sockets[0].getsockname()
            ready(sock[0], sock[1])
        async with srv:
            await srv.serve_forever()

    try:
        run_loop(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    finally:
        server.shutdown()
