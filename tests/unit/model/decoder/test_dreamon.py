"""DreamOn's expand/delete decoding: control flow with a scripted model, and the fast
batched path against the slow reference on a random tiny transformer."""

from __future__ import annotations

import pytest
import torch
from diffill.model.decoder.dreamon import (
    DreamOnConfig,
    decode_dreamon,
    infill_dreamon,
    infill_dreamon_reference,
)
from diffill.model.decoder.loop import InfillRequest
from diffill.model.decoder.spec import InfillCancelled, SamplerConfig, Strategy
from diffill.model.recipes import CanvasRecipe
from diffill.model.transformer import Transformer
from support import tiny_config

V = 64
BOS, EOS, PAD, MASK, EXPAND, DELETE = 0, 1, 2, 3, 4, 5
A, B, C = 10, 11, 12
PRE, SUF = [20, 21], [22]


def cfg(shift: bool = True):
    recipe = CanvasRecipe(name="dreamon", reason="test", start=(BOS,), end=(EOS,),
                          terminators=(EOS,), filler=PAD, mask=MASK, lead=EOS,
                          expand=EXPAND, delete=DELETE)
    return tiny_config(vocab_size=V, shift_logits=shift, recipe=recipe)


class Scripted(torch.nn.Module):
    """Sees the whole canvas (prefix and suffix lengths known): while the hole is shorter
    than ``want`` slots, every masked slot asks for <|expand|>; once it has room, masked
    slot j writes ``answer[j]`` (then EOS), slots past it <|delete|>. Slot j's confidence
    falls with j, so the leftmost slot is committed first."""

    def __init__(self, answer: list[int], want: int, shift: bool = True) -> None:
        super().__init__()
        self.answer, self.want, self.shift = answer, want, shift
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []  # hole length at every forward

    def _logits(self, ids: torch.Tensor, attn: torch.Tensor | None) -> torch.Tensor:
        L, T = ids.shape
        out = torch.full((L, T, V), -20.0)
        for r in range(L):
            n_real = int(attn[r].sum()) if attn is not None else T
            s0 = 1 + len(PRE)
            hole = n_real - s0 - len(SUF) - 1
            self.seen.append(hole)
            for j in range(hole):
                if int(ids[r, s0 + j]) != MASK:
                    continue
                if hole < self.want:
                    t = EXPAND
                else:
                    seq = [*self.answer, EOS]
                    t = seq[j] if j < len(seq) else DELETE
                p = s0 + j - (1 if self.shift else 0)
                out[r, p, t] = 10.0 - 0.1 * j
        return out

    def forward_hidden(self, ids, attention_mask=None):
        return self._logits(ids, attention_mask), None

    def head(self, h):
        return h

    def forward(self, ids, attention_mask=None):
        return self._logits(ids, attention_mask)


@pytest.mark.parametrize("fast", [True, False])
def test_a_short_hole_grows(fast):
    m = Scripted([A, B, C], want=5)
    run = infill_dreamon if fast else infill_dreamon_reference
    res = run(m, cfg(), PRE, SUF, SamplerConfig(steps=100, lengths=(2,)), dc=DreamOnConfig(cap=16))
    assert res[0].ids == [A, B, C]
    assert max(m.seen) == 5 and m.seen[0] == 2  # grew from 2 slots to 5


@pytest.mark.parametrize("fast", [True, False])
def test_a_long_hole_shrinks(fast):
    m = Scripted([A, B], want=1)
    run = infill_dreamon if fast else infill_dreamon_reference
    res = run(m, cfg(), PRE, SUF, SamplerConfig(steps=100, lengths=(8,), absorb_pad=False))
    assert res[0].ids == [A, B]
    assert m.seen[0] == 8 and m.seen[-1] < 8  # <|delete|> slots were removed


def test_expand_stops_at_the_cap_and_the_budget():
    m = Scripted([A, B, C], want=50)  # never enough room: asks for more until it may not
    res = infill_dreamon(m, cfg(), PRE, SUF, SamplerConfig(steps=100, lengths=(2,)),
                         dc=DreamOnConfig(cap=4))
    assert max(m.seen) == 4
    assert res[0].ids  # expand forbidden at the cap: the next best tokens fill the hole
    m = Scripted([A, B, C], want=50)
    infill_dreamon(m, cfg(), PRE, SUF, SamplerConfig(steps=100, lengths=(2,)),
                   dc=DreamOnConfig(cap=40, budget=3))
    assert max(m.seen) == 5  # 2 slots + 3 expands


@pytest.mark.parametrize("fast", [True, False])
def test_the_decided_steps_bound_the_loop(fast):
    """However much the model asks to expand, a row takes at most ``SamplerConfig.steps``
    steps; the last one may not expand and commits every masked slot."""
    m = Scripted([A, B, C], want=50)
    run = infill_dreamon if fast else infill_dreamon_reference
    res = run(m, cfg(), PRE, SUF, SamplerConfig(steps=3, lengths=(2,)), dc=DreamOnConfig(cap=40),
              dedup=False)
    assert len(m.seen) == 3 and res[0].steps == 3
    assert m.seen == [2, 3, 5]  # ceil(masked / steps left) expands a step, none at the last
    assert res[0].ids and EXPAND not in res[0].ids and MASK not in res[0].ids


