"""A live ``diffill serve-http`` stack in-process for the tests of lsp_server/http/: the
prompt the scripted checkpoint (support/scripted_model.py) answers, the base URL of each
client session's server, and raw-socket helpers that send what a well-behaved client
library never would. The ``serve`` fixture that starts one is in
tests/unit/lsp_server/http/conftest.py."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

from aiohttp import ClientSession
from diffill.lsp_server.completion.options import CompletionOptions

PROMPT = "def add_numbers(a, b):\n    total = a + b\n    return "
SUFFIX = "\n\n\ndef greet_user(name):\n    message = \"hello \" + name\n"
OPTS = CompletionOptions(steps=2)
TOKEN = "tok-Secret-4711-abcdef"
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()

BASE_URLS: dict[int, str] = {}
"""id(session) -> the base URL of the live server it talks to."""


def base_url(client: ClientSession) -> str:
    return BASE_URLS[id(client)]


async def post(client: ClientSession, body: dict | bytes, **kw):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post("/v1/completions", data=data, **kw)
    return resp, await resp.json()


def addr(client) -> tuple[str, int]:
    u = urlsplit(base_url(client))
    return u.hostname, u.port


def _complete(raw: bytes) -> bool:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return len(body) >= int(v)
    return False


async def raw_exchange(client, data: bytes, *, wait_s: float = 5.0, until_close: bool = False,
                       close: bool = False) -> tuple[bytes, float]:
    """Send ``data`` on a fresh connection and read one whole response (or, with
    ``until_close``, until the server closes the connection), at most ``wait_s``;
    (what was received, or b"<still open>" on a timeout; seconds it took)."""
    reader, writer = await asyncio.open_connection(*addr(client))
    t0 = time.monotonic()
    writer.write(data)
    await writer.drain()
    if close:
        writer.close()
        return b"", 0.0
    got = bytearray()

    async def read() -> None:
        while True:
            chunk = await reader.read(65536)
            got.extend(chunk)
            if not chunk or (not until_close and _complete(bytes(got))):
                return

    try:
        await asyncio.wait_for(read(), wait_s)
        out = bytes(got)
    except asyncio.TimeoutError:
        out = b"<still open>"
    writer.close()
    return out, time.monotonic() - t0


def parse_http(raw: bytes) -> tuple[int, dict[str, str], dict]:
    """(status, headers, JSON body) of the first response in ``raw``."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    n = int(headers.get("content-length", len(body)))
    return status, headers, json.loads(body[:n])


async def health(client) -> dict:
    async with client.get("/health") as r:
        return await r.json()


def completion_head(length: int, *, auth: bool = True, extra: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + (AUTH if auth else b"") + extra + f"Content-Length: {length}\r\n\r\n".encode())
