"""Where middles come from: a :class:`Backend` turns a :class:`FimContext` into
candidate middles (text). The language server and the CLI only see this protocol.

* :class:`LocalBackend` -- the resident model in this process
  (:class:`diffill.model.engine.Engine`), token ids straight from the context.
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

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .backend_api import Backend, BackendError, CancelFn, Cancelled, Candidate
from .context import FimContext
from .options import default_latency_budget_ms
from .remote import load_remote_backend

DEBUG_DELAY_ENV = "DIFFILL_DEBUG_STEP_DELAY_MS"
DEBUG_FAULT_ENV = "DIFFILL_DEBUG_FAULT"
_FAULTS: dict[str, type[Exception]] = {"MemoryError": MemoryError, "RuntimeError": RuntimeError}


def spread_lengths(max_tokens: int, n: int) -> tuple[int, ...] | None:
    """Candidate hole lengths for ``n`` candidates under ``max_tokens``: ``None`` for one
    candidate (the engine's default set), else halving down from ``max_tokens``."""
    if n <= 1:
        return None
    out: list[int] = []
    length = max_tokens
    while len(out) < n and length >= 2:
        out.append(length)
        length //= 2
    return tuple(sorted(set(out))) or (max_tokens,)


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


class StepTimer:
    """Running estimate of model milliseconds per diffusion step (exponential average),
    used to turn a latency budget into a step count."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.ms_per_step: float | None = None
        self._lock = threading.Lock()

    def observe(self, ms: float, steps: int) -> None:
        if steps <= 0:
            return
        v = ms / steps
        with self._lock:
            self.ms_per_step = v if self.ms_per_step is None else (
                (1 - self.alpha) * self.ms_per_step + self.alpha * v
            )

    def steps_for(self, budget_ms: float, max_steps: int, default: int) -> int:
        if self.ms_per_step is None or self.ms_per_step <= 0:
            return max(1, min(default, max_steps))
        return max(1, min(max_steps, int(budget_ms / self.ms_per_step)))


class LocalBackend:
    """The in-process model through :class:`diffill.model.engine.Engine`."""

    name = "local"

    def __init__(self, engine: Any, *, max_steps: int = 16, step_delay_s: float | None = None,
                 latency_budget_ms: float | None = None) -> None:
        self.engine = engine
        self.max_steps = max_steps
        self.latency_budget_ms = latency_budget_ms
        self.timer = StepTimer()
        self.step_delay_s = debug_step_delay_s() if step_delay_s is None else step_delay_s
        self.model_calls = 0
        fault = debug_fault()
        self._fault, self._faults_left = fault if fault is not None else (None, 0)
        self._fault_lock = threading.Lock()

    # -- protocol --------------------------------------------------------------------------
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.engine.tokenizer.encode_batch(texts)

    def max_context_tokens(self, max_tokens: int) -> int | None:
        limit = getattr(self.engine.config, "max_position_embeddings", None)
        if not limit:
            return None
        return max(0, int(limit) - max_tokens - 2)  # BOS + EOS around the canvas

    def infill(
        self,
        ctx: FimContext,
        *,
        n: int,
        max_tokens: int,
        steps: int | None = None,
        latency_budget_ms: float | None = None,
        cancel: CancelFn | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> list[Candidate]:
        """See :class:`Backend`; ``temperature`` > 0 samples (``seed`` makes it repeatable)."""
        from ..model.sampler import InfillCancelled  # torch: loaded with the model

        if steps is None:
            latency_budget_ms = self.budget_ms(latency_budget_ms)
            if getattr(self.engine, "plan", None) is not None:
                self._replan(latency_budget_ms)  # the engine's step plan picks steps per shape
            else:
                steps = self.timer.steps_for(
                    latency_budget_ms, self.max_steps, self.engine.sampler.steps
                )
        check = self._wrap_cancel(cancel)
        self.model_calls += 1
        t0 = time.perf_counter()
        kw: dict[str, Any] = dict(max_tokens=max_tokens, lengths=spread_lengths(max_tokens, n),
                                  steps=steps, cancel=check)
        try:
            if temperature > 0:
                req = self.engine.make_request(ctx.prefix_ids, ctx.suffix_ids, **kw)
                req.sampler = dataclasses.replace(req.sampler, temperature=float(temperature),
                                                  seed=seed)
                results = self.engine.submit(req)
            else:
                results = self.engine.infill(ctx.prefix_ids, ctx.suffix_ids, **kw)
        except InfillCancelled as e:
            raise Cancelled(str(e)) from None
        except ValueError as e:
            raise BackendError(str(e)) from None
        ms = (time.perf_counter() - t0) * 1000.0
        if results and self.step_delay_s == 0:
            self.timer.observe(ms, max(r.steps for r in results))
        tok = self.engine.tokenizer
        return [
            Candidate(text=tok.decode(r.ids), score=float(r.score), tokens=len(r.ids), steps=r.steps)
            for r in results
        ]

    def describe(self) -> dict[str, Any]:
        lm = self.engine.lm
        cfg = self.engine.config
        es = self.engine.stats() if hasattr(self.engine, "stats") else {}
        return {
            "backend": self.name,
            "model": str(getattr(lm, "path", "")),
            "family": getattr(cfg, "family", None),
            "device": str(self.engine.device),
            "dtype": str(self.engine.dtype).replace("torch.", ""),
            "ms_per_step": self.timer.ms_per_step,
            "latency_budget_ms": self.budget_ms(),
            "step_plan": getattr(self.engine, "plan", None) is not None,
            "model_calls": self.model_calls,
            "engine_completed": es.get("completed"),
            "engine_cancelled": es.get("cancelled"),
        }

    # -- helpers ---------------------------------------------------------------------------
    def budget_ms(self, requested: float | None = None) -> float:
        """The latency budget in force: the request's, else the backend's, else the device's
        default (:data:`~.options.DEFAULT_LATENCY_BUDGET_MS`)."""
        if requested is not None:
            return float(requested)
        if self.latency_budget_ms is not None:
            return float(self.latency_budget_ms)
        return default_latency_budget_ms(getattr(getattr(self.engine, "device", None), "type", "cpu"))

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

    def _replan(self, budget_ms: float) -> None:
        """Re-derive the engine's step plan for a new budget from its measured timings."""
        plan = self.engine.plan
        if abs(plan.budget_ms - budget_ms) < 1e-9:
            return
        from ..model.plan import plan_from_timings  # torch: as above

        thresholds = [c.threshold for c in plan.choices if c.threshold is not None]
        self.engine.plan = plan_from_timings(
            plan.timings, budget_ms, refresh_every=plan.refresh_every, min_steps=plan.min_steps,
            max_steps=plan.max_steps, threshold=thresholds[0] if thresholds else None,
            device=plan.device, dtype=plan.dtype, model=plan.model, measured_at=plan.measured_at,
        )

    def warmup(self) -> None:
        """One tiny infill (first-call overheads paid, ms/step measured); on CUDA also the
        engine's per-shape step plan for ``self.latency_budget_ms`` (CPU: the running
        ms/step estimate is used instead, measuring every bucket would take too long)."""
        latency_budget_ms = self.budget_ms()
        ids = self.encode_batch(["def f(x):\n    return ", "\n"])
        t0 = time.perf_counter()
        res = self.engine.infill(ids[0], ids[1], max_tokens=8, steps=2)
        ms = (time.perf_counter() - t0) * 1000.0
        if res and self.step_delay_s == 0:
            self.timer.observe(ms, max(r.steps for r in res))
        dev = getattr(self.engine, "device", None)
        if (getattr(dev, "type", "") == "cuda"
                and hasattr(self.engine, "measure_plan")):
            self.engine.measure_plan(budget_ms=latency_budget_ms, max_steps=self.max_steps)


def load_local_backend(
    model_path: str | None, device: str = "cpu", *, max_steps: int = 16, options: Any = None, **_: Any
) -> LocalBackend:
    """Load a checkpoint (None = the shipped default model) into a :class:`LocalBackend`.
    ``options`` (CompletionOptions) supplies the latency budget for the step plan."""
    from ..model import load_model  # torch: the server imports this module before `initialize`
    from ..model.engine import Engine  # torch: as above
    from ..model.runtime import resolve_device  # torch: as above

    lm = load_model(model_path, device=str(resolve_device(device)))
    budget = getattr(options, "latency_budget_ms", None)
    return LocalBackend(Engine(lm), max_steps=max_steps, latency_budget_ms=budget)


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
    "LocalBackend",
    "load_local_backend",
]
