"""The decode loop (diffill.model.decoder.loop) and its slow reference (.reference).

Control flow is checked with mock models whose logits are designed so the right
answer is known; the fast batched path is checked token for token against the
slow reference on a small random Transformer (fp32).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from diffill.model.config import ModelConfig
from diffill.model.decoder.canvas import build_canvas
from diffill.model.decoder.loop import infill
from diffill.model.decoder.reference import infill_reference
from diffill.model.decoder.spec import Infill, InfillCancelled, SamplerConfig, Strategy
from diffill.model.transformer import Transformer
from support import tiny_model
from support.mock_vocab import BOS, EOS, MASK, PAD, V, logits_from_probs, mock_cfg
from torch import nn

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class MockModel(nn.Module):
    """A model whose logits at canvas position ``pos`` are ``fn(row_ids, pos)``.

    ``row_ids`` holds the real (unpadded) tokens of the row. The hidden state IS
    the logit vector and ``head`` is the identity, so the sampler's gather/head
    path and the reference's full-logits path see the same numbers. Records every
    canvas it was run on and the shapes ``head`` was applied to.
    """

    def __init__(self, fn: Callable[[list[int], int], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn
        self.canvases: list[list[list[int]]] = []  # per forward: the rows
        self.head_shapes: list[tuple[int, ...]] = []

    def forward_hidden(self, input_ids, attention_mask=None, position_ids=None, **_):
        B, T = input_ids.shape
        out = torch.zeros(B, T, V)
        rows = []
        for b in range(B):
            n = T if attention_mask is None else int(attention_mask[b].sum())
            row = input_ids[b, :n].tolist()
            rows.append(row)
            for p in range(n):
                out[b, p] = self.fn(row, p)
        self.canvases.append(rows)
        return out, None

    def head(self, hidden):
        self.head_shapes.append(tuple(hidden.shape))
        return hidden

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        hidden, _ = self.forward_hidden(input_ids, attention_mask)
        return hidden


def holes_per_forward(model: MockModel, start: int, n: int, row: int = 0) -> list[list[int]]:
    return [c[row][start : start + n] for c in model.canvases]


def unmask_order(
    model: MockModel, start: int, n: int, final: list[int] | None = None
) -> list[set[int]]:
    """Slots unmasked at each step, read from the canvases seen by successive forwards."""
    holes = holes_per_forward(model, start, n)
    if final is not None:
        holes.append(final)
    out = []
    for a, b in itertools.pairwise(holes):
        out.append({j for j in range(n) if a[j] == MASK and b[j] != MASK})
    return out


PREFIX = [1, 2]
SUFFIX = [3]
S0 = 1 + len(PREFIX)  # hole start: BOS + prefix

# three slots with designed distributions:
#   A = {3: .5, 4: .5}           conf .50  margin .00  entropy .69  (tie -> token 3)
#   B = {5: .45, 11 others: .05}  conf .45  margin .40  entropy 2.00
#   C = {6: .4, 7: .3, 8: .3}     conf .40  margin .10  entropy 1.09
SLOT_PROBS = [
    {3: 0.5, 4: 0.5},
    {5: 0.45, **{t: 0.05 for t in range(12) if t != 5}},
    {6: 0.4, 7: 0.3, 8: 0.3},
]


def designed_fn(row: list[int], pos: int) -> torch.Tensor:
    j = pos - S0
    if 0 <= j < len(SLOT_PROBS):
        return logits_from_probs(SLOT_PROBS[j])
    return logits_from_probs({0: 1.0})


@pytest.mark.parametrize(
    "strategy, order",
    [
        (Strategy.CONFIDENCE, [{0}, {1}, {2}]),
        (Strategy.MARGIN, [{1}, {2}, {0}]),
        (Strategy.ENTROPY, [{0}, {2}, {1}]),
    ],
)
@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_strategy_orders(strategy, order, impl):
    m = MockModel(designed_fn)
    sc = SamplerConfig(steps=3, strategy=strategy, lengths=(3,))
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, sc)
    assert res.ids == [3, 5, 6]  # A's tie between 3 and 4 goes to the lower id
    assert res.steps == 3 and len(m.canvases) == 3
    assert unmask_order(m, S0, 3, final=res.ids) == order


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_threshold_mode(impl):
    cfg = mock_cfg()
    # A (.5) and B (.45) exceed .42: both in step 1, C in step 2; the loop then stops
    m = MockModel(designed_fn)
    (res,) = impl(m, cfg, PREFIX, SUFFIX, SamplerConfig(steps=10, threshold=0.42, lengths=(3,)))
    assert res.ids == [3, 5, 6] and res.steps == 2 and len(m.canvases) == 2
    assert unmask_order(m, S0, 3, final=res.ids) == [{0, 1}, {2}]
    # nothing above the threshold: still the best one per step, never stuck
    m = MockModel(designed_fn)
    (res,) = impl(m, cfg, PREFIX, SUFFIX, SamplerConfig(steps=10, threshold=0.99, lengths=(3,)))
    assert res.steps == 3 and unmask_order(m, S0, 3, final=res.ids) == [{0}, {1}, {2}]
    # steps is an upper bound: the fixed schedule is the floor
    m = MockModel(designed_fn)
    (res,) = impl(m, cfg, PREFIX, SUFFIX, SamplerConfig(steps=2, threshold=0.99, lengths=(3,)))
    assert res.steps == 2 and unmask_order(m, S0, 3, final=res.ids) == [{0, 1}, {2}]
    # entropy scores are exp(-H): A's exp(-.69) = .5 is the only one above .45
    m = MockModel(designed_fn)
    sc = SamplerConfig(steps=3, threshold=0.45, strategy=Strategy.ENTROPY, lengths=(3,))
    (res,) = impl(m, cfg, PREFIX, SUFFIX, sc)
    assert unmask_order(m, S0, 3, final=res.ids) == [{0}, {2}, {1}]


def counting_fn(row: list[int], pos: int) -> torch.Tensor:
    """Slot j predicts token j % 12 with confidence decreasing in j (no pads)."""
    j = pos - S0
    if not 0 <= j < 12:
        return logits_from_probs({0: 1.0})
    t = j
    p = 0.95 - 0.03 * j
    return logits_from_probs({t: p, (t + 1) % 12: 1 - p})


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_fixed_schedule(impl):
    m = MockModel(counting_fn)
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=3, lengths=(7,)))
    assert res.ids == list(range(7)) and res.steps == 3
    # ceil(7/3) = 3, ceil(4/2) = 2, ceil(2/1) = 2; the most confident (lowest j) first
    assert unmask_order(m, S0, 7, final=res.ids) == [{0, 1, 2}, {3, 4}, {5, 6}]
    # more steps than slots: one per step, and only as many forwards as slots
    m = MockModel(counting_fn)
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=5, lengths=(2,)))
    assert res.ids == [0, 1] and res.steps == 2 and len(m.canvases) == 2


def test_one_batched_forward_per_step_and_head_only_at_hole():
    m = MockModel(counting_fn)
    sc = SamplerConfig(steps=4, lengths=(2, 5, 8))
    res = infill(m, mock_cfg(), PREFIX, SUFFIX, sc, dedup=False)
    assert len(m.canvases) == 4  # min(steps, max n) forwards, all three lengths in each
    assert all(len(c) == 3 for c in m.canvases)
    # hole slots only: L x N = 3 x 8 head rows a step (in pieces: score_slots)
    assert all(len(s) == 2 and s[1] == V for s in m.head_shapes)
    assert sum(s[0] for s in m.head_shapes) == 4 * 3 * 8
    assert sorted(r.length for r in res) == [2, 5, 8]
    for r in res:
        assert r.ids == list(range(r.length))
    # rows are padded to a common length; each row keeps its own canvas
    lens = sorted(len(row) for row in m.canvases[0])
    assert lens == [S0 + n + len(SUFFIX) + 1 for n in (2, 5, 8)]


def test_build_canvas_layout():
    cfg = mock_cfg()
    cv = build_canvas(cfg, [7, 8], [9], [1, 3])
    assert cv.ids.tolist() == [
        [BOS, 7, 8, MASK, 9, EOS, PAD, PAD],
        [BOS, 7, 8, MASK, MASK, MASK, 9, EOS],
    ]
    assert cv.attn.sum(1).tolist() == [6, 8]
    assert cv.hole_pos.tolist() == [[3, 6, 7], [3, 4, 5]]  # unused slots -> own padding
    assert cv.valid.tolist() == [[True, False, False], [True, True, True]]
    nobos = build_canvas(mock_cfg(bos_token_id=None), [], [9], [2])
    assert nobos.ids.tolist() == [[MASK, MASK, 9, EOS]]
    shifted = build_canvas(mock_cfg(bos_token_id=None, shift_logits=True), [], [9], [2])
    assert shifted.ids.tolist() == [[EOS, MASK, MASK, 9, EOS]]


def target_fn(
    middle: list[int], p_tok: float = 0.9, p_pad: float = 0.95, shift: bool = False, start: int = S0
):
    """Slot j predicts middle[j], then pads; the logit for position i is emitted at
    i - 1 when ``shift``."""

    def fn(row: list[int], pos: int) -> torch.Tensor:
        j = pos + (1 if shift else 0) - start
        if j < 0:
            return logits_from_probs({0: 1.0})
        if j < len(middle):
            return logits_from_probs({middle[j]: p_tok, 0: 1 - p_tok})
        return logits_from_probs({PAD: p_pad, 0: 1 - p_pad})

    return fn


@pytest.mark.parametrize("impl", [infill, infill_reference])
@pytest.mark.parametrize("absorb", [True, False])
def test_pad_trimming(impl, absorb):
    m = MockModel(target_fn([4, 5, 6]))
    sc = SamplerConfig(steps=8, lengths=(8,), absorb_pad=absorb)
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, sc)
    assert res.ids == [4, 5, 6]
    # mean log-prob over the 3 middle tokens and the first pad
    assert res.score == pytest.approx((3 * math.log(0.9) + math.log(0.95)) / 4, rel=1e-5)
    # an EOS predicted inside the hole ends the middle too; nothing after it survives
    m = MockModel(target_fn([4, EOS, 5, 6]))
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, sc)
    assert res.ids == [4]


def absorb_fn(row: list[int], pos: int) -> torch.Tensor:
    """Slot 2 is a very confident pad; slots 3.. predict ordinary tokens (less sure)."""
    j = pos - S0
    if j == 2:
        return logits_from_probs({PAD: 0.99, 0: 0.01})
    if j in (0, 1):
        return logits_from_probs({7 + j: 0.6, 0: 0.4})
    return logits_from_probs({9: 0.8, 0: 0.2})


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_pad_absorption_rule(impl):
    cfg = mock_cfg()
    m = MockModel(absorb_fn)
    (res,) = impl(m, cfg, PREFIX, SUFFIX, SamplerConfig(steps=6, lengths=(6,), absorb_pad=True))
    assert res.ids == [7, 8]
    # after step 1 committed the pad at slot 2, the model sees pads in slots 3..5
    assert holes_per_forward(m, S0, 6)[1] == [MASK, MASK, PAD, PAD, PAD, PAD]
    assert res.steps == 3  # slots 0 and 1 remain: ceil(2/5) = 1 per step
    m = MockModel(absorb_fn)
    (res2,) = impl(m, cfg, PREFIX, SUFFIX, SamplerConfig(steps=6, lengths=(6,), absorb_pad=False))
    assert res2.ids == [7, 8]  # same middle: slots after the first pad are trimmed
    # without the rule slots 3..5 are decoded (to 9) and seen by later steps
    assert holes_per_forward(m, S0, 6)[-1] == [7, MASK, PAD, 9, 9, 9]
    assert res2.steps == 6


def length_fn(row: list[int], pos: int) -> torch.Tensor:
    """The middle is [4, 5, 6]. The mock knows the hole length n from the row and is
    most sure of itself for n = 4: tokens and terminator at .8; for n = 8 at .7 with
    near-certain pads after; for n = 2 (too short) at .55."""
    n = len(row) - S0 - len(SUFFIX) - 1
    p = {2: 0.55, 4: 0.8, 8: 0.7}[n]
    j = pos - S0
    if j < 0 or j >= n:
        return logits_from_probs({0: 1.0})
    if j < 3:
        return logits_from_probs({4 + j: p, 0: 1 - p})
    return logits_from_probs({PAD: p if j == 3 else 0.999, 0: 1 - (p if j == 3 else 0.999)})


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_length_ranking(impl):
    cfg = mock_cfg()
    sc = SamplerConfig(steps=8, lengths=(8, 2, 4), absorb_pad=False)
    res = impl(MockModel(length_fn), cfg, PREFIX, SUFFIX, sc, dedup=False)
    assert [r.length for r in res] == [4, 8, 2]
    assert [r.ids for r in res] == [[4, 5, 6], [4, 5, 6], [4, 5]]
    assert res[0].score == pytest.approx(math.log(0.8), rel=1e-5)
    # n = 8: the trailing near-certain pads do not dilute the score (a mean over all
    # eight slots would have ranked n = 8 first: -0.179 > log .8 = -0.223)
    assert res[1].score == pytest.approx(math.log(0.7), rel=1e-5)
    assert res[2].score == pytest.approx(math.log(0.55), rel=1e-5)
    # dedup: the identical middle from n = 8 is dropped, the better one kept
    res = impl(MockModel(length_fn), cfg, PREFIX, SUFFIX, sc)
    assert [(r.length, r.ids) for r in res] == [(4, [4, 5, 6]), (2, [4, 5])]


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_shift_logits(impl):
    cfg = mock_cfg(shift_logits=True)
    m = MockModel(target_fn([4, 5, 6], shift=True))
    (res,) = impl(m, cfg, PREFIX, SUFFIX, SamplerConfig(steps=4, lengths=(5,)))
    assert res.ids == [4, 5, 6]
    # the same mock read without the shift is off by one slot
    (wrong,) = impl(
        MockModel(target_fn([4, 5, 6], shift=True)),
        mock_cfg(),
        PREFIX,
        SUFFIX,
        SamplerConfig(steps=4, lengths=(5,)),
    )
    assert wrong.ids != [4, 5, 6]
    # no BOS, no prefix: an EOS is put first so slot 0 is read from position 0
    cfg = mock_cfg(shift_logits=True, bos_token_id=None)
    m = MockModel(target_fn([4, 5], shift=True, start=1))
    (res,) = impl(m, cfg, [], SUFFIX, SamplerConfig(steps=3, lengths=(3,)))
    assert res.ids == [4, 5]
    assert m.canvases[0][0][0] == EOS


def test_never_predicts_mask():
    m = MockModel(lambda row, pos: logits_from_probs({MASK: 0.9, 5: 0.1}))
    (res,) = infill(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=2, lengths=(3,)))
    assert res.ids == [5, 5, 5]


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_cancel_after_k_steps(impl):
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 2  # cancel before the third step

    m = MockModel(counting_fn)
    with pytest.raises(InfillCancelled):
        impl(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=6, lengths=(6,)), cancel)
    assert len(m.canvases) == 2
    # nothing leaked: a fresh call on the same model gives the full answer
    (res,) = impl(
        m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=6, lengths=(6,)), lambda: False
    )
    assert res.ids == list(range(6))


def test_rejects_bad_requests():
    m = MockModel(counting_fn)
    with pytest.raises(ValueError):
        infill(m, mock_cfg(), [V + 3], SUFFIX, SamplerConfig(lengths=(2,)))
    with pytest.raises(ValueError):
        SamplerConfig(lengths=(0,))
    with pytest.raises(ValueError):
        SamplerConfig(steps=0)
    with pytest.raises(ValueError):
        infill(m, mock_cfg(mask_token_id=None), PREFIX, SUFFIX, SamplerConfig(lengths=(2,)))


# --------------------------------------------------------------------------- random Transformer

TV = 40
T_BOS, T_EOS, T_PAD, T_MASK = 36, 37, 38, 39


def tiny(shift: bool = False, bos: int | None = T_BOS) -> tuple[Transformer, ModelConfig]:
    # large weights -> peaked distributions (no near-ties between fast and reference);
    # weaker pad/eos rows so that middles are not all empty
    return tiny_model(1 + shift, std=0.4, weak_pad=True, vocab_size=TV, mask_token_id=T_MASK,
                      pad_token_id=T_PAD, eos_token_id=T_EOS, bos_token_id=bos, shift_logits=shift,
                      max_position_embeddings=128)


def same(a: list[Infill], b: list[Infill]) -> None:
    assert [(x.ids, x.length, x.steps) for x in a] == [(x.ids, x.length, x.steps) for x in b]
    assert [x.score for x in a] == pytest.approx([x.score for x in b], abs=1e-4)


# (temperature, absorb_pad, steps, prefix, suffix): each combination of the
# parametrised knobs runs all three; steps = 9 exceeds every hole length
RUNS = [
    (0.0, True, 4, [1, 2, 3, 4, 5], [6, 7]),
    (1.0, True, 9, [9], []),
    (0.0, False, 3, [], [10, 11, 12]),
]


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("threshold", [None, 0.6])
@pytest.mark.parametrize("strategy", list(Strategy))
def test_fast_matches_reference(shift, threshold, strategy):
    model, cfg = tiny(shift)
    for temperature, absorb, steps, prefix, suffix in RUNS:
        sc = SamplerConfig(
            steps=steps,
            threshold=threshold,
            strategy=strategy,
            temperature=temperature,
            seed=11,
            lengths=(1, 3, 7),
            absorb_pad=absorb,
        )
        fast = infill(model, cfg, prefix, suffix, sc, dedup=False)
        ref = infill_reference(model, cfg, prefix, suffix, sc, dedup=False)
        same(fast, ref)


def test_fast_matches_reference_without_bos():
    model, cfg = tiny(shift=True, bos=None)
    sc = SamplerConfig(steps=5, lengths=(2, 6), threshold=0.5)
    for prefix in ([], [3, 4]):
        same(
            infill(model, cfg, prefix, [5], sc, dedup=False),
            infill_reference(model, cfg, prefix, [5], sc, dedup=False),
        )


def test_middles_are_not_trivial():
    """Guards the random-model comparisons: they must exercise real middles."""
    model, cfg = tiny()
    res = infill(
        model, cfg, [1, 2, 3, 4, 5], [6, 7], SamplerConfig(steps=4, lengths=(1, 3, 7)), dedup=False
    )
    assert any(len(r.ids) >= 2 for r in res)


def test_determinism_and_seeds():
    model, cfg = tiny()
    pre, suf = [1, 2, 3, 4], [5, 6]
    greedy = SamplerConfig(steps=4, lengths=(4, 8))
    assert infill(model, cfg, pre, suf, greedy) == infill(model, cfg, pre, suf, greedy)
    hot = SamplerConfig(steps=4, lengths=(4, 8), temperature=2.0, seed=5)
    assert infill(model, cfg, pre, suf, hot) == infill(model, cfg, pre, suf, hot)
    outs = {
        tuple(
            tuple(r.ids)
            for r in infill(
                model,
                cfg,
                pre,
                suf,
                SamplerConfig(steps=4, lengths=(4, 8), temperature=2.0, seed=s),
                dedup=False,
            )
        )
        for s in range(6)
    }
    assert len(outs) > 1


def test_candidate_independent_of_batch_mates():
    """A candidate's result depends on its own length only, not on the others batched with it."""
    model, cfg = tiny()
    sc = SamplerConfig(steps=4, temperature=1.0, seed=3, lengths=(3, 7))
    both = {r.length: r for r in infill(model, cfg, [1, 2], [3], sc, dedup=False)}
    alone = infill(
        model, cfg, [1, 2], [3], SamplerConfig(steps=4, temperature=1.0, seed=3, lengths=(7,))
    )
    assert alone[0].ids == both[7].ids and alone[0].steps == both[7].steps


