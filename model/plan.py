"""The step plan: how many denoising steps fit the latency budget, per shape bucket.

This module owns the plan and the choosing: the shape buckets, a bucket's timing
(:class:`BucketTiming`), the plan (:class:`StepPlan`: the steps per bucket, a request's
choice for its shapes and rows), the prediction and the cost model fitted through timed
points. Taking the timings is :mod:`.measure`'s; the one owner of budget -> steps, held by
the engine, is :class:`~.budget.StepBudget` (:mod:`.budget`), which reads a plan; nothing
else turns a latency budget into a step count. The policy below is all three's.

The policy
----------
* **The budget** in force for a request is the request's own (``latencyBudgetMs``), else
  the one the engine was built with, else (a plan given ready-made) the plan's, else the
  device's default,
  :data:`~.limits.DEFAULT_BUDGET_MS`: 25 ms on a GPU (the product's target), 200 ms on a CPU (a
  step of the shipped model takes ~20-30 ms there; 25 ms would allow one step, too few
  for a usable suggestion). Other accelerators get the GPU figure.
* **Steps per shape, planned once.** A step's cost depends on the shapes (context
  length, hole length, candidate rows), not on the text, so the engine times steps when
  it warms up (:meth:`~diffill.model.engine.Engine.warmup`, or on demand:
  ``diffill info --plan``, ``diffill bench --plan``) and picks the number of steps per
  *shape bucket* from those timings. The plan is then frozen: the same request under the
  same budget always gets the same steps, however loaded the machine is -- load shows up
  as latency (or as 429 from ``diffill serve-http``), never as silently fewer steps and
  worse code. (An earlier design adapted a running average of observed ms/step, so
  requests got fewer steps under load.) A request for another budget gets a plan derived
  from the same frozen timings (:meth:`StepPlan.for_budget`).
* **How the timings are taken.** On CUDA every bucket that fits the model is measured
  (each a few ms). Elsewhere warm-up must stay quick (the first suggestion is due about a
  second after the server starts), so two points are measured -- the smallest bucket with
  one canvas row and the largest with the plan's rows -- and a per-step cost model
  ``a + b * rows * (ctx + hole)`` fitted through them predicts every bucket
  (:func:`fit_timings`; ``BucketTiming.source`` says which is which). Two points that
  differ in rows as well as in length pin the slope down better than two lengths alone,
  and a one-row step is cheap. Warm-up keeps the fastest of its repeats (the step's cost
  without the machine's other work; a busy machine then shows as latency, not as fewer
  steps). About 0.3 s for the shipped model on a quiet 2-core CPU (was 1 s with both
  points at three rows and more repeats).
* **Rows are priced.** A request's canvas rows are its candidate lengths plus the drafts it
  verifies (:mod:`.decoder` *Drafts*), and on a CPU a step's cost grows with them. Each
  bucket's timing carries ``row_ms``, the cost of a row more or less (the fitted slope on
  a CPU; on CUDA the largest bucket timed again with twice the rows), and a request gets
  the steps that fit for its own row count (:meth:`StepPlan.choice`): a request with three
  drafts may get fewer steps than one without, never more time than its budget.
* **A slow model on a CPU** (a 0.5B checkpoint: one step of the largest bucket takes
  seconds, the plan a minute or more) is planned in the background by the language server
  (:meth:`diffill.lsp_server.backend.backends.LocalBackend.warmup`); until that plan is in, requests
  follow a :func:`~.measure.provisional_plan` priced from one tiny timed request, which never allows
  more steps than fit.
* **One-shot callers** (``diffill complete``) time one step of their own request and plan
  from that one shape (:func:`~.measure.plan_from_one_request`). A model below the smallest context
  bucket is timed at its own longest context, which stands in for that bucket.
* **Explicit steps win.** A request that names ``steps`` gets them; an engine with no
  plan (never warmed up) uses its sampler's default steps.

Buckets and the prediction
--------------------------
* context buckets (canvas length without the hole): 256, 512, 1024, 2048;
* hole buckets (longest candidate length): 8, 16, 32, 64.

Canvases are padded up to their bucket (:func:`~diffill.model.decoder.canvas.pad_canvas`), so
shapes repeat -- which CUDA graphs and ``torch.compile`` need -- and a bucket's
measurement holds for every request in it. A request beyond the largest bucket the model's
positions let be timed falls back to it and is priced for its own size
(:meth:`StepPlan.sized`: the step scaled by the tokens it runs, never below the timed figure).

Predicted end-to-end time for ``s`` steps with the dual cache refreshing every
``r`` steps::

    overhead + ceil(s / r) * full_ms + (s - ceil(s / r)) * block_ms

(``block_ms = full_ms`` without the cache). The plan takes the largest ``s``
in ``[min_steps, min(max_steps, hole)]`` whose prediction fits the budget
(``min_steps`` and ``over_budget=True`` when none does). When ``s`` is below
the hole length (several tokens per step) it also turns on threshold decoding:
the fixed schedule stays the floor, so ``s`` remains a hard upper bound, and
slots above the threshold are committed early, which leaves fewer forced
low-confidence commits for the later steps (Fast-dLLM parallel decoding).

The plan is a msgspec Struct, saved and loaded as JSON; :func:`describe_plan`
renders it for ``diffill info``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .cache import ONCE
from .limits import DEFAULT_MAX_STEPS

CTX_BUCKETS: tuple[int, ...] = (256, 512, 1024, 2048)
HOLE_BUCKETS: tuple[int, ...] = (8, 16, 32, 64)
DEFAULT_THRESHOLD = 0.9


class NoBucketFits(ValueError):
    """The model's positions hold not even the smallest hole bucket (8 slots)."""


def bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; beyond the largest, n rounded up to a multiple of it."""
    for b in buckets:
        if n <= b:
            return b
    top = buckets[-1]
    return -(-n // top) * top


PROVISIONAL = "provisional"
"""``BucketTiming.source`` of a :func:`~.measure.provisional_plan`'s timings."""


class BucketTiming(msgspec.Struct, frozen=True):
    """Cost of one step in one bucket (milliseconds, median of repeats, or fitted)."""

    ctx: int  # context bucket (canvas tokens outside the hole)
    hole: int  # hole bucket (slots per row)
    rows: int  # canvas rows per forward (candidate lengths x batched requests)
    full_ms: float  # one step with a full forward (LM head + selection included)
    block_ms: float  # one cached step (hole block only); = full_ms if not measured
    overhead_ms: float = 0.0  # per request, outside the steps (canvas build, trimming)
    source: str = "measured"  # or "fitted": predicted from two measured buckets (fit_timings),
    # or "provisional": extrapolated from one tiny request (provisional_plan)
    row_ms: float = 0.0  # a full step's cost per row more (or less) than ``rows``; 0: not priced
    block_row_ms: float = 0.0  # the same for a cached step

    def step_ms(self, rows: int | None = None) -> tuple[float, float]:
        """(full, cached) ms of one step with ``rows`` canvas rows (None: ``self.rows``),
        priced by ``row_ms`` / ``block_row_ms``; never below a tenth of the measured cost."""
        if rows is None or rows == self.rows:
            return self.full_ms, self.block_ms
        d = rows - self.rows
        return (max(self.full_ms / 10, self.full_ms + d * self.row_ms),
                max(self.block_ms / 10, self.block_ms + d * self.block_row_ms))


class BucketChoice(msgspec.Struct, frozen=True):
    ctx: int
    hole: int
    steps: int
    threshold: float | None
    predicted_ms: float
    over_budget: bool
    rows: int = 0  # the rows priced (0: the bucket timing's own)


