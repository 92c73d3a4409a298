"""The OpenAI completion routes, ``POST /v1/completions`` and ``POST /v1/fim/completions``,
over an :class:`.http_server.HttpFront`: a request's prompts as :class:`.http_wire.Fill`
values, the shared request path (:meth:`.http_server.HttpFront.execute`), and the answer in
OpenAI's shape, plain or streamed.

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

A client that does its own token healing (the language server's ``openai`` backend) sends
``X-Diffill-Token-Healing: 0`` so the hole is not backed off twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from ..text.fim_prompt import split_fim_prompt
from .http_wire import (
    DEFAULT_MAX_TOKENS,
    CompletionRequest,
    Fill,
    FillResult,
    Reply,
    RequestError,
    error_response,
    parse_request,
    request_id,
    stop_list,
)

log = logging.getLogger("diffill.http")

NO_HEALING_HEADER = "X-Diffill-Token-Healing"
"""``X-Diffill-Token-Healing: 0`` turns server-side token healing off for a request
(sent by diffill's own ``openai`` backend, whose language server heals already)."""


class OpenAICompletions:
    """The ``/v1/completions`` and ``/v1/fim/completions`` handlers over an
    :class:`.http_server.HttpFront`."""

    def __init__(self, front: Any) -> None:  # an http_server.HttpFront (which imports this)
        self.front = front

    def add_routes(self, app: web.Application, expect: Any) -> None:
        app.router.add_post("/v1/completions", self.completions, expect_handler=expect)
        app.router.add_post("/v1/fim/completions", self.completions, expect_handler=expect)

    def openai_fills(self, req: CompletionRequest, healing: bool) -> list[Fill]:
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        max_tokens = req.max_tokens or min(DEFAULT_MAX_TOKENS, self.front.max_tokens_limit)
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

    async def completions(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        rid = request_id(request)
        t0 = time.perf_counter()
        try:
            async with front.admitted(request) as body:
                req = parse_request(body)
                model_name = front.check_model(req.model)
                front.check_limits(req)
                healing = request.headers.get(NO_HEALING_HEADER, "").strip().lower() not in (
                    "0", "false", "off")
                fills = self.openai_fills(req, healing)
                front.check_cost(fills)
                results = await front.execute(request, fills, t0)
        except RequestError as e:
            front.count_error(e)
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
        if self.front.config.debug_log_buffers:
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
                    "max_steps": self.front.options.max_steps if first.max_steps is None else first.max_steps}
        return {"steps": steps, "steps_planned": first.steps_planned,
                "steps_from": "request" if req.steps is not None else "server",
                "latency_budget_ms": None, "max_steps": None}


__all__ = ["NO_HEALING_HEADER", "OpenAICompletions"]
