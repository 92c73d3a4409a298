"""llama-server's fill-in-the-middle contract, ``POST /infill`` and ``GET /props``, so that
llama.vim and llama.vscode (ggml-org) work against ``diffill serve-http`` by changing one
URL. The contract is read from llama.cpp's ``tools/server/README.md`` and from what those
two clients send and read; every prompt goes through the same request path as the OpenAI
route (:meth:`.http_server.HttpFront.complete_one`: context, token healing, the model,
post-processing) under the same admission, token, caps and timeouts.

Request (JSON; unknown fields are accepted and ignored)
-------------------------------------------------------
``input_prefix``
    The text above the cursor's line (llama.vim: whole lines, each ending in a newline).
``prompt``
    The cursor line's text before the cursor: the model's prefix is ``input_prefix +
    prompt``.
``input_suffix``
    The text after the cursor.
``input_extra``
    ``[{"filename", "text"}, ...]``: chunks of other files, given to the context builder
    as cross-file extra context (:class:`.context.Snippet`), written the way the context
    builder writes every other file: a ``<comment> path: <filename>`` line, then the text,
    in front of the prefix, inside a bounded share of the prefix budget
    (``extra_context_fraction``); the chunks that do not fit are left out (``truncated``).
``n_predict``
    The longest middle in model tokens (-1 or absent: :data:`DEFAULT_N_PREDICT`). Above
    the server's ``--max-request-tokens`` it is lowered to that (llama-server bounds it by
    its context the same way), and the answer's ``generation_settings.n_predict`` says so.
    ``0`` is llama.vim's idle warm-up (below).
``t_max_predict_ms``
    The request's latency budget: the step plan picks the refinement steps that fit it
    (bounded by ``--max-request-ms``). Honoured.
``t_max_prompt_ms``
    Accepted, not honoured: a diffusion model has no separate prompt phase (the context is
    read in every step, inside ``t_max_predict_ms``).
``n_indent``
    The middle is cut before its first later line indented less than this. Honoured.
``temperature``
    0 (default): greedy; above: sampled (``seed`` repeats it). Honoured.
``top_k``, ``top_p``, ``min_p``, ``samplers``, ``cache_prompt``, ``id_slot``
    Accepted and ignored (the diffusion sampler has no such stages; there are no slots).
``stop``
    Up to 4 strings; the middle is cut at the earliest. Honoured.
``stream``
    ``false`` only: llama.vim and llama.vscode never stream ``/infill``; ``true`` is a 400.
``response_fields``
    When given, the answer holds just those fields, a nested one as a flat key
    (``"timings/prompt_n"``), fields that do not exist left out (llama.vim's warm-up asks
    for ``[""]`` and gets ``{}``).

Answer
------
``content`` (the text to insert at the cursor), ``stop: true``, ``stop_type`` (``"eos"``:
the model ended the middle; ``"limit"``: it filled ``n_predict``; ``"word"``: a ``stop``
string cut it), ``stopping_word``, ``tokens_predicted`` (tokens of ``content``),
``tokens_evaluated`` (tokens of context the model read), ``tokens_cached`` (of those, the
extra context's tokens taken from the tokenization cache a warm-up filled), ``truncated``
(the context was cut to the budget or an ``input_extra`` chunk was left out),
``has_new_line``, ``id_slot``, ``index``, ``model``, ``generation_settings`` (what was
honoured) and ``timings``: ``prompt_n`` / ``prompt_ms`` (context: building, tokenizing,
healing, post-processing -- the worker's time outside the model) and ``predicted_n`` /
``predicted_ms`` (the model's denoising steps), each with ``*_per_token_ms`` and
``*_per_second``. Plus ``diffill.steps``.

Errors are llama-server's shape, ``{"error": {"code": <status>, "message", "type"}}``
(``invalid_request_error``, ``authentication_error``, ``not_found_error``,
``unavailable_error``, ``server_error``), with the same statuses and headers as the OpenAI
route (401 + ``WWW-Authenticate``, 429/503 + ``Retry-After``, 413, 408, 504).

The idle warm-up
----------------
llama.vim sends, while the user is idle, ``n_predict: 0`` with its ring of extra chunks
(llama.vscode does the same) so that llama-server pre-fills its KV cache. Here it is
answered at once (no model call), and the chunks are tokenized in the background into a
bounded cache (:class:`TokenCache`) that the next requests' context builder reads: the
extra context is the part of the prompt that repeats from request to request, and
tokenizing it is the part of the prompt's cost the engine can do ahead (the diffusion
model reads the context again in every step, so there is no KV cache to pre-fill across
requests).

``GET /props``
    ``default_generation_settings`` (``n_ctx``: the context budget; ``params``:
    ``n_predict``, ``temperature``), ``total_slots`` (the worker threads), ``model_path``
    (the served model's name, never a path on this machine), ``build_info``, and which
    request fields are honoured. Needs the token like ``/infill``; ``/health`` does not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta

from ..completion.completer import Completer
from ..text.context import Snippet
from .http_wire import (
    MAX_STOP,
    Fill,
    FillResult,
    Reply,
    RequestError,
    decode_body,
    printable,
    request_id,
)

log = logging.getLogger("diffill.http")

DEFAULT_N_PREDICT = 64
"""``n_predict`` when the request gives none (or -1), before the server's token cap."""
MAX_EXTRA_CHUNKS = 256
HONOURED = ["input_prefix", "prompt", "input_suffix", "input_extra", "n_predict",
            "t_max_predict_ms", "n_indent", "temperature", "seed", "stop", "response_fields"]
