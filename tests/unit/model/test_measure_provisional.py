"""measure.provisional_plan (issue 25): the plan a slow CPU model follows while its plan is
measured in the background, priced in proportion to step tokens from one tiny request."""

from __future__ import annotations

import pytest
from diffill.model.measure import provisional_plan
from diffill.model.plan import (
    PROVISIONAL,
    BucketTiming,
    NoBucketFits,
    plan_from_timings,
    predict_ms,
    step_tokens,
)


@pytest.mark.parametrize("shared", [False, True])
def test_provisional_plan_overpredicts_an_affine_cost(shared):
    """True step cost a + b * tokens (a >= 0): the plan priced from a tiny request predicts
    at least that in every bucket, so it never gives more steps than the true plan."""
    a, b = 5.0, 0.02
    tiny = step_tokens(3, 16, 8, shared)
    plan = provisional_plan(a + b * tiny, tiny, 200.0, rows=3, shared_context=shared)
    assert all(t.source == PROVISIONAL for t in plan.timings) and len(plan.timings) == 16
    true = plan_from_timings([BucketTiming(t.ctx, t.hole, 3, a + b * step_tokens(3, t.ctx, t.hole, shared),
                                           a + b * step_tokens(3, t.ctx, t.hole, shared))
                              for t in plan.timings], 200.0)
    for t in plan.timings:
        assert predict_ms(t, 1) >= a + b * step_tokens(3, t.ctx, t.hole, shared)
        assert plan.choice(t.ctx, t.hole).steps <= true.choice(t.ctx, t.hole).steps
    # another row count (drafts) is priced too, and costs more
    t = next(t for t in plan.timings if (t.ctx, t.hole) == (256, 16))
    assert predict_ms(t, 1, rows=5) > predict_ms(t, 1)
    assert plan.choice(256, 16, rows=5).steps <= plan.choice(256, 16).steps


def test_provisional_plan_buckets_follow_the_positions():
    plan = provisional_plan(10.0, 40, 200.0, limit=300)
    assert {(t.ctx, t.hole) for t in plan.timings} == {(256, 8), (256, 16), (256, 32)}
    small = provisional_plan(10.0, 40, 200.0, limit=100)  # below the smallest context bucket
    assert {(t.ctx, t.hole) for t in small.timings} == {(256, 8), (256, 16), (256, 32), (256, 64)}
    with pytest.raises(NoBucketFits):
        provisional_plan(10.0, 40, 200.0, limit=8)


def test_a_slow_tiny_request_gives_one_step():
    """The 0.5B shape on a 2-core CPU: a 40-token tiny request of ~0.5 s."""
    plan = provisional_plan(500.0, 40, 200.0)
    assert {c.steps for c in plan.choices} == {1}
