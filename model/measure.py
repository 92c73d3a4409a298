"""Timing the step plan: the steps of each shape bucket timed on the model, and the plans made
from timings taken elsewhere.

:func:`measure_plan` (the engine's warm-up, ``diffill info --plan``, ``diffill bench
--plan``) times the buckets that fit the model's positions, every one on CUDA, two points and
a fitted cost model elsewhere (:func:`measure_bucket`, one bucket); :func:`plan_from_one_request`
is a one-shot caller's plan from its own request's one step, :func:`provisional_plan` the plan
a slow CPU model follows while its real one is measured in the background. What the timings
are and how a plan chooses from them: :mod:`.plan` (its module doc holds the policy).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec
import torch

from .cache import ONCE, DualCache, SharedContext, infill_cached
from .decoder.canvas import DenoiseState, build_canvas, canvas_end, canvas_start, initial_state
from .decoder.loop import infill
from .decoder.spec import SamplerConfig, SpecialIds, StepSpec
from .decoder.step import denoise_step
from .int8_load import release_free_memory
from .limits import DEFAULT_MAX_STEPS
from .plan import (
    CTX_BUCKETS,
    DEFAULT_THRESHOLD,
    HOLE_BUCKETS,
    PROVISIONAL,
    BucketTiming,
    NoBucketFits,
    StepPlan,
    bucket,
    fit_timings,
    plan_from_timings,
    step_tokens,
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device | str, *, warmup: int = 1,
            repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Milliseconds of ``fn()`` (device synchronised) by ``clock`` (seconds: wall-clock unless
    a caller's clock leaves out its pauses), after warm-up."""
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(dev)
    out = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        _sync(dev)
        out.append((clock() - t0) * 1e3)
    return out