class StepPlan(msgspec.Struct, frozen=True):
    budget_ms: float
    refresh_every: int  # dual-cache refresh period used for the prediction (1 = no cache)
    min_steps: int
    max_steps: int
    timings: list[BucketTiming]
    choices: list[BucketChoice]
    device: str = "cpu"
    dtype: str = "float32"
    model: str = ""
    measured_at: str = ""
    threshold: float | None = DEFAULT_THRESHOLD  # turned on where steps < hole (module doc)
    shared_context: bool = False  # timed with one context per request (cache.SharedContext)

    def choice(self, ctx_len: int, hole_len: int, rows: int | None = None) -> BucketChoice:
        """The choice for a request's shapes (its buckets; the nearest measured bucket
        when a shape lies beyond the measured ones) and its canvas ``rows`` (candidate
        lengths + drafts; None: the rows the plan was timed with). Other row counts are
        priced with the bucket's ``row_ms`` (a plan without it prices every count alike); a
        request larger than the bucket it falls in, for its own size (:meth:`sized`)."""
        c, h = bucket(ctx_len, CTX_BUCKETS), bucket(hole_len, HOLE_BUCKETS)
        by_key = {(x.ctx, x.hole): x for x in self.choices}
        if (c, h) not in by_key:
            # beyond what was measured: the largest measured bucket not smaller, else the largest
            c, h = sorted(by_key, key=lambda k: (k[0] < c, k[1] < h, abs(k[0] - c), abs(k[1] - h)))[0]
        ch = by_key[(c, h)]
        t = next((x for x in self.timings if (x.ctx, x.hole) == (c, h)), None)
        if t is None:
            return ch
        sized = self.sized(t, ctx_len, hole_len)
        if sized is t and (rows is None or rows == t.rows or not (t.row_ms or t.block_row_ms)):
            return ch
        return choose(sized, self.budget_ms, refresh_every=self.refresh_every,
                      min_steps=self.min_steps, max_steps=self.max_steps, threshold=self.threshold,
                      rows=rows)

    def sized(self, t: BucketTiming, ctx_len: int, hole_len: int) -> BucketTiming:
        """``t`` priced for a request larger than its bucket (beyond the largest bucket the
        model's positions left timed: the shipped model's 512 positions leave one context
        bucket, 256, for requests of up to ~480 context tokens): every cost scaled by the
        tokens the request's step runs over the tokens timed (:func:`step_tokens`), a row's
        by the tokens a row adds. A step costs ``a + b x tokens`` with ``a >= 0``, so this
        never under-prices the larger step, and never prices below the timed figure. A
        request within the bucket: ``t`` itself."""
        ctx, hole = max(ctx_len, t.ctx), max(hole_len, t.hole)
        if (ctx, hole) == (t.ctx, t.hole):
            return t
        shared = self.shared_context
        timed = step_tokens(t.rows, t.ctx, t.hole, shared)
        scale = step_tokens(t.rows, ctx, hole, shared) / timed
        per_row = ((step_tokens(t.rows + 1, ctx, hole, shared) - step_tokens(t.rows, ctx, hole, shared))
                   / (step_tokens(t.rows + 1, t.ctx, t.hole, shared) - timed))
        return msgspec.structs.replace(
            t, full_ms=t.full_ms * scale, block_ms=t.block_ms * scale,
            row_ms=t.row_ms * per_row, block_row_ms=t.block_row_ms * per_row)

    def whole_canvas_choice(self, ctx_len: int, hole_len: int, rows: int | None = None
                            ) -> BucketChoice:
        """The choice for a decoder whose every step is a full forward of ``rows`` whole
        canvases, with no cache and no shared context (DreamOn's,
        :mod:`~diffill.model.decoder.dreamon`): the bucket's full step scaled by the tokens
        such a step runs, ``rows x (ctx + hole)`` (the request's own ``ctx`` and ``hole`` where
        larger than the bucket's, as :meth:`sized`), over the tokens it was timed with
        (:func:`step_tokens`), the scale never below 1, and every step full. A step costs
        ``a + b x tokens`` with ``a >= 0`` (module doc), so the scaled figure is never below
        that cost: the steps chosen do not over-spend the budget. ``rows`` None: the rows the
        plan was timed with."""
        ch = self.choice(ctx_len, hole_len)
        t = next((x for x in self.timings if (x.ctx, x.hole) == (ch.ctx, ch.hole)), None)
        if t is None:
            return ch
        rows = t.rows if rows is None else rows
        scale = max(1.0, step_tokens(rows, max(ctx_len, t.ctx), max(hole_len, t.hole))
                    / step_tokens(t.rows, t.ctx, t.hole, self.shared_context))
        ms = t.full_ms * scale
        whole = BucketTiming(t.ctx, t.hole, rows, ms, ms, t.overhead_ms, t.source)
        return choose(whole, self.budget_ms, refresh_every=1, min_steps=self.min_steps,
                      max_steps=self.max_steps, threshold=self.threshold)

    def choice_for(self, ctx_len: int, hole_len: int, rows: int | None = None, *,
                   whole_canvases: bool = False) -> BucketChoice:
        """The one pricing entry: :meth:`choice`, or for a decoder that runs its ``rows`` as
        whole canvases at every step (DreamOn) :meth:`whole_canvas_choice`."""
        if whole_canvases:
            return self.whole_canvas_choice(ctx_len, hole_len, rows)
        return self.choice(ctx_len, hole_len, rows)

    def steps_for(self, ctx_len: int, hole_len: int, rows: int | None = None, *,
                  whole_canvases: bool = False) -> tuple[int, float | None]:
        """(steps, threshold) of :meth:`choice_for`."""
        ch = self.choice_for(ctx_len, hole_len, rows, whole_canvases=whole_canvases)
        return ch.steps, ch.threshold

    def for_budget(self, budget_ms: float) -> StepPlan:
        """The plan for another budget, from the same timings (nothing is measured)."""
        if budget_ms == self.budget_ms:
            return self
        return plan_from_timings(
            self.timings, budget_ms, refresh_every=self.refresh_every, min_steps=self.min_steps,
            max_steps=self.max_steps, threshold=self.threshold, device=self.device,
            dtype=self.dtype, model=self.model, measured_at=self.measured_at)

    def to_json(self) -> bytes:
        return msgspec.json.format(msgspec.json.encode(self), indent=2)

    @classmethod
    def from_json(cls, data: bytes | str) -> StepPlan:
        return msgspec.json.decode(data, type=cls)


