"""Where middles come from: a :class:`Backend` turns a :class:`FimContext` into
candidate middles (text). The language server and the CLI only see this protocol.

* :class:`LocalBackend` -- the resident model in this process
  (:class:`diffill.model.engine.Engine`), token ids straight from the context. The
  engine decides the steps: a request's ``InfillAsk.budget_ms`` goes to its step budget
  (:mod:`diffill.model.plan`), which :meth:`LocalBackend.warmup` measures once.
* a remote backend (``backend="openai"``: an OpenAI-compatible ``/v1/completions``
  endpoint with ``prompt`` + ``suffix``) implements the same protocol: it sends
  ``ctx.prefix`` / ``ctx.suffix`` as text and may count tokens with a local
  tokenizer or an estimate. Register it in :data:`BACKENDS` under its name.

Cancellation: ``infill`` calls ``cancel()`` between refinement steps and raises
:class:`Cancelled` when it returns True.

Test hook: the environment variable ``DIFFILL_DEBUG_STEP_DELAY_MS`` makes
:class:`LocalBackend` sleep that long inside every cancel check, i.e. once per
diffusion step, so end-to-end tests get deterministic slowness for
cancellation and supersession. Never set it in normal use.

Test hook: ``DIFFILL_DEBUG_FAULT=<MemoryError|RuntimeError>:<n>`` makes the first ``n``
model calls of :class:`LocalBackend` raise that exception from their first cancel
check inside the engine (where the step loop checks between steps, i.e. where an
out-of-memory error in a step would surface), to test how faults reach the user.
Never set it in normal use.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ...model.limits import DEFAULT_MAX_STEPS
from ..text.context import FimContext
from .backend_api import (
    Backend,
    BackendError,
    CancelFn,
    Cancelled,
    Candidate,
    InfillAsk,
    InfillResult,
)
from .remote import load_remote_backend

if TYPE_CHECKING:  # the model side imports torch; only the types are needed here
    from ...model.asks import EngineAsk, InfillOutcome
    from ...model.config import ModelConfig

log = logging.getLogger("diffill.backends")

QUICK_PLAN_MS = 50.0
"""A CPU model whose tiny warm-up request takes longer is planned in the background
(:meth:`LocalBackend.warmup`); the shipped model's takes a few ms, the 0.5B shape's ~0.25 s."""
BACKGROUND_PLAN_PARAMS = 100_000_000
"""Smaller models are always planned before the server is ready (the shipped one's plan takes
~0.3 s), whatever a busy machine makes of their warm-up request's time."""
TINY_CONTEXT, TINY_HOLE = 16, 8  # the warm-up request: canvas context tokens, hole slots
PLAN_ROWS = 3  # the rows measure_plan (and so Engine.measure_plan) plans for

DEBUG_DELAY_ENV = "DIFFILL_DEBUG_STEP_DELAY_MS"
DEBUG_FAULT_ENV = "DIFFILL_DEBUG_FAULT"
_FAULTS: dict[str, type[Exception]] = {"MemoryError": MemoryError, "RuntimeError": RuntimeError}


def debug_step_delay_s() -> float:
    """Seconds from ``DIFFILL_DEBUG_STEP_DELAY_MS`` (test hook; 0 when unset/bad)."""
    try:
        return max(0.0, float(os.environ.get(DEBUG_DELAY_ENV, "0")) / 1000.0)
    except ValueError:
        return 0.0


def debug_fault() -> tuple[type[Exception], int] | None:
    """``DIFFILL_DEBUG_FAULT`` parsed (test hook; None when unset or malformed)."""
    kind, _, count = os.environ.get(DEBUG_FAULT_ENV, "").partition(":")
    if kind not in _FAULTS:
        return None
    return _FAULTS[kind], int(count) if count.isdigit() else 1


class TokenizerLike(Protocol):
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


class InfillEngine(Protocol):
    """What :class:`LocalBackend` needs from :class:`diffill.model.engine.Engine` (which
    implements it; test fakes implement it too)."""

    @property
    def tokenizer(self) -> TokenizerLike: ...

    @property
    def config(self) -> ModelConfig: ...

    def infill(self, ask: EngineAsk) -> InfillOutcome:
        """Candidates best first (a candidate's ``draft`` indexes ``ask.drafts``) and the step
        decision; raises ``InfillCancelled`` or ``ValueError``."""
        ...

    def warmup(self) -> Any:
        """First-call overheads paid, the step plan measured."""
        ...

    def warmup_on(self, prefix_ids: list[int], suffix_ids: list[int], *, max_tokens: int,
                  candidates: int = 1) -> float:
        """One step timed on this request's shape, the step plan made from it (ms)."""
        ...

    def budget_ms(self, requested: float | None = None) -> float:
        """The latency budget in force for a request."""
        ...

    def describe(self) -> dict[str, Any]:
        """Model, device, step budget and counters, for status reports."""
        ...


