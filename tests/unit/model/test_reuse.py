"""Reuse of a document's context across requests (model/reuse.py): the matching, the policy,
the engine's control flow, and the slow reference -- a reused context whose tokens did not
change gives the states a full computation gives (to float tolerance)."""

from __future__ import annotations

import pytest
import torch
from diffill.model.asks import EngineAsk
from diffill.model.cache import SharedContext, shift_keys
from diffill.model.decoder.canvas import build_canvas
from diffill.model.decoder.spec import SamplerConfig, StepSpec
from diffill.model.engine import Engine
from diffill.model.engine_options import EngineOptions
from diffill.model.reuse import (
    Kept,
    ReusedContext,
    ReusePolicy,
    context_parts,
    match_runs,
    plan_reuse,
)
from support import tiny_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 64


def _ids(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, V, (n,), generator=g).tolist()


# ----------------------------------------------------------------------------- matching


def test_match_runs_of_a_keystroke_and_of_an_edit_inside():
    old = list(range(100, 140))
    typed = old[:-1] + [7, 8]  # the last token re-tokenized into two
    assert match_runs(old, typed) == [(0, 0, 39)]
    assert match_runs(old, old) == [(0, 0, 40)]
    edited = old[:10] + [1, 2, 3] + old[12:]  # two tokens replaced by three inside the window
    assert match_runs(old, edited) == [(0, 0, 10), (13, 12, 28)]
    slid = old[5:] + [9]  # the window's start slid by five tokens, one typed at the end
    runs = match_runs(old, slid)
    assert runs == [(0, 5, 35)]
    assert match_runs([], [1, 2]) == [] and match_runs([1, 2], []) == []


def test_match_runs_leaves_short_accidental_matches_in_the_middle():
    old = [1, 2, 3, 50, 51, 4, 5, 6]
    new = [1, 2, 3, 60, 50, 61, 4, 5, 6]
    assert match_runs(old, new) == [(0, 0, 3), (6, 5, 3)]  # the lone 50 is not reused


def _kept(prefix: list[int], suffix: list[int], suffix_at: int, reuses: int = 0) -> Kept:
    n = len(prefix) + len(suffix)
    kv = [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]
    return Kept(prefix, suffix, suffix_at, kv, reuses)


def test_plan_of_a_typed_character():
    pre, suf = [0, *_ids(1, 20)], [*_ids(2, 10), 1]
    kept = _kept(pre, suf, suffix_at=21 + 8)  # an 8-slot block after the prefix
    new_pre = pre[:-1] + [9, 10]
    plan = plan_reuse(kept, new_pre, suf, 22 + 8, ReusePolicy())
    assert plan is not None
    assert plan.recomputed.tolist() == [20, 21]
    assert plan.reused.tolist() == list(range(20)) + list(range(30, 41))
    assert plan.source.tolist() == list(range(20)) + list(range(21, 32))
    assert plan.delta.tolist() == [0] * 20 + [1] * 11  # the suffix moved one position right


def test_policy_says_compute_in_full():
    pre, suf = [0, *_ids(1, 40)], [*_ids(2, 10), 1]
    kept = _kept(pre, suf, 49)
    far = [0, *_ids(3, 40)]  # another document
    assert plan_reuse(kept, far, suf, 49, ReusePolicy(far=32)) is None
    assert plan_reuse(kept, far, suf, 49, ReusePolicy(far=64)) is not None
    assert plan_reuse(_kept(pre, suf, 49, reuses=8), pre, suf, 49, ReusePolicy(full_every=8)) is None
    assert plan_reuse(_kept(pre, suf, 49, reuses=7), pre, suf, 49, ReusePolicy(full_every=8)) is not None


