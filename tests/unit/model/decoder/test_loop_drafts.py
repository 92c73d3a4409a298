"""Draft and verify in the decode loop (diffill.model.decoder, package doc *Drafts*) and its
engine path: the verification rule on a model whose marginals are designed, the batched
fast path against the slow reference (each draft verified alone, step by step) on a small
random Transformer, and the engine's batching, CUDA-graph loop (without capture) and
DreamOn path with drafts."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from diffill.model.asks import EngineAsk, default_sampler
from diffill.model.config import ModelConfig
from diffill.model.decoder.loop import InfillRequest, check_request, infill
from diffill.model.decoder.reference import infill_reference
from diffill.model.decoder.spec import Infill, InfillCancelled, SamplerConfig
from diffill.model.engine import Engine
from diffill.model.engine_options import EngineOptions
from diffill.model.limits import MAX_DRAFTS
from diffill.model.loader import LoadedModel
from diffill.model.recipes import CanvasRecipe
from support import one_batch, tiny_config, tiny_lm, tiny_model
from support.mock_vocab import EOS, MASK, PAD, V, logits_from_probs, mock_cfg
from torch import nn

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ---------------------------------------------------------------- a designed model
PREFIX, SUFFIX = [1, 2], [3]
S0 = 1 + len(PREFIX)

# marginals of the all-masked hole, per slot: the model's answer is 5 7 <eos>
SLOTS = [
    {5: 0.6, 6: 0.4},
    {7: 0.9, 8: 0.1},
    {EOS: 0.8, 9: 0.2},
]


def cfg() -> ModelConfig:
    return mock_cfg(max_position_embeddings=64)



class Designed(nn.Module):
    """Logits at hole slot j are those of ``SLOTS[j]`` (pad beyond), whatever the canvas;
    counts its forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward_hidden(self, ids, attention_mask=None, **_):
        self.forwards += 1
        B, T = ids.shape
        out = torch.stack([logits_from_probs(SLOTS[p - S0]) if 0 <= p - S0 < len(SLOTS)
                           else logits_from_probs({PAD: 1.0}) for p in range(T)])
        return out.expand(B, T, V).clone(), None

    def head(self, h):
        return h

    def forward(self, ids, attention_mask=None):
        return self.forward_hidden(ids, attention_mask)[0]


def designed(drafts, *, ratio=0.5, steps=4, lengths=(4,), dedup=True, wanted=1,
             **kw) -> tuple[list[Infill], Designed]:
    m = Designed()
    sc = SamplerConfig(steps=steps, lengths=lengths, draft_ratio=ratio, **kw)
    return infill(m, cfg(), PREFIX, SUFFIX, sc, drafts=drafts, dedup=dedup, wanted=wanted), m


def test_a_draft_the_model_agrees_with_is_verified_in_one_step():
    res, m = designed([[5, 7]])
    assert m.forwards == 1  # the request finished at the verification step
    assert [(r.ids, r.draft, r.accepted, r.verified, r.steps) for r in res] == [([5, 7], 0, 2, True, 1)]
    # its score is the mean log-prob of the draft tokens and of the end, as for any candidate
    assert res[0].score == pytest.approx((math.log(0.6) + math.log(0.9) + math.log(0.8)) / 3, abs=1e-5)


def test_the_bar_is_relative_to_the_slot_top():
    # p(6) = .4 against a top of .6: accepted at ratio .5, not at .9 (then nothing is)
    res, _ = designed([[6, 7]], ratio=0.5)
    assert (res[0].ids, res[0].verified) == ([6, 7], True)
    res, m = designed([[6, 7]], ratio=0.9, dedup=False)
    assert not any(r.verified for r in res) and m.forwards > 1
    d = [r for r in res if r.draft == 0]
    assert d and d[0].accepted == 0
    assert res[0].ids == [5, 7]  # the model's own answer


def test_a_partly_accepted_draft_keeps_its_run_and_goes_on():
    res, m = designed([[5, 8]], ratio=0.5)  # p(8) = .1 < .5 * .9 at slot 1
    assert m.forwards > 1
    d = next(r for r in res if r.draft == 0) if any(r.draft == 0 for r in res) else None
    # the draft row ends as the model's own answer (5 7), deduplicated against the model row
    assert d is None or (d.accepted == 1 and not d.verified)
    assert res[0].ids == [5, 7]
    res = infill(Designed(), cfg(), PREFIX, SUFFIX,
                 SamplerConfig(steps=4, lengths=(4,), draft_ratio=0.5), drafts=[[5, 8]], dedup=False)
    d = next(r for r in res if r.draft == 0)
    assert (d.accepted, d.verified, d.ids) == (1, False, [5, 7])


