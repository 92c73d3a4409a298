"""The OpenAI-compatible remote backend (lsp_server/backend/remote.py).

* against diffill's own serve-http app over the scripted checkpoint (in-process,
  loopback): the same suggestions as the local backend, the ones its script gives;
* against a scripted server: retries with back-off on 429/5xx/connection errors,
  Retry-After, deadlines, no retry on other 4xx, the API key only in the header,
  cancellation while waiting and while backing off, keep-alive reuse.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from email.utils import formatdate
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from diffill.lsp_server.backend.backends import (
    BackendError,
    Cancelled,
    InfillAsk,
    load_local_backend,
)
from diffill.lsp_server.backend.remote import (
    RemoteBackend,
    RemoteSettings,
    estimate_tokens,
    parse_retry_after,
)
from diffill.lsp_server.completion.completer import Completer
from diffill.lsp_server.completion.options import CompletionOptions
from diffill.lsp_server.http.http_connection import HttpConfig
from diffill.lsp_server.http.http_server import HttpFront
from diffill.lsp_server.text.context import build_context
from hypothesis import given
from hypothesis import strategies as st

OPTS = CompletionOptions(steps=2, max_tokens=16)
DOCS = [  # (prefix, suffix, what the scripted checkpoint suggests)
    ("def add_numbers(a, b):\n    total = a + b\n    return ", "\n", "total"),
    ("def greet_user(name):\n    message = ", "\n    print(message)\n    return message\n",
     '"hello " + name'),
    ("def is_even(number):\n    return number % ", "\n", "2 == 0"),
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def ctx_for(prefix: str, suffix: str = ""):
    return build_context(prefix + suffix, len(prefix), lambda ts: [[0] * estimate_tokens(t) for t in ts])


# ----------------------------------------------------------------------------- helpers


def test_estimate_tokens_examples():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1 and estimate_tokens("abcd") == 2
    assert estimate_tokens("\u00e9") == 1  # 2 bytes


@given(st.text(max_size=200), st.text(max_size=50))
def test_estimate_tokens_is_monotone(a: str, b: str):
    assert estimate_tokens(a) <= estimate_tokens(a + b)
    assert estimate_tokens(b) <= estimate_tokens(a + b)


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = time.time()
    assert 9 <= parse_retry_after(formatdate(now + 10, usegmt=True), now=now) <= 11
    assert parse_retry_after(formatdate(now - 10, usegmt=True), now=now) == 0.0


def test_bad_url_is_refused():
    with pytest.raises(BackendError):
        RemoteBackend(RemoteSettings(url="ftp://host/v1"))


# ----------------------------------------------------------------------------- against serve-http


async def test_same_suggestions_as_the_local_backend(model_dir: Path):
    local = await asyncio.to_thread(load_local_backend, str(model_dir))
    front = HttpFront(OPTS, HttpConfig(token="team-token"), backend=local)
    server = TestServer(front.make_app())
    await server.start_server()
    try:
        os.environ["DIFFILL_TEST_REMOTE_KEY"] = "team-token"
        remote = RemoteBackend(RemoteSettings(url=str(server.make_url("/v1")), model="diffill",
                                              api_key_env="DIFFILL_TEST_REMOTE_KEY"))
        for prefix, suffix, expected in DOCS:
            want = Completer(local, OPTS).run(prefix + suffix, len(prefix))
            got = await asyncio.to_thread(
                Completer(remote, OPTS).run, prefix + suffix, len(prefix))
            assert [s.text for s in got.suggestions] == [s.text for s in want.suggestions] == [expected]
            assert got.context.prefix == want.context.prefix  # small documents: nothing cut
        desc = remote.describe()
        assert desc["model_calls"] == len(DOCS) and desc["failures"] == 0
        assert "team-token" not in json.dumps(desc)
    finally:
        os.environ.pop("DIFFILL_TEST_REMOTE_KEY", None)
        await server.close()


# ----------------------------------------------------------------------------- scripted server


class Script:
    """A fake /v1/completions: answers from a list of (status, headers, delay_s), then 200."""

    def __init__(self, plan: list[tuple[int, dict[str, str], float]] | None = None) -> None:
        self.plan = list(plan or [])
        self.hits = 0
        self.auth: list[str | None] = []
        self.bodies: list[dict] = []
        self.peers: list[tuple] = []
        self.transports: list = []
        self.disconnected = 0
        self.close_after = False

    async def handler(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.auth.append(request.headers.get("Authorization"))
        self.bodies.append(await request.json())
        self.peers.append(request.transport.get_extra_info("peername"))
        self.transports.append(request.transport)
        status, headers, delay = self.plan.pop(0) if self.plan else (200, {}, 0.0)
        if delay:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                self.disconnected += 1
                raise
        if status != 200:
            return web.json_response({"error": {"message": f"scripted {status}"}}, status=status,
                                     headers=headers)
        body = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m",
                "choices": [{"text": "second", "index": 1, "finish_reason": "stop", "logprobs": None},
                            {"text": "first", "index": 0, "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
        headers = {"Connection": "close"} if self.close_after else {}
        return web.json_response(body, headers=headers)


@pytest_asyncio.fixture
async def scripted():
    servers: list[TestServer] = []

    async def make(plan=None, **settings) -> tuple[Script, RemoteBackend]:
        script = Script(plan)
        app = web.Application()
        app.router.add_post("/v1/completions", script.handler)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        settings.setdefault("backoff_s", 0.05)
        remote = RemoteBackend(RemoteSettings(url=str(server.make_url("/v1")), **settings))
        return script, remote

    yield make
    for s in servers:
        await s.close()


async def call(remote: RemoteBackend, cancel=None, n: int = 2):
    got = await asyncio.to_thread(remote.infill, ctx_for("def f(x):\n    return ", "\n"),
                                  InfillAsk(n=n, max_tokens=8, cancel=cancel))
    assert got.decision is None  # an endpoint decides its steps and does not say
    return got.candidates


async def test_request_body_and_choice_order(scripted):
    script, remote = await scripted(model="team-model")
    cands = await call(remote)
    assert [c.text for c in cands] == ["first", "second"]  # by index
    assert cands[0].score > cands[1].score
    body = script.bodies[0]
    assert body == {"prompt": "def f(x):\n    return ", "suffix": "\n", "max_tokens": 8,
                    "temperature": 0.0, "n": 2, "model": "team-model"}


async def test_429_retry_after_is_honoured(scripted):
    script, remote = await scripted([(429, {"Retry-After": "0.4"}, 0.0)])
    t0 = time.monotonic()
    cands = await call(remote)
    assert cands and script.hits == 2 and remote.retried == 1
    assert time.monotonic() - t0 >= 0.4


async def test_5xx_retried_then_gives_up(scripted):
    script, remote = await scripted([(503, {}, 0.0)] * 5, retries=2)
    with pytest.raises(BackendError, match="after 3 attempts.*503"):
        await call(remote)
    assert script.hits == 3
    script, remote = await scripted([(500, {}, 0.0), (502, {}, 0.0)], retries=2)
    assert await call(remote) and script.hits == 3


async def test_other_4xx_fail_at_once(scripted):
    script, remote = await scripted([(400, {}, 0.0)])
    with pytest.raises(BackendError, match="scripted 400"):
        await call(remote)
    assert script.hits == 1


async def test_retry_after_past_the_deadline_fails_fast(scripted):
    script, remote = await scripted([(429, {"Retry-After": "120"}, 0.0)], deadline_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="deadline"):
        await call(remote)
    assert time.monotonic() - t0 < 2.0 and script.hits == 1


async def test_api_key_only_in_the_header(scripted, monkeypatch):
    monkeypatch.setenv("DIFFILL_TEST_KEY", "sk-very-secret")
    script, remote = await scripted([(401, {}, 0.0)], api_key_env="DIFFILL_TEST_KEY")
    with pytest.raises(BackendError) as e:
        await call(remote)
    assert script.auth == ["Bearer sk-very-secret"]
    assert "DIFFILL_TEST_KEY" in str(e.value) and "sk-very-secret" not in str(e.value)
    assert "sk-very-secret" not in json.dumps(remote.describe())
    assert remote.describe()["api_key_set"] is True
    monkeypatch.delenv("DIFFILL_TEST_KEY")
    await call(remote)
    assert script.auth[-1] is None  # unset variable: no header at all


async def test_connection_refused_is_retried_then_reported():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteBackend(RemoteSettings(url=f"http://127.0.0.1:{port}/v1", retries=2, backoff_s=0.01))
    with pytest.raises(BackendError, match="after 3 attempts.*cannot reach"):
        await call(remote)
    assert remote.retried == 2 and remote.describe()["failures"] == 1


async def test_timeout_is_retried(scripted):
    script, remote = await scripted([(200, {}, 1.0)], timeout_s=0.3, retries=1)
    assert await call(remote)
    assert script.hits == 2 and remote.retried == 1


async def test_cancel_while_waiting_closes_the_connection(scripted):
    script, remote = await scripted([(200, {}, 5.0)])
    flag = {"stop": False}
    task = asyncio.ensure_future(call(remote, cancel=lambda: flag["stop"]))
    while script.hits == 0:
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    flag["stop"] = True
    with pytest.raises(Cancelled):
        await task
    assert time.monotonic() - t0 < 1.0
    for _ in range(100):
        if script.disconnected:
            break
        await asyncio.sleep(0.02)
    assert script.disconnected == 1  # the server saw the client go away


async def test_cancel_during_back_off(scripted):
    script, remote = await scripted([(503, {"Retry-After": "3"}, 0.0)], deadline_s=30.0)
    flag = {"stop": False}
    task = asyncio.ensure_future(call(remote, cancel=lambda: flag["stop"]))
    while script.hits == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    t0 = time.monotonic()
    flag["stop"] = True
    with pytest.raises(Cancelled):
        await task
    assert time.monotonic() - t0 < 1.0 and script.hits == 1


async def test_keep_alive_reuse(scripted):
    script, remote = await scripted()
    await call(remote)
    await call(remote)
    assert len(set(script.peers)) == 1  # one connection for both
    script.close_after = True  # answered with "Connection: close": not kept for the next one
    await call(remote)
    await call(remote)
    assert remote.retried == 0 and script.hits == 4
    assert script.peers[2] == script.peers[0] and script.peers[3] != script.peers[2]


async def test_idle_connection_closed_by_the_server_is_replaced(scripted):
    script, remote = await scripted()
    await call(remote)
    script.transports[0].close()  # the server drops the idle keep-alive connection
    await asyncio.sleep(0.1)
    assert await call(remote)
    assert remote.retried == 0 and script.hits == 2 and len(set(script.peers)) == 2


def test_settings_from_options():
    """RemoteSettings built from options: the wire names a user sets."""
    from diffill.lsp_server.backend.remote import settings_from_options

    class Opts:
        remote_url = "http://gpu-box:8000/v1"
        remote_model = "team"
        api_key_env = "TEAM_KEY"
        remote_timeout_ms = 2500.0
        remote_retries = 4

    s = settings_from_options(Opts())
    assert (s.url, s.model, s.api_key_env, s.timeout_s, s.retries) == (
        "http://gpu-box:8000/v1", "team", "TEAM_KEY", 2.5, 4)
    assert msgspec.json.encode(s)  # plain data, no key inside