def predict_ms(t: BucketTiming, steps: int, refresh_every: int = 1, rows: int | None = None) -> float:
    """Predicted end-to-end time of a request with ``steps`` steps and ``rows`` canvas rows
    (None: the timing's own; see module doc)."""
    full_ms, block_ms = t.step_ms(rows)
    full = math.ceil(steps / refresh_every)
    return t.overhead_ms + full * full_ms + (steps - full) * block_ms


def choose(t: BucketTiming, budget_ms: float, *, refresh_every: int = 1, min_steps: int = 1,
           max_steps: int = DEFAULT_MAX_STEPS, threshold: float | None = DEFAULT_THRESHOLD,
           rows: int | None = None) -> BucketChoice:
    """The most steps (<= hole, <= max_steps) that fit ``budget_ms`` for this bucket with
    ``rows`` canvas rows (None: the timing's own)."""
    hi = max(min_steps, min(max_steps, t.hole))
    steps = min_steps
    for s in range(min_steps, hi + 1):
        if predict_ms(t, s, refresh_every, rows) <= budget_ms:
            steps = s
    pred = predict_ms(t, steps, refresh_every, rows)
    thr = threshold if steps < t.hole else None
    return BucketChoice(t.ctx, t.hole, steps, thr, round(pred, 3), pred > budget_ms,
                        0 if rows is None or rows == t.rows else rows)


def plan_from_timings(timings: Sequence[BucketTiming], budget_ms: float, *,
                      refresh_every: int = 1, min_steps: int = 1,
                      max_steps: int = DEFAULT_MAX_STEPS,
                      threshold: float | None = DEFAULT_THRESHOLD, **meta: Any) -> StepPlan:
    choices = [choose(t, budget_ms, refresh_every=refresh_every, min_steps=min_steps,
                      max_steps=max_steps, threshold=threshold) for t in timings]
    return StepPlan(budget_ms=budget_ms, refresh_every=refresh_every, min_steps=min_steps,
                    max_steps=max_steps, timings=list(timings), choices=choices,
                    threshold=threshold, **meta)