PLAN_FIT_CTX = 1024
"""The background plan's largest measured context (the default ``contextTokens``): larger
buckets come from its cost model, and the server's peak memory stays that of a request."""
PLAN_FIT_HOLE = 32
"""Likewise its largest measured hole (the default ``maxTokens``)."""


class LocalBackend:
    """The in-process model through :class:`diffill.model.engine.Engine`."""

    name = "local"

    def __init__(self, engine: InfillEngine, *, step_delay_s: float | None = None) -> None:
        self.engine = engine
        self.step_delay_s = debug_step_delay_s() if step_delay_s is None else step_delay_s
        self.model_calls = 0
        fault = debug_fault()
        self._fault, self._faults_left = fault if fault is not None else (None, 0)
        self._fault_lock = threading.Lock()
        self.plan_thread: threading.Thread | None = None  # the background step plan (warmup)
        self._plan_stop = threading.Event()
        self.requests_first = RequestsFirst()  # the background plan gives way to requests

    # -- protocol --------------------------------------------------------------------------
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.engine.tokenizer.encode_batch(texts)

    @property
    def cross_file(self) -> str:
        """How the loaded family reads other files before the prefix (``Recipe.cross_file``)."""
        recipe = getattr(self.engine.config, "recipe", None)
        return getattr(recipe, "cross_file", "comment") if recipe is not None else "comment"

    def max_context_tokens(self, max_tokens: int) -> int | None:
        limit = self.engine.config.max_position_embeddings
        if not limit:
            return None
        return max(0, int(limit) - max_tokens - 2)  # BOS + EOS around the canvas

    def infill(self, ctx: FimContext, ask: InfillAsk) -> InfillResult:
        """See :class:`Backend`; ``temperature`` > 0 samples (``seed`` makes it repeatable).
        The steps: ``ask.steps``, else the engine's step plan for ``ask.budget_ms``.
        ``drafts`` are tokenized here and verified by the engine in the same batch. The
        document's path is the engine's ``context_key`` (its context kept for the next request)."""
        from ...model.asks import EngineAsk  # torch: as above
        from ...model.decoder.spec import InfillCancelled  # torch: loaded with the model

        check = self._wrap_cancel(ask.cancel)
        self.model_calls += 1
        draft_ids = self.encode_batch(list(ask.drafts)) if ask.drafts else []
        sampled = ask.temperature > 0
        self.requests_first.enter()
        try:
            out = self.engine.infill(EngineAsk(
                ctx.prefix_ids, ctx.suffix_ids, max_tokens=ask.max_tokens, candidates=ask.n,
                steps=ask.steps, budget_ms=ask.budget_ms,
                temperature=float(ask.temperature) if sampled else None,
                seed=ask.seed if sampled else None, cancel=check, drafts=draft_ids,
                context_key=ctx.path))
        except InfillCancelled as e:
            raise Cancelled(str(e)) from None
        except ValueError as e:
            raise BackendError(str(e)) from None
        finally:
            self.requests_first.leave()
        tok = self.engine.tokenizer
        return InfillResult([
            Candidate(text=tok.decode(r.ids), score=float(r.score), tokens=len(r.ids), steps=r.steps,
                      draft=r.draft, accepted=r.accepted, verified=r.verified)
            for r in out.candidates
        ], out.decision)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, **self.engine.describe(), "model_calls": self.model_calls}

    def warmup(self) -> None:
        """The engine's warm-up: first-call overheads, then the step plan (every shape
        bucket on CUDA; two buckets and a fitted cost model on a CPU, to stay quick).

        On a CPU, for a model of :data:`BACKGROUND_PLAN_PARAMS` parameters or more, one tiny
        request (one row, one step) runs first and pays the first-call costs. When it
        took more than :data:`QUICK_PLAN_MS` (a model whose plan takes a minute or more to
        measure there: the 0.5B shape's largest bucket alone is a step of seconds), the plan
        is measured on a background thread and the server is ready now: requests meanwhile
        follow :func:`~diffill.model.measure.provisional_plan` from that request's time, which
        never allows more steps than fit (its timings say ``provisional``, and so does
        :meth:`describe`'s ``step_plan.provisional``). A faster model is planned here, as before."""
        eng = self.engine
        if not _plans_in_background(eng) or \
                getattr(eng.lm, "num_parameters", 0) < BACKGROUND_PLAN_PARAMS:
            eng.warmup()
            return
        ms, tokens, rows = self._tiny_request()
        if ms <= QUICK_PLAN_MS:
            eng.warmup()
            return
        from ...model.measure import provisional_plan  # torch: loaded with the model
        from ...model.plan import NoBucketFits  # torch: loaded with the model

        try:
            eng.plan = provisional_plan(
                ms, tokens, eng.budget.budget_ms(), rows=PLAN_ROWS, shared_context=eng.shared_context,
                limit=eng.config.max_position_embeddings, refresh_every=eng.refresh_every,
                max_steps=eng.budget.max_steps, device=str(eng.device),
                dtype=str(eng.dtype).removeprefix("torch."), model=str(getattr(eng.lm, "path", "")))
        except NoBucketFits:
            eng.warmup()  # logs that there is no plan; nothing to measure in the background
            return
        log.info("tiny request %.0f ms (%d tokens x %d rows): provisional step plan; the plan is "
                 "measured in the background", ms, tokens, rows)
        self.plan_thread = threading.Thread(target=self._measure_plan, name="diffill-step-plan",
                                            daemon=True)
        self.plan_thread.start()
        atexit.register(self.stop_plan)

    def stop_plan(self, timeout: float = 10.0) -> None:
        """Stop the background step plan (at its next layer) and wait for it; the provisional
        plan stays. Registered with ``atexit``: a thread still inside a torch op when the
        interpreter finalizes aborts the process ("terminate called without an active
        exception"); ``diffill serve`` itself ends with ``os._exit``."""
        self._plan_stop.set()
        t = self.plan_thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout)

    def _tiny_request(self) -> tuple[float, int, int]:
        """One request of a few tokens, one row, one step, timed: (ms, step tokens, rows)."""
        from ...model.asks import EngineAsk  # torch: loaded with the model
        from ...model.decoder.canvas import canvas_length  # torch: as above
        from ...model.measure import synthetic_request  # torch: as above
        from ...model.plan import step_tokens  # torch: as above

        eng = self.engine
        prefix, suffix = synthetic_request(eng.config, TINY_CONTEXT)
        hole, rows = TINY_HOLE, 1  # one row: half the time of the default three (0.25 s, 0.5B)
        ctx = canvas_length(eng.config, len(prefix), len(suffix), hole) - hole
        t0 = time.perf_counter()
        eng.infill(EngineAsk(prefix, suffix, lengths=(hole,), steps=1))
        ms = (time.perf_counter() - t0) * 1000.0
        return ms, step_tokens(rows, ctx, hole, eng.shared_context), rows

    def _measure_plan(self) -> None:
        """The background plan (:meth:`warmup`): what ``Engine.measure_plan`` measures on a
        CPU, without the engine's lock (a model's forward holds no state). Requests come
        first: while one is in flight the plan waits before its next layer op
        (:class:`RequestsFirst`), so a request has the cores and the memory to itself but for
        the one op the plan was in, and the plan's timings leave the waits out. The thread
        also runs at a lower priority (nice +10 on Linux)."""
        from ...model.measure import measure_plan  # torch: loaded with the model

        eng = self.engine
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        me, stop, first = threading.get_ident(), self._plan_stop, self.requests_first

        def check(_module: Any, _args: Any) -> None:  # between two layers' ops, this thread only
            if threading.get_ident() == me:
                if stop.is_set():
                    raise _PlanStopped
                first.give_way(stop)

        leaves = [m for m in eng.model.modules() if next(m.children(), None) is None]
        hooks = [m.register_forward_pre_hook(check) for m in leaves]
        t0 = time.perf_counter()
        try:
            plan = measure_plan(
                eng.model, eng.config, budget_ms=eng.budget.budget_ms(), fit=True, rows=PLAN_ROWS,
                refresh_every=eng.refresh_every, repeats=2, max_steps=eng.budget.max_steps,
                statistic=min, model_name=str(getattr(eng.lm, "path", "")),
                shared_context=eng.shared_context, fit_ctx=PLAN_FIT_CTX, fit_hole=PLAN_FIT_HOLE,
                clock=first.clock)
        except _PlanStopped:
            return
        except Exception as e:  # the provisional plan stays
            log.warning("background step plan failed (%s: %s); the provisional plan stays",
                        type(e).__name__, e)
            return
        finally:
            for h in hooks:
                h.remove()
        if stop.is_set():
            return
        eng.plan = plan
        log.info("step plan measured in the background in %.1f s", time.perf_counter() - t0)

    def warmup_on(self, ctx: FimContext, *, n: int, max_tokens: int) -> float:
        """A one-shot caller's warm-up (``diffill complete``): one step timed on this
        request's own shape, and the engine's step plan made from it. Milliseconds taken."""
        return self.engine.warmup_on(ctx.prefix_ids, ctx.suffix_ids, max_tokens=max_tokens,
                                     candidates=n)

    def budget_ms(self, requested: float | None = None) -> float:
        """The latency budget in force (the engine's step budget decides)."""
        return self.engine.budget_ms(requested)

    # -- helpers ---------------------------------------------------------------------------
    def _wrap_cancel(self, cancel: CancelFn | None) -> CancelFn | None:
        delay = self.step_delay_s
        fault: type[Exception] | None = None
        if self._fault is not None:
            with self._fault_lock:
                if self._faults_left > 0:
                    self._faults_left -= 1
                    fault = self._fault
        if not delay and fault is None:
            return cancel

        def check() -> bool:
            if fault is not None:
                raise fault(f"injected fault ({DEBUG_FAULT_ENV})")
            time.sleep(delay)
            return bool(cancel and cancel())

        return check


