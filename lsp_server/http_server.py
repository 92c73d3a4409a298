"""The engine as an OpenAI-compatible completions API (aiohttp), so one GPU box can
serve a team.

Endpoints
---------
``POST /v1/completions``
    ``prompt`` (text before the hole; a string or a list of strings), ``suffix``
    (text after it), ``max_tokens`` (longest middle, model tokens, default 16),
    ``temperature`` (default 0: greedy), ``stop`` (string or list of up to 4),
    ``n`` (candidates per prompt), ``model``, ``seed``, ``user``; diffill
    extensions ``raw`` (skip post-processing) and ``steps`` (refinement steps).
    Other OpenAI fields (``top_p``, penalties, ...) are accepted and ignored;
    ``stream``, ``echo``, ``logprobs``, ``best_of > n`` and ``logit_bias`` are
    refused with a 400 rather than silently wrong. Answer: the OpenAI shape
    (``id``, ``object="text_completion"``, ``created``, ``model``, ``choices``
    [``text``, ``index``, ``finish_reason``, ``logprobs: null``], ``usage``).
``GET /v1/models``
    The served model (``--served-model-name``, default the checkpoint folder's
    name, plus the alias ``diffill``).
``GET /health`` and ``GET /healthz``
    200 ``{"status": "ok", ...}`` once the model is loaded, 503 while loading or
    after a load failure (load balancers take the replica out). Never needs a token.

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
* Requests run on ``workers`` threads (default 4): context building and
  tokenisation overlap, and requests that reach the engine together are batched
  by it (:class:`diffill.model.engine.Engine` runs compatible queued requests as
  one forward per step; the device still does one batch at a time). At most
  ``max_queue`` requests are admitted (running + waiting); beyond that 429 with
  a ``Retry-After`` estimated from recent latencies.
* Bodies over ``max_body_bytes`` get 413 (checked on ``Content-Length`` and while
  reading a chunked body). Malformed JSON, wrong types, out-of-range values: 400
  naming the field (``error.param``), validated by msgspec Structs.
* With a token configured, ``/v1/*`` needs ``Authorization: Bearer <token>``
  (401 otherwise; constant-time comparison).
* A request is cancelled between diffusion steps when its client disconnects or
  its ``request_timeout_s`` passes (504). A model error (out of memory, ...) is a
  500 for that request only; the server stays up.
* ``X-Request-Id`` is echoed back (generated when absent). Prompts and
  completions are never logged unless ``debug_log_buffers`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import re
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta

from .backends import Backend, BackendError, Cancelled, Candidate
from .completer import Completer
from .context import FimContext
from .options import CompletionOptions

log = logging.getLogger("diffill.http")

DEFAULT_MAX_TOKENS = 16
MAX_STOP = 4
RETRYABLE_HINT_S = 1
NO_HEALING_HEADER = "X-Diffill-Token-Healing"
"""``X-Diffill-Token-Healing: 0`` turns server-side token healing off for a request
(sent by diffill's own ``openai`` backend, whose language server heals already)."""
LOAD_TASK = web.AppKey("diffill_load", asyncio.Task)


# ----------------------------------------------------------------------------- wire types


class CompletionRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/completions`` body. Unknown fields are accepted and ignored."""

    prompt: str | list[str]
    suffix: str | None = None
    model: str | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=1024)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    seed: int | None = None
    user: str | None = None
    stream: bool | None = None
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    raw: bool = False
    """diffill extension: return the model's middles without post-processing."""
    steps: Annotated[int, Meta(ge=1, le=512)] | None = None
    """diffill extension: refinement steps (default: the server's)."""


class RequestError(Exception):
    """A client error with an HTTP status, an OpenAI error ``type`` and the bad field."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code
        self.headers = headers or {}


def error_response(err: RequestError, request_id: str | None = None) -> web.Response:
    body = {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}
    headers = dict(err.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    return web.Response(status=err.status, body=msgspec.json.encode(body),
                        content_type="application/json", headers=headers)


def _param_of(e: msgspec.ValidationError) -> str | None:
    """The top-level field a msgspec error is about: ``"... - at `$.max_tokens[0]`"``
    or ``"Object missing required field `prompt`"``."""
    msg = str(e)
    m = re.search(r"at `\$\.(\w+)", msg) or re.search(r"required field `(\w+)`", msg)
    return m.group(1) if m else None


def parse_request(body: bytes) -> CompletionRequest:
    """Decode and validate a request body; raises :class:`RequestError` (400)."""
    try:
        req = msgspec.json.decode(body, type=CompletionRequest)
    except msgspec.ValidationError as e:
        raise RequestError(400, f"invalid request: {e}", param=_param_of(e)) from None
    except msgspec.DecodeError as e:
        raise RequestError(400, f"malformed JSON body: {e}") from None
    if req.stream:
        raise RequestError(400, "stream=true is not supported; send stream=false", param="stream")
    if req.echo:
        raise RequestError(400, "echo=true is not supported", param="echo")
    if req.logprobs:
        raise RequestError(400, "logprobs are not supported; send null", param="logprobs")
    if req.best_of is not None and req.best_of != req.n:
        raise RequestError(400, "best_of must equal n (candidates are ranked by the model)",
                           param="best_of")
    if req.logit_bias:
        raise RequestError(400, "logit_bias is not supported", param="logit_bias")
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not prompts:
        raise RequestError(400, "prompt must be a string or a non-empty list of strings",
                           param="prompt")
    if len(prompts) * req.n > 16:
        raise RequestError(400, f"{len(prompts)} prompts x n={req.n} exceeds 16 choices",
                           param="prompt")
    stops = stop_list(req.stop)
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise RequestError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} "
                           "non-empty strings", param="stop")
    return req


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop sequence (excluded); (text, whether one was found)."""
    best = -1
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best = i
    return (text, False) if best < 0 else (text[:best], True)


# ----------------------------------------------------------------------------- config & state


@dataclass
class HttpConfig:
    """Serving limits and identity."""

    token: str | None = None
    """Bearer token required on /v1/* (None: no auth)."""
    max_queue: int = 32
    """Requests admitted at once (running + waiting); more get 429."""
    workers: int = 4
    """Threads running requests (the engine batches the ones that meet)."""
    max_body_bytes: int = 4 * 1024 * 1024
    request_timeout_s: float = 60.0
    model_names: list[str] = field(default_factory=lambda: ["diffill"])
    """Names ``model`` may take; the first is reported. Empty: any name accepted."""
    debug_log_buffers: bool = False


@dataclass
class Choice:
    text: str
    finish_reason: str
    tokens: int


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
    the admission counter, statistics."""

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
        self.options = options
        self.config = config
        self.backend = backend
        self.loader = loader
        self.load_error: str | None = None
        self.executor = ThreadPoolExecutor(max_workers=max(1, config.workers),
                                           thread_name_prefix="diffill-http-model")
        self.pending = 0
        self.counters: dict[str, int] = {}
        self.latencies: deque[float] = deque(maxlen=200)
        self.started = time.time()

    # -- model ------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the model on the worker thread (health says 503 meanwhile)."""
        if self.backend is not None or self.loader is None:
            return
        t0 = time.perf_counter()
        loader = self.loader

        def work() -> Backend:
            backend = loader()
            backend.warmup()
            return backend

        try:
            self.backend = await asyncio.get_running_loop().run_in_executor(self.executor, work)
        except Exception as e:
            self.load_error = f"cannot load model: {type(e).__name__}: {e}"
            log.error("%s", self.load_error)
        else:
            log.info("model loaded in %.2f s: %s", time.perf_counter() - t0, self.backend.describe())

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def retry_after_s(self) -> int:
        """Seconds a rejected client should wait: queue length x mean latency."""
        lat = list(self.latencies)
        mean = sum(lat) / len(lat) if lat else 1.0
        waves = max(self.pending, 1) / max(1, self.config.workers)
        return max(RETRYABLE_HINT_S, math.ceil(mean * waves))

    # -- the model call (worker thread) ------------------------------------------------------
    def complete_one(self, req: CompletionRequest, prompt: str, job: Job, *,
                     healing: bool = True) -> tuple[list[Choice], FimContext]:
        """One prompt through the language server's text path (:meth:`Completer.run`:
        context, token healing, model, post-processing); ``raw`` skips token healing and
        post-processing (the model's middles at the cursor, untouched); ``healing=False``
        skips token healing only (the client healed already)."""
        backend = self.backend
        assert backend is not None
        max_tokens = req.max_tokens or DEFAULT_MAX_TOKENS
        opts = msgspec.structs.replace(self.options, max_tokens=max_tokens)
        if req.raw or not healing:
            opts = msgspec.structs.replace(opts, token_healing=False)
        temperature = req.temperature or 0.0
        extra: dict[str, Any] = {"temperature": temperature, "seed": req.seed} if temperature > 0 else {}
        res = Completer(backend, opts).run(
            prompt + (req.suffix or ""),
            len(prompt),
            n=req.n,
            cancel=job.cancel,
            steps=req.steps,
            backend_kwargs=extra,
        )
        cands: list[Candidate] = res.candidates
        stops = stop_list(req.stop)
        raw_tokens = {c.text: c.tokens for c in cands}
        if req.raw:
            picked = [(c.text, c.text) for c in cands[: req.n]]
        else:
            picked = [(s.text, s.raw) for s in res.suggestions]
        if not picked:
            picked = [("", "")]
        texts = []
        reasons = []
        for text, raw in picked:
            cut, stopped = cut_at_stop(text, stops)
            full = raw_tokens.get(raw, 0) >= max_tokens
            texts.append(cut)
            reasons.append("length" if full and not stopped else "stop")
        counts = backend.encode_batch(texts)
        return [Choice(t, r, len(c)) for t, r, c in zip(texts, reasons, counts, strict=True)], res.context

    # -- handlers ----------------------------------------------------------------------------
    def check_auth(self, request: web.Request) -> None:
        token = self.config.token
        if token is None:
            return
        got = request.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise RequestError(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_model(self, name: str | None) -> str:
        names = self.config.model_names
        if name is None or not names or name in names:
            return name or (names[0] if names else "diffill")
        raise RequestError(404, f"model {name!r} is not served here (served: {', '.join(names)})",
                           param="model", code="model_not_found")

    async def read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(413, f"request body of {request.content_length} bytes exceeds the "
                               f"limit of {limit} bytes", code="request_too_large")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"request body exceeds the limit of {limit} bytes",
                               code="request_too_large") from None

    async def completions(self, request: web.Request) -> web.Response:
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        t0 = time.perf_counter()
        try:
            self.check_auth(request)
            body = await self.read_body(request)
            req = parse_request(body)
            model_name = self.check_model(req.model)
            if self.backend is None:
                what = self.load_error or "the model is still loading"
                raise RequestError(503, what, kind="server_error", code="model_not_ready",
                                   headers={"Retry-After": "5" if self.load_error is None else "60"})
            if self.pending >= self.config.max_queue:
                self.count("rejected_429")
                raise RequestError(429, f"server busy: {self.pending} requests queued "
                                   f"(limit {self.config.max_queue}); retry later",
                                   kind="rate_limit_error", code="queue_full",
                                   headers={"Retry-After": str(self.retry_after_s())})
        except RequestError as e:
            if e.status != 429:
                self.count(f"http_{e.status}")
            return error_response(e, rid)
        healing = request.headers.get(NO_HEALING_HEADER, "").strip().lower() not in ("0", "false", "off")
        response = await self._run(request, req, model_name, rid, t0, healing)
        return response

    async def _run(self, request: web.Request, req: CompletionRequest, model_name: str,
                   rid: str, t0: float, healing: bool = True) -> web.Response:
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        transport = request.transport

        def closing() -> bool:
            return transport is None or transport.is_closing()

        job = Job(time.monotonic() + self.config.request_timeout_s, closing)
        self.pending += 1
        loop = asyncio.get_running_loop()

        def work() -> list[tuple[list[Choice], FimContext]]:
            return [self.complete_one(req, p, job, healing=healing) for p in prompts]

        try:
            results = await loop.run_in_executor(self.executor, work)
        except asyncio.CancelledError:  # aiohttp cancels the handler of a closed connection
            job.aborted.set()
            self.count("client_gone")
            raise
        except Cancelled:
            if job.timed_out:
                self.count("http_504")
                return error_response(RequestError(504, "request timed out", kind="server_error",
                                                   code="timeout"), rid)
            self.count("client_gone")
            return error_response(RequestError(499, "client closed the request",
                                               kind="server_error"), rid)
        except BackendError as e:
            self.count("http_400")
            return error_response(RequestError(400, str(e)), rid)
        except Exception as e:  # the model failed (out of memory, ...): this request only
            self.count("http_500")
            log.error("model error on request %s: %s: %s", rid, type(e).__name__, e)
            return error_response(RequestError(500, f"model error: {type(e).__name__}: {e}",
                                               kind="server_error", code="model_error"), rid)
        finally:
            self.pending -= 1
        dt = time.perf_counter() - t0
        self.latencies.append(dt)
        self.count("completed")
        choices = []
        prompt_tokens = 0
        completion_tokens = 0
        for i, (chs, ctx) in enumerate(results):
            prompt_tokens += ctx.prefix_tokens + ctx.suffix_tokens
            for j, ch in enumerate(chs):
                completion_tokens += ch.tokens
                choices.append({"text": ch.text, "index": i * req.n + j,
                                "finish_reason": ch.finish_reason, "logprobs": None})
        if self.config.debug_log_buffers:
            log.debug("request %s prompt tail %r suffix head %r -> %r", rid, prompts[0][-200:],
                      (req.suffix or "")[:200], [c["text"] for c in choices])
        log.info("request %s: %d prompt(s), %d prompt tokens -> %d choices, %.1f ms",
                 rid, len(prompts), prompt_tokens, len(choices), dt * 1000.0)
        out = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }
        return web.Response(body=msgspec.json.encode(out), content_type="application/json",
                            headers={"X-Request-Id": rid})

    async def models(self, request: web.Request) -> web.Response:
        try:
            self.check_auth(request)
        except RequestError as e:
            return error_response(e)
        data = [{"id": name, "object": "model", "created": int(self.started), "owned_by": "diffill"}
                for name in (self.config.model_names or ["diffill"])]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        if self.backend is not None:
            status, code = "ok", 200
        elif self.load_error is not None:
            status, code = "error", 503
        else:
            status, code = "loading", 503
        desc = self.backend.describe() if self.backend is not None else {}
        body = {
            "status": status,
            "error": self.load_error,
            "model": self.config.model_names[0] if self.config.model_names else None,
            "device": desc.get("device"),
            "queue": self.pending,
            "max_queue": self.config.max_queue,
            "uptime_s": round(time.time() - self.started, 1),
            "engine_requests": desc.get("engine_requests"),
            "engine_batches": desc.get("engine_batches"),
            "engine_max_batch_requests": desc.get("engine_max_batch_requests"),
            **self.counters,
        }
        return web.json_response(body, status=code)

    def make_app(self) -> web.Application:
        # aiohttp's own limit backs up the Content-Length check for chunked bodies.
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/healthz", self.health)

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


async def serve(front: HttpFront, host: str, port: int,
                 ready: Callable[[str], None] | None = None) -> None:
    """Listen on ``host:port`` until SIGINT/SIGTERM; ``ready(url)`` once bound (port 0
    picks a free port; the URL names the real one). Logs "listening on URL"."""
    runner = web.AppRunner(front.make_app(), access_log_format='%a "%r" %s %b %Tf')
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname() if site._server and site._server.sockets else (host, port)
    h = bound[0]
    url = f"http://[{h}]:{bound[1]}" if ":" in h else f"http://{h}:{bound[1]}"
    log.info("listening on %s", url)
    if ready is not None:
        ready(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


__all__ = [
    "CompletionRequest",
    "HttpConfig",
    "HttpFront",
    "RequestError",
    "cut_at_stop",
    "parse_request",
    "serve",
]
