"""The model behind the language server: loading it on the scheduler's worker thread
(again when the settings that build it change), with ``$/progress`` when the client
supports it; a failure shown to the user, the server staying up; and the wait of a request
that arrives meanwhile (:meth:`ModelLoad.wait`).

A request that arrives while the model loads waits for the load instead of being answered
empty, so the keystroke that opened the file still gets its suggestion: at most
``LOAD_WAIT_S`` seconds, cancelled by ``$/cancelRequest`` (or a shutdown), and superseded
by a newer request of the same kind on the same document (latest wins: the older one is
answered empty at once).

Test hook: the environment variable ``DIFFILL_DEBUG_LOAD_DELAY_MS=N`` makes every model
load wait N ms on the worker thread before it starts, so end-to-end tests can act while
the model is still loading (an editor closed right after opening a file). Never set it
in normal use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from ..backend.backends import BACKENDS, Backend
from ..completion.completer import Completer
from ..completion.options import CompletionOptions
from .scheduler import Scheduler

log = logging.getLogger("diffill.server")  # the server's lifecycle lines, as before the cut

LOAD_DELAY_ENV = "DIFFILL_DEBUG_LOAD_DELAY_MS"
LOAD_WAIT_S = 20.0
"""Longest a request that arrives while the model loads waits for the load."""


def debug_load_delay() -> float:
    """Seconds from ``DIFFILL_DEBUG_LOAD_DELAY_MS`` (test hook; 0 when unset or bad)."""
    try:
        return max(0.0, float(os.environ.get(LOAD_DELAY_ENV, "0")) / 1000.0)
    except ValueError:
        return 0.0


class ModelLoad:
    """The model of one server: ``backend`` and its ``completer`` once loaded (None before,
    while loading and after a failure), ``loading``, the failure's message ``error``, and
    the load's ``task``. ``options`` gives the options in force; the load runs on
    ``scheduler``'s worker thread and reports through ``server`` (messages, progress)."""

    def __init__(self, server: LanguageServer, options: Callable[[], CompletionOptions],
                 scheduler: Scheduler) -> None:
        self.server = server
        self.options = options
        self.scheduler = scheduler
        self.backend: Backend | None = None
        self.completer: Completer | None = None
        self.error: str | None = None
        self.loading = False
        self.task: asyncio.Task[None] | None = None
        self._waiters: dict[str, asyncio.Future[None]] = {}  # key -> the waiting request's

    def start(self) -> None:
        """Load the configured model (again): a load in progress is cancelled first."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.task = asyncio.ensure_future(self.load())

    def pending(self) -> bool:
        """True while a model load has been started and has not finished."""
        return self.task is not None and not self.task.done()

    async def wait(self, key: str) -> bool:
        """Wait (at most ``LOAD_WAIT_S``) for the model load in progress; False when a newer
        request with the same ``key`` superseded this one meanwhile. The load itself is not
        cancelled when the waiting request is ($/cancelRequest raises here)."""
        loop = asyncio.get_running_loop()
        older = self._waiters.get(key)
        if older is not None and not older.done():
            older.set_result(None)  # latest wins: the older request is answered empty now
        mine: asyncio.Future[None] = loop.create_future()
        self._waiters[key] = mine
        deadline = loop.time() + LOAD_WAIT_S
        try:
            # A reload (settings changed) replaces the task: wait for the new one.
            while self.completer is None and self.pending() and not mine.done():
                left = deadline - loop.time()
                if left <= 0:
                    break
                task = self.task
                assert task is not None
                await asyncio.wait({task, mine}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._waiters.get(key) is mine:
                del self._waiters[key]
        return not mine.done()

    def _supports_progress(self) -> bool:
        caps = self.server.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    async def load(self) -> None:
        """Load the configured model on the worker thread, with $/progress when the
        client supports it; a failure is shown to the user and leaves the server up."""
        opts = self.options()
        name = opts.remote_url if opts.backend == "openai" else (opts.model_path or "the default model")
        self.loading, self.backend, self.completer, self.error = True, None, None, None
        token = await self._progress_begin(f"loading {name} on {opts.device}")
        t0 = time.perf_counter()
        try:
            factory = BACKENDS[opts.backend]

            def work() -> Backend:
                delay = debug_load_delay()
                if delay:
                    time.sleep(delay)
                backend = factory(opts.model_path, opts.device, max_steps=opts.max_steps, options=opts)
                backend.warmup()
                return backend

            backend = await self.scheduler.call(work)
        except asyncio.CancelledError:
            self._progress_end(token, "cancelled")
            raise
        except Exception as e:
            self.error = f"cannot load model {name}: {type(e).__name__}: {e}"
            log.error("%s", self.error)
            self.server.window_show_message(
                types.ShowMessageParams(type=types.MessageType.Error, message=f"diffill: {self.error}")
            )
            self._progress_end(token, "failed")
        else:
            self.backend = backend
            self.completer = Completer(backend, self.options())
            log.info("model loaded in %.2f s: %s", time.perf_counter() - t0, backend.describe())
            self._progress_end(token, "model loaded")
        finally:
            self.loading = False

    async def _progress_begin(self, message: str) -> str | None:
        if not self._supports_progress():
            return None
        token = f"diffill-load-{uuid.uuid4().hex[:8]}"
        # asyncio.wait, not wait_for: Python 3.11's wait_for drops a cancel that arrives as
        # the answer does, and the cancelled load would go on (at exit, or after a reload).
        create = asyncio.ensure_future(self.server.work_done_progress.create_async(token))
        try:
            done, _ = await asyncio.wait({create}, timeout=5.0)
        finally:
            if not create.done():
                create.cancel()
        if not done:
            log.info("no progress token: the client did not answer in 5 s")
            return None
        if create.cancelled():  # by pygls, at a shutdown request
            return None
        if create.exception() is not None:  # the client refused
            log.info("no progress token: %s", create.exception())
            return None
        self.server.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title="diffill", message=message, cancellable=False)
        )
        return token

    def _progress_end(self, token: str | None, message: str) -> None:
        if token is not None:
            self.server.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))


__all__ = ["LOAD_WAIT_S", "ModelLoad", "debug_load_delay"]
