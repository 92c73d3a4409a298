"""ModelLoad.wait (lsp_server/protocol/loading.py; issue 31.5): a request that arrives
while the model loads waits for the load, at most ``LOAD_WAIT_S``. The protocol-level behaviour (the answer comes
once the model is loaded, latest wins, $/cancelRequest) is in tests/e2e/test_lsp_loading.py
against the real ``diffill serve``; here only the bound, with a load that never ends."""

from __future__ import annotations

import asyncio
import time

from diffill.lsp_server.protocol import loading
from diffill.lsp_server.protocol import server as srv


async def test_the_wait_for_the_load_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(loading, "LOAD_WAIT_S", 0.3)
    ls = srv.DiffillServer()
    try:
        ls.model.task = asyncio.ensure_future(asyncio.sleep(3600))  # a load that never ends
        t0 = time.monotonic()
        assert await ls.model.wait("inline file:///a.py") is True  # not superseded: timed out
        assert 0.25 <= time.monotonic() - t0 < 2.0
        assert ls.model.pending()  # the load itself goes on
        # a newer request on the same key answers the older one at once
        older = asyncio.ensure_future(ls.model.wait("inline file:///a.py"))
        await asyncio.sleep(0.05)
        newer = asyncio.ensure_future(ls.model.wait("inline file:///a.py"))
        assert await asyncio.wait_for(older, 0.2) is False
        assert await newer is True
    finally:
        ls.model.task.cancel()
        ls.scheduler.shutdown()