def test_the_end_of_the_middle_must_be_accepted_too():
    res, m = designed([[5]])  # slot 1 wants 7, not a terminator
    assert not any(r.verified for r in res) and m.forwards > 1
    res = infill(Designed(), cfg(), PREFIX, SUFFIX,
                 SamplerConfig(steps=4, lengths=(4,), draft_ratio=0.5), drafts=[[5]], dedup=False)
    d = next(r for r in res if r.draft == 0)
    assert (d.accepted, d.verified) == (1, False)


def test_ratio_one_accepts_only_the_argmax_and_zero_accepts_anything():
    assert designed([[6, 7]], ratio=1.0)[0][0].ids == [5, 7]
    res, m = designed([[9, 9]], ratio=0.0)
    assert (res[0].ids, res[0].verified, m.forwards) == ([9, 9], True, 1)


def test_several_drafts_verified_are_ranked_by_score():
    res, m = designed([[6, 7], [5, 7], [9]], ratio=0.3)
    assert m.forwards == 1
    assert [r.ids for r in res] == [[5, 7], [6, 7]]  # [9]: its end is not accepted
    assert all(r.verified for r in res)


def test_a_request_wanting_more_keeps_decoding_and_ranks_all_together():
    res, m = designed([[5, 7]], wanted=2, dedup=False)
    assert m.forwards > 1  # one verified draft, two wanted: the model rows go on
    assert {(tuple(r.ids), r.draft, r.verified) for r in res} >= {((5, 7), 0, True), ((5, 7), None, False)}
    assert next(r for r in res if r.verified).steps == 1
    ref = infill_reference(Designed(), cfg(), PREFIX, SUFFIX,
                           SamplerConfig(steps=4, lengths=(4,), draft_ratio=0.5), drafts=[[5, 7]],
                           wanted=2, dedup=False)
    assert key(res) == key(ref)


def test_one_step_leaves_nothing_masked():
    res = infill(Designed(), cfg(), PREFIX, SUFFIX,
                 SamplerConfig(steps=1, lengths=(4,), draft_ratio=0.9), drafts=[[6, 7]], dedup=False)
    assert all(MASK not in r.ids for r in res)


def test_bad_drafts_are_refused():
    sc = SamplerConfig(lengths=(4,))
    for drafts in ([[]], [[1, 2, 3, 4]], [[MASK]], [[EOS]], [[V]]):
        with pytest.raises(ValueError):
            check_request(cfg(), InfillRequest(PREFIX, SUFFIX, sc, None, tuple(map(tuple, drafts))))
    with pytest.raises(ValueError):
        SamplerConfig(draft_ratio=1.5)


# ---------------------------------------------------------------- fast path vs reference
TV = 40
T_BOS, T_EOS, T_PAD, T_MASK = 36, 37, 38, 39


def tiny(shift: bool = False):
    return tiny_model(1 + shift, std=0.4, weak_pad=True, vocab_size=TV, mask_token_id=T_MASK,
                      pad_token_id=T_PAD, eos_token_id=T_EOS, bos_token_id=T_BOS,
                      shift_logits=shift, max_position_embeddings=128)


def key(res: list[Infill]):
    return [(r.ids, r.length, r.steps, r.draft, r.accepted, r.verified) for r in res]


def same(a: list[Infill], b: list[Infill]) -> None:
    assert key(a) == key(b)
    assert [r.score for r in a] == pytest.approx([r.score for r in b], abs=1e-4)


def own_answer(model, c, pre, suf, sc) -> list[int]:
    """The model's own best middle: a draft it will verify at a low enough ratio."""
    return infill_reference(model, c, pre, suf, replace(sc, temperature=0.0))[0].ids


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("threshold", [None, 0.6])
@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("ratio,wanted", [(1e-3, 1), (1e-3, 2), (0.3, 1), (1.0, 1)])
def test_fast_matches_reference_with_drafts(shift, threshold, block, ratio, wanted):
    model, c = tiny(shift)
    runs = [  # temperature, absorb, steps, prefix, suffix
        (0.0, True, 4, [1, 2, 3, 4, 5], [6, 7]),
        (1.0, True, 9, [9], []),
        (0.0, False, 3, [], [10, 11, 12]),
    ]
    verified = 0
    for temperature, absorb, steps, pre, suf in runs:
        sc = SamplerConfig(steps=steps, threshold=threshold, temperature=temperature, seed=11,
                           lengths=(2, 7), absorb_pad=absorb, block=block, draft_ratio=ratio)
        mine = own_answer(model, c, pre, suf, sc)
        drafts = [d for d in ([4, 5, 6], mine, [7] * 5, mine[:1]) if 0 < len(d) < 7]
        fast = infill(model, c, pre, suf, sc, dedup=False, drafts=drafts, wanted=wanted)
        ref = infill_reference(model, c, pre, suf, sc, dedup=False, drafts=drafts, wanted=wanted)
        same(fast, ref)
        verified += any(r.verified for r in fast)
    if ratio < 0.01:
        assert verified  # the comparison exercises the verified path too


