"""What an outside probe of a team server still found (issue 28, part 3), one test each:
strangers holding the connection cap (kept-alive health checks, silent connections),
the open-connection count running ahead of the real one (connect-then-close bursts), a
cheap request holding a worker for long (cost priced from the step plan), the token in
the access log (a bare query item, a path segment, the ``model`` field), ``Expect:
100-continue`` over the size cap, ``X-Request-Id`` on every answer. (The port in use and
SIGHUP are tried on a real process: tests/e2e/test_load_http.py.)

The server runs in-process on a loopback port over the scripted checkpoint, as in
test_http_server.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from urllib.parse import urlsplit

import pytest_asyncio
from aiohttp import ClientSession
from diffill.lsp_server.backend.backends import LocalBackend
from diffill.lsp_server.completion.options import CompletionOptions
from diffill.lsp_server.http.http_connection import HttpConfig, Listener
from diffill.lsp_server.http.http_server import HttpFront
from diffill.model.engine import Engine
from diffill.model.plan import BucketTiming, plan_from_timings

PROMPT = "def add_numbers(a, b):\n    total = a + b\n    return "
OPTS = CompletionOptions(steps=2)
TOKEN = "tok-Probe-0815-qwerty"
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()

@pytest_asyncio.fixture
async def serve():
    started: list[tuple[ClientSession, Listener]] = []

    async def make(backend, options=OPTS, **cfg) -> tuple[str, HttpFront]:
        front = HttpFront(options, HttpConfig(**cfg), backend=backend)
        listener = Listener(front)
        url = await listener.start("127.0.0.1", 0)
        started.append((ClientSession(base_url=url), listener))
        return url, front

    yield make
    for c, listener in started:
        await c.close()
        await listener.close()


def addr(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname, u.port


async def exchange(reader, writer, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send one request on an open connection and read its whole response."""
    writer.write(data)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait_s)
    length = 0
    for line in head.split(b"\r\n"):
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    body = await asyncio.wait_for(reader.readexactly(length), wait_s)
    return head + body


async def one_request(url: str, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*addr(url))
    try:
        return await exchange(reader, writer, data)
    except (asyncio.IncompleteReadError, ConnectionError):
        return b"<closed>"
    finally:
        writer.close()


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else -1


HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n" + AUTH + b"\r\n"


async def health_of(url: str) -> dict:
    raw = await one_request(url, HEALTH)
    return json.loads(raw.partition(b"\r\n\r\n")[2])


# ----------------------------------------------------------------------------- the connection cap


async def test_kept_alive_strangers_cannot_lock_out_the_team(serve, backend):
    """The probe: strangers' kept-alive connections, each sending GET /health now and
    then, held every slot, and everyone else got 503. Now a newcomer closes the longest
    idle stranger's connection; an authenticated connection outlives the strangers'."""
    url, front = await serve(backend, token=TOKEN, max_connections=4)
    team = await asyncio.open_connection(*addr(url))
    assert status_of(await exchange(*team, MODELS)) == 200  # authenticated, now idle
    strangers = [await asyncio.open_connection(*addr(url)) for _ in range(3)]
    for conn in strangers:
        assert status_of(await exchange(*conn, HEALTH)) == 200  # idle, kept alive
    await asyncio.sleep(0.05)
    assert len(front.connections) == 4
    for _ in range(3):  # health checks and the team's requests on new connections
        assert status_of(await one_request(url, HEALTH)) == 200
    more = []
    for _ in range(3):  # teammates who keep their connections
        more.append(await asyncio.open_connection(*addr(url)))
        assert status_of(await exchange(*more[-1], MODELS)) == 200
    assert status_of(await exchange(*team, MODELS)) == 200  # the first teammate's survived
    for r, _ in strangers:  # every stranger was closed for room, none of the team
        assert await asyncio.wait_for(r.read(), 1) == b""
    h = await health_of(url)
    assert h.get("rejected_connections", 0) == 0 and h["evicted_connections"] >= 3
    for _, w in [team, *strangers, *more]:
        w.close()