# --------------------------------------------------------------------------- semi-AR blocks


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_block_schedule(impl):
    """8 slots, blocks of 3 (3 blocks), 6 steps: each block gets 2 steps, and no slot of a
    later block is committed before the earlier blocks are done -- although the model is
    most confident about the LAST slots (counting_fn: confidence falls with j, so reverse it)."""

    def reverse_fn(row, pos):
        j = pos - S0
        return counting_fn(row, S0 + (7 - j)) if 0 <= j < 8 else counting_fn(row, pos)

    m = MockModel(reverse_fn)
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=6, lengths=(8,), block=3))
    assert res.steps == 6
    # block 0 = {0,1,2}: ceil(3/2)=2 then 1; block 1 = {3,4,5}; block 2 = {6,7}: 1 and 1
    assert unmask_order(m, S0, 8, final=res.ids) == [{1, 2}, {0}, {4, 5}, {3}, {7}, {6}]
    # fewer steps than blocks: one step covers several blocks, all done by the last step
    m = MockModel(reverse_fn)
    (res,) = impl(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=2, lengths=(8,), block=2))
    assert unmask_order(m, S0, 8, final=res.ids) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    # block >= n is plain any-order decoding
    m = MockModel(reverse_fn)
    impl(m, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=4, lengths=(8,), block=8))
    m2 = MockModel(reverse_fn)
    impl(m2, mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=4, lengths=(8,)))
    assert m.canvases == m2.canvases