# ----------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("shift", [False, True])
def test_an_unchanged_context_reused_gives_the_full_forward(shift: bool):
    """The slow reference: a kept context of exactly this canvas (computed in full with the
    hole all masked) reused for the same request gives the hidden states of the full
    computation at every row's block (float tolerance), and so the same kept context."""
    lm = tiny_lm(0, vocab_size=V, shift_logits=shift, max_position_embeddings=512)
    model, cfg = lm.model, lm.config
    prefix, suffix = _ids(4, 30), _ids(5, 12)
    cv = build_canvas(cfg, prefix, suffix, [4, 8, 8], "cpu")
    full = SharedContext(model, cv, shift=shift, refresh_every=1)
    with torch.inference_mode():
        h_full, _ = full.forward_hidden(cv.ids, cv.attn)
        ids, ctx_pos, start, kv = full.last_context
        pre, suf, at = context_parts(ids, ctx_pos, int(start))
        kept = Kept(pre, suf, at, [(k.clone(), v.clone()) for k, v in kv])
        plan = plan_reuse(kept, pre, suf, at, ReusePolicy())
        assert plan is not None and plan.recomputed.numel() == 0
        reused = ReusedContext(model, cv, shift=shift, kept=kept, plan=plan)
        h_reused, _ = reused.forward_hidden(cv.ids, cv.attn)
    blocks = full.block_pos
    for r in range(cv.ids.shape[0]):
        a, b = h_full[r, blocks[r]], h_reused[r, blocks[r]]
        valid = full.block_attn[r] if full.block_attn is not None else torch.ones_like(blocks[r], dtype=torch.bool)
        torch.testing.assert_close(b[valid], a[valid], rtol=1e-4, atol=1e-5)
    for (k1, v1), (k2, v2) in zip(full.kv, reused.kv, strict=True):
        torch.testing.assert_close(k2, k1, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v2, v1, rtol=1e-4, atol=1e-5)


def test_recomputed_tokens_are_computed_against_the_reused_ones():
    """A typed token: its keys/values are the block forward's against the reused context
    (checked by computing that forward by hand), the reused ones are the kept ones moved."""
    lm = tiny_lm(1, vocab_size=V, max_position_embeddings=512)
    model, cfg = lm.model, lm.config
    prefix, suffix = _ids(6, 20), _ids(7, 8)
    cv0 = build_canvas(cfg, prefix, suffix, [6], "cpu")
    with torch.inference_mode():
        first = SharedContext(model, cv0, shift=False, refresh_every=1)
        first.forward_hidden(cv0.ids, cv0.attn)
        ids, ctx_pos, start, kv = first.last_context
        kept = Kept(*context_parts(ids, ctx_pos, int(start)), [(k.clone(), v.clone()) for k, v in kv])
        cv = build_canvas(cfg, prefix + [11], suffix, [6], "cpu")
        probe = SharedContext(model, cv, shift=False, refresh_every=1)
        pre, suf, at = context_parts(cv.ids[0], probe.ctx_pos[0], int(probe.block_pos[0, 0]))
        plan = plan_reuse(kept, pre, suf, at, ReusePolicy())
        assert plan is not None
        assert plan.recomputed.tolist() == [len(pre) - 1]  # the typed token, the prefix's last
        reused = ReusedContext(model, cv, shift=False, kept=kept, plan=plan)
        reused.forward_hidden(cv.ids, cv.attn)
        # by hand: the reused keys moved, then the typed token + the block against them
        from diffill.model.transformer import KVContext
        ctx = [(shift_keys(k[:, plan.source][None], plan.delta[None], cfg.head_dim, cfg.rope_theta),
                v[:, plan.source][None]) for k, v in kept.kv]
        ext = torch.cat((plan.recomputed, reused.block_pos[0]))
        _, kve = model.forward_hidden(cv.ids[0, ext][None], None, position_ids=ext[None],
                                      ctx=KVContext(ctx), return_kv=True)
    typed = (reused.ctx_pos[0] == plan.recomputed[0]).nonzero().item()
    torch.testing.assert_close(reused.kv[0][0][0, :, typed], kve[0][0][0, :, 0])
    i = (reused.ctx_pos[0] == plan.reused[-1]).nonzero().item()
    torch.testing.assert_close(reused.kv[0][1][0, :, i], kept.kv[0][1][:, plan.source[-1]])


# ----------------------------------------------------------------------------- the engine


