"""Engine speed features against the plain per-request sampler: batching across
requests, the dual KV cache, shape buckets, the fused select step, the step plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffill.model.asks import EngineAsk
from diffill.model.cache import infill_cached
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import InfillCancelled, SamplerConfig, Strategy
from diffill.model.engine import ONCE, Engine
from diffill.model.engine_options import EngineOptions
from diffill.model.loader import LoadedModel
from diffill.model.plan import BucketTiming, describe_plan, plan_from_timings
from diffill.model.transformer import Transformer
from support import one_batch, tiny_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROW = EngineOptions(context="row")  # the exact path (the CPU default shares one context)


V = 53


def make_lm(shift: bool = False, seed: int = 0) -> LoadedModel:
    return tiny_lm(seed, vocab_size=V, shift_logits=shift, max_position_embeddings=512)


def prompts(n: int, seed: int = 0) -> list[tuple[list[int], list[int], tuple[int, ...]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        pre = torch.randint(4, V, (int(torch.randint(0, 30, (1,), generator=g)),), generator=g).tolist()
        suf = torch.randint(4, V, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g).tolist()
        lens = [(8,), (4, 8, 16), (3, 7), (12,), (2, 5, 9)][i % 5]
        out.append((pre, suf, lens))
    return out


def run_together(eng: Engine, reqs, **kw) -> list:
    """Queue all requests while the device is held, then release it: one batch."""
    return one_batch(eng, [lambda r=r: eng.infill(EngineAsk(r[0], r[1], lengths=r[2], **kw)) for r in reqs])


def _key(res):
    return [(r.ids, r.length, r.steps) for r in res]


def _assert_same(got, want, tol: float = 1e-5):
    assert _key(got) == _key(want)
    assert [r.score for r in got] == pytest.approx([r.score for r in want], abs=tol)


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("sc", [
    SamplerConfig(steps=4),
    SamplerConfig(steps=6, threshold=0.4, strategy=Strategy.MARGIN),
    SamplerConfig(steps=5, temperature=0.7, seed=3),
    SamplerConfig(steps=5, block=2),
    SamplerConfig(steps=4, threshold=0.5, block=3),
])
def test_batched_requests_equal_unbatched(shift, sc):
    lm = make_lm(shift)
    reqs = prompts(6)
    eng = Engine(lm, sc, options=ROW)
    got = run_together(eng, reqs)
    st = eng.stats()
    assert st["batches"] == 1 and st["max_batch_requests"] == 6
    for (pre, suf, lens), res in zip(reqs, got, strict=True):
        want = infill(lm.model, lm.config, pre, suf, SamplerConfig(**{**sc.__dict__, "lengths": lens}))
        _assert_same(res, want)


def test_requests_with_different_steps_are_not_mixed_but_all_answered():
    lm = make_lm()
    reqs = prompts(4, seed=1)
    eng = Engine(lm, SamplerConfig(steps=3), options=EngineOptions(max_batch_rows=5, context="row"))
    out = one_batch(eng, [lambda r=r, i=i: eng.infill(EngineAsk(r[0], r[1], lengths=r[2], steps=2 + i % 2))
                          for i, r in enumerate(reqs)])
    for i, (pre, suf, lens) in enumerate(reqs):
        _assert_same(out[i], infill(lm.model, lm.config, pre, suf,
                                    SamplerConfig(steps=2 + i % 2, lengths=lens)))
    assert eng.stats()["batches"] >= 2


def test_cancelled_request_leaves_the_batch_and_the_others_finish():
    lm = make_lm()
    reqs = prompts(4, seed=2)
    eng = Engine(lm, SamplerConfig(steps=5), options=ROW)
    calls = {"n": 0}

    def cancel_third() -> bool:
        calls["n"] += 1
        return calls["n"] > 3  # cancelled in the middle of the loop

    out = one_batch(eng, [lambda r=r, i=i: eng.infill(EngineAsk(r[0], r[1], lengths=r[2],
                                                             cancel=cancel_third if i == 2 else None))
                          for i, r in enumerate(reqs)])
    assert isinstance(out[2], InfillCancelled)
    for i in (0, 1, 3):
        pre, suf, lens = reqs[i]
        _assert_same(out[i], infill(lm.model, lm.config, pre, suf, SamplerConfig(steps=5, lengths=lens)))
    st = eng.stats()
    assert st["cancelled"] == 1 and st["completed"] == 3 and st["batches"] == 1


@pytest.mark.parametrize("shift", [False, True])
def test_buckets_and_fused_select_give_the_same_results(shift):
    lm = make_lm(shift, seed=4)
    reqs = prompts(5, seed=3)
    plain = Engine(lm, SamplerConfig(steps=4, threshold=0.5), options=EngineOptions(batch=False))
    fast = Engine(lm, SamplerConfig(steps=4, threshold=0.5),
                  options=EngineOptions(buckets=True, select_impl="torch"))
    got = run_together(fast, reqs)
    for (pre, suf, lens), res in zip(reqs, got, strict=True):
        _assert_same(res, plain.infill(EngineAsk(pre, suf, lengths=lens)))


@pytest.mark.parametrize("shift", [False, True])
def test_engine_dual_cache(shift):
    lm = make_lm(shift, seed=5)
    reqs = prompts(4, seed=4)
    # refresh every step: exactly the uncached sampler
    eng1 = Engine(lm, SamplerConfig(steps=6), options=EngineOptions(refresh_every=1, context="row"))
    for pre, suf, lens in reqs:
        assert eng1.infill(EngineAsk(pre, suf, lengths=lens)).candidates == infill(
            lm.model, lm.config, pre, suf, SamplerConfig(steps=6, lengths=lens))
    # refresh every 3 steps, batched: each request as the single-request cached sampler
    eng3 = Engine(lm, SamplerConfig(steps=6), options=EngineOptions(refresh_every=3, context="row"))
    got = run_together(eng3, reqs)
    for (pre, suf, lens), res in zip(reqs, got, strict=True):
        _assert_same(res, infill_cached(lm.model, lm.config, pre, suf,
                                        SamplerConfig(steps=6, lengths=lens), refresh_every=3))


def test_plan_chooses_steps_when_the_request_names_none():
    lm = make_lm()
    timings = [BucketTiming(ctx=256, hole=16, rows=3, full_ms=5.0, block_ms=5.0, overhead_ms=0.0),
               BucketTiming(ctx=512, hole=16, rows=3, full_ms=10.0, block_ms=10.0, overhead_ms=0.0)]
    plan = plan_from_timings(timings, 25.0)
    eng = Engine(lm, SamplerConfig(steps=8), plan=plan)
    small = eng.make_request(EngineAsk(list(range(4, 40)), [5], lengths=(16,)))
    big = eng.make_request(EngineAsk(list(range(4, 44)) * 8, [5], lengths=(16,)))
    assert (small.sampler.steps, small.sampler.threshold) == (5, 0.9)
    assert (big.sampler.steps, big.sampler.threshold) == (2, 0.9)
    assert eng.make_request(EngineAsk([4], [5], lengths=(16,), steps=7)).sampler.steps == 7
    res = eng.infill(EngineAsk(list(range(4, 40)), [5], lengths=(16,)))
    assert res and res[0].steps <= 5


@pytest.mark.parametrize("refresh", [1, 2])
@pytest.mark.parametrize("shift", [False, True])
def test_static_buffer_graph_loop_equals_eager(refresh, shift):
    """The CUDA-graph loop (static buffers, state written back, steps_left decremented,
    refresh/cached graphs, frozen cancelled rows) run without capture on CPU."""
    lm = make_lm(shift, seed=6)
    reqs = prompts(5, seed=6)
    for sc in (SamplerConfig(steps=5), SamplerConfig(steps=6, threshold=0.4),
               SamplerConfig(steps=5, block=2)):
        eager = Engine(lm, sc, options=EngineOptions(refresh_every=refresh, buckets=True,
                                                      context="row"))
        graphs = Engine(lm, sc, options=EngineOptions(refresh_every=refresh, cuda_graphs=True))
        want = run_together(eager, reqs)
        got = run_together(graphs, reqs)
        for a, b in zip(got, want, strict=True):
            _assert_same(a, b)
        # later rounds reuse the same static buffers (one bucket), other prompts included
        again = run_together(graphs, reqs)
        for a, b in zip(again, want, strict=True):
            _assert_same(a, b)
        other = [(pre + [7, 8, 9], suf, lens) for pre, suf, lens in prompts(5, seed=9)]
        for a, b in zip(run_together(graphs, other), run_together(eager, other), strict=True):
            _assert_same(a, b)
        assert graphs.stats()["cuda_graphs"] == 1


def test_static_buffer_loop_freezes_cancelled_rows():
    lm = make_lm(seed=7)
    reqs = prompts(3, seed=7)
    sc = SamplerConfig(steps=5)
    eng = Engine(lm, sc, options=EngineOptions(cuda_graphs=True, refresh_every=2))
    calls = {"n": 0}

    def cancel() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    out = one_batch(eng, [lambda r=r, i=i: eng.infill(EngineAsk(r[0], r[1], lengths=r[2],
                                                             cancel=cancel if i == 1 else None))
                          for i, r in enumerate(reqs)])
    assert isinstance(out[1], InfillCancelled)
    for i in (0, 2):
        pre, suf, lens = reqs[i]
        _assert_same(out[i], infill_cached(lm.model, lm.config, pre, suf,
                                           SamplerConfig(steps=5, lengths=lens), refresh_every=2))


class _MaskSpy(torch.nn.Module):
    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner = inner
        self.masks: list = []

    def forward_hidden(self, ids, attention_mask=None, *a, **kw):
        self.masks.append(attention_mask)
        return self.inner.forward_hidden(ids, attention_mask, *a, **kw)

    def head(self, h):
        return self.inner.head(h)


@pytest.mark.parametrize("refresh", [1, 3])
def test_unpadded_batches_run_without_an_attention_mask(refresh):
    lm = make_lm(seed=8)
    spy = _MaskSpy(lm.model)
    lm_spy = LoadedModel(model=spy, tokenizer=None, config=lm.config, path=Path("."),
                         provenance={}, device=lm.device, dtype=lm.dtype)
    eng = Engine(lm_spy, SamplerConfig(steps=4), options=EngineOptions(refresh_every=refresh))
    pre, suf = [5, 6, 7, 8, 9], [10, 11]
    one = eng.infill(EngineAsk(pre, suf, lengths=(6,)))  # one row, no padding
    assert spy.masks and all(m is None for m in spy.masks)
    want = infill_cached(lm.model, lm.config, pre, suf, SamplerConfig(steps=4, lengths=(6,)),
                         refresh_every=refresh)
    _assert_same(one, want)
    spy.masks.clear()
    eng.infill(EngineAsk(pre, suf, lengths=(3, 6)))  # rows of different lengths: padding, masks needed
    assert spy.masks and all(m is not None for m in spy.masks)


def test_default_sampler_takes_the_checkpoints_decode_block():
    lm = make_lm()
    assert Engine(lm).sampler.block is None
    lm.config = lm.config.replace(decode_block=2)
    eng = Engine(lm, options=ROW)  # the exact path, to compare with the sampler
    assert eng.sampler.block == 2 and Engine(lm).sampler.block == 2
    pre, suf, lens = prompts(1, seed=2)[0]
    assert eng.infill(EngineAsk(pre, suf, lengths=lens)).candidates == infill(
        lm.model, lm.config, pre, suf, SamplerConfig(block=2, lengths=lens))
    assert Engine(lm, SamplerConfig(steps=3)).sampler.block is None  # an explicit sampler wins


@pytest.mark.parametrize("shift", [False, True])
def test_cpu_default_shares_one_context_per_request(shift):
    """On a CPU the engine runs each request's rows against one context (cache.SharedContext),
    computed at the request's first step (refresh_context 'request'): the same results as the
    shared-context sampler with no refresh, batched or not, a lone row included. With
    refresh_context 'step' the context is recomputed every step: exact where a request has
    rows of one length. 'row' is the exact path."""
    lm = make_lm(shift)
    eng = Engine(lm, SamplerConfig(steps=4))
    assert eng.options.context == "auto" and eng.shared_context and eng.refresh_every == ONCE
    assert not Engine(lm, options=ROW).shared_context and Engine(lm, options=ROW).refresh_every == 1
    assert not Engine(lm, options=EngineOptions(cuda_graphs=True)).shared_context
    step = Engine(lm, SamplerConfig(steps=4), options=EngineOptions(refresh_context="step"))
    assert step.refresh_every == 1
    reqs = prompts(5, seed=3)
    got, got_step = run_together(eng, reqs), run_together(step, reqs)
    for (pre, suf, lens), res, res_step in zip(reqs, got, got_step, strict=True):
        sc = SamplerConfig(steps=4, lengths=lens)
        _assert_same(res, infill_cached(lm.model, lm.config, pre, suf, sc, refresh_every=ONCE, shared=True))
        _assert_same(res, eng.infill(EngineAsk(pre, suf, lengths=lens)))  # alone as in a batch
        _assert_same(res_step, infill_cached(lm.model, lm.config, pre, suf, sc, refresh_every=1, shared=True))
        if len(lens) == 1:
            _assert_same(res_step, infill(lm.model, lm.config, pre, suf, sc))
    with pytest.raises(ValueError):
        EngineOptions(refresh_context="sometimes")
    with pytest.raises(ValueError):
        EngineOptions(context="document")


def test_the_plan_is_timed_with_the_shared_context():
    lm = make_lm()
    shared = Engine(lm).measure_plan(200.0, ctx_buckets=(256,), hole_buckets=(8, 16), repeats=1)
    exact = Engine(lm, options=ROW).measure_plan(200.0, ctx_buckets=(256,), hole_buckets=(8, 16),
                                                 repeats=1)
    assert shared.shared_context and not exact.shared_context
    assert "one context per request" in describe_plan(shared)
    by_hole = {t.hole: t for t in shared.timings}  # a row more costs its hole, not a canvas
    assert by_hole[16].row_ms == pytest.approx(2 * by_hole[8].row_ms, abs=1e-3)
    by_hole = {t.hole: t for t in exact.timings}
    assert by_hole[16].row_ms == pytest.approx(by_hole[8].row_ms * 272 / 264, abs=1e-3)


def test_drafts_are_sent_only_while_the_request_fits_its_budget():
    lm = make_lm()
    t = BucketTiming(256, 16, 3, full_ms=100.0, block_ms=100.0, row_ms=40.0, block_row_ms=40.0)
    eng = Engine(lm, plan=plan_from_timings([t], 150.0, min_steps=1))
    drafts = [[5, 6], [7, 8], [9, 10]]
    # 3 rows: 100 ms, 4 rows: 140 ms, 5 rows: 180 ms > 150 ms -> one draft is sent
    assert eng.make_request(EngineAsk([4, 5, 6], [7], max_tokens=16, drafts=drafts)).drafts == ((5, 6),)
    # nothing fits even without drafts: all are kept (a verified one ends the request)
    assert len(eng.make_request(EngineAsk([4, 5, 6], [7], max_tokens=16, drafts=drafts,
                                budget_ms=50.0)).drafts) == 3
    assert len(eng.make_request(EngineAsk([4, 5, 6], [7], max_tokens=16, drafts=drafts,
                                budget_ms=500.0)).drafts) == 3
    # explicit steps: the drafts are the caller's business
    assert len(eng.make_request(EngineAsk([4, 5, 6], [7], max_tokens=16, drafts=drafts, steps=2)).drafts) == 3
