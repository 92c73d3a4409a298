"""Every HTTP server test runs torch on one thread (tiny models: faster, and far faster on a
busy machine); the ``serve`` fixture of the HTTP server's tests: an :class:`HttpFront` behind a real
:class:`Listener` on a loopback port (the same stack as ``diffill serve-http``: connection
guard, access log), and a client session to it; closed at the end of the test."""

from __future__ import annotations

import pytest
import pytest_asyncio
from aiohttp import ClientSession
from diffill.lsp_server.http.http_connection import HttpConfig, Listener
from diffill.lsp_server.http.http_server import HttpFront
from support.http_serving import BASE_URLS, OPTS


@pytest.fixture(autouse=True)
def _torch_on_one_thread(one_torch_thread):
    yield


@pytest_asyncio.fixture
async def serve():
    started: list[tuple[ClientSession, Listener]] = []

    async def make(backend=None, loader=None, options=OPTS, **cfg) -> tuple[ClientSession, HttpFront]:
        front = HttpFront(options, HttpConfig(**cfg), backend=backend, loader=loader)
        listener = Listener(front)
        url = await listener.start("127.0.0.1", 0)
        client = ClientSession(base_url=url)
        BASE_URLS[id(client)] = url
        started.append((client, listener))
        return client, front

    yield make
    for c, listener in started:
        BASE_URLS.pop(id(c), None)
        await c.close()
        await listener.close()