@pytest.mark.parametrize("impl", [infill, infill_reference])
def test_blocks_stop_pads_creeping_in_from_the_right(impl):
    """A model that is sure the far slots are pad and lukewarm about the content: any-order
    decoding commits the far pads first and absorption eats the middle; blocks keep it."""

    def fn(row, pos):
        j = pos - S0
        if not 0 <= j < 8:
            return logits_from_probs({0: 1.0})
        hole = row[S0 : S0 + 8]
        if j >= 4 or PAD in hole[j + 1 :]:  # the true middle is 4 tokens; pads feed pads
            return logits_from_probs({PAD: 0.9, 5: 0.1})
        return logits_from_probs({5: 0.6, PAD: 0.4})

    plain = impl(MockModel(fn), mock_cfg(), PREFIX, SUFFIX, SamplerConfig(steps=4, lengths=(8,)))
    blocked = impl(MockModel(fn), mock_cfg(), PREFIX, SUFFIX,
                   SamplerConfig(steps=4, lengths=(8,), block=2))
    assert len(plain[0].ids) <= 1
    assert blocked[0].ids == [5, 5, 5, 5]


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("threshold", [None, 0.6])
@pytest.mark.parametrize("block", [1, 2, 3])
def test_fast_matches_reference_with_blocks(shift, threshold, block):
    model, cfg = tiny(shift)
    for temperature, absorb, steps, prefix, suffix in RUNS + [(0.0, True, 2, [1, 2], [3])]:
        sc = SamplerConfig(steps=steps, threshold=threshold, temperature=temperature, seed=11,
                           lengths=(1, 3, 7), absorb_pad=absorb, block=block)
        same(infill(model, cfg, prefix, suffix, sc, dedup=False),
             infill_reference(model, cfg, prefix, suffix, sc, dedup=False))


def test_blocks_candidate_independent_of_batch_mates():
    model, cfg = tiny()
    sc = SamplerConfig(steps=5, lengths=(3, 7), block=2)
    both = {r.length: r for r in infill(model, cfg, [1, 2], [3], sc, dedup=False)}
    for n in (3, 7):
        (alone,) = infill(model, cfg, [1, 2], [3], replace(sc, lengths=(n,)))
        assert alone.ids == both[n].ids and alone.steps == both[n].steps


def test_block_must_be_positive():
    with pytest.raises(ValueError, match="block"):
        SamplerConfig(block=0)