IGNORED = ["t_max_prompt_ms", "top_k", "top_p", "min_p", "samplers", "cache_prompt", "id_slot"]


# ----------------------------------------------------------------------------- wire types


class ExtraChunk(msgspec.Struct):
    """One ``input_extra`` item (llama.vim also sends ``time``: ignored)."""

    text: str
    filename: str = ""


class InfillRequest(msgspec.Struct, kw_only=True):
    input_prefix: str = ""
    input_suffix: str = ""
    prompt: str = ""
    input_extra: list[ExtraChunk] = msgspec.field(default_factory=list)
    n_predict: Annotated[int, Meta(ge=-1)] = -1
    t_max_predict_ms: Annotated[float, Meta(ge=0)] | None = None
    t_max_prompt_ms: Annotated[float, Meta(ge=0)] | None = None
    n_indent: Annotated[int, Meta(ge=0, le=1024)] = 0
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    seed: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    samplers: list[str] | str | None = None
    cache_prompt: bool | None = None
    stream: bool = False
    stop: list[str] | str | None = None
    response_fields: list[str] | None = None
    id_slot: int | None = None
    model: str | None = None


def parse_infill(body: bytes) -> InfillRequest:
    """Decode and validate an ``/infill`` body; raises :class:`RequestError` (400)."""
    req = decode_body(body, InfillRequest)
    if req.stream:
        raise RequestError(400, "stream=true is not supported on /infill; send stream=false "
                           "(llama.vim and llama.vscode do)", param="stream")
    if len(req.input_extra) > MAX_EXTRA_CHUNKS:
        raise RequestError(400, f"input_extra holds {len(req.input_extra)} chunks, more than "
                           f"{MAX_EXTRA_CHUNKS}", param="input_extra")
    stops = stop_strings(req.stop)
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise RequestError(400, f"stop must be a list of at most {MAX_STOP} non-empty strings",
                           param="stop")
    return req


