"""One step's pieces (diffill.model.decoder.step): scoring in pieces equals the whole."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from diffill.model.decoder.spec import StepSpec, Strategy
from diffill.model.decoder.step import (
    DraftRows,
    accept_drafts,
    draft_ids,
    score_slots,
    token_scores,
    verify_drafts,
)


def _assert_the_whole_logits_give(got, logits, spec, noise, draft):
    """``got`` (score_slots' SlotScores) is what token_scores and verify_drafts, the
    references, give on the whole logits [L, N, V] (the mask id banned here)."""
    logits = logits.clone()
    logits[..., spec.mask_id] = float("-inf")
    want_tok, want_score, want_lp = token_scores(logits, spec.strategy, spec.temperature, noise)
    want_draft = verify_drafts(logits, draft, spec)
    assert torch.equal(got.tok, want_tok)
    torch.testing.assert_close(got.score, want_score)
    torch.testing.assert_close(got.logp, want_lp)
    acc = accept_drafts(got.top, got.lp_draft, got.lp_terms, draft, spec)
    assert torch.equal(acc[0], want_draft[0]) and torch.equal(acc[1], want_draft[1])
    torch.testing.assert_close(acc[2], want_draft[2])


@pytest.mark.parametrize("strategy", ["confidence", "margin", "entropy"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_scores_in_pieces_are_the_whole_tensors(strategy, temperature):
    """score_slots over pieces of a few slots gives what one piece over the whole [L, N, V]
    gives (the reference: token_scores and verify_drafts on the whole logits)."""
    g = torch.Generator().manual_seed(3)
    L, N, D, V = 3, 7, 16, 97
    w = torch.randn(V, D, generator=g)

    def head(x):
        return x @ w.T

    h = torch.randn(L, N, D, generator=g)
    noise = torch.rand(L, N, V, generator=g) if temperature > 0 else None
    spec = StepSpec(mask_id=5, pad_id=0, terminators=(1, 2), shift=False,
                    strategy=Strategy(strategy), temperature=temperature, vocab=V)
    draft = DraftRows(torch.randint(6, V, (L, N), generator=g), torch.tensor([3, -1, 7]))
    logits = head(h).float()
    for max_bytes in (1, 4 * V * 5, 1 << 30):  # a slot a piece, 5 slots a piece, one piece
        got = score_slots(head, h, spec, noise, draft_ids(draft), max_bytes=max_bytes)
        _assert_the_whole_logits_give(got, logits, spec, noise, draft)
    plain = score_slots(head, h, spec, noise, max_bytes=1)
    assert plain.top is None and plain.lp_draft is None and plain.lp_terms is None
    calls = []
    score_slots(lambda x: calls.append(len(x)) or head(x), h, spec, noise, max_bytes=4 * V * 5)
    assert calls == [5, 5, 5, 5, 1]  # 21 slots, 5 a piece
    calls.clear()
    whole = dataclasses.replace(spec, vocab=0)  # vocabulary unknown: one piece
    score_slots(lambda x: calls.append(len(x)) or head(x), h, whole, noise, max_bytes=1)
    assert calls == [L * N]


@pytest.mark.parametrize("strategy", ["confidence", "margin", "entropy"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("width", [1, 10, 50, 97])
def test_scores_streamed_by_vocabulary_pieces_are_the_whole_tensors(strategy, temperature, width):
    """score_slots reading the head by vocabulary pieces (an online log-sum-exp, the CPU's
    path: Transformer.head_pieces) gives what token_scores and verify_drafts give on the whole
    logits, for pieces of one id, of a width that leaves a short last piece, and of all ids;
    the mask id (banned) sits inside a piece and at a piece's first column."""
    g = torch.Generator().manual_seed(11)
    L, N, D, V = 3, 7, 16, 97
    w = torch.randn(V, D, generator=g) * 3

    def head(x):
        return x @ w.T

    def pieces(x):
        return ((lo, x @ w[lo:lo + width].T) for lo in range(0, V, width))

    h = torch.randn(L, N, D, generator=g)
    noise = torch.rand(L, N, V, generator=g) if temperature > 0 else None
    draft = DraftRows(torch.randint(6, V, (L, N), generator=g), torch.tensor([3, -1, 7]))
    calls = []

    def counted(x):
        calls.append(len(x))
        return head(x)

    for mask_id in (5, 10):
        spec = StepSpec(mask_id=mask_id, pad_id=0, terminators=(1, 96), shift=False,
                        strategy=Strategy(strategy), temperature=temperature, vocab=V)
        got = score_slots(counted, h, spec, noise, draft_ids(draft), pieces=pieces)
        assert calls == []  # the whole logits were never computed
        _assert_the_whole_logits_give(got, head(h).float(), spec, noise, draft)
        assert score_slots(head, h, spec, noise, pieces=pieces).lp_draft is None


def test_streamed_scores_break_ties_to_the_lowest_id_as_argmax_does():
    """Two ids with the same best logit in different vocabulary pieces: the streamed scorer
    picks the lower id, as argmax over the whole logits does; a head whose pieces are None
    (an accelerator, one piece) is read whole."""
    V = 20
    row = torch.zeros(V)
    row[4] = row[15] = 2.0
    h = torch.eye(V)[None, :1]  # one slot whose hidden picks the identity head's first row

    def head(x):
        return x[:, :1] * row[None, :]

    def pieces(x):
        return ((lo, head(x)[:, lo:lo + 8]) for lo in range(0, V, 8))

    spec = StepSpec(mask_id=19, pad_id=0, terminators=(1,), shift=False, vocab=V)
    assert int(score_slots(head, h, spec, pieces=pieces).tok) == 4
    assert int(score_slots(head, h, spec).tok) == 4
    assert int(score_slots(head, h, spec, pieces=lambda x: None).tok) == 4
