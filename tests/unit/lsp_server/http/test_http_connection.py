"""The connection layer of diffill serve-http (lsp_server/http/http_connection.py): the
bearer token, header and idle timeouts, the connection cap, the token never in the log.
The server runs in-process on a loopback port (the ``serve`` fixture, conftest.py) over
the scripted checkpoint; raw sockets send what a client library never would."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from support.http_serving import (
    TOKEN,
    addr,
    completion_head,
    health,
    parse_http,
    post,
    raw_exchange,
)


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


async def test_slow_and_silent_headers_are_closed_within_the_header_timeout(serve, backend):
    """Slowloris: a head dripped a byte at a time, or nothing at all, without a token."""
    client, _ = await serve(backend, token=TOKEN, header_timeout_s=0.5)

    async def drip() -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection(*addr(client))
        t0 = time.monotonic()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n")
        out = b""
        for _ in range(40):  # 8 s of one header byte every 0.2 s
            try:
                out = await asyncio.wait_for(reader.read(), 0.2)
                break
            except asyncio.TimeoutError:
                writer.write(b"X")
        writer.close()
        return out, time.monotonic() - t0

    (dripped, t_drip), (silent, t_silent) = await asyncio.gather(
        drip(), raw_exchange(client, b"", wait_s=8, until_close=True))
    for raw, took in ((dripped, t_drip), (silent, t_silent)):
        assert raw and raw != b"<still open>"
        status, headers, body = parse_http(raw)
        assert status == 408 and body["error"]["code"] == "header_timeout"
        assert headers["connection"] == "close"
        assert 0.4 <= took < 1.5, took
    h = await health(client)
    assert h["closed_header_timeout"] == 2 and h["limits"]["header_timeout_s"] == 0.5


async def test_idle_keep_alive_connection_is_closed(serve, backend):
    client, _ = await serve(backend, idle_timeout_s=0.5)
    out, took = await raw_exchange(client, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n", wait_s=8,
                                   until_close=True)
    assert out.startswith(b"HTTP/1.1 200")  # answered, then kept alive until idle
    assert 0.4 <= took < 1.5, took
    assert (await health(client))["closed_idle"] == 1


async def test_connection_cap(serve, backend):
    """With every connection busy (here: each uploading a body that has not all arrived),
    a new one gets 503 and is closed. (Connections that only wait are closed to make room
    instead: tests/unit/lsp_server/http/test_http_server_probe.py.)"""
    client, _ = await serve(backend, max_connections=3)
    held = []
    for _ in range(3):
        r, w = await asyncio.open_connection(*addr(client))
        w.write(completion_head(1000, auth=False) + b'{"prompt": "')
        held.append((r, w))
    await asyncio.sleep(0.1)
    out, took = await raw_exchange(client, b"")
    status, _, err = parse_http(out)
    assert status == 503 and err["error"]["code"] == "too_many_connections" and took < 1.0
    for _, w in held:
        w.close()
    await asyncio.sleep(0.2)
    h = await health(client)
    assert h["status"] == "ok" and h["rejected_connections"] == 1 and h["connections"] <= 1


async def test_a_non_utf8_authorization_byte_reveals_nothing_about_the_token(serve, backend):
    client, _ = await serve(backend, token=TOKEN)
    bodies = set()
    for presented in (b"\xff", b"tok-\xff", b"x" * len(TOKEN) + b"\xfe", b"wrong"):
        out, _ = await raw_exchange(client, b"GET /v1/models HTTP/1.1\r\nHost: t\r\n"
                                    b"Authorization: Bearer " + presented + b"\r\n\r\n")
        status, _, body = parse_http(out)
        assert status == 401
        bodies.add(json.dumps(body))
    assert len(bodies) == 1  # one answer whatever was sent: no position, no length


async def test_the_token_never_reaches_the_log(serve, backend, caplog):
    client, _ = await serve(backend, token=TOKEN)
    caplog.set_level(logging.DEBUG)
    sent = [
        f"GET /v1/models?api_key={TOKEN} HTTP/1.1\r\nHost: t\r\n\r\n".encode(),
        f"POST /v1/completions?token={TOKEN}&x=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{{}}"
        .encode(),
        f"GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\x01\r\n\r\n".encode(),
        f"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Api-Key: {TOKEN}\x7f\r\n\r\n".encode(),
        f"GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}x\r\n\r\n".encode(),
    ]
    answers = [(await raw_exchange(client, data))[0] for data in sent]
    await asyncio.sleep(0.05)
    assert all(a.startswith(b"HTTP/1.") for a in answers)
    assert TOKEN.encode() not in b"".join(answers)  # nor echoed back
    logged = "\n".join(caplog.text.splitlines() + [str(r.__dict__) for r in caplog.records])
    assert TOKEN not in logged and TOKEN[4:-4] not in logged
    assert "<redacted>" in logged
