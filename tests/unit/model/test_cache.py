"""Dual KV cache: the cached step against the full-recompute sampler."""

from __future__ import annotations

import pytest
import torch
from diffill.model.cache import DualCache, active_block, context_positions, infill_cached
from diffill.model.decoder.canvas import build_canvas
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import SamplerConfig, Strategy
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


# -- one context per request ------------------------------------------------------------------


def test_context_groups_pick_each_requests_longest_row():
    from diffill.model.cache import context_groups
    from diffill.model.decoder.canvas import pad_canvas, stack_canvases

    _, cfg = _model(0)
    g = torch.Generator().manual_seed(3)
    a = build_canvas(cfg, _ids(g, 5), _ids(g, 4), [2, 4, 8, 8])  # 3 lengths + a draft row
    b = build_canvas(cfg, _ids(g, 7), _ids(g, 2), [3, 6])
    cv = stack_canvases([a, b], cfg.pad_token_id)
    cv = pad_canvas(cv, cfg.pad_token_id, cv.ids.shape[1], cv.hole_pos.shape[1], 8)  # 2 fillers
    assert context_groups(cv).tolist() == [2, 2, 2, 2, 5, 5, 6, 7]


@pytest.mark.parametrize("shift", [False, True])
def test_shifted_keys_are_the_rows_own_keys_at_layer_zero(shift):
    """Layer 0's keys depend on the token and its position only: the representative's
    suffix keys moved by the offset must be the shorter row's own keys (RoPE exactness)."""
    from diffill.model.cache import SharedContext

    model, cfg = _model(4, shift_logits=shift)
    g = torch.Generator().manual_seed(5)
    cv = build_canvas(cfg, _ids(g, 6), _ids(g, 7), [2, 5, 9])
    fwd = SharedContext(model, cv, shift=shift, refresh_every=100)
    with torch.inference_mode():
        fwd.forward_hidden(cv.ids, cv.attn)
        own = DualCache(model, cv, shift=shift, refresh_every=100)
        own.forward_hidden(cv.ids, cv.attn)
    k_shared, k_own = fwd.kv[0][0], own.kv[0][0]
    real = own.ctx_mask[:, None, :, None].expand_as(k_own)
    assert torch.allclose(k_shared[real], k_own[real], atol=1e-5)
    assert torch.equal(fwd.kv[0][1][real], own.kv[0][1][real])
    assert fwd.shared_rows == 2


@pytest.mark.parametrize("shift", [False, True])
def test_shared_context_is_exact_where_the_rows_canvases_agree(shift):
    """Rows of one length (a candidate and its draft rows, all masked) get exactly what
    each would get on its own; one row alone is the plain sampler."""
    from diffill.model.cache import SharedContext

    model, cfg = _model(6, shift_logits=shift)
    g = torch.Generator().manual_seed(7)
    cv = build_canvas(cfg, _ids(g, 8), _ids(g, 5), [6, 6, 6])
    fwd = SharedContext(model, cv, shift=shift, refresh_every=100)
    with torch.inference_mode():
        got, _ = fwd.forward_hidden(cv.ids, cv.attn)
        ref, _ = model.forward_hidden(cv.ids, cv.attn)
    bp, battn = active_block(cv, shift)
    D = ref.shape[-1]
    sel = bp[..., None].expand(-1, -1, D)
    assert torch.allclose(got.gather(1, sel)[battn], ref.gather(1, sel)[battn], atol=1e-5)
    pre, suf = _ids(g, 9), _ids(g, 4)
    sc = SamplerConfig(steps=4, lengths=(7,))
    assert [c.ids for c in infill_cached(model, cfg, pre, suf, sc, refresh_every=1, shared=True)] \
        == [c.ids for c in infill(model, cfg, pre, suf, sc)]


