"""The routes that report on the server rather than complete: ``GET /health`` (and
``/healthz``, ``/v1/health``), ``GET /v1/models`` and ``GET /v1/models/{model}``, over an
:class:`.http_server.HttpFront`.

``GET /v1/models`` and ``GET /v1/models/{model}``
    The served model (``--served-model-name``, default the checkpoint folder's
    name, plus the alias ``diffill``); an unknown id is a 404 ``model_not_found``.
``GET /health``, ``GET /healthz`` and ``GET /v1/health``
    200 ``{"status": "ok", ...}`` once the model is loaded, 503 while loading or
    after a load failure (load balancers take the replica out). Never needs a token.
    Also the limits in force and the counters (requests by outcome, connections
    closed by each timeout, connections refused).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from .http_wire import Reply, RequestError, error_response, request_id


class StatusRoutes:
    """The ``/health`` and ``/v1/models`` handlers over an :class:`.http_server.HttpFront`."""

    def __init__(self, front: Any) -> None:  # an http_server.HttpFront (which imports this)
        self.front = front

    def add_routes(self, app: web.Application, expect: Any) -> None:
        app.router.add_get("/v1/models", self.models, expect_handler=expect)
        app.router.add_get("/v1/models/{model:.+}", self.model, expect_handler=expect)
        for path in ("/health", "/healthz", "/v1/health"):
            app.router.add_get(path, self.health, expect_handler=expect)

    async def models(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        try:
            front.check_auth(request)
        except RequestError as e:
            front.count_error(e)
            return error_response(e, request_id(request))
        data = [self.model_object(name) for name in (front.config.model_names or ["diffill"])]
        return Reply(body=msgspec.json.encode({"object": "list", "data": data}),
                     content_type="application/json", headers={"X-Request-Id": request_id(request)})

    async def model(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models/{model}`` (the openai client's ``models.retrieve``)."""
        front = self.front
        name = request.match_info["model"]
        try:
            front.check_auth(request)
            names = front.config.model_names or ["diffill"]
            if name not in names:  # not repeated (see check_model)
                raise RequestError(404, f"the model asked for is not served here (served: "
                                   f"{', '.join(names)})", param="model", code="model_not_found")
        except RequestError as e:
            front.count_error(e)
            return error_response(e, request_id(request))
        return Reply(body=msgspec.json.encode(self.model_object(name)),
                     content_type="application/json", headers={"X-Request-Id": request_id(request)})

    def model_object(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(self.front.started), "owned_by": "diffill"}

    async def health(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        if front.backend is not None:
            status, code = "ok", 200
        elif front.load_error is not None:
            status, code = "error", 503
        else:
            status, code = "loading", 503
        desc = front.backend.describe() if front.backend is not None else {}
        c = front.config
        body = {
            "status": status,
            "error": front.load_error,
            "model": c.model_names[0] if c.model_names else None,
            "device": desc.get("device"),
            "queue": front.pending,
            "max_queue": c.max_queue,
            "reading_body": front.reading,
            "running": front.running,
            "connections": len(front.connections),
            "limits": {
                "max_connections": c.max_connections,
                "header_timeout_s": c.header_timeout_s,
                "body_timeout_s": c.body_timeout_s,
                "idle_timeout_s": c.idle_timeout_s,
                "request_timeout_s": c.request_timeout_s,
                "max_body_bytes": c.max_body_bytes,
                "max_request_steps": c.max_request_steps,
                "max_request_tokens": front.max_tokens_limit,
                "max_request_ms": front.max_request_ms() if front.backend is not None else None,
            },
            "uptime_s": round(time.time() - front.started, 1),
            "engine_requests": desc.get("engine_requests"),
            "engine_batches": desc.get("engine_batches"),
            "engine_max_batch_requests": desc.get("engine_max_batch_requests"),
            **front.counters,
        }
        return Reply(body=msgspec.json.encode(body), status=code, content_type="application/json",
                     headers={"X-Request-Id": request_id(request)})


__all__ = ["StatusRoutes"]
