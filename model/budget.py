"""The step budget: the one owner of budget -> steps, one per engine.

:class:`StepBudget` (held by the engine as ``Engine.budget``) says which latency budget is in
force for a request (the request's, else the engine's, else the device's default,
:func:`default_budget_ms`), holds the step plan measured at warm-up (frozen; plans for other
budgets derived from its timings) and decides each request's steps
(:meth:`StepBudget.decide`), carried back with its result as a :class:`StepDecision`. The
plan and its policy: :mod:`.plan`; docs/step-budget.md.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .limits import DEFAULT_BUDGET_MS, DEFAULT_MAX_STEPS
from .plan import PROVISIONAL, StepPlan


def default_budget_ms(device_type: str) -> float:
    """:data:`DEFAULT_BUDGET_MS` for a device type (others: the GPU figure)."""
    return DEFAULT_BUDGET_MS.get(device_type, DEFAULT_BUDGET_MS["cuda"])


class StepDecision(msgspec.Struct, frozen=True):
    """What :meth:`StepBudget.decide` chose for one request, carried back with its result
    so that reports read it instead of deciding again. ``source``: ``"request"`` (the
    request named its steps), ``"plan"`` (the plan's choice for its shapes, rows and
    budget) or ``"default"`` (no plan: the sampler's steps). ``budget_ms``: the budget the
    choice was made for (None when the request named its steps); ``bucket`` (ctx, hole),
    ``predicted_ms`` and ``over_budget``: the plan's, where a plan chose."""

    steps: int
    source: str
    max_steps: int
    budget_ms: float | None = None
    threshold: float | None = None
    rows: int = 0
    bucket: tuple[int, int] | None = None
    predicted_ms: float | None = None
    over_budget: bool = False

    @property
    def planned(self) -> bool:
        """The budget chose the steps (the plan's, or the sampler's without a plan)."""
        return self.source != "request"


class StepBudget:
    """The one owner of budget -> steps (module doc), one per engine: the budget it was
    built with (None: the device's default), the bounds of a planned step count, and the
    plan measured at warm-up (frozen; plans for other budgets derived from its timings)."""

    def __init__(self, device_type: str, budget_ms: float | None = None, *,
                 max_steps: int = DEFAULT_MAX_STEPS, plan: StepPlan | None = None) -> None:
        if budget_ms is not None and budget_ms <= 0:
            raise ValueError(f"budget_ms must be > 0, got {budget_ms}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.device_type = device_type
        self.configured_ms = budget_ms
        self.max_steps = max_steps
        self._plan = plan
        self._derived: dict[float, StepPlan] = {}

    @property
    def plan(self) -> StepPlan | None:
        """The plan measured at warm-up (or given); None until then."""
        return self._plan

    @plan.setter
    def plan(self, plan: StepPlan | None) -> None:
        self._derived = {}
        self._plan = plan

    def budget_ms(self, requested: float | None = None) -> float:
        """The budget in force: the request's, else the configured one, else the one the
        plan was made for (when a plan was given rather than measured), else the device's."""
        if requested is not None:
            return float(requested)
        if self.configured_ms is not None:
            return float(self.configured_ms)
        if self._plan is not None:
            return float(self._plan.budget_ms)
        return default_budget_ms(self.device_type)

    def plan_for(self, budget_ms: float) -> StepPlan | None:
        """The frozen plan re-derived for ``budget_ms`` (None: nothing measured yet)."""
        plan = self.plan
        if plan is None or budget_ms == plan.budget_ms:
            return plan
        derived = self._derived.get(budget_ms)
        if derived is None:
            derived = plan.for_budget(budget_ms)
            if len(self._derived) >= 32:  # a handful of budgets in practice; stay bounded
                self._derived.clear()
            self._derived[budget_ms] = derived
        return derived

    def steps_for(self, ctx_len: int, hole_len: int, budget_ms: float | None = None,
                  rows: int | None = None, *, whole_canvases: bool = False,
                  ) -> tuple[int, float | None] | None:
        """(steps, threshold) for a request's shapes and canvas ``rows`` (None: the plan's
        own), or None when no plan was measured. ``whole_canvases``: the request's decoder
        runs every row's whole canvas at every step (DreamOn; :meth:`StepPlan.choice_for`)."""
        d = self.decide(ctx_len, hole_len, rows, budget_ms=budget_ms, whole_canvases=whole_canvases)
        return None if d.source == "default" else (d.steps, d.threshold)

    def decide(self, ctx_len: int, hole_len: int, rows: int | None, *,
               budget_ms: float | None = None,
               steps: int | None = None, default_steps: int = 8,
               whole_canvases: bool = False) -> StepDecision:
        """The steps of one request: ``steps`` when it names them, else the plan's choice for
        its shapes, canvas ``rows`` and budget (``budget_ms``, else the one in force), else
        (no plan) ``default_steps``. ``rows`` None: the rows the plan was timed with.
        ``whole_canvases``: the request's decoder runs every row's whole canvas at every step
        (DreamOn: :meth:`StepPlan.choice_for`)."""
        if steps is not None:
            return StepDecision(int(steps), "request", self.max_steps, rows=rows)
        budget = self.budget_ms(budget_ms)
        plan = self.plan_for(budget)
        if plan is None:
            return StepDecision(default_steps, "default", self.max_steps, budget, rows=rows)
        c = plan.choice_for(ctx_len, hole_len, rows, whole_canvases=whole_canvases)
        return StepDecision(c.steps, "plan", self.max_steps, budget, c.threshold, rows,
                            (c.ctx, c.hole), c.predicted_ms, c.over_budget)

    def summary(self) -> dict[str, Any]:
        """For status reports: the budget, and what the plan was built from."""
        plan = self.plan
        return {
            "latency_budget_ms": self.budget_ms(),
            "max_steps": self.max_steps,
            "step_plan": None if plan is None else {
                "measured_at": plan.measured_at,
                "buckets": len(plan.timings),
                "fitted": sum(t.source == "fitted" for t in plan.timings),
                "provisional": any(t.source == PROVISIONAL for t in plan.timings),
                "steps": {f"{c.ctx}x{c.hole}": c.steps for c in plan.choices},
            },
        }
