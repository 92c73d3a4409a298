"""The engine as an OpenAI-compatible completions API (aiohttp), so one GPU box can
serve a team: :class:`HttpFront`, the state of one ``diffill serve-http`` process and the
request path every route shares (admission, the body, caps on cost, the model call on a
worker thread, errors), and the app that puts the routes together.

Routes, each in its own module over the front:

* ``POST /v1/completions`` and ``POST /v1/fim/completions``: :mod:`.http_openai`;
* ``GET /v1/models``, ``GET /v1/models/{model}`` and ``GET /health`` (``/healthz``,
  ``/v1/health``): :mod:`.http_status`;
* ``POST /infill`` and ``GET /props``, llama-server's fill-in-the-middle contract
  (llama.vim, llama.vscode): :mod:`.llama_infill`.

Connections, their timeouts and cap, the token, the access log and the listener are
:mod:`.http_connection`'s; the wire types and parsing :mod:`.http_wire`'s; admission by
predicted cost :mod:`.http_cost`'s.

The text path is the language server's: ``prompt + suffix`` is one document with
the cursor between them, cut to the token budget by :mod:`.context`
(:meth:`.completer.Completer.run`: token healing, the backend, post-processing
by :func:`.completer.finish`; ``raw`` skips healing and post-processing), then cut
at the first ``stop`` sequence (:meth:`HttpFront.complete_one`). ``finish_reason`` is
``"stop"`` when the model ended the middle itself
(pad/EOS inside the hole) or a stop sequence cut it, ``"length"`` when the middle
filled the whole ``max_tokens`` hole. ``n`` > 1 asks the backend for several
candidate hole lengths; identical (after post-processing) or empty candidates are
merged, so up to ``n`` choices come back -- at least one, possibly with empty
text. ``usage.prompt_tokens`` counts what the model saw (prefix + suffix windows,
not the whole prompt when it was cut), ``completion_tokens`` the choices' texts.

Serving discipline
------------------
* **Connections**: timeouts and the connection cap, :mod:`.http_connection`.
* **Admission before the body**: the token, the model's readiness and a queue slot
  are checked from the headers, before a byte of the body is read: a stranger or a
  full server costs no buffering. At most ``max_queue`` requests are admitted
  (reading their body + waiting + running); beyond that 429 with a
  ``Retry-After`` estimated from recent latencies. So at most ``max_queue x
  max_body_bytes`` of bodies are buffered at once. The body must arrive within
  ``body_timeout_s`` (else 408, ``closed_body_timeout``); bodies over
  ``max_body_bytes`` get 413 (checked on ``Content-Length`` and while reading).
* **Caps on cost**: ``steps`` above ``max_request_steps`` and ``max_tokens`` above
  ``max_request_tokens`` (lowered at load to what the model's positions hold) are a
  400 naming the field; and every request is priced from the step plan before it runs
  (:mod:`.http_cost`): over ``max_request_ms`` of predicted model time it is a 400
  ``request_too_costly``. Malformed JSON, wrong types, out-of-range values: 400 naming
  the field (``error.param``), validated by msgspec Structs.
* ``request_timeout_s`` after admission a request still unanswered gets 504 at once;
  its worker stops at the next diffusion step (a queued one never starts). A client
  that disconnects is cancelled the same way. A model error (out of memory, ...) is
  a 500 for that request only; the server stays up.
* **Errors**: every error, including aiohttp's own (bad request line,
  bad header, unknown route 404, 405 with ``Allow``, a CORS preflight), is JSON in
  the OpenAI error shape (llama-server's on its routes). No error repeats a requested
  model name; prompts and completions are logged only with
  ``debug_log_buffers``. ``X-Request-Id`` is echoed back (generated when
  absent or not a short printable string).

Test hook: ``DIFFILL_DEBUG_LOAD_GATE=<path>`` holds the model load (``/health`` says
``loading``) until that file exists, so load-balancer tests control how long a replica
stays out. Never set it in normal use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from aiohttp import web

from ..backend.backends import Backend, BackendError, Cancelled, Candidate, InfillAsk, InfillResult
from ..completion.completer import Completer, CompletionAsk
from ..completion.options import CompletionOptions
from ..text.context import FimContext
from .http_connection import BearerToken, Connection, HttpConfig
from .http_cost import Price, default_max_request_ms, price
from .http_openai import OpenAICompletions
from .http_status import StatusRoutes
from .http_wire import (
    Choice,
    CompletionRequest,
    Fill,
    FillResult,
    Reply,
    RequestError,
    cut_at_indent,
    earliest_stop,
    error_response,
    log_target,
    printable,
    request_id,
)
from .llama_infill import LlamaInfill, llama_error

log = logging.getLogger("diffill.http")

RETRYABLE_HINT_S = 1
LOAD_GATE_ENV = "DIFFILL_DEBUG_LOAD_GATE"
LOAD_TASK = web.AppKey("diffill_load", asyncio.Task)
ENDPOINTS = ("POST /v1/completions (and /v1/fim/completions), GET /v1/models, GET /v1/models/{model}, GET /health, "
             "POST /infill, GET /props")


class _TimedBackend:
    """The backend as :class:`Completer` sees it for one request: its ``infill`` calls
    timed, and (optionally) another tokenizer; everything else is the backend's."""

    def __init__(self, backend: Backend,
                 encode_batch: Callable[[list[str]], list[list[int]]] | None = None) -> None:
        self._backend = backend
        self.model_ms = 0.0
        if encode_batch is not None:
            self.encode_batch = encode_batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def infill(self, ctx: FimContext, ask: InfillAsk) -> InfillResult:
        t0 = time.perf_counter()
        try:
            return self._backend.infill(ctx, ask)
        finally:
            self.model_ms += (time.perf_counter() - t0) * 1000.0


