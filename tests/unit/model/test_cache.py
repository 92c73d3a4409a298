"""Dual KV cache: the cached step against the full-recompute sampler."""

from __future__ import annotations

import pytest
import torch
from diffill.model.cache import DualCache, active_block, context_positions, infill_cached
from diffill.model.sampler import SamplerConfig, Strategy, build_canvas, infill
from support import tiny_model


def _model(seed: int = 0, **kw):
    return tiny_model(seed, vocab_size=61, **kw)


def _ids(g, n):
    return torch.randint(4, 61, (n,), generator=g).tolist()


@pytest.mark.parametrize("shift", [False, True])
def test_block_forward_equals_full_forward_on_the_same_canvas(shift):
    model, cfg = _model(1, shift_logits=shift)
    g = torch.Generator().manual_seed(2)
    cv = build_canvas(cfg, _ids(g, 9), _ids(g, 6), [3, 7, 5])
    # put some committed tokens into the hole so it is not all [MASK]
    ids = cv.ids.clone()
    hole = ids.gather(1, cv.hole_pos)
    hole = torch.where(cv.valid & (torch.rand(hole.shape, generator=g) < 0.5),
                       torch.randint(4, 61, hole.shape, generator=g), hole)
    ids.scatter_(1, cv.hole_pos, hole)
    fwd = DualCache(model, cv, shift=shift, refresh_every=100)
    with torch.inference_mode():
        full, _ = fwd.forward_hidden(ids, cv.attn)  # refresh: full forward, keeps context kv
        cached, _ = fwd.forward_hidden(ids, cv.attn)  # block only, same canvas
        ref, _ = model.forward_hidden(ids, cv.attn)
    assert fwd.refreshes == 1 and fwd.calls == 2
    bp, battn = active_block(cv, shift)
    D = ref.shape[-1]
    got = cached.gather(1, bp[..., None].expand(-1, -1, D))
    want = ref.gather(1, bp[..., None].expand(-1, -1, D))
    assert torch.allclose(full, ref)
    assert torch.allclose(got[battn], want[battn], atol=1e-5)
    # positions outside the block are not computed (left zero)
    outside = torch.ones(ids.shape, dtype=torch.bool)
    outside.scatter_(1, bp, False)
    assert (cached[outside] == 0).all() and (cached[~outside].abs().sum(-1) > 0).all()
    # dropping a row keeps the others exact
    fwd.select_rows(torch.tensor([0, 2]))
    with torch.inference_mode():
        sub, _ = fwd.forward_hidden(ids[[0, 2]], cv.attn[[0, 2]])
    got2 = sub.gather(1, bp[[0, 2], :, None].expand(-1, -1, D))
    assert torch.allclose(got2[battn[[0, 2]]], want[[0, 2]][battn[[0, 2]]], atol=1e-5)


def test_context_positions_are_the_complement():
    bp = torch.tensor([[2, 3, 4], [2, 3, 9]])
    ctx = context_positions(10, bp)
    assert ctx.tolist() == [[0, 1, 5, 6, 7, 8, 9], [0, 1, 4, 5, 6, 7, 8]]
    with pytest.raises(ValueError):
        context_positions(10, torch.tensor([[2, 2, 3]]))


SETTINGS = [
    dict(steps=4, lengths=(6,)),
    dict(steps=8, lengths=(3, 8, 5), strategy=Strategy.MARGIN),
    dict(steps=6, lengths=(4, 9), threshold=0.3, strategy=Strategy.ENTROPY),
    dict(steps=5, lengths=(7, 2), temperature=0.8, seed=11),
    dict(steps=3, lengths=(6, 6, 12), absorb_pad=False),
    dict(steps=4, lengths=(5, 9), block=2),
]


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("kw", SETTINGS)
def test_refresh_every_step_equals_uncached_sampler(shift, kw):
    model, cfg = _model(3, shift_logits=shift)
    g = torch.Generator().manual_seed(4)
    for _ in range(2):
        pre, suf = _ids(g, int(torch.randint(0, 12, (1,), generator=g))), _ids(g, 5)
        sc = SamplerConfig(**kw)
        want = infill(model, cfg, pre, suf, sc)
        got = infill_cached(model, cfg, pre, suf, sc, refresh_every=1)
        assert got == want


def test_cached_steps_refresh_on_schedule():
    model, cfg = _model(5)
    g = torch.Generator().manual_seed(6)
    calls = []

    class Spy(DualCache):
        def forward_hidden(self, ids, attn=None, **kw):
            calls.append(self.kv is None or self.calls % self.refresh_every == 0)
            return super().forward_hidden(ids, attn, **kw)

    import diffill.model.cache as cache_mod

    orig = cache_mod.DualCache
    cache_mod.DualCache = Spy
    try:
        pre, suf = _ids(g, 20), _ids(g, 20)
        sc = SamplerConfig(steps=8, lengths=(8,))
        got = infill_cached(model, cfg, pre, suf, sc, refresh_every=3)
    finally:
        cache_mod.DualCache = orig
    assert calls == [True, False, False, True, False, False, True, False]
    want = infill(model, cfg, pre, suf, sc)
    assert got[0].length == want[0].length == 8 and got[0].steps == want[0].steps


def test_bad_refresh_value():
    model, cfg = _model(0)
    cv = build_canvas(cfg, [5], [6], [4])
    with pytest.raises(ValueError):
        DualCache(model, cv, shift=False, refresh_every=0)