def _engine(**opts) -> Engine:
    lm = tiny_lm(2, vocab_size=V, max_position_embeddings=512)
    return Engine(lm, SamplerConfig(steps=3, lengths=(8,)), options=EngineOptions(context="request", **opts))


def test_engine_reuses_per_document_and_refreshes_by_the_policy():
    eng = _engine(reuse="on", reuse_full_every=2)
    prefix, suffix = _ids(8, 40), _ids(9, 10)
    eng.infill(EngineAsk(prefix, suffix, lengths=(4, 8), context_key="a.py"))
    st = eng.stats()
    assert (st["context_reused"], st["context_computed"]) == (0, 1) and st["context_kept_bytes"] > 0
    eng.infill(EngineAsk(prefix + [12], suffix, lengths=(4, 8), context_key="a.py"))  # a keystroke
    eng.infill(EngineAsk(prefix + [12, 13], suffix, lengths=(4, 8), context_key="a.py"))
    st = eng.stats()
    assert (st["context_reused"], st["context_recomputed_tokens"]) == (2, 2)
    eng.infill(EngineAsk(prefix + [12, 13, 14], suffix, lengths=(4, 8), context_key="a.py"))  # 2 reuses: full
    assert eng.stats()["context_computed"] == 2
    eng.infill(EngineAsk(prefix, suffix, lengths=(4, 8), context_key="b.py"))  # another document
    eng.infill(EngineAsk(_ids(10, 40), suffix, lengths=(4, 8), context_key="a.py"))  # far: full
    eng.infill(EngineAsk(prefix, suffix, lengths=(4, 8)))  # no key: nothing kept or reused
    st = eng.stats()
    assert (st["context_reused"], st["context_computed"]) == (2, 4)


def test_engine_without_reuse_keeps_nothing(monkeypatch):
    eng = _engine(reuse="off")
    prefix, suffix = _ids(8, 40), _ids(9, 10)
    eng.infill(EngineAsk(prefix, suffix, context_key="a.py"))
    eng.infill(EngineAsk(prefix + [12], suffix, context_key="a.py"))
    st = eng.stats()
    assert (st["context_reused"], st["context_computed"], st["context_kept_bytes"]) == (0, 0, 0)
    monkeypatch.setenv("DIFFILL_REUSE", "off")
    assert not _engine().reuse_context
    monkeypatch.setenv("DIFFILL_REUSE", "on")
    assert _engine().reuse_context
    assert not _engine(reuse="on").__class__(
        tiny_lm(0, vocab_size=V), options=EngineOptions(context="row", reuse="on")).reuse_context
    monkeypatch.setenv("DIFFILL_REUSE", "sometimes")
    with pytest.raises(ValueError, match="DIFFILL_REUSE"):
        _ = _engine().reuse_context


def test_an_identical_request_answers_the_same_with_a_reused_context():
    """One step (the kept context is then the all-masked one): the same request again,
    from its kept context, gives the same tokens as computing it in full."""
    eng = _engine(reuse="on")
    prefix, suffix = _ids(11, 40), _ids(12, 10)
    a = eng.infill(EngineAsk(prefix, suffix, lengths=(4, 8), steps=1, context_key="a.py"))
    b = eng.infill(EngineAsk(prefix, suffix, lengths=(4, 8), steps=1, context_key="a.py"))
    assert eng.stats()["context_reused"] == 1
    assert [r.ids for r in a] == [r.ids for r in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x.score - y.score) < 1e-4


def test_step_spec_shift_model_reuse_runs():
    lm = tiny_lm(3, vocab_size=V, shift_logits=True, max_position_embeddings=512)
    eng = Engine(lm, SamplerConfig(steps=2, lengths=(8,)), options=EngineOptions(context="request", reuse="on"))
    prefix, suffix = _ids(13, 30), _ids(14, 6)
    eng.infill(EngineAsk(prefix, suffix, context_key="k", drafts=[prefix[:3]]))
    res = eng.infill(EngineAsk(prefix + [20], suffix, context_key="k", drafts=[prefix[:3]]))
    assert eng.stats()["context_reused"] == 1 and res
    assert StepSpec.of(lm.config, eng.sampler).shift
