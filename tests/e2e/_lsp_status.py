"""What the pytest-lsp end-to-end tests (``test_lsp_*.py``) share: the server's own
``diffill/status`` request, and a wait until its answer says what the test needs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pytest_lsp import LanguageClient


async def status(client: LanguageClient) -> Any:
    return await client.protocol.send_request_async("diffill/status", None)


async def wait_status(client: LanguageClient, done: Callable[[Any], Any], why: str,
                      timeout: float = 90.0) -> Any:
    """The server's status once ``done(status)`` is true, polled every 0.1 s; the test fails
    with ``why`` after ``timeout`` seconds."""
    t0 = time.monotonic()
    while True:
        st = await status(client)
        if done(st):
            return st
        assert time.monotonic() - t0 < timeout, why
        await asyncio.sleep(0.1)
