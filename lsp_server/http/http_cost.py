"""What one completion request will cost, priced before it runs, so that serve-http can
cap the cost of a request rather than only its fields.

A request's fields alone do not bound its cost: ``max_tokens`` 256 x ``steps`` 64 is a
68-byte body that held a CPU worker for 24 s. The engine's step plan
(:mod:`diffill.model.plan`, measured at warm-up) knows what one refinement step costs
for each shape bucket (context tokens x hole slots, per canvas row), so the price is
the plan's own prediction (:func:`~diffill.model.plan.predict_ms`) for the request's
shapes:

* context: the prompt + suffix + extra context, at most the context budget, counted
  as one token per character when that is fewer (a token holds at least one
  character, so this never under-prices a short prompt by more than the bucket);
* hole: ``max_tokens``; rows: the candidate hole lengths the engine will run
  (:func:`~diffill.model.asks.default_lengths` of ``max_tokens`` and ``n``);
* steps: the request's ``steps``, else what the plan picks for its latency budget;
* a shape beyond the largest measured bucket is priced from that bucket scaled by the
  canvas length (the bucket's context + the request's hole, over the bucket's canvas).

Measured on the shared 2-core dev box, shipped model, one torch thread, plan measured at
load (issue 28's report): 16 tokens x 4 steps priced 796 ms, ran 322 ms; 64 x 16 priced
5674 ms, ran 3024 ms; 128 x 32 priced 13.6 s, ran 11.6 s; 256 x 64 priced 36 s (the
probe's 24 s request; refused by the CPU default). The price errs high on small holes (the
plan is timed at three rows with a context bucket of 256) and is close on large ones,
which are the ones the cap is for; the plan is measured once at load, so on a busy machine
the prices move with it (two loads differed by 20 %).

Without a plan (the backend is remote, or the model is too small for the smallest
bucket) nothing is priced and only the field caps apply.

Default caps by device (``--max-request-ms``): :data:`DEFAULT_MAX_REQUEST_MS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_REQUEST_MS: dict[str, float] = {"cpu": 5000.0, "cuda": 1000.0}
"""The largest predicted model time of one request, by torch device type: 25 x the
device's default latency budget on a CPU (200 ms), 40 x on a GPU (25 ms). A request the
plan chooses the steps for costs about its latency budget, so these only refuse requests
that ask for many steps of a large hole."""


def default_max_request_ms(device: str | None) -> float:
    kind = (device or "cpu").split(":", 1)[0]
    return DEFAULT_MAX_REQUEST_MS.get(kind, DEFAULT_MAX_REQUEST_MS["cuda"])


@dataclass(frozen=True)
class Price:
    """A request's predicted model time and the shapes it was priced at."""

    ms: float
    steps: int
    ctx: int
    hole: int
    rows: int

    def describe(self) -> str:
        return (f"{self.steps} steps x {self.rows} rows of a {self.hole}-slot hole in "
                f"{self.ctx} tokens of context, about {self.ms:.0f} ms")


def step_plan(backend: Any) -> Any:
    """The backend's frozen step plan, or None (remote backend, nothing measured)."""
    budget = getattr(getattr(backend, "engine", None), "budget", None)
    return getattr(budget, "plan", None)


def price(backend: Any, *, ctx_tokens: int, max_tokens: int, n: int = 1,
          steps: int | None = None, budget_ms: float | None = None) -> Price | None:
    """The predicted model time of one prompt (see the module doc); None without a plan."""
    plan = step_plan(backend)
    if plan is None or not plan.timings:
        return None
    from ...model.asks import default_lengths  # torch: loaded with the model
    from ...model.plan import predict_ms  # as above

    rows = len(default_lengths(max_tokens, n))
    ctx = max(1, ctx_tokens)
    if steps is None:
        planned = backend.engine.budget.steps_for(ctx, max_tokens, budget_ms, rows=rows)
        steps = planned[0] if planned is not None else plan.max_steps
    choice = plan.choice(ctx, max_tokens, rows)
    timing = next((t for t in plan.timings if (t.ctx, t.hole) == (choice.ctx, choice.hole)),
                  None)
    if timing is None:
        return None
    ms = predict_ms(timing, steps, plan.refresh_every, rows)
    scale = (max(ctx, timing.ctx) + max_tokens) / (timing.ctx + timing.hole)
    if scale > 1.0:  # beyond the measured buckets: scaled by the canvas length
        ms *= scale
    return Price(ms=ms, steps=steps, ctx=ctx, hole=max_tokens, rows=rows)


__all__ = ["DEFAULT_MAX_REQUEST_MS", "Price", "default_max_request_ms", "price", "step_plan"]