class Job:
    """One admitted request: its cancel flag and deadline."""

    def __init__(self, deadline: float, transport_closing: Callable[[], bool]) -> None:
        self.deadline = deadline
        self.closing = transport_closing
        self.aborted = threading.Event()
        self.timed_out = False

    def cancel(self) -> bool:
        if self.aborted.is_set() or self.closing():
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return True
        return False


class HttpFront:
    """State of one serve-http process: the backend (loaded on the worker thread),
    the admission counter, the open connections, statistics."""

    def __init__(
        self,
        options: CompletionOptions,
        config: HttpConfig,
        *,
        backend: Backend | None = None,
        loader: Callable[[], Backend] | None = None,
    ) -> None:
        if backend is None and loader is None:
            raise ValueError("HttpFront needs a backend or a loader")
        config.check()
        self.options = options
        self.config = config
        self.backend: Backend | None = None
        self.loader = loader
        self.load_error: str | None = None
        self.executor = ThreadPoolExecutor(max_workers=max(1, config.workers),
                                           thread_name_prefix="diffill-http-model")
        self.pending = 0
        """Admitted requests: reading their body, queued or running."""
        self.reading = 0
        """Admitted requests still reading their body."""
        self.running = 0
        """Requests inside a worker thread right now."""
        self._running_lock = threading.Lock()
        self.connections: set[Connection] = set()
        self.counters: dict[str, int] = {}
        self.latencies: deque[float] = deque(maxlen=200)
        self.started = time.time()
        self.max_tokens_limit = config.max_request_tokens
        self.model_hole_limit: int | None = None
        self.token = BearerToken(config.token)
        if backend is not None:
            self._set_backend(backend)

    # -- model ------------------------------------------------------------------------------
    def _set_backend(self, backend: Backend) -> None:
        """Install the backend and lower the max_tokens limit to what its model holds."""
        hole = backend.max_context_tokens(0)
        self.model_hole_limit = hole
        if hole is not None and hole < self.config.max_request_tokens:
            log.info("max_request_tokens %d lowered to %d: the model's positions hold at most "
                        "%d tokens of hole and context", self.config.max_request_tokens, hole, hole)
            self.max_tokens_limit = max(1, hole)
        self.backend = backend

    async def load(self) -> None:
        """Load the model on the worker thread (health says 503 meanwhile)."""
        if self.backend is not None or self.loader is None:
            return
        t0 = time.perf_counter()
        loader = self.loader

        gate = os.environ.get(LOAD_GATE_ENV)

        def work() -> Backend:
            while gate and not os.path.exists(gate):  # test hook (module doc)
                time.sleep(0.05)
            backend = loader()
            backend.warmup()
            return backend

        try:
            backend = await asyncio.get_running_loop().run_in_executor(self.executor, work)
        except Exception as e:
            self.load_error = f"cannot load model: {type(e).__name__}: {e}"
            log.error("%s", self.load_error)
        else:
            self._set_backend(backend)
            log.info("model loaded in %.2f s: %s", time.perf_counter() - t0, backend.describe())

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def count_error(self, err: RequestError) -> None:
        """Count an error answer as ``http_<status>``, but 429 and 499: those are counted
        where they happen (``rejected_429`` by :meth:`check_queue`, ``client_gone`` by
        :meth:`execute`). Every route's handler counts its errors through here."""
        if err.status not in (429, 499):
            self.count(f"http_{err.status}")

    def retry_after_s(self) -> int:
        """Seconds a rejected client should wait: queue length x mean latency."""
        lat = list(self.latencies)
        mean = sum(lat) / len(lat) if lat else 1.0
        waves = max(self.pending, 1) / max(1, self.config.workers)
        return max(RETRYABLE_HINT_S, math.ceil(mean * waves))

    # -- the model call (worker thread) ------------------------------------------------------
    def complete_one(self, fill: Fill, job: Job) -> FillResult:
        """One prompt through the language server's text path (:meth:`Completer.run`:
        context, token healing, model, post-processing); ``raw`` skips token healing and
        post-processing (the model's middles at the cursor, untouched); ``healing=False``
        skips token healing only (the client healed already). Every route (OpenAI
        ``/v1/completions``, llama-server ``/infill``) runs its prompts through here."""
        backend = self.backend
        assert backend is not None
        max_tokens = fill.max_tokens
        changes: dict[str, Any] = {"max_tokens": max_tokens}
        if fill.raw or not fill.healing:
            changes["token_healing"] = False
        if fill.raw:  # the model's own middles: no drafts either
            changes["drafts"] = False
        if fill.snippets:
            changes["extra_context"] = True
        opts = msgspec.structs.replace(self.options, **changes)
        sampled = fill.temperature > 0
        ask = CompletionAsk(n=fill.n, steps=fill.steps, temperature=fill.temperature if sampled else 0.0,
                            seed=fill.seed if sampled else None, budget_ms=fill.latency_budget_ms,
                            cancel=job.cancel)
        timed = _TimedBackend(backend, fill.encode_batch)
        t0 = time.perf_counter()
        res = Completer(timed, opts).run(fill.prompt + fill.suffix, len(fill.prompt), ask,
                                         snippets=fill.snippets)
        total_ms = (time.perf_counter() - t0) * 1000.0
        cands: list[Candidate] = res.candidates
        raw_tokens = {c.text: c.tokens for c in cands}
        if fill.raw:
            picked = [(c.text, c.text) for c in cands[: fill.n]]
        else:
            picked = [(s.text, s.raw) for s in res.suggestions]
        if not picked:
            picked = [("", "")]
        texts = []
        reasons = []
        words = []
        for text, raw in picked:
            if fill.n_indent > 0:
                text, dedented = cut_at_indent(text, fill.n_indent)
            else:
                dedented = False
            cut, word = earliest_stop(text, fill.stops)
            full = raw_tokens.get(raw, 0) >= max_tokens
            texts.append(cut)
            words.append(word)
            reasons.append("length" if full and not word and not dedented else "stop")
        counts = backend.encode_batch(texts)
        steps = max((c.steps for c in cands), default=0)
        choices = [Choice(t, r, len(c), w)
                   for t, r, c, w in zip(texts, reasons, counts, words, strict=True)]
        d = res.decision
        return FillResult(choices, res.context, steps, timed.model_ms,
                          max(0.0, total_ms - timed.model_ms),
                          steps_planned=None if res.planned else res.steps_asked,
                          budget_ms=res.budget_ms if res.planned else None,
                          max_steps=d.max_steps if d is not None and res.planned else None)

    # -- checks on the headers (before any body byte is read) --------------------------------
    def check_auth(self, request: web.Request) -> None:
        """401 unless the request presents the token (:class:`.http_connection.BearerToken`)."""
        self.token.check(request)

    def check_ready(self) -> None:
        if self.backend is None:
            what = self.load_error or "the model is still loading"
            raise RequestError(503, what, kind="server_error", code="model_not_ready",
                               headers={"Retry-After": "5" if self.load_error is None else "60"})

    def check_queue(self) -> None:
        """429 (counted) when no queue slot is left."""
        if self.pending >= self.config.max_queue:
            self.count("rejected_429")
            raise RequestError(429, f"server busy: {self.pending} requests queued "
                               f"(limit {self.config.max_queue}); retry later",
                               kind="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(self.retry_after_s())})

    def admit(self) -> None:
        """Take a queue slot (429 when none is left)."""
        self.check_queue()
        self.pending += 1

    def check_model(self, name: str | None) -> str:
        names = self.config.model_names
        if name is None or not names or name in names:
            return name or (names[0] if names else "diffill")
        # the name asked for is not repeated: the answer's note is logged, and a client
        # may have put its token in the wrong field
        raise RequestError(404, f"the model asked for is not served here (served: "
                           f"{', '.join(names)})", param="model", code="model_not_found")

    def check_limits(self, req: CompletionRequest) -> None:
        """The server's caps on what a request may cost (400 naming the field)."""
        limit = self.max_tokens_limit
        if req.max_tokens is not None and req.max_tokens > limit:
            hole = self.model_hole_limit
            why = (f"the model's positions hold at most {hole} tokens of hole and context"
                   if hole is not None and hole < self.config.max_request_tokens
                   else "the server's limit (--max-request-tokens)")
            raise RequestError(400, f"max_tokens={req.max_tokens} is over {limit}: {why}",
                               param="max_tokens", code="max_tokens_too_large")
        steps_cap = self.config.max_request_steps
        if req.steps is not None and req.steps > steps_cap:
            raise RequestError(400, f"steps={req.steps} is over the server's limit of {steps_cap} "
                               "(--max-request-steps)", param="steps", code="steps_too_large")

    def max_request_ms(self) -> float:
        """The cap on a request's predicted model time (``max_request_ms``, else the
        device's default, :data:`.http_cost.DEFAULT_MAX_REQUEST_MS`)."""
        if self.config.max_request_ms is not None:
            return self.config.max_request_ms
        device = self.backend.describe().get("device") if self.backend is not None else None
        return default_max_request_ms(str(device) if device else None)

    def price(self, fill: Fill) -> Price | None:
        """The predicted model time of one prompt (:mod:`.http_cost`; None: no plan)."""
        budget = self.options.context_tokens
        extra = sum(len(s.text) + len(s.path) + 16 for s in fill.snippets)
        return price(self.backend, ctx_tokens=min(budget, len(fill.prompt) + len(fill.suffix)
                                                  + extra),
                     max_tokens=fill.max_tokens, n=fill.n,
                     steps=fill.steps if fill.steps is not None else self.options.steps,
                     budget_ms=fill.latency_budget_ms or self.options.latency_budget_ms)

    def check_cost(self, fills: Sequence[Fill]) -> None:
        """A request whose prompts together would hold a worker longer than
        :meth:`max_request_ms` is a 400 naming what it costs (before it runs)."""
        cap = self.max_request_ms()
        prices = [p for p in (self.price(f) for f in fills) if p is not None]
        total = sum(p.ms for p in prices)
        if prices and total > cap:
            worst = max(prices, key=lambda p: p.ms)
            param = "steps" if fills[0].steps is not None else "max_tokens"
            raise RequestError(400, f"request too costly: {len(fills)} prompt(s), the largest "
                               f"{worst.describe()}; {total:.0f} ms in all is over the server's "
                               f"limit of {cap:.0f} ms of model time per request "
                               "(--max-request-ms); ask for fewer steps or tokens",
                               param=param, code="request_too_costly")

    async def read_body(self, request: web.Request) -> bytes:
        """The body, within ``body_timeout_s`` and ``max_body_bytes`` (408 / 413), decoded
        (a bad ``Content-Encoding`` or a body cut short: 400)."""
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(413, f"request body of {request.content_length} bytes exceeds the "
                               f"limit of {limit} bytes", code="request_too_large")
        timeout = self.config.body_timeout_s
        self.reading += 1
        try:
            body = await asyncio.wait_for(request.read(), timeout)
        except asyncio.TimeoutError:
            self.count("closed_body_timeout")
            raise RequestError(408, f"request body not received within {timeout:g} s",
                               code="body_timeout") from None
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"request body exceeds the limit of {limit} bytes",
                               code="request_too_large") from None
        except web.RequestPayloadError as e:
            encoding = request.headers.get("Content-Encoding", "")
            what = (f"cannot decode the body's Content-Encoding {printable(encoding)!r}"
                    if "encoding" in str(e).lower() else "malformed request body")
            raise RequestError(400, what, code="bad_body") from None
        except ConnectionError:
            self.count("body_incomplete")
            raise RequestError(400, "the connection closed before the whole body arrived",
                               code="body_incomplete") from None
        finally:
            self.reading -= 1
        conn = request.protocol
        if isinstance(conn, Connection):
            conn.body_read()
        return body

    # -- the request path shared by every route ----------------------------------------------
    @contextlib.asynccontextmanager
    async def admitted(self, request: web.Request) -> AsyncIterator[bytes]:
        """The checks on the headers (token, readiness, a queue slot), then the body: the
        request holds its queue slot until the block ends. Raises :class:`RequestError`."""
        self.check_auth(request)
        self.check_ready()
        self.admit()
        try:
            yield await self.read_body(request)
        finally:
            self.pending -= 1

    async def execute(self, request: web.Request, fills: list[Fill],
                      t0: float) -> list[FillResult]:
        """Run the prompts on a worker thread within the request timeout (measured from
        ``t0``, admission). Raises :class:`RequestError` (504 timeout, 499 client gone, 400
        from the backend, 500 model error); counts what happened."""
        transport = request.transport

        def closing() -> bool:
            return transport is None or transport.is_closing()

        timeout = self.config.request_timeout_s
        left = timeout - (time.perf_counter() - t0)
        job = Job(time.monotonic() + left, closing)
        loop = asyncio.get_running_loop()

        def work() -> list[FillResult]:
            with self._running_lock:
                self.running += 1
            try:
                return [self.complete_one(f, job) for f in fills]
            finally:
                with self._running_lock:
                    self.running -= 1

        timed_out = RequestError(504, f"request timed out after {timeout:g} s",
                                 kind="server_error", code="timeout")
        fut = loop.run_in_executor(self.executor, work)
        # the worker may finish after the answer went out (timeout, disconnect): its
        # result or exception is dropped here rather than reported as never retrieved
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            results = await asyncio.wait_for(asyncio.shield(fut), max(0.0, left))
        except asyncio.TimeoutError:
            job.timed_out = True
            job.aborted.set()  # a queued job never starts; a running one stops at its next step
            raise timed_out from None
        except asyncio.CancelledError:  # the handler of a closed connection is cancelled
            job.aborted.set()
            self.count("client_gone")
            raise
        except Cancelled:
            if job.timed_out:
                raise timed_out from None
            self.count("client_gone")
            raise RequestError(499, "client closed the request", kind="server_error",
                               code="client_gone") from None
        except BackendError as e:
            raise RequestError(400, str(e)) from None
        except Exception as e:  # the model failed (out of memory, ...): this request only
            raise RequestError(500, f"model error: {type(e).__name__}: {e}",
                               kind="server_error", code="model_error") from None
        self.latencies.append(time.perf_counter() - t0)
        self.count("completed")
        return results

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: the client waits for a go before sending its body;
        it gets one only when the token is right and a queue slot is free, else the
        error at once (and no body is ever sent)."""
        value = request.headers.get("Expect", "").lower()
        if request.version < (1, 1):
            return None
        try:
            if value != "100-continue":
                raise RequestError(417, "only 'Expect: 100-continue' is understood",
                                   code="expectation_failed")
            if request.method == "POST":
                limit = self.config.max_body_bytes
                if request.content_length is not None and request.content_length > limit:
                    raise RequestError(413, f"request body of {request.content_length} bytes "
                                       f"exceeds the limit of {limit} bytes",
                                       code="request_too_large")
                self.check_auth(request)
                self.check_ready()
                self.check_queue()
        except RequestError as e:
            self.count_error(e)
            resp = self.error_for(request, e)
            resp.force_close()
            return resp
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the real answer has not started
        return None

    # -- errors outside the handlers ---------------------------------------------------------
    def http_exception(self, request: web.BaseRequest, e: web.HTTPException) -> Reply:
        """aiohttp's own HTTP errors (no route: 404, wrong method: 405, ...) as JSON."""
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        if isinstance(e, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(e.allowed_methods))
            err = RequestError(405, f"method {e.method} is not allowed here (allowed: {allowed}); "
                               "this server answers no CORS preflight", code="method_not_allowed",
                               headers=headers)
        elif e.status == 404:
            err = RequestError(404, f"no such endpoint (this server has {ENDPOINTS})",
                               code="not_found")
        else:
            err = RequestError(e.status, e.reason, code=None, headers=headers,
                               kind="server_error" if e.status >= 500 else "invalid_request_error")
        self.count(f"http_{e.status}")
        return self.error_for(request, err)

    def error_for(self, request: web.BaseRequest, err: RequestError) -> Reply:
        """An error in the shape of the route asked for: llama-server's on ``/infill`` and
        ``/props``, OpenAI's everywhere else."""
        rid = request_id(request)
        if request.path in ("/infill", "/props"):

            return llama_error(err, rid)
        return error_response(err, rid)

    def make_app(self) -> web.Application:
        front = self

        @web.middleware
        async def guard(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            conn = request.protocol
            if isinstance(conn, Connection):
                conn.begin(request.body_exists)
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                resp = front.http_exception(request, e)
            except Exception as e:  # a bug of ours: one line, the traceback only at debug
                front.count("http_500")
                log.debug("internal error on %s", log_target(request.raw_path), exc_info=True)
                resp = error_response(RequestError(500, f"internal error ({type(e).__name__})",
                                                   kind="server_error", code="internal_error"),
                                      request_id(request))
            if request.body_exists and not request.content.is_eof():
                resp.force_close()  # an unread body: close rather than read it on
            return resp

        # aiohttp's own limit backs up the Content-Length check for chunked bodies.
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[guard])
        ex = self.expect
        self.openai = OpenAICompletions(self)
        self.openai.add_routes(app, ex)
        self.status = StatusRoutes(self)
        self.status.add_routes(app, ex)
        self.llama = LlamaInfill(self)
        self.llama.add_routes(app, ex)

        async def on_startup(app: web.Application) -> None:
            app[LOAD_TASK] = asyncio.ensure_future(self.load())

        async def on_cleanup(app: web.Application) -> None:
            task = app.get(LOAD_TASK)
            if task is not None and not task.done():
                task.cancel()
            self.executor.shutdown(wait=False, cancel_futures=True)

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app


__all__ = ["HttpFront", "Job"]