def test_a_rejected_draft_changes_nothing_else():
    """A draft that is not verified leaves the model's own rows as they were."""
    model, c = tiny()
    sc = SamplerConfig(steps=4, lengths=(3, 7), draft_ratio=1.0)
    pre, suf = [1, 2, 3, 4, 5], [6, 7]
    plain = infill(model, c, pre, suf, sc, dedup=False)
    with_draft = infill(model, c, pre, suf, sc, dedup=False, drafts=[[30, 31, 32]])
    assert not any(r.verified for r in with_draft)
    same([r for r in with_draft if r.draft is None], plain)


# ---------------------------------------------------------------- engine
DV = 64
D_BOS, D_EOS, D_PAD, D_MASK, D_EXPAND, D_DELETE = 0, 1, 2, 3, 4, 5
A_, B_, C_ = 10, 11, 12
DPRE, DSUF = [20, 21], [22]


def dreamon_cfg():
    recipe = CanvasRecipe(name="dreamon", reason="test", start=(D_BOS,), end=(D_EOS,),
                          terminators=(D_EOS,), filler=D_PAD, mask=D_MASK, lead=D_EOS,
                          expand=D_EXPAND, delete=D_DELETE)
    return tiny_config(vocab_size=DV, shift_logits=True, recipe=recipe)


class Scripted(nn.Module):
    """DreamOn-like: while the hole is shorter than ``want`` every masked slot asks for
    <|expand|>; with room, masked slot j writes ``answer[j]`` (then EOS, then <|delete|>),
    less confident with j. Records the hole length of every row it runs."""

    def __init__(self, answer: list[int], want: int) -> None:
        super().__init__()
        self.answer, self.want = answer, want
        self.w = nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def forward_hidden(self, ids, attention_mask=None, **_):
        L, T = ids.shape
        out = torch.full((L, T, DV), -20.0)
        s0 = 1 + len(DPRE)
        for r in range(L):
            n_real = int(attention_mask[r].sum()) if attention_mask is not None else T
            hole = n_real - s0 - len(DSUF) - 1
            self.seen.append(hole)
            for j in range(hole):
                if int(ids[r, s0 + j]) != D_MASK:
                    continue
                seq = [*self.answer, D_EOS]
                t = D_EXPAND if hole < self.want else (seq[j] if j < len(seq) else D_DELETE)
                out[r, s0 + j - 1, t] = 10.0 - 0.1 * j
        return out, None

    def head(self, h):
        return h

    def forward(self, ids, attention_mask=None):
        return self.forward_hidden(ids, attention_mask)[0]


def make_lm(shift: bool = False):
    return tiny_lm(3, std=0.4, weak_pad=True, vocab_size=TV, mask_token_id=T_MASK,
                   pad_token_id=T_PAD, eos_token_id=T_EOS, bos_token_id=T_BOS,
                   shift_logits=shift, max_position_embeddings=128)


def test_engine_keeps_usable_drafts_and_indexes_them():
    eng = Engine(make_lm(), SamplerConfig(steps=3))
    req = eng.make_request(EngineAsk([1, 2], [3], lengths=(4,),
                           drafts=[[5], [], [5], [T_EOS], [1, 2, 3, 4], [TV], [6], [7], [8], [9]]))
    assert req.drafts == ((5,), (6,), (7,), (8,))[:MAX_DRAFTS]
    assert req.wanted == 1 and eng.make_request(EngineAsk([1], [], lengths=(4,), candidates=3)).wanted == 3
    # candidates index the drafts as given (the empty one left out still counts)
    res = Engine(make_lm(), SamplerConfig(steps=3, draft_ratio=0.0)).infill(EngineAsk(
        [1, 2], [3], lengths=(4,), drafts=[[], [5, 6]]))
    assert [(r.ids, r.draft, r.verified) for r in res] == [([5, 6], 1, True)]


def test_default_sampler_takes_the_checkpoint_ratio():
    c = make_lm().config
    assert default_sampler(c).draft_ratio == SamplerConfig().draft_ratio
    assert default_sampler(c.replace(draft_ratio=1e-4)).draft_ratio == 1e-4


@pytest.mark.parametrize("opts", [EngineOptions(context="row"),
                                  EngineOptions(buckets=True, context="row"),
                                  EngineOptions(cuda_graphs=True),
                                  EngineOptions(cuda_graphs=True, refresh_every=2),
                                  EngineOptions(refresh_every=2, context="row")])
