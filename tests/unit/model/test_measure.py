"""Timing the step plan: the buckets measured on a tiny model, every one or two and a fit."""

from __future__ import annotations

from diffill.model.measure import measure_plan
from support import tiny_model


def _tiny():
    return tiny_model(0, vocab_size=50, max_position_embeddings=300)


def test_measure_plan_on_a_tiny_model():
    model, cfg = _tiny()
    plan = measure_plan(model, cfg, budget_ms=1e9, ctx_buckets=(32, 64, 512), hole_buckets=(8,),
                        rows=2, refresh_every=2, repeats=1, max_steps=4)
    assert [(t.ctx, t.hole) for t in plan.timings] == [(32, 8), (64, 8)]  # 512 exceeds 300 positions
    assert all(t.full_ms > 0 and t.block_ms > 0 and t.rows == 2 for t in plan.timings)
    assert all(t.row_ms >= 0 and t.block_row_ms >= 0 for t in plan.timings)  # from 4 rows at (64, 8)
    assert all(c.steps == 4 for c in plan.choices)
    # a model below the smallest context bucket: its own longest context stands in for it
    small, scfg = tiny_model(0, vocab_size=50, max_position_embeddings=40)
    plan = measure_plan(small, scfg, budget_ms=1e9, hole_buckets=(8, 16, 64), rows=2, repeats=1)
    assert [(t.ctx, t.hole) for t in plan.timings] == [(256, 8), (256, 16)]
    assert plan.steps_for(20, 8) == (8, None)


def test_measure_plan_with_a_fit_times_two_buckets():
    model, cfg = _tiny()
    plan = measure_plan(model, cfg, budget_ms=1e9, fit=True, ctx_buckets=(32, 64, 128),
                        hole_buckets=(8, 16), rows=2, repeats=1, max_steps=4)
    src = {(t.ctx, t.hole): t.source for t in plan.timings}
    # the smallest bucket is timed with one row (cheap), so at the plan's two rows it is fitted
    assert src == {(32, 8): "fitted", (32, 16): "fitted", (64, 8): "fitted", (64, 16): "fitted",
                   (128, 8): "fitted", (128, 16): "measured"}
    assert all(t.full_ms > 0 and t.rows == 2 and t.row_ms >= 0 for t in plan.timings)
    assert all(c.steps == 4 for c in plan.choices)


def test_a_fit_measures_no_context_beyond_fit_ctx():
    """``fit_ctx`` (the background plan on a CPU): the large point is the largest bucket of
    at most that context; the larger contexts come from the cost model."""
    model, cfg = _tiny()
    plan = measure_plan(model, cfg, budget_ms=1e9, fit=True, ctx_buckets=(32, 64, 128),
                        hole_buckets=(8, 16), rows=2, repeats=1, max_steps=4, fit_ctx=64)
    src = {(t.ctx, t.hole): t.source for t in plan.timings}
    assert [b for b, s in src.items() if s == "measured"] == [(64, 16)]
    assert src[(128, 16)] == "fitted" and all(t.full_ms > 0 for t in plan.timings)


def test_a_fit_measures_no_hole_beyond_fit_hole():
    """``fit_hole`` (the editors' default maxTokens) bounds the large point's hole the same way."""
    model, cfg = _tiny()
    plan = measure_plan(model, cfg, budget_ms=1e9, fit=True, ctx_buckets=(32, 64, 128),
                        hole_buckets=(8, 16), rows=2, repeats=1, max_steps=4, fit_ctx=64,
                        fit_hole=8)
    src = {(t.ctx, t.hole): t.source for t in plan.timings}
    assert [b for b, s in src.items() if s == "measured"] == [(64, 8)]
    assert src[(64, 16)] == src[(128, 16)] == "fitted" and all(t.full_ms > 0 for t in plan.timings)


def test_a_cpu_plan_trims_the_heap_after_its_largest_step(monkeypatch):
    """On a CPU the plan hands the heap's free pages back after its last (largest) step as
    well as before each bucket: what that step freed would otherwise stay resident while the
    requests after it allocate in other sizes (BENCHMARKS.md, *The step's memory*)."""
    from diffill.model import measure

    events = []
    monkeypatch.setattr(measure, "release_free_memory", lambda: events.append("trim"))
    real = measure.measure_bucket

    def bucket(*a, **k):
        out = real(*a, **k)
        events.append("bucket timed")
        return out

    monkeypatch.setattr(measure, "measure_bucket", bucket)
    model, cfg = _tiny()
    measure_plan(model, cfg, budget_ms=1e9, fit=True, ctx_buckets=(32, 64), hole_buckets=(8,),
                 rows=2, repeats=1, max_steps=4)
    assert events.count("bucket timed") == 2 and events[-2:] == ["bucket timed", "trim"]