def step_tokens(rows: int, ctx: int, hole: int, shared: bool = False) -> int:
    """Tokens a full step runs through the model: every row's whole canvas, or with one
    context per request (``shared``) one whole canvas and the other rows' holes."""
    return ctx + hole + (rows - 1) * hole if shared else rows * (ctx + hole)


def fit_timings(measured: Sequence[BucketTiming], buckets: Sequence[tuple[int, int]],
                rows: int | None = None, *, shared: bool = False) -> list[BucketTiming]:
    """Every bucket of ``buckets`` (ctx, hole) at ``rows`` canvas rows (None: the most rows
    measured): the measured timing where one was taken at those rows, else predicted by the
    per-step cost model ``a + b * rows * (ctx + hole)`` (least squares through the measured
    points, which may differ in rows as well as in shape; ``b >= 0``; one point: a
    constant), the same for the cached step, and the measured buckets' mean overhead. Every
    timing prices other row counts with the fitted slope (``row_ms = b * (ctx + hole)``).
    ``shared`` (one context per request): a full step runs :func:`step_tokens` tokens,
    ``ctx + rows * hole``, so a row more costs ``b * hole``."""
    if not measured:
        raise ValueError("fit_timings needs at least one measured bucket")
    rows = max(t.rows for t in measured) if rows is None else rows
    by_key = {(t.ctx, t.hole): t for t in measured if t.rows == rows}
    x = [step_tokens(t.rows, t.ctx, t.hole, shared) for t in measured]
    overhead = statistics.fmean(t.overhead_ms for t in measured)

    def line(y: list[float]) -> tuple[Callable[[float], float], float]:
        mx, my = statistics.fmean(x), statistics.fmean(y)
        var = sum((xi - mx) ** 2 for xi in x)
        b = max(0.0, sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / var) if var else 0.0
        return (lambda xi: max(0.0, my + b * (xi - mx))), b

    full, b_full = line([t.full_ms for t in measured])
    block, b_block = line([t.block_ms for t in measured])
    out = []
    for c, h in buckets:
        per_row = {"row_ms": round(b_full * (h if shared else c + h), 4),
                   "block_row_ms": round(b_block * (h if shared else c + h), 4)}
        if (c, h) in by_key:
            out.append(msgspec.structs.replace(by_key[(c, h)], **per_row))
            continue
        xi = step_tokens(rows, c, h, shared)
        out.append(BucketTiming(c, h, rows, round(full(xi), 4), round(block(xi), 4),
                                round(overhead, 4), source="fitted", **per_row))
    return out


def describe_plan(plan: StepPlan) -> str:
    """Human-readable table of a plan (for ``diffill info``)."""
    lines = [
        f"step plan: budget {plan.budget_ms:g} ms, {plan.device} {plan.dtype}"
        + (f", model {plan.model}" if plan.model else "")
        + (", one context per request" if plan.shared_context else "")
        + (", context computed at the first step only" if plan.refresh_every >= ONCE
           else f", dual cache refresh every {plan.refresh_every}" if plan.refresh_every > 1
           else ", no KV cache")
        + (f", measured {plan.measured_at}" if plan.measured_at else ""),
        f"{'context':>8} {'hole':>5} {'rows':>4} {'full ms':>8} {'cached ms':>9} {'ms/row':>7} "
        f"{'steps':>5} {'threshold':>9} {'predicted ms':>12}",
    ]
    timing = {(t.ctx, t.hole): t for t in plan.timings}
    for c in sorted(plan.choices, key=lambda c: (c.ctx, c.hole)):
        t = timing.get((c.ctx, c.hole))
        thr = "-" if c.threshold is None else f"{c.threshold:g}"
        per_row = f"{t.row_ms:>7.2f}" if t and t.row_ms else f"{'-':>7}"
        lines.append(
            f"{c.ctx:>8} {c.hole:>5} {t.rows if t else 0:>4} {t.full_ms if t else 0:>8.2f} "
            f"{t.block_ms if t else 0:>9.2f} {per_row} {c.steps:>5} {thr:>9} {c.predicted_ms:>12.2f}"
            + ("  OVER BUDGET" if c.over_budget else "")
        )
    return "\n".join(lines)
