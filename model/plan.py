"""Step budget: how many denoising steps fit the latency budget, per shape bucket.

An editor wants a completion in about 25 ms. A step's cost depends on the
shapes (context length, hole length, candidate rows), not on the text, so the
engine measures it once per *shape bucket* at start-up (or on demand) and picks
the number of steps per bucket from the measurements:

* context buckets (canvas length without the hole): 256, 512, 1024, 2048;
* hole buckets (longest candidate length): 8, 16, 32, 64.

Canvases are padded up to their bucket (:func:`~diffill.model.sampler.pad_canvas`), so shapes repeat
-- which CUDA graphs and ``torch.compile`` need -- and a bucket's measurement
holds for every request in it.

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
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec
import torch

from .cache import DualCache
from .sampler import (
    DenoiseState,
    SamplerConfig,
    SpecialIds,
    StepSpec,
    build_canvas,
    denoise_step,
    infill,
    initial_state,
)

CTX_BUCKETS: tuple[int, ...] = (256, 512, 1024, 2048)
HOLE_BUCKETS: tuple[int, ...] = (8, 16, 32, 64)
DEFAULT_BUDGET_MS = 25.0
DEFAULT_THRESHOLD = 0.9


def bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; beyond the largest, n rounded up to a multiple of it."""
    for b in buckets:
        if n <= b:
            return b
    top = buckets[-1]
    return -(-n // top) * top


class BucketTiming(msgspec.Struct, frozen=True):
    """Measured cost of one step in one bucket (milliseconds, median of repeats)."""

    ctx: int  # context bucket (canvas tokens outside the hole)
    hole: int  # hole bucket (slots per row)
    rows: int  # canvas rows per forward (candidate lengths x batched requests)
    full_ms: float  # one step with a full forward (LM head + selection included)
    block_ms: float  # one cached step (hole block only); = full_ms if not measured
    overhead_ms: float = 0.0  # per request, outside the steps (canvas build, trimming)


class BucketChoice(msgspec.Struct, frozen=True):
    ctx: int
    hole: int
    steps: int
    threshold: float | None
    predicted_ms: float
    over_budget: bool


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

    def choice(self, ctx_len: int, hole_len: int) -> BucketChoice:
        """The choice for a request's shapes (its buckets; the nearest measured bucket
        when a shape lies beyond the measured ones)."""
        c, h = bucket(ctx_len, CTX_BUCKETS), bucket(hole_len, HOLE_BUCKETS)
        by_key = {(x.ctx, x.hole): x for x in self.choices}
        if (c, h) in by_key:
            return by_key[(c, h)]
        # beyond what was measured: the largest measured bucket not smaller, else the largest
        cands = sorted(by_key, key=lambda k: (k[0] < c, k[1] < h, abs(k[0] - c), abs(k[1] - h)))
        return by_key[cands[0]]

    def steps_for(self, ctx_len: int, hole_len: int) -> tuple[int, float | None]:
        ch = self.choice(ctx_len, hole_len)
        return ch.steps, ch.threshold

    def to_json(self) -> bytes:
        return msgspec.json.format(msgspec.json.encode(self), indent=2)

    @classmethod
    def from_json(cls, data: bytes | str) -> StepPlan:
        return msgspec.json.decode(data, type=cls)


def predict_ms(t: BucketTiming, steps: int, refresh_every: int = 1) -> float:
    """Predicted end-to-end time of a request with ``steps`` steps (see module doc)."""
    full = math.ceil(steps / refresh_every)
    return t.overhead_ms + full * t.full_ms + (steps - full) * t.block_ms


def choose(t: BucketTiming, budget_ms: float, *, refresh_every: int = 1, min_steps: int = 1,
           max_steps: int = 16, threshold: float | None = DEFAULT_THRESHOLD) -> BucketChoice:
    """The most steps (<= hole, <= max_steps) that fit ``budget_ms`` for this bucket."""
    hi = max(min_steps, min(max_steps, t.hole))
    steps = min_steps
    for s in range(min_steps, hi + 1):
        if predict_ms(t, s, refresh_every) <= budget_ms:
            steps = s
    pred = predict_ms(t, steps, refresh_every)
    thr = threshold if steps < t.hole else None
    return BucketChoice(t.ctx, t.hole, steps, thr, round(pred, 3), pred > budget_ms)


def plan_from_timings(timings: Sequence[BucketTiming], budget_ms: float = DEFAULT_BUDGET_MS, *,
                      refresh_every: int = 1, min_steps: int = 1, max_steps: int = 16,
                      threshold: float | None = DEFAULT_THRESHOLD, **meta: Any) -> StepPlan:
    choices = [choose(t, budget_ms, refresh_every=refresh_every, min_steps=min_steps,
                      max_steps=max_steps, threshold=threshold) for t in timings]
    return StepPlan(budget_ms=budget_ms, refresh_every=refresh_every, min_steps=min_steps,
                    max_steps=max_steps, timings=list(timings), choices=choices, **meta)


def describe_plan(plan: StepPlan) -> str:
    """Human-readable table of a plan (for ``diffill info``)."""
    lines = [
        f"step plan: budget {plan.budget_ms:g} ms, {plan.device} {plan.dtype}"
        + (f", model {plan.model}" if plan.model else "")
        + (f", dual cache refresh every {plan.refresh_every}" if plan.refresh_every > 1 else ", no KV cache")
        + (f", measured {plan.measured_at}" if plan.measured_at else ""),
        f"{'context':>8} {'hole':>5} {'rows':>4} {'full ms':>8} {'cached ms':>9} {'steps':>5} "
        f"{'threshold':>9} {'predicted ms':>12}",
    ]
    timing = {(t.ctx, t.hole): t for t in plan.timings}
    for c in sorted(plan.choices, key=lambda c: (c.ctx, c.hole)):
        t = timing.get((c.ctx, c.hole))
        thr = "-" if c.threshold is None else f"{c.threshold:g}"
        lines.append(
            f"{c.ctx:>8} {c.hole:>5} {t.rows if t else 0:>4} {t.full_ms if t else 0:>8.2f} "
            f"{t.block_ms if t else 0:>9.2f} {c.steps:>5} {thr:>9} {c.predicted_ms:>12.2f}"
            + ("  OVER BUDGET" if c.over_budget else "")
        )
    return "\n".join(lines)


# -- measuring ---------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device | str, *, warmup: int = 1,
            repeats: int = 5) -> list[float]:
    """Wall-clock milliseconds of ``fn()`` (device synchronised), after warm-up."""
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(dev)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def synthetic_request(cfg: Any, ctx: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Prefix and suffix ids (random ordinary tokens) whose canvas context is ``ctx`` tokens."""
    specials = {cfg.mask_token_id, cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id}
    n = max(0, ctx - (cfg.bos_token_id is not None) - (cfg.eos_token_id is not None))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    ok = next(i for i in range(cfg.vocab_size) if i not in specials)
    ids = [ok if i in specials else i for i in ids]
    cut = (2 * n) // 3
    return ids[:cut], ids[cut:]


@torch.inference_mode()
def measure_bucket(model: Any, cfg: Any, ctx: int, hole: int, *, rows: int = 3,
                   refresh_every: int = 1, repeats: int = 5, warmup: int = 1) -> BucketTiming:
    """Time one full step, one cached step and the per-request overhead for a bucket.

    ``rows`` candidate lengths (``hole``, ``hole // 2``, ...) share the batch, as
    the engine's default lengths do.
    """

    dev = next(model.parameters()).device
    sp = SpecialIds.from_config(cfg)
    lengths = sorted({max(1, hole >> i) for i in range(rows)}, reverse=True)
    while len(lengths) < rows:
        lengths.append(lengths[-1])
    prefix, suffix = synthetic_request(cfg, ctx)
    cv = build_canvas(cfg, prefix, suffix, lengths, dev)
    spec = StepSpec(sp.mask, sp.pad, sp.terminators, cfg.shift_logits)  # greedy, fixed steps
    L, N = cv.valid.shape

    def fresh() -> DenoiseState:
        return initial_state(cv)

    full = statistics.median(time_ms(lambda: denoise_step(model, cv, fresh(), 2, spec), dev,
                                     warmup=warmup, repeats=repeats))
    block = full
    if refresh_every > 1:
        fwd = DualCache(model, cv, shift=cfg.shift_logits, refresh_every=1 << 30)
        denoise_step(fwd, cv, fresh(), 2, spec)  # the refresh
        block = statistics.median(time_ms(lambda: denoise_step(fwd, cv, fresh(), 2, spec), dev,
                                          warmup=warmup, repeats=repeats))
    one = statistics.median(time_ms(
        lambda: infill(model, cfg, prefix, suffix, SamplerConfig(steps=1, lengths=tuple(lengths))),
        dev, warmup=warmup, repeats=repeats))
    return BucketTiming(ctx, hole, L, round(full, 4), round(block, 4), round(max(0.0, one - full), 4))


def measure_plan(model: Any, cfg: Any, *, budget_ms: float = DEFAULT_BUDGET_MS,
                 ctx_buckets: Sequence[int] = CTX_BUCKETS, hole_buckets: Sequence[int] = HOLE_BUCKETS,
                 rows: int = 3, refresh_every: int = 1, repeats: int = 5, min_steps: int = 1,
                 max_steps: int = 16, threshold: float | None = DEFAULT_THRESHOLD,
                 model_name: str = "") -> StepPlan:
    """Measure every bucket that fits the model's positions and build the plan."""
    p = next(model.parameters())
    limit = getattr(cfg, "max_position_embeddings", 1 << 30)
    timings = [
        measure_bucket(model, cfg, c, h, rows=rows, refresh_every=refresh_every, repeats=repeats)
        for c in ctx_buckets for h in hole_buckets if c + h <= limit
    ]
    if not timings:
        raise ValueError(f"no bucket fits max_position_embeddings={limit}")
    return plan_from_timings(
        timings, budget_ms, refresh_every=refresh_every, min_steps=min_steps, max_steps=max_steps,
        threshold=threshold, device=str(p.device), dtype=str(p.dtype).removeprefix("torch."),
        model=model_name, measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
