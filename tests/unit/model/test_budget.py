"""The one owner of budget -> steps: the budget in force, the frozen plan re-derived, a
request's decision and what it says."""

from __future__ import annotations

import pytest
from diffill.model.budget import StepBudget, default_budget_ms
from diffill.model.plan import BucketTiming, plan_from_timings


def test_step_budget_decides_and_says_why():
    t = BucketTiming(ctx=1024, hole=16, rows=3, full_ms=2.0, block_ms=0.5, overhead_ms=1.0)
    sb = StepBudget("cpu", plan=plan_from_timings([t], 25.0))
    d = sb.decide(600, 16, 3)  # the plan's own budget and rows
    assert (d.steps, d.source, d.budget_ms, d.bucket, d.predicted_ms, d.over_budget) == (
        12, "plan", 25.0, (1024, 16), 25.0, False)
    assert (d.threshold, d.max_steps, d.planned) == (0.9, sb.max_steps, True)
    assert sb.decide(600, 16, 3, budget_ms=1e-3).over_budget  # nothing fits: the fewest steps
    forced = sb.decide(600, 16, 3, budget_ms=1e-3, steps=5)
    assert (forced.steps, forced.source, forced.budget_ms, forced.planned) == (5, "request", None, False)
    none = StepBudget("cpu").decide(600, 16, 3, default_steps=8)  # no plan: the sampler's steps
    assert (none.steps, none.source, none.budget_ms, none.bucket) == (8, "default", 200.0, None)


def test_default_budget_by_device():
    assert default_budget_ms("cuda") == 25.0 and default_budget_ms("cpu") == 200.0
    assert default_budget_ms("mps") == 25.0  # other accelerators: the GPU target


def test_step_budget_resolves_the_budget_and_re_derives_the_frozen_plan():
    timings = [BucketTiming(ctx=256, hole=h, rows=3, full_ms=2.0, block_ms=2.0) for h in (8, 16, 32, 64)]
    plan = plan_from_timings(timings, 25.0, max_steps=16)
    assert StepBudget("cpu").budget_ms() == 200.0  # nothing configured: the device's
    assert StepBudget("cuda").budget_ms() == 25.0
    assert StepBudget("cpu", 50.0).budget_ms() == 50.0 and StepBudget("cpu", 50.0).budget_ms(12.0) == 12.0
    assert StepBudget("cpu", plan=plan).budget_ms() == 25.0  # a given plan: its budget
    assert StepBudget("cpu").steps_for(100, 16) is None  # nothing measured: no planned steps
    sb = StepBudget("cpu", plan=plan)
    assert sb.steps_for(100, 16) == (12, 0.9)  # 12 x 2 ms fit 25 ms
    assert sb.steps_for(100, 16, 10.0) == (5, 0.9)  # another budget: the same timings
    derived = sb.plan_for(10.0)
    assert derived.budget_ms == 10.0 and derived.timings == plan.timings
    assert all(c.predicted_ms <= 10.0 or c.over_budget for c in derived.choices)
    assert sb.plan_for(10.0) is derived and sb.plan is plan  # cached; the plan stays frozen
    assert sb.steps_for(100, 8, 1e6) == (8, None)  # never more steps than slots
    sb.plan = plan_from_timings(timings, 25.0, max_steps=4)  # a new measurement replaces it
    assert sb.steps_for(100, 16, 10.0) == (4, 0.9)
    summary = sb.summary()
    assert summary["latency_budget_ms"] == 25.0 and summary["step_plan"]["steps"]["256x16"] == 4
    with pytest.raises(ValueError):
        StepBudget("cpu", 0.0)