def test_engine_batches_with_drafts_equal_each_alone(opts):
    """Requests with and without drafts share a batch; each gets what the sampler gives it
    alone (the cached and graph loops are checked at refresh 1 against the reference)."""
    lm = make_lm(shift=True)
    sc = SamplerConfig(steps=4, draft_ratio=1e-3)
    eng = Engine(lm, sc, options=opts)
    reqs = [([1, 2, 3], [4, 5], (3, 6)), ([7, 8], [], (4,)), ([9, 10, 11, 12], [13], (2, 5))]
    drafts = [[(own_answer(lm.model, lm.config, p, s, replace(sc, lengths=lens))
                or [20])[: max(lens) - 1]] for p, s, lens in reqs]
    drafts[1] = [[21, 22]]
    out = one_batch(eng, [lambda r=r, d=d: eng.infill(EngineAsk(r[0], r[1], lengths=r[2], drafts=d))
                          for r, d in zip(reqs, drafts, strict=True)])
    assert eng.stats()["batches"] == 1
    assert any(r.verified for got in out for r in got)
    for (p, s, lens), d, got in zip(reqs, drafts, out, strict=True):
        want = infill(lm.model, lm.config, p, s, replace(sc, lengths=lens), drafts=d)
        if opts.refresh_every == 1:
            want_ref = infill_reference(lm.model, lm.config, p, s, replace(sc, lengths=lens), drafts=d)
            same(want, want_ref)
            same(got, want)
        else:  # the dual cache approximates; the draft outcome is decided at step 0 (a refresh)
            assert [r.verified for r in got][:1] == [r.verified for r in want][:1]


def test_engine_cancelled_request_with_drafts():
    eng = Engine(make_lm(), SamplerConfig(steps=4, draft_ratio=1e-3))
    with pytest.raises(InfillCancelled):
        eng.infill(EngineAsk([1, 2], [3], lengths=(4,), drafts=[[5, 6]], cancel=lambda: True))


def test_dreamon_verifies_drafts_on_a_fixed_canvas():
    """A DreamOn checkpoint (expand/delete tokens in its recipe): a verified draft answers
    after one forward, else DreamOn's own decoding runs."""
    c = dreamon_cfg()
    model = Scripted([A_, B_], want=2)
    lm = LoadedModel(model=model, tokenizer=None, config=c, path=Path("."), provenance={},
                     device=torch.device("cpu"), dtype=torch.float32)
    eng = Engine(lm, SamplerConfig(steps=8, draft_ratio=0.5))
    res = eng.infill(EngineAsk(DPRE, DSUF, lengths=(4,), drafts=[[A_, B_]]))
    assert [(r.ids, r.verified, r.steps) for r in res] == [([A_, B_], True, 1)]
    assert model.seen == [4, 4]  # one forward: the probe's row of the longest length, the draft's
    res = eng.infill(EngineAsk(DPRE, DSUF, lengths=(4,), drafts=[[C_]]))
    assert res[0].ids == [A_, B_] and not res[0].verified and len(model.seen) > 2


def test_dreamon_requests_share_a_batch():
    """Concurrent requests on a DreamOn checkpoint are decoded together: one forward per step
    holds the rows of both; one answered by its verified draft leaves the others to DreamOn."""
    c = dreamon_cfg()
    model = Scripted([A_, B_], want=2)
    rows_per_forward: list[int] = []
    forward_hidden = model.forward_hidden

    def counted(ids, attention_mask=None, **kw):
        rows_per_forward.append(ids.shape[0])
        return forward_hidden(ids, attention_mask, **kw)

    model.forward_hidden = counted
    lm = LoadedModel(model=model, tokenizer=None, config=c, path=Path("."), provenance={},
                     device=torch.device("cpu"), dtype=torch.float32)
    eng = Engine(lm, SamplerConfig(steps=8, draft_ratio=0.5))
    alone = eng.infill(EngineAsk(DPRE, DSUF, lengths=(2,)))
    steps = len(rows_per_forward)
    assert rows_per_forward == [1] * steps
    rows_per_forward.clear()
    out = one_batch(eng, [lambda: eng.infill(EngineAsk(DPRE, DSUF, lengths=(2,))),
                          lambda: eng.infill(EngineAsk(DPRE, DSUF, lengths=(2,))),
                          lambda: eng.infill(EngineAsk(DPRE, DSUF, lengths=(4,), drafts=[[A_, B_]]))])
    assert eng.stats()["batches"] == 2  # the alone request, then the three together
    assert [[r.ids for r in got] for got in out[:2]] == [[r.ids for r in alone]] * 2
    assert [(r.ids, r.verified) for r in out[2]] == [([A_, B_], True)]
    assert rows_per_forward == [2] + [2] * steps  # the draft's probe, then both rows a step
