"""diffill serve-http (lsp_server/http_server.py): request validation, the OpenAI
response shape, consistency with the language server's text path, limits (401,
404, 413, 429), cancellation on disconnect and timeout, model errors, health.

The app runs in-process (aiohttp's TestServer) over the micro model.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from diffill.lsp_server.backends import LocalBackend, load_local_backend
from diffill.lsp_server.completer import Completer
from diffill.lsp_server.http_server import (
    HttpConfig,
    HttpFront,
    RequestError,
    cut_at_stop,
    parse_request,
)
from diffill.lsp_server.options import CompletionOptions

PROMPT = "def add_numbers(a, b):\n    total = a + b\n    return "
SUFFIX = "\n\n\ndef greet_user(name):\n    message = \"hello \" + name\n"
OPTS = CompletionOptions(steps=2)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def backend(model_dir: Path) -> LocalBackend:
    return load_local_backend(str(model_dir))


@pytest_asyncio.fixture
async def serve():
    started: list[TestClient] = []

    async def make(backend=None, loader=None, options=OPTS, **cfg) -> tuple[TestClient, HttpFront]:
        front = HttpFront(options, HttpConfig(**cfg), backend=backend, loader=loader)
        client = TestClient(TestServer(front.make_app()))
        await client.start_server()
        started.append(client)
        return client, front

    yield make
    for c in started:
        await c.close()


async def post(client: TestClient, body: dict | bytes, **kw):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post("/v1/completions", data=data, **kw)
    return resp, await resp.json()


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "body, param",
    [
        ({"suffix": "x"}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": [1, 2]}, "prompt"),
        ({"prompt": "x", "max_tokens": "8"}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "n": 17}, "n"),
        ({"prompt": "x", "stop": 5}, "stop"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "stream": True}, "stream"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "logprobs": 3}, "logprobs"),
        ({"prompt": "x", "n": 2, "best_of": 4}, "best_of"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a"] * 9, "n": 2}, "prompt"),
    ],
)
def test_bad_fields_are_400_naming_the_field(body: dict, param: str):
    with pytest.raises(RequestError) as e:
        parse_request(json.dumps(body).encode())
    assert e.value.status == 400
    assert e.value.param == param, e.value.message


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b"\xff\xfe{}", b'{"prompt": "x"} trailing'])
def test_malformed_json_is_400(raw: bytes):
    with pytest.raises(RequestError) as e:
        parse_request(raw)
    assert e.value.status == 400


def test_openai_fields_are_accepted():
    req = parse_request(json.dumps({
        "prompt": "x", "suffix": "y", "model": "m", "max_tokens": 8, "temperature": 0.2,
        "stop": "\n", "n": 2, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0,
        "user": "u", "stream": False, "logprobs": None, "best_of": 2, "whatever_new": 1,
    }).encode())
    assert (req.prompt, req.suffix, req.max_tokens, req.n, req.stop) == ("x", "y", 8, 2, "\n")


def test_cut_at_stop_takes_the_earliest():
    assert cut_at_stop("abc\ndef;g", ["\n", ";"]) == ("abc", True)
    assert cut_at_stop("abc;d\n", ["\n", ";"]) == ("abc", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)
    assert cut_at_stop("abc", []) == ("abc", False)


# ----------------------------------------------------------------------------- completions


async def test_response_shape_and_consistency_with_the_lsp_text_path(serve, backend):
    client, _ = await serve(backend)
    resp, out = await post(client, {"prompt": PROMPT, "suffix": SUFFIX, "max_tokens": 16},
                           headers={"X-Request-Id": "req-42"})
    assert resp.status == 200, out
    assert resp.headers["X-Request-Id"] == "req-42"
    assert out["id"].startswith("cmpl-") and out["object"] == "text_completion"
    assert isinstance(out["created"], int) and out["model"] == "diffill"
    [choice] = out["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    # the same text path as the language server: context -> model -> post-processing
    opts = msgspec.structs.replace(OPTS, max_tokens=16)
    completer = Completer(backend, opts)
    res = completer.run(PROMPT + SUFFIX, len(PROMPT), n=1)
    expected = res.suggestions[0].text if res.suggestions else ""
    assert choice["text"] == expected
    u = out["usage"]
    assert u["prompt_tokens"] == res.context.prefix_tokens + res.context.suffix_tokens > 0
    assert u["completion_tokens"] == len(backend.encode_batch([expected])[0])
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


async def test_healing_header_turns_server_side_token_healing_off(serve, backend):
    """A client that healed already (the openai backend) sends X-Diffill-Token-Healing: 0:
    the hole stays at the cursor, as Completer with token_healing off."""
    client, _ = await serve(backend)
    body = {"prompt": PROMPT, "suffix": SUFFIX, "max_tokens": 16}
    _, out = await post(client, body, headers={"X-Diffill-Token-Healing": "0"})
    opts = msgspec.structs.replace(OPTS, max_tokens=16, token_healing=False)
    res = Completer(backend, opts).run(PROMPT + SUFFIX, len(PROMPT), n=1)
    assert out["choices"][0]["text"] == (res.suggestions[0].text if res.suggestions else "")
    assert out["usage"]["prompt_tokens"] == res.context.prefix_tokens + res.context.suffix_tokens
    healed = Completer(backend, msgspec.structs.replace(OPTS, max_tokens=16)).run(
        PROMPT + SUFFIX, len(PROMPT), n=1)
    assert healed.context.prefix_tokens != res.context.prefix_tokens  # PROMPT ends in a space


async def test_raw_stop_and_length(serve, backend):
    client, _ = await serve(backend)
    base = {"prompt": PROMPT, "suffix": SUFFIX, "raw": True, "max_tokens": 16}
    _, out = await post(client, base)
    raw = out["choices"][0]["text"]
    res = backend.infill(Completer(backend, msgspec.structs.replace(OPTS, max_tokens=16)).build(
        PROMPT + SUFFIX, len(PROMPT)), n=1, max_tokens=16, steps=2)
    assert raw == res[0].text  # raw: the model's middle untouched
    if len(raw) >= 2:
        stop = raw[1]
        _, cut = await post(client, {**base, "stop": [stop, "\u2603"]})
        assert cut["choices"][0]["text"] == raw[: raw.index(stop)]
        assert cut["choices"][0]["finish_reason"] == "stop"
    # a one-token hole filled to the brim ends by length (unless the model put a pad in it)
    _, one = await post(client, {**base, "max_tokens": 1})
    c = one["choices"][0]
    assert c["finish_reason"] == ("length" if c["text"] else "stop")
    assert one["usage"]["completion_tokens"] <= 1


async def test_n_and_prompt_lists_index_choices(serve, backend):
    client, _ = await serve(backend)
    resp, out = await post(client, {"prompt": [PROMPT, "def f(x):\n    return "], "suffix": "\n",
                                    "n": 3, "max_tokens": 8})
    assert resp.status == 200, out
    idx = [c["index"] for c in out["choices"]]
    assert len(idx) == len(set(idx)) and 2 <= len(idx) <= 6
    assert {i // 3 for i in idx} == {0, 1}  # prompt p owns indices p*n .. p*n+n-1


async def test_model_names_and_models_endpoint(serve, backend):
    client, _ = await serve(backend, model_names=["micro", "diffill"])
    resp = await client.get("/v1/models")
    ids = [m["id"] for m in (await resp.json())["data"]]
    assert ids == ["micro", "diffill"]
    resp, out = await post(client, {"prompt": "x", "model": "gpt-4o"})
    assert resp.status == 404 and out["error"]["code"] == "model_not_found"
    resp, out = await post(client, {"prompt": "x", "model": "micro", "max_tokens": 2})
    assert resp.status == 200 and out["model"] == "micro"


# ----------------------------------------------------------------------------- limits


async def test_bearer_token(serve, backend):
    client, _ = await serve(backend, token="s3cret-token")
    body = {"prompt": "x", "max_tokens": 2}
    resp, out = await post(client, body)
    assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    assert "s3cret" not in json.dumps(out)
    resp, _ = await post(client, body, headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    resp, _ = await post(client, body, headers={"Authorization": "Bearer s3cret-token"})
    assert resp.status == 200
    assert (await client.get("/v1/models")).status == 401
    assert (await client.get("/health")).status == 200  # health stays open for load balancers


async def test_body_size_limit(serve, backend):
    client, _ = await serve(backend, max_body_bytes=2048)
    resp, out = await post(client, {"prompt": "x" * 4000})
    assert resp.status == 413 and out["error"]["code"] == "request_too_large"

    async def chunks():  # no Content-Length: aiohttp's own limit while reading
        for _ in range(8):
            yield b"x" * 1024

    resp = await client.post("/v1/completions", data=chunks())
    assert resp.status == 413
    resp, _ = await post(client, {"prompt": "x", "max_tokens": 2})
    assert resp.status == 200


async def test_queue_full_is_429_with_retry_after(serve, backend):
    slow = LocalBackend(backend.engine, step_delay_s=0.15)
    client, front = await serve(slow, max_queue=1)
    body = {"prompt": PROMPT, "max_tokens": 4, "steps": 4}
    first = asyncio.ensure_future(post(client, body))
    while front.pending == 0:
        await asyncio.sleep(0.01)
    resp, out = await post(client, body)
    assert resp.status == 429 and out["error"]["type"] == "rate_limit_error"
    assert int(resp.headers["Retry-After"]) >= 1
    resp, _ = await first
    assert resp.status == 200
    health = await (await client.get("/health")).json()
    assert health["rejected_429"] == 1 and health["completed"] == 1 and health["queue"] == 0


async def test_client_disconnect_cancels_the_model_run(serve, backend):
    slow = LocalBackend(backend.engine, step_delay_s=0.1)
    client, front = await serve(slow)
    before = backend.engine.stats()["cancelled"]
    body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "steps": 30}).encode()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(client.post("/v1/completions", data=body), 0.5)
    for _ in range(100):  # the worker notices the closed transport at its next step
        if front.pending == 0:
            break
        await asyncio.sleep(0.05)
    assert front.pending == 0
    assert backend.engine.stats()["cancelled"] == before + 1
    assert front.counters.get("client_gone") == 1


async def test_request_timeout_is_504(serve, backend):
    slow = LocalBackend(backend.engine, step_delay_s=0.1)
    client, _ = await serve(slow, request_timeout_s=0.3)
    resp, out = await post(client, {"prompt": PROMPT, "max_tokens": 4, "steps": 30})
    assert resp.status == 504 and out["error"]["code"] == "timeout"


async def test_long_prompts_are_cut_and_model_errors_are_500(serve, backend, monkeypatch):
    client, _ = await serve(backend, options=msgspec.structs.replace(OPTS, context_tokens=131_072))
    # the backend caps the budget at the model's context: a long prompt still fits
    resp, out = await post(client, {"prompt": "x = 1\n" * 3000, "max_tokens": 4})
    assert resp.status == 200, out
    assert out["usage"]["prompt_tokens"] <= backend.max_context_tokens(4)

    calls = {"n": 0}
    real = backend.engine.infill

    def failing(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("simulated: cannot allocate 64 MiB")
        return real(*a, **kw)

    monkeypatch.setattr(backend.engine, "infill", failing)
    resp, out = await post(client, {"prompt": PROMPT, "max_tokens": 4})
    assert resp.status == 500 and out["error"]["code"] == "model_error"
    assert "MemoryError" in out["error"]["message"]
    resp, out = await post(client, {"prompt": PROMPT, "max_tokens": 4})  # the server stays up
    assert resp.status == 200 and calls["n"] == 2


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


async def test_temperature_samples_and_seed_repeats(serve, backend):
    client, _ = await serve(backend)
    body = {"prompt": PROMPT, "suffix": SUFFIX, "max_tokens": 8, "temperature": 1.5, "raw": True,
            "seed": 7}
    outs = []
    for _ in range(2):
        resp, out = await post(client, body)
        assert resp.status == 200, out
        outs.append(out["choices"][0]["text"])
    assert outs[0] == outs[1]  # the same seed gives the same sample
    sampled = backend.infill(Completer(backend, msgspec.structs.replace(OPTS, max_tokens=8)).build(
        PROMPT + SUFFIX, len(PROMPT)), n=1, max_tokens=8, steps=2, temperature=1.5, seed=7)
    assert outs[0] == sampled[0].text  # and the backend's own sample for that seed


def test_token_sources_never_echo_the_token(tmp_path, monkeypatch):
    import argparse

    from diffill.lsp_server.commands.serve_http import read_token

    def ns(**kw):
        return argparse.Namespace(**{"token_env": None, "api_key_file": None, **kw})

    monkeypatch.setenv("TEAM_TOKEN", " tok-123 \n")
    assert read_token(ns(token_env="TEAM_TOKEN")) == "tok-123"
    assert read_token(ns()) is None
    for bad in (ns(token_env="sk-pasted-the-key-itself"), ns(token_env="UNSET_VAR_XYZ"),
                ns(api_key_file=str(tmp_path / "missing"))):
        with pytest.raises(ValueError) as e:
            read_token(bad)
        assert "sk-pasted" not in str(e.value)
    f = tmp_path / "key"
    f.write_text("file-token\nsecond line ignored\n")
    assert read_token(ns(api_key_file=str(f))) == "file-token"
    f.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(ns(api_key_file=str(f)))
