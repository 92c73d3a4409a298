"""The resident inference engine.

One :class:`Engine` holds a loaded model for the lifetime of the process and
serves infill requests from any thread. Only one batch runs on the device at a
time; what makes it fast is chosen by :class:`EngineOptions`:

* **Batching across requests** (``batch``, on by default). Requests that
  arrive while a batch runs (several documents, several clients) queue up; the
  next thread to get the device takes every queued request that can share a
  batch (same steps, threshold, strategy, temperature, pad absorption) up to
  ``max_batch_rows`` canvas rows, optionally after waiting ``batch_window_ms``
  for company, and runs them as ONE forward per step. Every request keeps its
  own cancel callback, checked between steps; a cancelled request's rows are
  dropped from the batch (kept but frozen under CUDA graphs, whose shapes are
  fixed) and the others go on. A lone request pays no waiting.
* **Dual KV cache** (``refresh_every`` > 1): prefix/suffix keys and values are
  reused across steps and refreshed every ``refresh_every`` steps
  (:mod:`diffill.model.cache`).
* **One context per request** (``context``; ``'auto'``: on a CPU). The candidate rows and
  draft rows of a request share their prefix and suffix: on a refresh only the request's
  longest row runs its whole canvas and the other rows run their holes against its context
  keys/values (moved to their own positions; :class:`~diffill.model.cache.SharedContext`).
  A step then costs about one canvas plus a hole per row instead of a canvas per row. An
  approximation for the rows whose hole length differs from the longest (measured:
  BENCHMARKS.md, *One context per request*); ``context='row'`` is the exact path.
* **Reuse across keystrokes** (``reuse``; ``'auto'``: where the context is shared). A
  lone request that names its document (``context_key``) starts from the context its
  document's last request left (:mod:`diffill.model.reuse`): the tokens still there are
  reused, the few typed since are recomputed with the hole, and no step recomputes the
  context. Bounded by ``reuse_far`` tokens recomputed and ``reuse_full_every`` reuses in a
  row; ``DIFFILL_REUSE=off`` (or ``reuse='off'``) is the exact path.
* **Fused select-and-unmask** (``select_impl``): the Triton kernel on CUDA
  (:mod:`diffill.kernels.select_unmask`); ``None`` keeps the sampler's torch step.
* **Shape buckets** (``buckets``) and **CUDA graphs** (``cuda_graphs``, greedy
  requests): canvases are padded up to bucket sizes (:mod:`diffill.model.plan`)
  so shapes repeat, and each bucket's step is captured once as a CUDA graph
  and replayed, with no host synchronisation inside the step loop (threshold
  mode reads one flag per step to stop early). Off CUDA the same static-buffer
  loop runs without capture.
* **Step budget** (:attr:`Engine.budget`, a :class:`~diffill.model.budget.StepBudget`):
  a request that names no ``steps`` gets the steps (and threshold) that the step plan
  -- measured once at :meth:`Engine.warmup` / :meth:`Engine.measure_plan`, or given as
  ``plan=``, then frozen -- chose for its shape bucket to fit the latency budget (the
  request's ``budget_ms``, else the engine's, else the device's default). No plan yet:
  the sampler's steps. The policy is :mod:`diffill.model.plan`'s.

With ``context='row'`` and the other defaults (batching on, everything else off) a request's
result is the same as :func:`diffill.model.decoder.loop.infill` on its own (with the CPU default,
``context='auto'``, the same where a request has one row, or rows of one length): both run the sampler's one
decode loop (:func:`diffill.model.decoder.loop.run_steps`); the engine adds the grouping, the
shape buckets and the stepper the options choose (eager, dual cache, CUDA graphs). A
checkpoint whose recipe carries DreamOn's ``<|expand|>`` / ``<|delete|>`` tokens is
decoded by the second decoder, :func:`diffill.model.decoder.dreamon.decode_dreamon`, instead
(the hole grows and shrinks; the candidate lengths are its starting lengths; a batch's
requests share its forwards too), chosen in :meth:`Engine._decode`.

Around it: the request and its answer, the candidate-length policy and the sampler's defaults
(:mod:`.asks`: :class:`~.asks.EngineAsk`, :class:`~.asks.InfillOutcome`,
:func:`~.asks.default_lengths`), the options (:mod:`.engine_options`), the shape buckets and
CUDA graphs (:mod:`.graphs`), the step budget (:mod:`.budget`).

Context trimming is the caller's job: the engine truncates nothing and raises
``ValueError`` when the longest canvas exceeds ``cfg.max_position_embeddings``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .asks import EngineAsk, InfillOutcome, default_lengths, default_sampler
from .budget import StepBudget, StepDecision
from .cache import (
    ONCE,
    SharedContext,
    cached_steps,
    context_groups,
    shared_steps,
    supports_shared_context,
)
from .decoder.canvas import (
    Canvas,
    build_canvas,
    canvas_length,
    initial_state,
    stack_canvases,
)
from .decoder.dreamon import decode_dreamon_with_drafts, length_control_ids
from .decoder.loop import (
    EagerSteps,
    InfillRequest,
    Stepper,
    batch_rows,
    check_request,
    collect,
    draft_problem,
    draft_tensor,
    run_steps,
)
from .decoder.spec import Infill, InfillCancelled, SamplerConfig, StepSpec, candidate_lengths
from .engine_options import CONTEXT_ENV, REFRESH_CONTEXT_ENV, REUSE_ENV, EngineOptions
from .graphs import StepGraphs, bucket_shape
from .limits import DEFAULT_MAX_STEPS, MAX_DRAFTS
from .measure import measure_plan, plan_from_one_request
from .plan import NoBucketFits, StepPlan
from .reuse import ContextStore, ReusedContext, ReusePolicy
from .runtime import ensure_cpu_threads

if TYPE_CHECKING:  # the loader imports torch-heavy modules; only the type is needed here
    from .loader import LoadedModel

log = logging.getLogger("diffill.engine")

@dataclass
class _Slot:
    req: InfillRequest
    done: threading.Event = field(default_factory=threading.Event)
    result: list[Infill] | None = None
    error: BaseException | None = None


class Engine:
    """Resident, thread-safe infill engine over a :class:`LoadedModel`."""

    def __init__(
        self,
        lm: LoadedModel,
        sampler: SamplerConfig | None = None,
        *,
        history: int = 64,
        options: EngineOptions | None = None,
        plan: StepPlan | None = None,
        budget_ms: float | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
    ) -> None:
        self.lm = lm
        self.sampler = sampler if sampler is not None else default_sampler(lm.config)
        self.options = options if options is not None else EngineOptions()
        #: budget -> steps: the latency budget, the step bounds and the frozen step plan
        self.budget = StepBudget(self.device.type, budget_ms, max_steps=max_steps, plan=plan)
        self._lock = threading.Lock()  # held while a batch runs on the device
        self._qlock = threading.Lock()
        self._queue: deque[_Slot] = deque()
        self._stats_lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=history)
        self._requests = 0
        self._completed = 0
        self._cancelled = 0
        self._failed = 0
        self._batches = 0
        self._max_batch = 0
        self._graphs: dict[tuple[Any, ...], StepGraphs] = {}
        o = self.options
        self._contexts = ContextStore(o.reuse_documents, ReusePolicy(o.reuse_far, o.reuse_full_every))
        self._graph_pool: Any = None
        ensure_cpu_threads(getattr(lm, "device", None))  # diffill's CPU thread default, unless configured
        model = self.model
        if hasattr(model, "eval"):
            model.eval()

    # -- properties ----------------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self.lm.model

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    @property
    def config(self) -> Any:
        return self.lm.config

    @property
    def device(self) -> torch.device:
        dev = getattr(self.lm, "device", None)
        if dev is not None:
            return torch.device(dev)
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def shared_context(self) -> bool:
        """Whether a request's rows share one context (EngineOptions.context): 'auto' is
        ``DIFFILL_CONTEXT`` (``request`` / ``row``) when set, else per request on a CPU, for a
        model that takes a KV context, outside CUDA graphs."""
        c = self.options.context
        if c == "auto":
            c = os.environ.get(CONTEXT_ENV, "").strip() or (
                "request" if self.device.type == "cpu" and not self.options.cuda_graphs else "row")
            if c not in ("request", "row"):
                raise ValueError(f"{CONTEXT_ENV}={c!r}: expected 'request' or 'row'")
        return c == "request" and supports_shared_context(self.model)

    @property
    def refresh_every(self) -> int:
        """The refresh period of this engine's context: with one context per request,
        :data:`ONCE` where ``refresh_context`` resolves to 'request' (the default: the
        context of the request's first step serves its later steps, as the dual cache with
        no refresh), else ``EngineOptions.refresh_every``."""
        if not self.shared_context:
            return self.options.refresh_every
        r = self.options.refresh_context
        if r == "auto":
            r = os.environ.get(REFRESH_CONTEXT_ENV, "").strip() or "request"
            if r not in ("step", "request"):
                raise ValueError(f"{REFRESH_CONTEXT_ENV}={r!r}: expected 'step' or 'request'")
        return ONCE if r == "request" else self.options.refresh_every

    @property
    def reuse_context(self) -> bool:
        """Whether a request with a ``context_key`` may start from its document's kept
        context (EngineOptions.reuse; 'auto' is ``DIFFILL_REUSE`` when set, else on where
        the context is shared)."""
        r = self.options.reuse
        if r == "auto":
            r = os.environ.get(REUSE_ENV, "").strip() or "on"
            if r not in ("on", "off"):
                raise ValueError(f"{REUSE_ENV}={r!r}: expected 'on' or 'off'")
        return r == "on" and self.shared_context and not self.options.cuda_graphs

    @property
    def dtype(self) -> torch.dtype:
        dt = getattr(self.lm, "dtype", None)
        if isinstance(dt, torch.dtype):
            return dt
        for p in self.model.parameters():
            return p.dtype
        return torch.float32

    # -- step budget ---------------------------------------------------------------------
    @property
    def plan(self) -> StepPlan | None:
        """The step plan requests without ``steps`` follow (:attr:`budget`)."""
        return self.budget.plan

    @plan.setter
    def plan(self, plan: StepPlan | None) -> None:
        self.budget.plan = plan

    def measure_plan(self, budget_ms: float | None = None, *, fit: bool | None = None,
                     **kw: Any) -> StepPlan:
        """Time the steps of the shape buckets and keep the resulting plan (see
        :mod:`diffill.model.plan`): every bucket on CUDA, two buckets and a fitted cost model
        elsewhere (``fit``); requests without ``steps`` follow it from then on."""
        fit = self.device.type != "cuda" if fit is None else fit
        kw.setdefault("refresh_every", self.refresh_every)
        kw.setdefault("max_steps", self.budget.max_steps)
        kw.setdefault("repeats", 2 if fit else 5)
        kw.setdefault("statistic", min)  # the step's own cost, not the machine's other work
        kw.setdefault("shared_context", self.shared_context)
        with self._lock:
            self.plan = measure_plan(self.model, self.config, budget_ms=self.budget.budget_ms(budget_ms),
                                     fit=fit, model_name=str(getattr(self.lm, "path", "")), **kw)
        return self.plan

    def budget_ms(self, requested: float | None = None) -> float:
        """The latency budget in force for a request (:class:`~diffill.model.budget.StepBudget`)."""
        return self.budget.budget_ms(requested)

    def warmup_on(self, prefix_ids: list[int], suffix_ids: list[int], *, max_tokens: int = 32,
                  candidates: int = 1) -> float:
        """A one-shot caller's warm-up (``diffill complete``): one refinement step of this
        request, timed (first-call costs included: pessimistic), and the step plan made from
        that one shape (:func:`~diffill.model.measure.plan_from_one_request`). Milliseconds."""
        req = self.make_request(EngineAsk(prefix_ids, suffix_ids, max_tokens=max_tokens,
                                          candidates=candidates, steps=1))
        t0 = time.perf_counter()
        self.submit(req)
        ms = (time.perf_counter() - t0) * 1000.0
        hole = max(req.sampler.lengths)
        ctx = canvas_length(self.config, len(prefix_ids), len(suffix_ids), hole) - hole
        self.plan = plan_from_one_request(
            ms, ctx, hole, len(req.sampler.lengths), self.budget.budget_ms(),
            refresh_every=self.refresh_every, max_steps=self.budget.max_steps,
            shared_context=self.shared_context, device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            model=str(getattr(self.lm, "path", "")))
        return ms

    def warmup(self) -> StepPlan | None:
        """Measure the step plan (:meth:`measure_plan` with its defaults); its first calls
        pay the first call's overheads too. Returns the plan, or None for a model too small
        for the smallest shape bucket (requests then take the sampler's steps)."""
        try:
            return self.measure_plan()
        except NoBucketFits as e:
            log.warning("no step plan: %s; requests without steps take %d", e, self.sampler.steps)
            return None

    # -- requests ------------------------------------------------------------------------
    def make_request(self, ask: EngineAsk) -> InfillRequest:
        """The sampler's request for ``ask`` (:meth:`plan_request` without its decision)."""
        return self.plan_request(ask)[0]

    def plan_request(self, ask: EngineAsk) -> tuple[InfillRequest, StepDecision]:
        """Validate ``ask`` and resolve its defaults; raises ValueError for a bad request.

        Hole lengths: ``ask.lengths``, else :func:`default_lengths` of ``max_tokens`` and
        ``candidates``. Steps: :meth:`~.budget.StepBudget.decide` (``steps``, else the step
        plan's for the request's shapes, its canvas rows -- lengths + drafts kept -- and
        ``budget_ms``, else the sampler's). ``drafts`` (token ids of candidate middles to
        verify, :mod:`.decoder` *Drafts*): the first :data:`MAX_DRAFTS` distinct ones that
        fit the longest hole with a slot to spare and hold no terminator, mask id or id
        outside the vocabulary (:meth:`usable_drafts`); the others are left out (the request's ``drafts`` are the ones kept, in order). The
        request ends after its verification step once ``candidates`` drafts are verified
        (``InfillRequest.wanted``)."""
        lens = (
            tuple(candidate_lengths(ask.lengths))
            if ask.lengths is not None
            else default_lengths(ask.max_tokens, ask.candidates)
        )
        cfg = self.config
        prefix_ids, suffix_ids = list(ask.prefix_ids), list(ask.suffix_ids)
        total = canvas_length(cfg, len(prefix_ids), len(suffix_ids), max(lens))
        if total > cfg.max_position_embeddings:
            raise ValueError(
                f"canvas of {total} tokens (prefix {len(prefix_ids)}, hole {max(lens)}, suffix "
                f"{len(suffix_ids)}) exceeds max_position_embeddings={cfg.max_position_embeddings}; "
                "trim the context"
            )
        changes: dict[str, Any] = {"lengths": lens}
        if ask.temperature is not None:
            changes["temperature"] = float(ask.temperature)
        if ask.seed is not None:
            changes["seed"] = ask.seed
        ctx = total - max(lens)
        kept = self.usable_drafts(ask.drafts, max(lens))
        if ask.steps is None:
            kept = self.affordable_drafts(kept, ctx, max(lens), len(lens), ask.budget_ms)
        decision = self.budget.decide(ctx, max(lens), len(lens) + len(kept), budget_ms=ask.budget_ms,
                                      steps=ask.steps, default_steps=self.sampler.steps,
                                      whole_canvases=length_control_ids(cfg) is not None)
        if decision.source != "default":
            changes["steps"] = decision.steps
        if decision.source == "plan" and self.sampler.threshold is None:
            changes["threshold"] = decision.threshold
        sc = dataclasses.replace(self.sampler, **changes)
        req = InfillRequest(prefix_ids, suffix_ids, sc, ask.cancel, kept,
                            max(1, ask.candidates), ask.context_key)
        check_request(cfg, req)
        return req, decision

    def affordable_drafts(self, drafts: tuple[tuple[int, ...], ...], ctx: int, hole: int,
                          candidates: int, budget_ms: float | None = None,
                          ) -> tuple[tuple[int, ...], ...]:
        """The drafts a planned request sends (each takes a row, priced by the step plan):
        the most of them, in order, with which the request still fits its budget at the
        plan's fewest steps. When it does not fit even without drafts they are all kept:
        the request is over its budget either way, and a verified draft ends it after its
        first step. No plan: all of them."""
        plan = self.budget.plan_for(self.budget.budget_ms(budget_ms))
        if plan is None or not drafts:
            return drafts
        for k in range(len(drafts), -1, -1):
            if not plan.choice(ctx, hole, candidates + k).over_budget:
                return drafts[:k]
        return drafts

    def usable_drafts(self, drafts: Sequence[Sequence[int]], hole: int) -> tuple[tuple[int, ...], ...]:
        """The drafts :meth:`make_request` keeps for a hole of ``hole`` slots (see there): the
        first :data:`MAX_DRAFTS` distinct ones that :func:`draft_problem` passes, the rule
        :func:`check_request` raises on, so a request never fails on a draft it was given."""
        kept: list[tuple[int, ...]] = []
        for d in drafts:
            t = tuple(int(i) for i in d)
            if t not in kept and draft_problem(self.config, t, hole) is None:
                kept.append(t)
            if len(kept) == MAX_DRAFTS:
                break
        return tuple(kept)

    def infill(self, ask: EngineAsk) -> InfillOutcome:
        """Fill the hole; candidates best first (see :mod:`diffill.model.decoder`), with the
        step decision they ran under. A candidate's ``draft`` indexes ``ask.drafts`` (as
        given). See :meth:`plan_request`.

        Raises ValueError (bad request, canvas too long) or
        :class:`~diffill.model.decoder.spec.InfillCancelled`.
        """
        req, decision = self.plan_request(ask)
        res = self.submit(req)
        if req.drafts:  # index the drafts as given
            given: dict[tuple[int, ...], int] = {}
            for i, d in enumerate(ask.drafts):
                given.setdefault(tuple(int(t) for t in d), i)
            res = [r if r.draft is None else dataclasses.replace(r, draft=given[req.drafts[r.draft]])
                   for r in res]
        return InfillOutcome(res, decision)

    def submit(self, req: InfillRequest) -> list[Infill]:
        with self._stats_lock:
            self._requests += 1
        outcome = "failed"
        t0 = time.perf_counter()
        try:
            if req.cancel is not None and req.cancel():
                raise InfillCancelled("infill cancelled before it started")
            slot = _Slot(req)
            if not self.options.batch:
                with self._lock:
                    self._run_slots([slot])
            else:
                with self._qlock:
                    self._queue.append(slot)
                while not slot.done.is_set():
                    with self._lock:
                        if slot.done.is_set():
                            break
                        if self.options.batch_window_ms > 0:
                            time.sleep(self.options.batch_window_ms / 1e3)
                        group = self._take_group()
                        if group:
                            self._run_slots(group)
            if slot.error is not None:
                raise slot.error
            assert slot.result is not None
            outcome = "completed"
            return slot.result
        except InfillCancelled:
            outcome = "cancelled"
            raise
        finally:
            dt = time.perf_counter() - t0
            with self._stats_lock:
                if outcome == "completed":
                    self._completed += 1
                    self._latencies.append(dt)
                elif outcome == "cancelled":
                    self._cancelled += 1
                else:
                    self._failed += 1

    def _take_group(self) -> list[_Slot]:
        """The queue's head plus every queued request that can share its batch (FIFO)."""
        with self._qlock:
            if not self._queue:
                return []
            head = self._queue[0]
            key = self._step_spec(head.req)
            group, rest, rows = [], deque(), 0
            for s in self._queue:
                n = len(s.req.row_lengths())
                if self._step_spec(s.req) == key and (not group or rows + n <= self.options.max_batch_rows):
                    group.append(s)
                    rows += n
                else:
                    rest.append(s)
            self._queue = rest
            return group

    def _step_spec(self, req: InfillRequest) -> StepSpec:
        """Requests whose step specs are equal share a batch (one forward per step)."""
        return StepSpec.of(self.config, req.sampler, select_impl=self.options.select_impl)

    def _run_slots(self, group: list[_Slot]) -> None:
        """Run one batch (device lock held) and hand each slot its outcome."""
        try:
            results = self._decode([s.req for s in group])
            for s, r in zip(group, results, strict=True):
                if isinstance(r, BaseException):
                    s.error = r
                else:
                    s.result = r
        except BaseException as e:  # noqa: BLE001 - every waiting request must get an answer
            for s in group:
                s.error = e
        finally:
            with self._stats_lock:
                self._batches += 1
                self._max_batch = max(self._max_batch, len(group))
            for s in group:
                s.done.set()

    def _decode(self, batch: list[InfillRequest]) -> list[list[Infill] | BaseException]:
        """The one place that picks the decoding: DreamOn's expand/delete length control
        (:mod:`.decoder.dreamon`) when the checkpoint's recipe carries those tokens, else the
        batched fixed-canvas loop (:meth:`_run`)."""
        if length_control_ids(self.config) is None:
            return self._run(batch)
        return decode_dreamon_with_drafts(self.model, self.config, batch, self._run)

    # -- the batched denoising loop -----------------------------------------------------------
    def _run(self, batch: list[InfillRequest]) -> list[list[Infill] | InfillCancelled]:
        """Run requests that share a group key as one batch (called with the lock held):
        their canvases stacked (padded to shape buckets with ``buckets`` / ``cuda_graphs``),
        :func:`~diffill.model.decoder.loop.run_steps` with the stepper the options ask for.
        Returns, per request, its candidates or the InfillCancelled it ended with."""
        cfg, dev, opts = self.config, self.device, self.options
        spec = self._step_spec(batch[0])
        use_graphs = opts.cuda_graphs and spec.temperature == 0
        cvs = [build_canvas(cfg, r.prefix_ids, r.suffix_ids, r.row_lengths(), dev) for r in batch]
        cv = stack_canvases(cvs, spec.pad_id, bucket_shape if opts.buckets or use_graphs else None)
        rows = batch_rows(batch, dev).pad_to(cv.ids.shape[0])
        draft = draft_tensor(rows, batch, cv.hole_pos.shape[1], dev)
        state = initial_state(cv)
        stepper: Stepper
        kept_by: tuple[SharedContext, Stepper, bool] | None = None
        if use_graphs:
            stepper = self._graphs_for(cv, spec)
            stepper.load(cv, state)
        else:
            if bool(cv.attn.all()):
                # no padding anywhere: no attention mask, so SDPA / flash-attn can take their
                # mask-free kernels (one host check before the loop)
                cv = cv._replace(attn=None)
            groups = context_groups(cv) if self.shared_context else None
            period = self.refresh_every
            key = batch[0].context_key if len(batch) == 1 and self.reuse_context else None
            if key is not None and groups is not None:
                kept_by = self._reusing_steps(key, cv, spec, groups, period)
                stepper = kept_by[1]
            elif groups is not None and bool((groups != torch.arange(len(groups), device=dev)).any()):
                stepper = shared_steps(self.model, cv, spec, refresh_every=period, groups=groups)
            elif period > 1:  # a row per request: the same refresh rule
                stepper = cached_steps(self.model, cv, spec, refresh_every=period)
            else:
                stepper = EagerSteps(self.model, spec)
        out = run_steps(stepper, cv, state, rows, spec, [r.cancel for r in batch],
                        vocab_size=cfg.vocab_size, draft=draft, wanted=[r.wanted for r in batch])
        if kept_by is not None:
            cache, _, reused = kept_by
            self._contexts.put(batch[0].context_key, cache, reused=reused)
        return collect(out, len(batch), spec.terminators)

    def _reusing_steps(self, key: str, cv: Canvas, spec: StepSpec, groups: torch.Tensor,
                       period: int) -> tuple[SharedContext, Stepper, bool]:
        """The stepper of a lone request of document ``key``: from the document's kept
        context where the policy allows (:meth:`~diffill.model.reuse.ContextStore.plan`), else
        one context per request as usual (refreshed every ``period`` steps), kept for the
        next request. Returns (the cache, the stepper, whether the context was reused)."""
        kept, plan = self._contexts.plan(key, cv, spec.shift, groups)
        cache = (SharedContext(self.model, cv, shift=spec.shift, refresh_every=period, groups=groups)
                 if plan is None else
                 ReusedContext(self.model, cv, shift=spec.shift, kept=kept, plan=plan, groups=groups))
        return cache, EagerSteps(cache, spec, on_drop=cache.select_rows), plan is not None

    def _graphs_for(self, cv: Canvas, spec: StepSpec) -> StepGraphs:
        L, T = cv.ids.shape
        N = cv.hole_pos.shape[1]
        key = (L, T, N, self.options.refresh_every, spec)
        g = self._graphs.get(key)
        if g is None:
            capture = cv.ids.device.type == "cuda"
            if capture and self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            g = StepGraphs(self.model, cv, spec, self.options.refresh_every, self._graph_pool,
                            capture=capture)
            self._graphs[key] = g
        return g

    # -- stats ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The model, the device and the step budget, for status reports."""
        es = self.stats()
        return {
            "model": str(getattr(self.lm, "path", "")),
            "family": self.config.family,
            "recipe": None if self.config.recipe is None else self.config.recipe.name,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "weights": getattr(self.lm, "weights", "fp32"),
            "context": "request" if self.shared_context else "row",
            "context_refresh": ("first step" if self.refresh_every >= ONCE
                                else f"every {self.refresh_every} steps"),
            **self.budget.summary(),
            **{f"engine_{k}": es[k] for k in ("requests", "completed", "cancelled", "batches",
                                               "max_batch_requests")},
            "context_reuse": self.reuse_context,
            **{k: es[k] for k in ("context_reused", "context_computed")},
        }

    def stats(self) -> dict[str, Any]:
        """Request counts, batches and latencies (seconds) of recent completed requests."""
        with self._stats_lock:
            lat = list(self._latencies)
            return {
                "requests": self._requests,
                "completed": self._completed,
                "cancelled": self._cancelled,
                "failed": self._failed,
                "batches": self._batches,
                "max_batch_requests": self._max_batch,
                "cuda_graphs": len(self._graphs),
                **self._contexts.stats(),
                "last_latency_s": lat[-1] if lat else None,
                "recent_latencies_s": lat,
                "mean_latency_s": sum(lat) / len(lat) if lat else None,
            }
