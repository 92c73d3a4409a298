"""The status routes of diffill serve-http (lsp_server/http/http_status.py): /v1/models
and the served names, /health while loading and after a load failure."""

from __future__ import annotations

import asyncio

from diffill.lsp_server.backend.backends import load_local_backend
from support.http_serving import post


async def test_model_names_and_models_endpoint(serve, backend):
    client, _ = await serve(backend, model_names=["micro", "diffill"])
    resp = await client.get("/v1/models")
    ids = [m["id"] for m in (await resp.json())["data"]]
    assert ids == ["micro", "diffill"]
    resp, out = await post(client, {"prompt": "x", "model": "gpt-4o"})
    assert resp.status == 404 and out["error"]["code"] == "model_not_found"
    resp, out = await post(client, {"prompt": "x", "model": "micro", "max_tokens": 2})
    assert resp.status == 200 and out["model"] == "micro"


async def test_health_while_loading_and_after_a_load_failure(serve, tmp_path):
    client, front = await serve(loader=lambda: load_local_backend(str(tmp_path / "missing")))
    for _ in range(200):
        if front.load_error:
            break
        await asyncio.sleep(0.02)
    resp = await client.get("/healthz")
    body = await resp.json()
    assert resp.status == 503 and body["status"] == "error" and "missing" in body["error"]
    resp, out = await post(client, {"prompt": "x"})
    assert resp.status == 503 and out["error"]["code"] == "model_not_ready"
    assert "Retry-After" in resp.headers
