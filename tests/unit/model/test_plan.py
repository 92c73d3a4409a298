"""The step plan: the chooser on synthetic timings, the fitted cost model, the JSON plan."""

from __future__ import annotations

import msgspec
import pytest
from diffill.model.budget import StepBudget
from diffill.model.plan import (
    BucketTiming,
    StepPlan,
    bucket,
    choose,
    describe_plan,
    fit_timings,
    plan_from_timings,
    predict_ms,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def test_bucket():
    assert bucket(1, (8, 16)) == 8
    assert bucket(8, (8, 16)) == 8
    assert bucket(9, (8, 16)) == 16
    assert bucket(17, (8, 16)) == 32
    assert bucket(33, (8, 16)) == 48


def test_predict_counts_refreshes():
    t = BucketTiming(ctx=1024, hole=32, rows=3, full_ms=2.0, block_ms=0.5, overhead_ms=1.0)
    assert predict_ms(t, 8) == 1 + 8 * 2.0
    assert predict_ms(t, 8, refresh_every=4) == 1 + 2 * 2.0 + 6 * 0.5
    assert predict_ms(t, 9, refresh_every=4) == 1 + 3 * 2.0 + 6 * 0.5


def test_rows_are_priced_per_step():
    t = BucketTiming(ctx=256, hole=16, rows=3, full_ms=30.0, block_ms=30.0, overhead_ms=0.0,
                     row_ms=9.0, block_row_ms=9.0)
    assert t.step_ms() == t.step_ms(3) == (30.0, 30.0)
    assert t.step_ms(6) == (57.0, 57.0) and t.step_ms(1) == (12.0, 12.0)
    assert t.step_ms(-100) == (3.0, 3.0)  # never below a tenth of the measured step
    assert predict_ms(t, 4, rows=6) == 4 * 57.0
    assert choose(t, 200.0).steps == 6 and choose(t, 200.0, rows=6).steps == 3
    assert choose(t, 200.0, rows=6).rows == 6 and choose(t, 200.0, rows=3).rows == 0
    plan = plan_from_timings([t], 200.0)
    assert plan.steps_for(100, 16) == plan.steps_for(100, 16, rows=3) == (6, 0.9)
    assert plan.steps_for(100, 16, rows=6) == (3, 0.9)  # three draft rows more: fewer steps
    assert plan.steps_for(100, 16, rows=1) == (16, None)  # fewer rows: more steps fit
    unpriced = plan_from_timings([msgspec.structs.replace(t, row_ms=0.0, block_row_ms=0.0)], 200.0)
    assert unpriced.steps_for(100, 16, rows=6) == (6, 0.9)  # a plan without row prices
    sb = StepBudget("cpu", plan=plan)
    assert sb.steps_for(100, 16, rows=6) == (3, 0.9) and sb.steps_for(100, 16, 400.0, rows=6) == (7, 0.9)
    assert "ms/row" in describe_plan(plan) and "9.00" in describe_plan(plan)


def test_whole_canvases_are_priced_as_full_forwards():
    """DreamOn's steps run every row's whole canvas with no cache: priced by the tokens they
    run, every step full, never below the step that was timed."""
    t = BucketTiming(ctx=256, hole=16, rows=3, full_ms=30.0, block_ms=5.0, overhead_ms=0.0)
    shared = plan_from_timings([t], 200.0, refresh_every=1 << 30, shared_context=True)
    assert shared.steps_for(100, 16) == (16, None)  # one full step, then cached ones
    # 3 x (256 + 16) tokens a step against the 256 + 3 x 16 timed: 80.5 ms, every step
    assert shared.steps_for(100, 16, rows=3, whole_canvases=True) == (2, 0.9)
    per_row = plan_from_timings([t], 200.0)
    assert per_row.steps_for(100, 16, whole_canvases=True) == (6, 0.9)  # as timed
    assert per_row.steps_for(100, 16, rows=1, whole_canvases=True) == (6, 0.9)  # never below
    assert StepBudget("cpu", plan=shared).steps_for(100, 16, rows=3, whole_canvases=True) == (2, 0.9)


def test_a_request_larger_than_its_bucket_is_priced_for_its_size():
    """The shipped model's 512 positions leave one context bucket (256): a request of 478
    context tokens falls back to it and is priced for the tokens its step runs, never below
    the timed figure; one within the bucket keeps the plan's choice."""
    t = BucketTiming(ctx=256, hole=16, rows=3, full_ms=30.0, block_ms=30.0, overhead_ms=0.0,
                     row_ms=9.0, block_row_ms=9.0)
    plan = plan_from_timings([t], 200.0)
    assert plan.choice(200, 16) is plan.choices[0] and plan.steps_for(256, 16) == (6, 0.9)
    # 3 x (478 + 16) tokens a step against 3 x (256 + 16) timed: 54.5 ms a step
    big = plan.choice(478, 16)
    assert (big.ctx, big.hole, big.steps, big.predicted_ms) == (256, 16, 3, 163.456)
    assert plan.steps_for(478, 16, rows=4) == (2, 0.9)  # a row more costs its larger canvas
    assert plan.steps_for(478, 16, rows=1) == (9, 0.9)
    d = StepBudget("cpu", plan=plan).decide(478, 16, 3)
    assert (d.steps, d.bucket, d.over_budget) == (3, (256, 16), False)
    # one context per request, the context computed once: the first step and the rest scaled
    # alike, (478 + 3 x 16) / (256 + 3 x 16) tokens
    once = plan_from_timings([msgspec.structs.replace(t, block_ms=10.0)], 200.0,
                             refresh_every=1 << 30, shared_context=True)
    assert once.steps_for(200, 16) == (16, None) and once.steps_for(478, 16) == (9, 0.9)


def test_choose_on_synthetic_timings():
    t = BucketTiming(ctx=1024, hole=16, rows=3, full_ms=2.0, block_ms=0.5, overhead_ms=1.0)
    c = choose(t, 25.0)
    assert (c.steps, c.threshold, c.over_budget) == (12, 0.9, False)  # 1 + 12*2 = 25
    assert c.predicted_ms == 25.0
    # with the cache every step but one in four is cheap: all 16 fit, one token per step
    c = choose(t, 25.0, refresh_every=4)
    assert (c.steps, c.threshold) == (16, None)
    # a short hole caps the steps; max_steps caps them too
    short = BucketTiming(ctx=256, hole=8, rows=3, full_ms=0.1, block_ms=0.1)
    assert choose(short, 25.0).steps == 8
    assert choose(short, 25.0, max_steps=4).steps == 4
    # nothing fits: min_steps, flagged
    slow = BucketTiming(ctx=2048, hole=64, rows=3, full_ms=30.0, block_ms=30.0)
    c = choose(slow, 25.0, min_steps=2)
    assert (c.steps, c.over_budget) == (2, True) and c.predicted_ms == 60.0


@settings(max_examples=60, deadline=None)
@given(full=st.floats(0.01, 40), block_frac=st.floats(0.05, 1.0), over=st.floats(0, 10),
       hole=st.sampled_from([8, 16, 32, 64]), budget=st.floats(1, 60), r=st.integers(1, 8))
def test_choice_is_the_largest_fitting_step_count(full, block_frac, over, hole, budget, r):
    t = BucketTiming(ctx=512, hole=hole, rows=3, full_ms=full, block_ms=full * block_frac,
                     overhead_ms=over)
    c = choose(t, budget, refresh_every=r, max_steps=16)
    hi = min(16, hole)
    assert 1 <= c.steps <= hi
    fits = [s for s in range(1, hi + 1) if predict_ms(t, s, r) <= budget]
    if fits:
        assert c.steps == max(fits) and not c.over_budget
    else:
        assert c.steps == 1 and c.over_budget
    assert (c.threshold is None) == (c.steps >= hole)
    # a slower step never gets more steps
    slower = BucketTiming(ctx=512, hole=hole, rows=3, full_ms=full * 1.5, block_ms=full * block_frac * 1.5,
                          overhead_ms=over)
    assert choose(slower, budget, refresh_every=r, max_steps=16).steps <= c.steps


def test_plan_json_round_trip_lookup_and_description():
    timings = [BucketTiming(ctx=c, hole=h, rows=3, full_ms=c / 256 * h / 16, block_ms=0.3)
               for c in (256, 512, 1024) for h in (8, 16, 32)]
    plan = plan_from_timings(timings, 25.0, refresh_every=2, device="cpu", model="tiny")
    again = StepPlan.from_json(plan.to_json())
    assert again == plan
    assert plan.choice(300, 10).ctx == 512 and plan.choice(300, 10).hole == 16
    assert plan.choice(5000, 10).ctx == 1024  # beyond the measured buckets: the largest
    steps, thr = plan.steps_for(100, 8)
    assert steps == 8 and thr is None
    text = describe_plan(plan)
    assert "budget 25 ms" in text and "refresh every 2" in text
    assert len(text.splitlines()) == 2 + len(timings)


def test_fit_timings_predicts_unmeasured_buckets_linearly_in_tokens():
    rows = 3
    measured = [BucketTiming(ctx=256, hole=8, rows=rows, full_ms=1.0 + 0.01 * rows * 264,
                             block_ms=0.5, overhead_ms=2.0),
                BucketTiming(ctx=1024, hole=64, rows=rows, full_ms=1.0 + 0.01 * rows * 1088,
                             block_ms=0.5, overhead_ms=2.0)]
    buckets = [(c, h) for c in (256, 512, 1024) for h in (8, 16, 64)]
    got = {(t.ctx, t.hole): t for t in fit_timings(measured, buckets)}
    assert sorted(got) == sorted(buckets)
    assert got[(256, 8)].source == got[(1024, 64)].source == "measured"
    assert got[(256, 8)].full_ms == measured[0].full_ms and got[(1024, 64)].full_ms == measured[1].full_ms
    t = got[(512, 16)]
    assert t.source == "fitted" and t.rows == rows and t.overhead_ms == 2.0 and t.block_ms == 0.5
    assert t.full_ms == pytest.approx(1.0 + 0.01 * rows * 528, abs=1e-3)
    assert t.row_ms == pytest.approx(0.01 * 528, abs=1e-3) and t.block_row_ms == 0.0  # the slope
    assert got[(256, 8)].row_ms == pytest.approx(0.01 * 264, abs=1e-3)
    # noise that makes the bigger shape look cheaper: no negative slope, a constant
    flat = fit_timings([measured[0], BucketTiming(ctx=1024, hole=64, rows=rows, full_ms=0.5,
                                                  block_ms=0.5)], buckets)
    mean = (measured[0].full_ms + 0.5) / 2
    assert all(x.full_ms == pytest.approx(mean, abs=1e-3) for x in flat if x.source == "fitted")
    assert all(x.row_ms == 0.0 for x in flat)
    one = fit_timings(measured[:1], buckets)  # one measurement: the same cost everywhere
    assert {x.full_ms for x in one} == {measured[0].full_ms}
    with pytest.raises(ValueError):
        fit_timings([], buckets)


def test_fit_timings_through_points_that_differ_in_rows():
    """The CPU warm-up's two points: the smallest bucket with one row, the largest with
    three; every bucket is predicted at three rows, and a row priced, from the one line."""

    def cost(rows: int, c: int, h: int) -> float:
        return 4.0 + 0.02 * rows * (c + h)

    small = BucketTiming(ctx=256, hole=8, rows=1, full_ms=cost(1, 256, 8), block_ms=cost(1, 256, 8),
                         overhead_ms=3.0)
    large = BucketTiming(ctx=256, hole=64, rows=3, full_ms=cost(3, 256, 64), block_ms=cost(3, 256, 64))
    buckets = [(256, h) for h in (8, 16, 32, 64)]
    got = {(t.ctx, t.hole): t for t in fit_timings([small, large], buckets, rows=3)}
    assert got[(256, 8)].source == "fitted" and got[(256, 64)].source == "measured"
    for (c, h), t in got.items():
        assert t.rows == 3
        assert t.full_ms == pytest.approx(cost(3, c, h), abs=1e-3)
        assert t.row_ms == pytest.approx(0.02 * (c + h), abs=1e-3)
        for rows in (1, 4, 6):  # the other row counts, priced
            assert t.step_ms(rows)[0] == pytest.approx(cost(rows, c, h), abs=1e-3)