class _PlanStopped(Exception):
    """Raised inside the background plan's forward when :meth:`LocalBackend.stop_plan` asks."""


class RequestsFirst:
    """Requests in flight, for a background job that must give way to them (the step plan):
    :meth:`give_way` returns at once when none is, else when the last one ends, and
    :meth:`clock` is a clock that leaves out the time spent waiting there."""

    POLL_S = 0.05  # how often a wait looks at its stop event

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self._idle = threading.Event()
        self._idle.set()
        self.waited_s = 0.0
        self.waiting = False  # a give_way is waiting now

    def enter(self) -> None:
        with self._lock:
            self._n += 1
            self._idle.clear()

    def leave(self) -> None:
        with self._lock:
            self._n -= 1
            if self._n == 0:
                self._idle.set()

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def give_way(self, stop: threading.Event) -> None:
        """Wait while a request is in flight; raises :class:`_PlanStopped` once ``stop`` is set."""
        if self._idle.is_set():
            return
        t0 = time.perf_counter()
        self.waiting = True
        try:
            while not self._idle.wait(self.POLL_S):
                if stop.is_set():
                    raise _PlanStopped
        finally:
            self.waiting = False
            self.waited_s += time.perf_counter() - t0

    def clock(self) -> float:
        """Seconds, as ``time.perf_counter``, less the time :meth:`give_way` waited."""
        return time.perf_counter() - self.waited_s