def synthetic_request(cfg: Any, ctx: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Prefix and suffix ids (random ordinary tokens) whose canvas context is ``ctx`` tokens."""
    specials = {cfg.mask_token_id, cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id}
    n = max(0, ctx - len(canvas_start(cfg, 1)) - len(canvas_end(cfg)))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    ok = next(i for i in range(cfg.vocab_size) if i not in specials)
    ids = [ok if i in specials else i for i in ids]
    cut = (2 * n) // 3
    return ids[:cut], ids[cut:]


@torch.inference_mode()
def plan_from_one_request(ms: float, ctx_len: int, hole_len: int, rows: int, budget_ms: float,
                          shared_context: bool = False, **kw: Any) -> StepPlan:
    """The plan of a one-shot caller (``diffill complete``): one request's one-step time,
    ``ms`` (its overhead included, so the prediction errs long), for its own shape bucket;
    other shapes fall back to it (:meth:`StepPlan.choice`); other row counts (drafts) are
    priced in proportion to the tokens they add (:func:`step_tokens`: a whole canvas per
    row, or with ``shared_context`` a hole per row). ``kw``: :func:`plan_from_timings`'s."""
    per_row = ms * (step_tokens(rows + 1, ctx_len, hole_len, shared_context)
                    - step_tokens(rows, ctx_len, hole_len, shared_context)) \
        / step_tokens(rows, ctx_len, hole_len, shared_context)
    t = BucketTiming(bucket(ctx_len, CTX_BUCKETS), bucket(hole_len, HOLE_BUCKETS), rows,
                     round(ms, 4), round(ms, 4), row_ms=round(per_row, 4),
                     block_row_ms=round(per_row, 4))
    return plan_from_timings([t], budget_ms, shared_context=shared_context,
                             measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                             **kw)



def provisional_plan(ms: float, tokens: int, budget_ms: float, *, rows: int = 3,
                     shared_context: bool = False, limit: int | None = None,
                     ctx_buckets: Sequence[int] = CTX_BUCKETS,
                     hole_buckets: Sequence[int] = HOLE_BUCKETS, **kw: Any) -> StepPlan:
    """The plan requests follow while the real one is measured in the background (a model
    whose steps are slow on a CPU, where measuring takes a minute or more: the server answers
    meanwhile). From one timed request that ran ``tokens`` step tokens (:func:`step_tokens`)
    in ``ms`` -- a tiny one, first-call costs and overhead included -- every bucket (those of
    ``limit`` positions, as :func:`measure_plan` picks them) is priced in proportion to its
    step tokens, at ``rows`` rows, cached steps at the full cost. A step costs
    ``a + b * tokens`` with ``a >= 0``, so for every bucket larger than the timed request this
    predicts more than the step costs: the provisional plan never gives more steps than fit
    (on the 0.5B shape on a 2-core CPU it gives the one step the measured plan gives too).
    The timings say ``source="provisional"``. ``kw``: :func:`plan_from_timings`'s."""
    limit = 1 << 30 if limit is None else limit
    buckets = [(c, h) for c in ctx_buckets for h in hole_buckets if c + h <= limit]
    if not buckets:
        buckets = [(min(ctx_buckets), h) for h in hole_buckets if h < limit]
    if not buckets:
        raise NoBucketFits(f"no hole bucket fits max_position_embeddings={limit}")
    per_token = ms / max(1, tokens)
    timings = []
    for c, h in buckets:
        n = step_tokens(rows, c, h, shared_context)
        row = per_token * (step_tokens(rows + 1, c, h, shared_context) - n)
        full = per_token * n
        timings.append(BucketTiming(c, h, rows, round(full, 4), round(full, 4), source=PROVISIONAL,
                                    row_ms=round(row, 4), block_row_ms=round(row, 4)))
    return plan_from_timings(timings, budget_ms, shared_context=shared_context,
                             measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                             **kw)


@torch.inference_mode()  # as requests run (the MLP works in place only there)
def measure_bucket(model: Any, cfg: Any, ctx: int, hole: int, *, rows: int = 3,
                   refresh_every: int = 1, repeats: int = 5, warmup: int = 1,
                   overhead: bool | int = True, shared: bool = False,
                   statistic: Callable[[list[float]], float] = statistics.median,
                   clock: Callable[[], float] = time.perf_counter) -> BucketTiming:
    """Time one full step, one cached step and (``overhead``) the per-request overhead
    for a bucket: ``statistic`` (median; the engine's warm-up takes the fastest, the
    cost without the machine's other work) of ``repeats`` after ``warmup`` calls (an int
    ``overhead``: that many repeats for the overhead instead).

    ``rows`` candidate lengths (``hole``, ``hole // 2``, ...) share the batch, as
    the engine's default lengths do. ``shared``: the steps with one context per request
    (:class:`~diffill.model.cache.SharedContext`), as the engine runs them on a CPU.
    ``clock``: :func:`time_ms`'s.
    """

    dev = next(model.parameters()).device
    if dev.type == "cpu":  # start each bucket from the heap's live memory only: what earlier
        release_free_memory()  # buckets and requests freed stays resident until trimmed
    sp = SpecialIds.from_config(cfg)
    lengths = sorted({max(1, hole >> i) for i in range(rows)}, reverse=True)
    while len(lengths) < rows:
        lengths.append(lengths[-1])
    prefix, suffix = synthetic_request(cfg, ctx)
    cv = build_canvas(cfg, prefix, suffix, lengths, dev)
    spec = StepSpec(sp.mask, sp.pad, sp.terminators, cfg.shift_logits,  # greedy, fixed steps
                    vocab=cfg.vocab_size)
    L, N = cv.valid.shape

    def fresh() -> DenoiseState:
        return initial_state(cv)

    def stepped() -> Any:
        if shared:
            return SharedContext(model, cv, shift=cfg.shift_logits, refresh_every=1)
        return model

    full = statistic(time_ms(lambda: denoise_step(stepped(), cv, fresh(), 2, spec), dev,
                             warmup=warmup, repeats=repeats, clock=clock))
    block = full
    if refresh_every > 1:
        kind = SharedContext if shared else DualCache
        fwd = kind(model, cv, shift=cfg.shift_logits, refresh_every=ONCE)
        denoise_step(fwd, cv, fresh(), 2, spec)  # the refresh
        block = statistic(time_ms(lambda: denoise_step(fwd, cv, fresh(), 2, spec), dev,
                                  warmup=warmup, repeats=repeats, clock=clock))
    extra = 0.0
    if overhead:
        one = statistic(time_ms(  # the full steps above warmed these shapes up already
            lambda: _one_step(model, cfg, prefix, suffix, tuple(lengths), shared),
            dev, warmup=0, repeats=repeats if overhead is True else int(overhead), clock=clock))
        extra = max(0.0, one - full)
    return BucketTiming(ctx, hole, L, round(full, 4), round(block, 4), round(extra, 4))


def _one_step(model: Any, cfg: Any, prefix: list[int], suffix: list[int],
              lengths: tuple[int, ...], shared: bool) -> Any:
    sc = SamplerConfig(steps=1, lengths=lengths)
    if shared:
        return infill_cached(model, cfg, prefix, suffix, sc, refresh_every=1, shared=True)
    return infill(model, cfg, prefix, suffix, sc)


def measure_plan(model: Any, cfg: Any, *, budget_ms: float, fit: bool = False,
                 ctx_buckets: Sequence[int] = CTX_BUCKETS, hole_buckets: Sequence[int] = HOLE_BUCKETS,
                 rows: int = 3, refresh_every: int = 1, repeats: int = 5, min_steps: int = 1,
                 max_steps: int = DEFAULT_MAX_STEPS, threshold: float | None = DEFAULT_THRESHOLD,
                 model_name: str = "", shared_context: bool = False,
                 statistic: Callable[[list[float]], float] = statistics.median,
                 fit_ctx: int | None = None, fit_hole: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> StepPlan:
    """Time the buckets that fit the model's positions and build the plan at ``rows`` canvas
    rows, pricing other row counts (a request's drafts add rows) per bucket:

    * every bucket (CUDA), then the largest again with twice the rows, whose difference
      prices a row (``row_ms``, in proportion to each bucket's tokens);
    * with ``fit`` (CPU, where warm-up must stay quick): two points only, the smallest
      bucket with one row (cheap; it also pays the first call's costs and gives the
      per-request overhead) and the largest with ``rows`` rows (half the ``repeats``: one
      such step costs several small ones), and every bucket, rows included, from the cost
      model through them (:func:`fit_timings`; module doc).

    ``statistic``: see :func:`measure_bucket`; ``shared_context``: timed (and fitted) as
    the engine runs a CPU step, one context per request. ``fit_ctx``: with ``fit``, the large
    point is the largest bucket of at most this context (the contexts requests get): a 2K
    context step of a 0.5B model peaks 0.4 GB above any default request; the larger buckets
    come from the cost model. ``fit_hole`` likewise for the hole (the editors' default
    ``maxTokens``: the large point is then the largest default request, and is timed ~2 s
    sooner on the 0.5B shape). ``clock``: :func:`time_ms`'s (the server's background plan
    leaves out the time it gave way to requests)."""
    p = next(model.parameters())
    limit = getattr(cfg, "max_position_embeddings", 1 << 30)
    buckets = [(c, h) for c in ctx_buckets for h in hole_buckets if c + h <= limit]
    measured_ctx = {b: b[0] for b in buckets}
    if not buckets:  # a model smaller than the smallest context bucket: its longest context
        c0 = min(ctx_buckets)  # stands in for that bucket (every request falls into it)
        buckets = [(c0, h) for h in hole_buckets if h < limit]
        measured_ctx = {(c, h): limit - h for c, h in buckets}
    if not buckets:
        raise NoBucketFits(f"no hole bucket fits max_position_embeddings={limit}")

    def timed(b: tuple[int, int], n: int, **kw: Any) -> BucketTiming:
        kw.setdefault("repeats", repeats)
        t = measure_bucket(model, cfg, measured_ctx[b], b[1], rows=n, refresh_every=refresh_every,
                           statistic=statistic, shared=shared_context, clock=clock, **kw)
        return msgspec.structs.replace(t, ctx=b[0])

    largest = max(buckets, key=lambda b: (b[0] + b[1], b))
    if fit and (fit_ctx is not None or fit_hole is not None):
        reach = [b for b in buckets if b != min(buckets) and b[0] <= (fit_ctx or b[0])
                 and b[1] <= (fit_hole or b[1])]
        largest = max(reach, key=lambda b: (b[0] + b[1], b)) if reach else largest
    if fit:
        small = timed(min(buckets), 1, overhead=1)
        # the model is warm now; the overhead is per request, measured once (a few ms on a
        # CPU, where a step takes tens); the large point costs several small ones, so half
        # the repeats
        large = timed(largest, rows, warmup=0, overhead=False, repeats=max(1, repeats // 2))
        large = msgspec.structs.replace(large, overhead_ms=small.overhead_ms)
        timings = fit_timings([small, large], buckets, rows, shared=shared_context)
    else:
        timings = [timed(b, rows) for b in buckets]
        base = next(t for t in timings if (t.ctx, t.hole) == largest)
        more = timed(largest, 2 * rows, overhead=False)
        tokens = (step_tokens(2 * rows, *largest, shared_context)
                  - step_tokens(rows, *largest, shared_context))
        b_full = max(0.0, more.full_ms - base.full_ms) / tokens
        b_block = max(0.0, more.block_ms - base.block_ms) / tokens
        per = (lambda t: t.hole) if shared_context else (lambda t: t.ctx + t.hole)
        timings = [msgspec.structs.replace(t, row_ms=round(b_full * per(t), 4),
                                           block_row_ms=round(b_block * per(t), 4))
                   for t in timings]
    if p.device.type == "cpu":  # what the largest step freed stays resident until trimmed, and
        release_free_memory()  # the requests after it allocate in other sizes (BENCHMARKS.md)
    return plan_from_timings(
        timings, budget_ms, refresh_every=refresh_every, min_steps=min_steps, max_steps=max_steps,
        threshold=threshold, device=str(p.device), dtype=str(p.dtype).removeprefix("torch."),
        model=model_name, shared_context=shared_context,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