@pytest.mark.parametrize("shift", [False, True])
def test_shared_context_decodes_close_to_the_exact_path(shift):
    """An approximation for rows of other lengths (how close is measured on real models,
    not asserted on a random one): it runs and answers every length, and the
    representative row's logits are the exact path's."""
    from diffill.model.cache import SharedContext

    model, cfg = _model(8, shift_logits=shift)
    g = torch.Generator().manual_seed(9)
    pre, suf = _ids(g, 12), _ids(g, 6)
    sc = SamplerConfig(steps=4, lengths=(3, 6, 12))
    res = infill_cached(model, cfg, pre, suf, sc, refresh_every=2, shared=True, dedup=False)
    assert sorted(c.length for c in res) == [3, 6, 12] and all(c.steps >= 1 for c in res)
    cv = build_canvas(cfg, pre, suf, [3, 6, 12])
    with torch.inference_mode():
        got, _ = SharedContext(model, cv, shift=shift, refresh_every=1).forward_hidden(cv.ids, cv.attn)
        ref, _ = model.forward_hidden(cv.ids, cv.attn)
    bp, battn = active_block(cv, shift)
    sel = bp[..., None].expand(-1, -1, ref.shape[-1])
    with torch.inference_mode():
        lg, lr = model.head(got.gather(1, sel))[battn], model.head(ref.gather(1, sel))[battn]
    assert torch.allclose(lg[-12:], lr[-12:], atol=1e-4)  # the representative row is exact


def test_shared_context_lets_rows_go_and_elects_a_new_representative():
    from diffill.model.cache import SharedContext

    model, cfg = _model(10)
    g = torch.Generator().manual_seed(11)
    cv = build_canvas(cfg, _ids(g, 6), _ids(g, 3), [2, 4, 8])
    fwd = SharedContext(model, cv, shift=False, refresh_every=1)
    with torch.inference_mode():
        fwd.forward_hidden(cv.ids, cv.attn)
        fwd.select_rows(torch.tensor([0, 1]))  # the representative (row 2) goes
        assert fwd.rep.tolist() == [1, 1]
        sub = cv.rows(torch.tensor([0, 1]))
        got, _ = fwd.forward_hidden(sub.ids, sub.attn)  # refresh with the new representative
        ref, _ = model.forward_hidden(sub.ids[1:], sub.attn[1:])
    assert torch.allclose(got[1], ref[0], atol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
def test_one_requests_rows_share_one_gathered_context(shift):
    """One request: the context is gathered once and its values (and keys, where no row moved)
    are views of it for every row, not a copy per row (a 1024-token context of the 0.5B shape:
    72 MB less live at a three-row step); the values are the per-row gathers' bit for bit, and
    the other rows' block reads a slice, not an indexed copy."""
    from diffill.model.cache import SharedContext, shift_keys

    model, cfg = _model(4, shift_logits=shift)
    g = torch.Generator().manual_seed(11)
    for lengths, moved in (([5, 5, 5], False), ([3, 5, 8], True)):
        cv = build_canvas(cfg, _ids(g, 6), _ids(g, 7), lengths)
        fwd = SharedContext(model, cv, shift=shift, refresh_every=100)
        with torch.inference_mode():
            fwd.forward_hidden(cv.ids, cv.attn)
            r = int(fwd.rep[0])
            _, kv = model.forward_hidden(cv.ids[r:r + 1], cv.attn[r:r + 1], return_kv=True)
        L = cv.ids.shape[0]
        rep_ctx = fwd.ctx_pos[fwd.rep]
        idx = rep_ctx[:, None, :, None].expand(-1, kv[0][0].shape[1], -1, kv[0][0].shape[3])
        src = torch.zeros(L, dtype=torch.long)
        for (k, v), (kc, vc) in zip(kv, fwd.kv, strict=True):
            want_k = k[src].gather(2, idx)
            if moved:
                want_k = shift_keys(want_k, fwd.ctx_pos - rep_ctx, fwd.head_dim, fwd.theta)
            assert torch.equal(kc, want_k) and torch.equal(vc, v[src].gather(2, idx))
            assert vc.stride(0) == 0 and (kc.stride(0) == 0) == (not moved)
