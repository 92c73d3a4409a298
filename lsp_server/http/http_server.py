"""The engine as an OpenAI-compatible completions API (aiohttp), so one GPU box can
serve a team.

Endpoints
---------
``POST /v1/completions``
    ``prompt`` (text before the hole; a string or a list of strings), ``suffix``
    (text after it), ``max_tokens`` (longest middle, model tokens, default 16),
    ``temperature`` (default 0: greedy), ``stop`` (string or list of up to 16),
    ``n`` (candidates per prompt), ``model``, ``seed``, ``user``; diffill
    extensions ``raw`` (skip post-processing) and ``steps`` (refinement steps).
    Other OpenAI fields (``top_p``, penalties, ...) are accepted and ignored;
    ``echo``, ``logprobs``, ``best_of > n`` and ``logit_bias`` are refused with a 400
    rather than silently wrong. ``stream: true`` answers server-sent events in the OpenAI
    chunk shape (each choice's whole text in one chunk, once the middle is decided -- the
    diffusion model commits the middle as a whole -- then ``data: [DONE]``); each chunk's
    choices carry ``delta.content`` too, for clients that read the chat shape (Continue).
    A ``prompt`` that writes the hole in a model family's FIM tokens and sends no
    ``suffix`` (Zed's ``prompt_format``, Continue's legacy templates) is split back into
    prefix and suffix (:mod:`.fim_prompt`).
``POST /v1/fim/completions``
    The same (Continue's route for providers with FIM). Answer: the OpenAI shape
    (``id``, ``object="text_completion"``, ``created``, ``model``, ``choices``
    [``text``, ``index``, ``finish_reason``, ``logprobs: null``], ``usage``) plus a
    ``diffill`` object: ``steps`` (refinement steps each prompt's middle took),
    ``steps_planned`` (the step count the sampler ran with, when the request or
    ``--steps`` set it), ``steps_from`` (``"request"``, ``"server"`` = ``--steps``, or
    ``"latency_budget"``) and ``latency_budget_ms`` / ``max_steps`` (what a
    budget-chosen count was bounded by).
``GET /v1/models`` and ``GET /v1/models/{model}``
    The served model (``--served-model-name``, default the checkpoint folder's
    name, plus the alias ``diffill``); an unknown id is a 404 ``model_not_found``.
``POST /infill`` and ``GET /props``
    llama-server's fill-in-the-middle contract (llama.vim, llama.vscode), in
    :mod:`.llama_infill`, over the same request path (:meth:`HttpFront.complete_one`).
``GET /health``, ``GET /healthz`` and ``GET /v1/health``
    200 ``{"status": "ok", ...}`` once the model is loaded, 503 while loading or
    after a load failure (load balancers take the replica out). Never needs a token.
    Also the limits in force and the counters (requests by outcome, connections
    closed by each timeout, connections refused).

The text path is the language server's: ``prompt + suffix`` is one document with
the cursor between them, cut to the token budget by :mod:`.context`
(:meth:`.completer.Completer.run`: token healing, the backend, post-processing
by :func:`.completer.finish`; ``raw`` skips healing and post-processing), then cut
at the first ``stop`` sequence. A client that does its own token healing (the
language server's ``openai`` backend) sends ``X-Diffill-Token-Healing: 0`` so the
hole is not backed off twice. ``finish_reason`` is ``"stop"`` when the model ended the middle itself
(pad/EOS inside the hole) or a stop sequence cut it, ``"length"`` when the middle
filled the whole ``max_tokens`` hole. ``n`` > 1 asks the backend for several
candidate hole lengths; identical (after post-processing) or empty candidates are
merged, so up to ``n`` choices come back -- at least one, possibly with empty
text. ``usage.prompt_tokens`` counts what the model saw (prefix + suffix windows,
not the whole prompt when it was cut), ``completion_tokens`` the choices' texts.

Serving discipline
------------------
* **Connections** (:class:`_Connection`): the request line and headers must arrive
  within ``header_timeout_s`` of the connection opening (or of the first byte of
  a later request on a kept-alive connection), else 408 and the connection is
  closed; a kept-alive connection idle for ``idle_timeout_s`` is closed. At
  ``max_connections`` open connections a new one makes room (:meth:`HttpFront.make_room`):
  connections whose peer already left are dropped, then the longest-waiting connection
  with no request in progress is closed, never-authenticated ones first; only when every
  connection is busy is the newcomer refused with 503. Each is counted
  (``closed_header_timeout``, ``closed_idle``, ``closed_peer_gone``,
  ``evicted_connections``, ``rejected_connections``).
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
* With a token configured, ``/v1/*`` needs ``Authorization: Bearer <token>``
  (401 otherwise; the SHA-256 digests are compared in constant time, so neither the
  comparison nor an error message depends on the token's length).
* ``request_timeout_s`` after admission a request still unanswered gets 504 at once;
  its worker stops at the next diffusion step (a queued one never starts). A client
  that disconnects is cancelled the same way. A model error (out of memory, ...) is
  a 500 for that request only; the server stays up.
* **Errors and logs**: every error, including aiohttp's own (bad request line,
  bad header, unknown route 404, 405 with ``Allow``, a CORS preflight), is JSON in
  the OpenAI error shape, and every request is one access-log line (status, request
  id, the error code and message, no traceback). The log never holds the token:
  query values and keys (but the usual credential names) and path segments other than
  the routes' words are redacted (:func:`log_target`), no error repeats a requested
  model name, header values are never logged, prompts and completions only with
  ``debug_log_buffers``. ``X-Request-Id`` is echoed back (generated when
  absent or not a short printable string).

Test hook: ``DIFFILL_DEBUG_LOAD_GATE=<path>`` holds the model load (``/health`` says
``loading``) until that file exists, so load-balancer tests control how long a replica
stays out. Never set it in normal use.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from ..backend.backends import Backend, BackendError, Cancelled, Candidate, InfillAsk, InfillResult
from ..completion.completer import Completer, CompletionAsk
from ..completion.options import CompletionOptions
from ..text.context import FimContext
from ..text.fim_prompt import split_fim_prompt
from .http_cost import Price, default_max_request_ms, price
from .http_wire import (  # re-exported: the wire types live there
    DEFAULT_MAX_TOKENS,
    Choice,
    CompletionRequest,
    Fill,
    FillResult,
    Reply,
    RequestError,
    cut_at_indent,
    cut_at_stop,
    earliest_stop,
    error_response,
    log_target,
    parse_request,
    printable,
    raw_error,
    request_id,
    stop_list,
)
from .llama_infill import LlamaInfill, llama_error

log = logging.getLogger("diffill.http")
access_log = logging.getLogger("diffill.http.access")

RETRYABLE_HINT_S = 1
LOAD_GATE_ENV = "DIFFILL_DEBUG_LOAD_GATE"
NO_HEALING_HEADER = "X-Diffill-Token-Healing"
"""``X-Diffill-Token-Healing: 0`` turns server-side token healing off for a request
(sent by diffill's own ``openai`` backend, whose language server heals already)."""
LOAD_TASK = web.AppKey("diffill_load", asyncio.Task)
HEALTH_PATHS = frozenset({"/health", "/healthz", "/v1/health"})
ENDPOINTS = ("POST /v1/completions (and /v1/fim/completions), GET /v1/models, GET /v1/models/{model}, GET /health, "
             "POST /infill, GET /props")


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


# ----------------------------------------------------------------------------- config & state


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
        self.connections: set[_Connection] = set()
        self.counters: dict[str, int] = {}
        self.latencies: deque[float] = deque(maxlen=200)
        self.started = time.time()
        self.max_tokens_limit = config.max_request_tokens
        self.model_hole_limit: int | None = None
        digest = hashlib.sha256(config.token.encode()).digest() if config.token else None
        self._token_digest = digest
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

    def make_room(self) -> None:
        """At the connection cap, before a new connection is refused: connections whose
        peer has already gone are dropped (the count then is the real one), then one
        connection that is waiting rather than working is closed for the newcomer -- a
        never-authenticated one first, the longest waiting first; with a token configured,
        a stranger's kept-alive connections never lock out the team, and without one a
        client that holds connections open idle only ever holds the oldest slots. Busy
        connections (a request being read or run) are never closed; only when all are
        busy is the newcomer refused (503)."""
        for conn in [c for c in self.connections if c.evictable() and c.peer_gone()]:
            self.connections.discard(conn)
            self.count("closed_peer_gone")
            conn.force_close()
        if len(self.connections) < self.config.max_connections:
            return
        waiting = [c for c in self.connections if c.evictable()]
        if not waiting:
            return
        victim = min(waiting, key=lambda c: (c.authed, c.since))
        self.connections.discard(victim)
        self.count("evicted_connections")
        log.info("connection cap: closed a %s %s connection for a new one",
                 "authenticated" if victim.authed else "unauthenticated", victim.phase)
        if victim.phase == "header":
            victim._refuse(RequestError(503, "connection closed to make room for another: "
                                        "send the request right after connecting",
                                        kind="server_error", code="too_many_connections",
                                        headers={"Retry-After": "1"}))
        else:
            victim.force_close()

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
        if self._token_digest is None:
            return
        got = request.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        # header values arrive as str with undecodable bytes as surrogates: encode them
        # back losslessly; digests make the comparison independent of the token's length
        presented = hashlib.sha256(value.strip().encode("utf-8", "surrogateescape")).digest()
        if not (hmac.compare_digest(presented, self._token_digest) and scheme.lower() == "bearer"):
            raise RequestError(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        conn = request.protocol
        if isinstance(conn, _Connection):
            conn.authed = True

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
        if isinstance(conn, _Connection):
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

    def openai_fills(self, req: CompletionRequest, healing: bool) -> list[Fill]:
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        max_tokens = req.max_tokens or min(DEFAULT_MAX_TOKENS, self.max_tokens_limit)
        fills = []
        for p in prompts:
            suffix = req.suffix
            if suffix is None:  # the hole written in FIM tokens (Zed, Continue's templates)
                split = split_fim_prompt(p)
                if split is not None:
                    p, suffix = split.prefix, split.suffix
            fills.append(Fill(prompt=p, suffix=suffix or "", max_tokens=max_tokens, n=req.n,
                              temperature=req.temperature or 0.0, seed=req.seed,
                              steps=req.steps, raw=req.raw, healing=healing,
                              stops=stop_list(req.stop)))
        return fills

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

    # -- handlers ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        rid = request_id(request)
        t0 = time.perf_counter()
        try:
            async with self.admitted(request) as body:
                req = parse_request(body)
                model_name = self.check_model(req.model)
                self.check_limits(req)
                healing = request.headers.get(NO_HEALING_HEADER, "").strip().lower() not in (
                    "0", "false", "off")
                fills = self.openai_fills(req, healing)
                self.check_cost(fills)
                results = await self.execute(request, fills, t0)
        except RequestError as e:
            if e.status not in (429, 499):
                self.count(f"http_{e.status}")
            return error_response(e, rid)
        answer = self.openai_answer(req, fills, results, model_name, rid)
        if req.stream:
            return await self.stream_answer(request, answer)
        return answer

    async def stream_answer(self, request: web.Request, answer: Reply) -> web.StreamResponse:
        """The answer as server-sent events: one chunk per choice (its whole text and its
        ``finish_reason``; ``delta.content`` as well), then ``[DONE]``. No usage chunk: a
        chunk without choices breaks clients that read ``choices[0]`` of every chunk."""
        out = msgspec.json.decode(answer.body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Request-Id": answer.headers["X-Request-Id"]})
        await resp.prepare(request)
        base = {k: out[k] for k in ("id", "object", "created", "model")}
        for ch in out["choices"]:
            chunk = {**base, "choices": [{**ch, "delta": {"content": ch["text"]}}]}
            await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def openai_answer(self, req: CompletionRequest, fills: list[Fill],
                      results: list[FillResult], model_name: str, rid: str) -> Reply:
        choices = []
        prompt_tokens = 0
        completion_tokens = 0
        steps = []
        for i, r in enumerate(results):
            prompt_tokens += r.context.prefix_tokens + r.context.suffix_tokens
            steps.append(r.steps)
            for j, ch in enumerate(r.choices):
                completion_tokens += ch.tokens
                choices.append({"text": ch.text, "index": i * req.n + j,
                                "finish_reason": ch.finish_reason, "logprobs": None})
        if self.config.debug_log_buffers:
            log.debug("request %s prompt tail %r suffix head %r -> %r", rid, fills[0].prompt[-200:],
                      fills[0].suffix[:200], [c["text"] for c in choices])
        out = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "diffill": self.step_report(req, results),
        }
        resp = Reply(body=msgspec.json.encode(out), content_type="application/json",
                     headers={"X-Request-Id": rid})
        resp.note = (f"{len(fills)} prompt(s), {prompt_tokens} prompt tokens -> {len(choices)} "
                     f"choices, steps {steps}")
        return resp

    def step_report(self, req: CompletionRequest, results: list[FillResult]) -> dict[str, Any]:
        """The ``diffill`` object of an answer: ``steps``, the refinement steps each
        prompt's middle took (the model may finish a short middle in fewer than planned);
        ``steps_planned``, the count the sampler ran with (the request's or ``--steps``;
        None when the backend's latency-budget policy chose it); what chose them -- all read
        from the step decision each prompt's result carries back."""
        steps = [r.steps for r in results]
        first = results[0]
        if first.steps_planned is None:
            return {"steps": steps, "steps_planned": None, "steps_from": "latency_budget",
                    "latency_budget_ms": first.budget_ms,
                    "max_steps": self.options.max_steps if first.max_steps is None else first.max_steps}
        return {"steps": steps, "steps_planned": first.steps_planned,
                "steps_from": "request" if req.steps is not None else "server",
                "latency_budget_ms": None, "max_steps": None}

    async def models(self, request: web.Request) -> web.StreamResponse:
        try:
            self.check_auth(request)
        except RequestError as e:
            self.count(f"http_{e.status}")
            return error_response(e, request_id(request))
        data = [self._model_object(name) for name in (self.config.model_names or ["diffill"])]
        return Reply(body=msgspec.json.encode({"object": "list", "data": data}),
                     content_type="application/json", headers={"X-Request-Id": request_id(request)})

    async def model(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models/{model}`` (the openai client's ``models.retrieve``)."""
        name = request.match_info["model"]
        try:
            self.check_auth(request)
            names = self.config.model_names or ["diffill"]
            if name not in names:  # not repeated (see check_model)
                raise RequestError(404, f"the model asked for is not served here (served: "
                                   f"{', '.join(names)})", param="model", code="model_not_found")
        except RequestError as e:
            self.count(f"http_{e.status}")
            return error_response(e, request_id(request))
        return Reply(body=msgspec.json.encode(self._model_object(name)),
                     content_type="application/json", headers={"X-Request-Id": request_id(request)})

    def _model_object(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(self.started), "owned_by": "diffill"}

    async def health(self, request: web.Request) -> web.StreamResponse:
        if self.backend is not None:
            status, code = "ok", 200
        elif self.load_error is not None:
            status, code = "error", 503
        else:
            status, code = "loading", 503
        desc = self.backend.describe() if self.backend is not None else {}
        c = self.config
        body = {
            "status": status,
            "error": self.load_error,
            "model": c.model_names[0] if c.model_names else None,
            "device": desc.get("device"),
            "queue": self.pending,
            "max_queue": c.max_queue,
            "reading_body": self.reading,
            "running": self.running,
            "connections": len(self.connections),
            "limits": {
                "max_connections": c.max_connections,
                "header_timeout_s": c.header_timeout_s,
                "body_timeout_s": c.body_timeout_s,
                "idle_timeout_s": c.idle_timeout_s,
                "request_timeout_s": c.request_timeout_s,
                "max_body_bytes": c.max_body_bytes,
                "max_request_steps": c.max_request_steps,
                "max_request_tokens": self.max_tokens_limit,
                "max_request_ms": self.max_request_ms() if self.backend is not None else None,
            },
            "uptime_s": round(time.time() - self.started, 1),
            "engine_requests": desc.get("engine_requests"),
            "engine_batches": desc.get("engine_batches"),
            "engine_max_batch_requests": desc.get("engine_max_batch_requests"),
            **self.counters,
        }
        return Reply(body=msgspec.json.encode(body), status=code, content_type="application/json",
                     headers={"X-Request-Id": request_id(request)})

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
            if e.status != 429:
                self.count(f"http_{e.status}")
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
            if isinstance(conn, _Connection):
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
        app.router.add_post("/v1/completions", self.completions, expect_handler=ex)
        app.router.add_post("/v1/fim/completions", self.completions, expect_handler=ex)
        app.router.add_get("/v1/models", self.models, expect_handler=ex)
        app.router.add_get("/v1/models/{model:.+}", self.model, expect_handler=ex)
        app.router.add_get("/health", self.health, expect_handler=ex)
        app.router.add_get("/healthz", self.health, expect_handler=ex)
        app.router.add_get("/v1/health", self.health, expect_handler=ex)

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


# ----------------------------------------------------------------------------- connections


class _Connection(web.RequestHandler):
    """aiohttp's HTTP/1.1 protocol with the connection discipline of :class:`HttpFront`:
    header / idle timeouts, the connection cap, and aiohttp's own errors as JSON with a
    one-line log (never the raw bytes, which may hold a token).

    Phases: ``header`` (waiting for a complete request head, ``header_timeout_s``),
    ``busy`` (a handler runs; the body has its own timeout in :meth:`HttpFront.read_body`),
    ``idle`` (kept alive between requests, ``idle_timeout_s``)."""

    def __init__(self, manager: web.Server, front: HttpFront, **kw: Any) -> None:
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
            self._refuse(RequestError(408, f"request line and headers not received within {t:g} s",
                                      code="header_timeout"))
        elif self.phase == "idle":
            f.count("closed_idle")
            log.debug("%s: closed, idle for %g s", who, f.config.idle_timeout_s)
            self.force_close()

    def _refuse(self, err: RequestError) -> None:
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
            f.make_room()
        if len(f.connections) >= f.config.max_connections:
            f.count("rejected_connections")
            log.info("connection refused: %d open (max_connections)", len(f.connections))
            self._refuse(RequestError(503, f"too many open connections (limit "
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


# ----------------------------------------------------------------------------- listening


class Listener:
    """A running server: :meth:`start` binds, :attr:`url` names the real port,
    :meth:`close` stops accepting, closes the connections and cleans the app up."""

    def __init__(self, front: HttpFront) -> None:
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
            # aiohttp's own keep-alive timer only backs up ours (_Connection)
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
            lambda: _Connection(manager, front, loop=loop, **kw), host, port)
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


async def serve(front: HttpFront, host: str, port: int,
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
    "CompletionRequest",
    "HttpConfig",
    "HttpFront",
    "ListenError",
    "Listener",
    "RequestError",
    "cut_at_stop",
    "log_target",
    "parse_request",
    "serve",
]