def test_absorb_removes_masks_after_a_terminator():
    m = Scripted([A], want=1)
    res = infill_dreamon(m, cfg(), PRE, SUF, SamplerConfig(steps=100, lengths=(6,)))
    assert res[0].ids == [A]
    # A, then EOS at slot 1; the four masked slots after it go at once
    assert m.seen == [6, 6]


def test_rows_share_a_forward_and_rank():
    m = Scripted([A, B, C], want=4)
    res = infill_dreamon(m, cfg(), PRE, SUF, SamplerConfig(steps=100, lengths=(1, 3, 8)))
    assert [r.ids for r in res] == [[A, B, C]]  # identical middles deduplicated
    assert {r.length for r in infill_dreamon(m, cfg(), PRE, SUF,
                                            SamplerConfig(steps=100, lengths=(1, 3, 8)),
                                            dedup=False)} == {1, 3, 8}


def test_cancel_between_steps():
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(InfillCancelled):
        infill_dreamon(Scripted([A, B, C], want=5), cfg(), PRE, SUF,
                       SamplerConfig(steps=100, lengths=(2,)), cancel, dc=DreamOnConfig(cap=9))


def test_needs_length_control_tokens():
    with pytest.raises(ValueError, match="expand/delete"):
        infill_dreamon(Scripted([A], 1), tiny_config(), PRE, SUF, SamplerConfig())


class Biased(torch.nn.Module):
    """A random transformer whose <|expand|> / <|delete|> logits move with the hidden state,
    so both length controls happen (a plain random model almost never picks them)."""

    def __init__(self, base: Transformer) -> None:
        super().__init__()
        self.base = base

    def forward_hidden(self, ids, attention_mask=None):
        return self.base.forward_hidden(ids, attention_mask)

    def head(self, h):
        out = self.base.head(h).clone()
        out[..., EXPAND] += 6.0 * h[..., 0]
        out[..., DELETE] += 6.0 * h[..., 1]
        return out

    def forward(self, ids, attention_mask=None):
        return self.head(self.forward_hidden(ids, attention_mask)[0])


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("temperature,strategy", [(0.0, Strategy.CONFIDENCE),
                                                  (0.0, Strategy.ENTROPY),
                                                  (0.8, Strategy.MARGIN)])
def test_fast_matches_reference_on_a_random_model(shift, temperature, strategy):
    c = cfg(shift)
    base = Transformer(c)
    base.init_weights(seed=3, std=0.5)
    model = Biased(base.eval())
    for seed in range(4):
        sc = SamplerConfig(steps=3, lengths=(2, 5), temperature=temperature, seed=seed,
                           strategy=strategy)
        dc = DreamOnConfig(cap=9)
        fast = infill_dreamon(model, c, PRE, SUF, sc, dc=dc, dedup=False)
        slow = infill_dreamon_reference(model, c, PRE, SUF, sc, dc=dc, dedup=False)
        assert [(r.ids, r.length, r.steps) for r in fast] == [(r.ids, r.length, r.steps)
                                                             for r in slow]
        for f, s in zip(fast, slow, strict=True):
            assert f.score == pytest.approx(s.score, abs=1e-5)


def test_requests_batched_together_equal_each_alone():
    """Rows of several requests (their own prefix and suffix) share each forward; a cancelled
    request's rows go and the others finish as they would alone."""
    c = cfg(True)
    base = Transformer(c)
    base.init_weights(seed=3, std=0.5)
    model = Biased(base.eval())
    asks = [([20, 21], [22]), ([30, 31, 32, 33], []), ([], [40, 41])]
    for temperature, strategy in [(0.0, Strategy.CONFIDENCE), (0.8, Strategy.MARGIN)]:
        reqs = [InfillRequest(p, s, SamplerConfig(steps=6, lengths=(2, 5), seed=i,
                                                  temperature=temperature, strategy=strategy))
                for i, (p, s) in enumerate(asks)]
        dc = DreamOnConfig(cap=9)
        together = decode_dreamon(model, c, reqs, dc=dc, dedup=False)
        for req, got in zip(reqs, together, strict=True):
            alone = infill_dreamon_reference(model, c, req.prefix_ids, req.suffix_ids, req.sampler,
                                             dc=dc, dedup=False)
            assert [(r.ids, r.length, r.steps) for r in got] == [(r.ids, r.length, r.steps)
                                                                for r in alone]
            assert [r.score for r in got] == pytest.approx([r.score for r in alone], abs=1e-5)
    calls = []
    reqs[1].cancel = lambda: calls.append(1) or len(calls) > 1
    res = decode_dreamon(model, c, reqs, dc=DreamOnConfig(cap=9), dedup=False)
    assert isinstance(res[1], InfillCancelled)
    assert [[r.ids for r in res[i]] for i in (0, 2)] == [[r.ids for r in together[i]] for i in (0, 2)]