def _plans_in_background(engine: Any) -> bool:
    """Whether :meth:`LocalBackend.warmup` may plan ``engine`` in the background: a real
    :class:`~diffill.model.engine.Engine` on a CPU (test fakes and CUDA warm up as before)."""
    try:
        from ...model.engine import Engine  # torch: loaded with the model
    except ImportError:
        return False
    return isinstance(engine, Engine) and engine.device.type == "cpu"


def load_local_backend(
    model_path: str | None, device: str = "cpu", *, max_steps: int = DEFAULT_MAX_STEPS, options: Any = None,
    recipe: str | None = None, **_: Any
) -> LocalBackend:
    """Load a checkpoint (None = the shipped default model; a folder or the name of a
    pulled checkpoint) into a :class:`LocalBackend`. ``options`` (CompletionOptions)
    supplies the engine's default latency budget (what a request without one falls back to;
    the completer passes each call its request's budget in the ask) and the ``recipe`` override (``recipe`` given here
    wins); ``max_steps`` bounds the steps its plan chooses."""
    from ...model import load_model  # torch: the server imports this module before `initialize`
    from ...model.engine import Engine  # torch: as above
    from ...model.engine_options import EngineOptions  # torch: as above
    from ...model.runtime import resolve_device  # torch: as above

    if recipe is None and options is not None:
        recipe = options.recipe
    # "auto" leaves the choice to the model side (and its DIFFILL_WEIGHTS / DIFFILL_CONTEXT)
    weights = None if options is None or options.weights == "auto" else options.weights
    context = "auto" if options is None else options.context
    lm = load_model(model_path, device=str(resolve_device(device)), recipe=recipe, weights=weights)
    budget = None if options is None else options.latency_budget_ms
    return LocalBackend(Engine(lm, budget_ms=budget, max_steps=max_steps,
                               options=EngineOptions(context=context)))


BACKENDS: dict[str, Callable[..., Backend]] = {
    "local": load_local_backend,
    "openai": load_remote_backend,  # see :mod:`.remote`
}
"""Backend name (options ``backend``) -> factory(model_path, device, *, max_steps, options)."""


__all__ = [  # the protocol's names are re-exported: importers of the backends need one module
    "BACKENDS",
    "Backend",
    "BackendError",
    "CancelFn",
    "Cancelled",
    "Candidate",
    "InfillAsk",
    "InfillEngine",
    "InfillResult",
    "LocalBackend",
    "load_local_backend",
]