async def test_silent_connections_do_not_lock_out_the_team(serve, backend):
    """The probe's second shape: connections that send nothing (reopened as the header
    timeout closes them) holding every slot."""
    url, front = await serve(backend, token=TOKEN, max_connections=4)
    silent = [await asyncio.open_connection(*addr(url)) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert len(front.connections) == 4
    assert status_of(await one_request(url, MODELS)) == 200
    assert status_of(await one_request(url, HEALTH)) == 200
    closed = 0
    for r, w in silent:  # the ones closed for room were told why, in JSON
        try:
            raw = await asyncio.wait_for(r.read(), 0.5)
        except asyncio.TimeoutError:
            continue
        if raw:
            assert status_of(raw) == 503 and b"make room" in raw
        closed += 1
        w.close()
    assert closed >= 1
    for _, w in silent:
        w.close()


async def test_connect_then_close_bursts_are_not_counted_as_open(serve, backend):
    """Clients that connected and closed before the server accepted them (a burst: the
    kernel completes the handshake, the loop accepts later) were counted as open until
    their EOF was read: with never more than one live socket, a burst got 503s. The
    count at the cap is now the real one."""
    url, front = await serve(backend, max_connections=4)
    host, port = addr(url)
    # all of this happens before the server's loop runs again: it accepts them in a batch
    for i in range(8):
        s = socket.create_connection((host, port))
        if i % 2:  # half with a reset instead of a FIN
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    live = socket.create_connection((host, port))
    live.sendall(HEALTH)
    live.setblocking(False)
    loop = asyncio.get_running_loop()
    raw = await asyncio.wait_for(loop.sock_recv(live, 65536), 5)
    live.close()
    assert status_of(raw) == 200, raw[:200]
    h = await health_of(url)
    assert h.get("rejected_connections", 0) == 0 and h["closed_peer_gone"] >= 1


# ----------------------------------------------------------------------------- the cost of a request


def slow_plan_backend(backend: LocalBackend, step_ms: float = 50.0) -> LocalBackend:
    """The scripted model with a step plan saying each step costs ``step_ms`` at 3 rows."""
    timings = [BucketTiming(ctx=c, hole=h, rows=3, full_ms=step_ms, block_ms=step_ms)
               for c in (256, 512, 1024) for h in (8, 16, 32, 64)]
    plan = plan_from_timings(timings, 200.0, max_steps=16)
    return LocalBackend(Engine(backend.engine.lm, plan=plan, max_steps=16))


async def test_a_request_is_priced_by_its_cost_and_the_cost_is_capped(serve, backend):
    """max_tokens 64 x steps 64 is a small body and 64 steps of 50 ms: over a 1 s cap it
    is refused before it runs, naming what it would cost; cheap requests pass, and so
    does a llama.vim request whose latency budget asks for far more than the cap."""
    priced = slow_plan_backend(backend)
    url, front = await serve(priced, max_request_ms=1000.0)
    async with ClientSession(base_url=url) as client:
        calls = priced.model_calls
        async with client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 64,
                                                         "steps": 64}) as r:
            out = await r.json()
            assert r.status == 400, out
        assert out["error"]["code"] == "request_too_costly" and out["error"]["param"] == "steps"
        assert "64 steps" in out["error"]["message"] and "1000 ms" in out["error"]["message"]
        assert priced.model_calls == calls  # refused before it ran
        async with client.post("/v1/completions", json={"prompt": [PROMPT] * 8, "max_tokens": 8,
                                                         "steps": 4}) as r:
            assert r.status == 400  # 8 prompts x 4 steps x 50 ms: the whole request is priced
        async with client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8,
                                                         "steps": 2}) as r:
            assert r.status == 200
        async with client.post("/infill", json={"input_prefix": PROMPT, "n_predict": 64,
                                                "t_max_predict_ms": 100_000}) as r:
            out = await r.json()
            assert r.status == 200, out  # the budget is lowered to the cap, not refused
            assert out["generation_settings"]["t_max_predict_ms"] == 1000.0
        assert (await health_of(url))["limits"]["max_request_ms"] == 1000.0


async def test_the_cost_cap_defaults_by_device(serve, backend):
    url, _ = await serve(slow_plan_backend(backend))
    assert (await health_of(url))["limits"]["max_request_ms"] == 5000.0  # a CPU


# ----------------------------------------------------------------------------- the token in the log


async def test_the_token_never_reaches_the_log_in_any_position(serve, backend, caplog):
    url, _ = await serve(backend, token=TOKEN, model_names=["micro"])
    caplog.set_level(logging.DEBUG)
    body = json.dumps({"prompt": "x", "model": TOKEN}).encode()
    infill = json.dumps({"prompt": "x", "model": TOKEN}).encode()
    sent = [
        f"GET /v1/models?{TOKEN} HTTP/1.1\r\nHost: t\r\n\r\n".encode(),
        f"GET /v1/models?{TOKEN}=1 HTTP/1.1\r\nHost: t\r\n\r\n".encode(),
        f"GET /v1/models/{TOKEN} HTTP/1.1\r\nHost: t\r\n".encode() + AUTH + b"\r\n",
        f"GET /{TOKEN}/v1/models HTTP/1.1\r\nHost: t\r\n\r\n".encode(),
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + AUTH
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body,
        b"POST /infill HTTP/1.1\r\nHost: t\r\n" + AUTH
        + f"Content-Length: {len(infill)}\r\n\r\n".encode() + infill,
    ]
    answers = [await one_request(url, data) for data in sent]
    await asyncio.sleep(0.05)
    assert [status_of(a) for a in answers] == [401, 401, 404, 404, 404, 404]
    logged = "\n".join(caplog.text.splitlines() + [str(r.__dict__) for r in caplog.records])
    assert TOKEN not in logged and TOKEN[4:-4] not in logged
    assert "/v1/models/<redacted>" in logged and "/v1/models?<redacted>" in logged


# ----------------------------------------------------------------------------- small things


async def test_expect_100_continue_over_the_size_cap_is_413_before_any_body(serve, backend):
    url, front = await serve(backend, token=TOKEN, max_body_bytes=4096)
    for path in (b"/v1/completions", b"/infill"):
        head = (b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                + AUTH + b"Expect: 100-continue\r\nContent-Length: 600000\r\n\r\n")
        reader, writer = await asyncio.open_connection(*addr(url))
        writer.write(head)  # and no body: a client that waits for the go-ahead
        raw = await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
        assert b"100 Continue" not in raw and status_of(raw) == 413, raw[:200]
    assert front.reading == 0


async def test_every_successful_answer_carries_a_request_id(serve, backend):
    url, _ = await serve(backend, model_names=["micro"])
    for target in (b"/v1/models", b"/v1/models/micro", b"/health", b"/props"):
        raw = await one_request(url, b"GET " + target + b" HTTP/1.1\r\nHost: t\r\n"
                                b"X-Request-Id: probe-7\r\n\r\n")
        assert status_of(raw) == 200 and b"\r\nX-Request-Id: probe-7\r\n" in raw, raw[:300]