def stop_strings(stop: list[str] | str | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def pick_fields(answer: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's ``response_fields``: each field (``a/b`` for a nested one) that
    exists, under its own name as a flat key; the others left out."""
    out: dict[str, Any] = {}
    for name in fields:
        node: Any = answer
        for part in name.split("/"):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            out[name] = node
    return out


_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "unavailable_error", 503: "unavailable_error"}


def llama_error(err: RequestError, rid: str) -> Reply:
    """An error in llama-server's shape: ``{"error": {"code", "message", "type"}}``."""
    kind = _ERROR_TYPES.get(err.status) or ("server_error" if err.status >= 500
                                            else "invalid_request_error")
    headers = {**err.headers, "X-Request-Id": rid}
    resp = Reply(status=err.status, content_type="application/json", headers=headers,
                 body=msgspec.json.encode({"error": {"code": err.status, "message": err.message,
                                                     "type": kind}}))
    resp.note = f"{err.code or err.kind}: {err.message!r}"
    return resp


# ----------------------------------------------------------------------------- token cache


class TokenCache:
    """Token ids of the extra-context blocks (which repeat from request to request), least
    recently used out first, bounded in entries and characters, thread-safe. Only texts
    that are extra-context blocks of the request at hand are kept (the cursor's own
    windows change with every keystroke); :meth:`view` gives one request's tokenizer,
    counting the token ids it was served from the cache."""

    def __init__(self, encode_batch: Callable[[list[str]], list[list[int]]], *,
                 max_entries: int = 1024, max_chars: int = 4_000_000) -> None:
        self._encode = encode_batch
        self._lock = threading.Lock()
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._ids)

    def encode_batch(self, texts: list[str], counter: list[int],
                     keep: Callable[[str], bool]) -> list[list[int]]:
        out: list[list[int] | None] = [None] * len(texts)
        todo: list[int] = []
        with self._lock:
            for i, t in enumerate(texts):
                ids = self._ids.get(t)
                if ids is None:
                    todo.append(i)
                else:
                    self._ids.move_to_end(t)
                    out[i] = ids
                    self.hits += 1
                    counter[0] += len(ids)
        if todo:
            fresh = self._encode([texts[i] for i in todo])
            with self._lock:
                for i, ids in zip(todo, fresh, strict=True):
                    out[i] = ids
                    t = texts[i]
                    if len(t) > self.max_chars // 4 or t in self._ids or not keep(t):
                        continue
                    self.misses += 1
                    self._ids[t] = list(ids)
                    self._chars += len(t)
                while self._ids and (len(self._ids) > self.max_entries
                                     or self._chars > self.max_chars):
                    old, _ = self._ids.popitem(last=False)
                    self._chars -= len(old)
        return [list(x) for x in out if x is not None]

    def view(self, snippets: Sequence[Snippet]
             ) -> tuple[Callable[[list[str]], list[list[int]]], list[int]]:
        """(a tokenizer for one request with these extra chunks, its counter of token ids
        served from the cache). A text is kept when it is one chunk's block as the context
        builder writes it, whatever the family's format: the chunk's whole text after a
        short line naming its path (``# path: p``, ``<|file_sep|>p``)."""
        bodies = {}
        for sn in snippets:
            body = sn.text if sn.text.endswith("\n") else sn.text + "\n"
            bodies.setdefault(body, set()).add(sn.path)

        def keep(text: str) -> bool:
            head, nl, rest = text.partition("\n")
            paths = bodies.get(rest) if nl else None
            return bool(paths) and len(head) <= 512 and any(p in head for p in paths)

        counter = [0]
        return (lambda texts: self.encode_batch(texts, counter, keep)), counter


# ----------------------------------------------------------------------------- the route


class LlamaInfill:
    """The ``/infill`` and ``/props`` handlers over an :class:`HttpFront`."""

    def __init__(self, front: Any) -> None:  # an http_server.HttpFront (which imports this)
        self.front = front
        self.cache: TokenCache | None = None
        self._warm_lock = threading.Lock()
        self._warm_next: list[Snippet] | None = None
        self._warm_running = False
        self.warmups = 0

    def add_routes(self, app: web.Application, expect: Any) -> None:
        app.router.add_post("/infill", self.infill, expect_handler=expect)
        app.router.add_get("/props", self.props, expect_handler=expect)

    def token_cache(self) -> TokenCache:
        backend = self.front.backend
        assert backend is not None
        if self.cache is None:
            self.cache = TokenCache(backend.encode_batch)
        return self.cache

    # -- request -> the shared path -----------------------------------------------------------
    def n_predict(self, req: InfillRequest) -> int:
        limit = self.front.max_tokens_limit
        wanted = DEFAULT_N_PREDICT if req.n_predict < 0 else req.n_predict
        return max(1, min(wanted, limit))

    def budget_ms(self, req: InfillRequest) -> float | None:
        if not req.t_max_predict_ms:  # absent or 0: the server's budget
            return None
        return min(float(req.t_max_predict_ms), self.front.max_request_ms())

    @staticmethod
    def snippets(req: InfillRequest) -> tuple[Snippet, ...]:
        return tuple(Snippet(path=c.filename or f"extra-{i}", text=c.text)
                     for i, c in enumerate(req.input_extra) if c.text.strip())

    def fill(self, req: InfillRequest, encode: Callable[[list[str]], list[list[int]]]) -> Fill:
        return Fill(prompt=req.input_prefix + req.prompt, suffix=req.input_suffix,
                    max_tokens=self.n_predict(req), temperature=req.temperature or 0.0,
                    seed=req.seed, stops=stop_strings(req.stop), snippets=self.snippets(req),
                    n_indent=req.n_indent, latency_budget_ms=self.budget_ms(req),
                    encode_batch=encode)

    # -- handlers -----------------------------------------------------------------------------
    async def infill(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        rid = request_id(request)
        t0 = time.perf_counter()
        try:
            async with front.admitted(request) as body:
                req = parse_infill(body)
                model_name = front.check_model(req.model)
                if req.n_predict == 0:
                    return self.warm_up(req, model_name, rid)
                encode, cached = self.token_cache().view(self.snippets(req))
                fill = self.fill(req, encode)
                front.check_cost([fill])
                [result] = await front.execute(request, [fill], t0)
        except RequestError as e:
            front.count_error(e)
            return llama_error(e, rid)
        answer = self.answer(req, fill, result, model_name, cached[0])
        if front.config.debug_log_buffers:
            log.debug("infill %s prompt tail %r suffix head %r extra %d -> %r", rid,
                      fill.prompt[-200:], fill.suffix[:200], len(fill.snippets), answer["content"])
        resp = Reply(body=msgspec.json.encode(pick_fields(answer, req.response_fields)
                                              if req.response_fields is not None else answer),
                     content_type="application/json", headers={"X-Request-Id": rid})
        t = answer["timings"]
        resp.note = (f"infill: {t['prompt_n']} prompt tokens ({len(fill.snippets)} extra "
                     f"chunks) -> {t['predicted_n']} tokens, steps {result.steps}")
        return resp

    def answer(self, req: InfillRequest, fill: Fill, r: FillResult, model_name: str,
               cached: int) -> dict[str, Any]:
        [choice] = r.choices[:1] or [None]
        content = choice.text if choice is not None else ""
        ctx = r.context
        prompt_n = ctx.prefix_tokens + ctx.suffix_tokens
        predicted_n = choice.tokens if choice is not None else 0
        text_len = len(fill.prompt) + len(fill.suffix)
        truncated = (ctx.prefix_start > 0 or ctx.suffix_end < text_len
                     or len(ctx.extra_paths) < len(fill.snippets))
        if choice is not None and choice.stop_word:
            stop_type = "word"
        elif choice is not None and choice.finish_reason == "length":
            stop_type = "limit"
        else:
            stop_type = "eos"
        return {
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": model_name,
            "tokens_predicted": predicted_n,
            "tokens_evaluated": prompt_n,
            "tokens_cached": min(cached, ctx.header_tokens),
            "generation_settings": {
                "n_predict": fill.max_tokens,
                "temperature": fill.temperature,
                "n_indent": fill.n_indent,
                "stop": fill.stops,
                "t_max_predict_ms": fill.latency_budget_ms,
                "seed": fill.seed,
                "honoured": HONOURED,
                "ignored": IGNORED,
            },
            "has_new_line": "\n" in content,
            "truncated": truncated,
            "stop_type": stop_type,
            "stopping_word": choice.stop_word if choice is not None else "",
            "timings": timings(prompt_n, r.other_ms, predicted_n, r.model_ms),
            "diffill": {"steps": r.steps, "extra_chunks_used": len(ctx.extra_paths)},
        }

    def warm_up(self, req: InfillRequest, model_name: str, rid: str) -> Reply:
        """``n_predict: 0``: answered at once; the extra chunks are tokenized in the
        background (one warm-up at a time, the latest one's chunks win)."""
        self.warmups += 1
        self.front.count("infill_warmups")
        snippets = list(self.snippets(req))
        if snippets:
            with self._warm_lock:
                self._warm_next = snippets
                start = not self._warm_running
                self._warm_running = True
            if start:
                fut = asyncio.get_running_loop().run_in_executor(self.front.executor,
                                                                  self._warm_work)
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        answer = {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True,
                  "model": model_name, "tokens_predicted": 0, "tokens_evaluated": 0,
                  "tokens_cached": 0, "truncated": False, "stop_type": "limit",
                  "stopping_word": "", "has_new_line": False,
                  "timings": timings(0, 0.0, 0, 0.0)}
        resp = Reply(body=msgspec.json.encode(pick_fields(answer, req.response_fields)
                                              if req.response_fields is not None else answer),
                     content_type="application/json", headers={"X-Request-Id": rid})
        resp.note = f"infill warm-up: {len(snippets)} extra chunks queued for tokenizing"
        resp.quiet = True
        return resp

    def _warm_work(self) -> None:
        """Tokenize the queued chunks the way the context builder will (each block as
        :func:`.context.build_header` writes it, then the header that fits)."""
        backend = self.front.backend
        assert backend is not None
        cache = self.token_cache()
        try:
            while True:
                with self._warm_lock:
                    snippets, self._warm_next = self._warm_next, None
                    if snippets is None:
                        self._warm_running = False
                        return
                t0 = time.perf_counter()
                opts = msgspec.structs.replace(self.front.options, extra_context=True,
                                               max_tokens=min(DEFAULT_N_PREDICT,
                                                              self.front.max_tokens_limit))
                encode, _ = cache.view(snippets)
                Completer(_Tokenizer(backend, encode), opts).build("", 0, snippets=snippets)
                log.debug("infill warm-up: %d chunks tokenized in %.1f ms (%d cached texts)",
                          len(snippets), (time.perf_counter() - t0) * 1000.0, len(cache))
        except Exception:
            with self._warm_lock:
                self._warm_running = False
            raise

    async def props(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        rid = request_id(request)
        try:
            front.check_auth(request)
            front.check_ready()
        except RequestError as e:
            front.count_error(e)
            return llama_error(e, rid)
        backend = front.backend
        assert backend is not None
        limit = backend.max_context_tokens(self.n_predict(InfillRequest()))
        n_ctx = front.options.context_tokens if limit is None else min(
            front.options.context_tokens, limit)
        names = front.config.model_names or ["diffill"]
        body = {
            "default_generation_settings": {
                "n_ctx": n_ctx,
                "params": {"n_predict": min(DEFAULT_N_PREDICT, front.max_tokens_limit),
                           "temperature": 0.0, "stream": False},
            },
            "total_slots": front.config.workers,
            "model_path": printable(names[0]),
            "modalities": {"vision": False, "audio": False},
            "build_info": "diffill serve-http (a masked-diffusion model; /infill contract of "
                          "llama-server)",
            "diffill": {"honoured": HONOURED, "ignored": IGNORED,
                        "max_n_predict": front.max_tokens_limit,
                        "max_request_ms": front.max_request_ms()},
        }
        return Reply(body=msgspec.json.encode(body), content_type="application/json",
                     headers={"X-Request-Id": rid})


class _Tokenizer:
    """The backend with another ``encode_batch`` (for building a context only)."""

    def __init__(self, backend: Any, encode_batch: Callable[[list[str]], list[list[int]]]) -> None:
        self._backend = backend
        self.encode_batch = encode_batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def timings(prompt_n: int, prompt_ms: float, predicted_n: int,
            predicted_ms: float) -> dict[str, float | int]:
    """llama-server's ``timings`` object (per-token and per-second figures 0 when there
    is nothing to divide)."""
    def per_token(ms: float, n: int) -> float:
        return round(ms / n, 6) if n else 0.0

    def per_second(ms: float, n: int) -> float:
        return round(1000.0 * n / ms, 3) if n and ms > 0 else 0.0

    return {
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": per_token(prompt_ms, prompt_n),
        "prompt_per_second": per_second(prompt_ms, prompt_n),
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": per_token(predicted_ms, predicted_n),
        "predicted_per_second": per_second(predicted_ms, predicted_n),
    }


__all__ = ["DEFAULT_N_PREDICT", "InfillRequest", "LlamaInfill", "TokenCache", "parse_infill",
           "pick_fields", "timings"]
