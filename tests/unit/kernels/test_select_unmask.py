"""Fused select-and-unmask: the Triton kernels against the torch reference.

The Triton comparisons run on CUDA, or on CPU when this file is imported with
``TRITON_INTERPRET=1`` (Triton's interpreter). Without either, one test reruns
them in a subprocess with the interpreter switched on, so a CPU-only CI still
exercises the kernels.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch
from diffill.kernels import select_unmask as su
from support import tiny_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_OK = su.triton_usable(DEVICE)
needs_kernel = pytest.mark.skipif(
    not KERNEL_OK, reason="Triton kernels need CUDA or TRITON_INTERPRET=1 at import (see subprocess test)"
)


def _case(B: int, N: int, V: int, *, seed: int, p_masked: float = 0.7, dtype=torch.float32,
          scale: float = 3.0, neg_inf_frac: float = 0.0, device: str = DEVICE):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, N, V, generator=g) * scale
    if neg_inf_frac:
        logits[torch.rand(B, N, V, generator=g) < neg_inf_frac] = -math.inf
    T = N + 11
    canvas = torch.randint(0, V, (B, T), generator=g)
    start = torch.randint(0, T - N + 1, (B,), generator=g)
    cols = start[:, None] + torch.arange(N)[None, :]
    masked = torch.rand(B, N, generator=g) < p_masked
    k = torch.randint(0, 4, (B,), generator=g)
    return (logits.to(dtype).to(device), canvas.to(device), cols.to(device), masked.to(device),
            k.to(device))


def _run_both(logits, canvas, cols, masked, k, threshold, strategy, ban=None, **kw):
    c_ref, m_ref = canvas.clone(), masked.clone()
    c_tri, m_tri = canvas.clone(), masked.clone()
    ref = su.select_unmask_reference(logits, c_ref, cols, m_ref, k, threshold, strategy, ban)
    tri = su.select_unmask_triton(logits, c_tri, cols, m_tri, k, threshold, strategy, ban, **kw)
    return (ref, c_ref, m_ref), (tri, c_tri, m_tri)


# -- reference ------------------------------------------------------------------------------


def test_select_reference_matches_explicit_loop():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        B, N = 3, 9
        score = torch.randn(B, N, generator=g).round(decimals=1)  # rounding makes ties
        masked = torch.rand(B, N, generator=g) < 0.6
        score = torch.where(masked, score, torch.full_like(score, -math.inf))
        k = torch.randint(0, 5, (B,), generator=g)
        thr = 0.5
        got = su.select_reference(score, masked, k, thr)
        for b in range(B):
            order = sorted((i for i in range(N) if masked[b, i]), key=lambda i: (-score[b, i].item(), i))
            want = set(order[: int(k[b])]) | {i for i in order if score[b, i] > thr}
            assert {i for i in range(N) if got[b, i]} == want


def test_reference_scores_and_inplace_update():
    logits = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]]])  # B=1, N=2, V=3
    canvas = torch.tensor([[7, 8, 9, 9]])
    cols = torch.tensor([[1, 2]])
    masked = torch.tensor([[True, True]])
    sel = su.select_unmask_reference(logits, canvas, cols, masked, torch.tensor([1]), None, "confidence")
    p = torch.softmax(logits[0], -1)
    assert torch.allclose(sel.score[0], p.max(-1).values)
    assert sel.x0.tolist() == [[0, 2]]
    # slot 1 is the more confident -> it alone is unmasked
    assert sel.selected.tolist() == [[False, True]]
    assert canvas.tolist() == [[7, 8, 2, 9]]
    assert masked.tolist() == [[True, False]]
    margin = su.scores_reference(logits, "margin")[1]
    top2 = p.topk(2, -1).values
    assert torch.allclose(margin[0], top2[:, 0] - top2[:, 1])
    ent = su.scores_reference(logits, "entropy")[1]
    assert torch.allclose(ent[0], (p * p.log()).sum(-1).exp())


def test_reference_threshold_adds_confident_slots_and_k_caps_at_masked():
    logits = torch.full((1, 4, 5), 0.0)
    logits[0, 0, 1] = 10.0  # very confident
    logits[0, 2, 3] = 9.0  # very confident
    canvas = torch.zeros(1, 4, dtype=torch.long)
    cols = torch.arange(4)[None]
    masked = torch.tensor([[True, True, True, False]])
    sel = su.select_unmask_reference(logits, canvas, cols, masked, torch.tensor([0]), 0.9, "confidence")
    assert sel.selected.tolist() == [[True, False, True, False]]
    masked = torch.tensor([[True, True, True, False]])
    sel = su.select_unmask_reference(logits, canvas, cols, masked, torch.tensor([10]), None, "confidence")
    assert sel.selected.tolist() == [[True, True, True, False]]
    assert not masked.any()


@pytest.mark.parametrize("strategy", su.STRATEGIES)
def test_reference_scores_follow_the_sampler_rules(strategy):
    """The kernel contract is the sampler's greedy step: same token, score and log-prob."""
    from diffill.model.decoder.spec import Strategy
    from diffill.model.decoder.step import token_scores

    logits = torch.randn(3, 5, 40) * 4
    ban = 7
    logits[..., 3] = logits.max() + 1  # the banned id would otherwise win everywhere
    banned = logits.clone()
    banned[..., ban] = -math.inf
    banned[..., 3] = -math.inf
    tok, score, logp = token_scores(banned, Strategy(strategy), 0.0, None)
    ref_logits = logits.clone()
    ref_logits[..., 3] = -math.inf
    x0, s2, lp2 = su.scores_reference(ref_logits, strategy, ban=ban)
    assert torch.equal(tok, x0)
    assert torch.allclose(score, s2, atol=1e-6) and torch.allclose(logp, lp2, atol=1e-6)


def test_dispatch_uses_reference_when_kernel_unusable_or_sampling():
    logits, canvas, cols, masked, k = _case(2, 5, 64, seed=3, device="cpu")
    c1, m1 = canvas.clone(), masked.clone()
    c2, m2 = canvas.clone(), masked.clone()
    a = su.select_unmask(logits, c1, cols, m1, k, None, "margin", impl="torch")
    b = su.select_unmask(logits, c2, cols, m2, k, None, "margin")
    assert torch.equal(a.selected, b.selected) and torch.equal(c1, c2) and torch.equal(m1, m2)
    with pytest.raises(ValueError):
        su.select_unmask(logits, c1, cols, m1, k, None, "bogus")
    with pytest.raises(ValueError):
        su.select_unmask(logits, c1, cols, m1, k, impl="cuda")


# -- Triton vs reference ----------------------------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("strategy", su.STRATEGIES)
@pytest.mark.parametrize(
    "B,N,V,splits,threshold",
    [(1, 16, 1000, None, None), (3, 7, 77, 1, 0.3), (2, 5, 3001, 3, None), (4, 33, 515, None, 0.05)],
)
def test_triton_vs_reference(strategy, B, N, V, splits, threshold):
    seed = hash((strategy, B, N, V)) % 10_000
    case = _case(B, N, V, seed=seed)
    thr = threshold if strategy == "confidence" else (None if threshold is None else -1.0)
    ban = V - 1 if splits is None else None
    (ref, c_ref, m_ref), (tri, c_tri, m_tri) = _run_both(*case, thr, strategy, ban, block_v=256,
                                                         splits=splits)
    masked = case[3]
    assert torch.equal(ref.x0[masked], tri.x0[masked])
    assert torch.allclose(ref.score, tri.score, atol=2e-6, rtol=1e-5)
    assert torch.allclose(ref.logp, tri.logp, atol=2e-6, rtol=1e-5)
    assert torch.equal(ref.selected, tri.selected)
    assert torch.equal(c_ref, c_tri)
    assert torch.equal(m_ref, m_tri)


@needs_kernel
def test_triton_vs_reference_edge_cases():
    # -inf logits (banned tokens), bf16 with ties, a row with nothing masked, non-contiguous logits
    case = _case(2, 6, 700, seed=11, neg_inf_frac=0.3)
    for strategy in su.STRATEGIES:
        (ref, c_ref, m_ref), (tri, c_tri, m_tri) = _run_both(*case, None, strategy, block_v=128)
        assert torch.equal(ref.selected, tri.selected) and torch.equal(c_ref, c_tri)
        assert torch.allclose(ref.score, tri.score, atol=2e-6, rtol=1e-5)

    logits, canvas, cols, masked, k = _case(3, 8, 300, seed=12, dtype=torch.bfloat16, scale=1.0)
    logits[..., 5] = logits.max()  # ties for the argmax: both must take the first index
    logits[..., 200] = logits.max()
    logits[..., 2] = logits.max()  # ... once the banned id 2 is ignored
    masked[1] = False
    (ref, c_ref, m_ref), (tri, c_tri, m_tri) = _run_both(logits, canvas, cols, masked, k, None,
                                                         "confidence", 2, block_v=64, splits=2)
    assert (tri.x0[masked] == 5).all()
    assert torch.equal(ref.x0[masked], tri.x0[masked])
    assert torch.equal(ref.selected, tri.selected) and torch.equal(c_ref, c_tri)
    assert not tri.selected[1].any() and torch.isinf(tri.score[1]).all()

    big = torch.randn(2, 5, 400, device=DEVICE)
    logits = big[:, :, 50:350]  # row stride 400, not contiguous over the slot dim
    _, canvas, cols, masked, k = _case(2, 5, 300, seed=13)
    (ref, c_ref, _), (tri, c_tri, _) = _run_both(logits, canvas, cols, masked, k, 0.2, "confidence",
                                                 block_v=64)
    assert torch.equal(ref.selected, tri.selected) and torch.equal(c_ref, c_tri)


@needs_kernel
def test_triton_equal_scores_rank_by_slot_index():
    V = 50
    logits = torch.zeros(1, 10, V, device=DEVICE)
    logits[0, :, 7] = 4.0  # every slot has the same confidence
    canvas = torch.zeros(1, 10, dtype=torch.long, device=DEVICE)
    cols = torch.arange(10, device=DEVICE)[None]
    masked = torch.ones(1, 10, dtype=torch.bool, device=DEVICE)
    masked[0, 0] = False
    (ref, c_ref, _), (tri, c_tri, _) = _run_both(logits, canvas, cols, masked,
                                                 torch.tensor([3], device=DEVICE), None, "confidence")
    assert tri.selected[0].nonzero().flatten().tolist() == [1, 2, 3]
    assert torch.equal(ref.selected, tri.selected) and torch.equal(c_ref, c_tri)


@pytest.mark.slow
@pytest.mark.skipif(KERNEL_OK, reason="kernels already run in this process")
@pytest.mark.skipif(not su.HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_under_interpreter_subprocess():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "triton_",
         "-x"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 14, out[-2000:]


# -- inside the sampler's step ----------------------------------------------------------------

SAMPLER_SETTINGS = [
    dict(steps=4, lengths=(6,)),
    dict(steps=6, lengths=(3, 8, 5), strategy="margin"),
    dict(steps=5, lengths=(4, 9), threshold=0.3, strategy="entropy"),
    dict(steps=3, lengths=(7, 7, 12), threshold=0.5, absorb_pad=False),
    dict(steps=4, lengths=(6, 11), block=3),
    dict(steps=5, lengths=(4, 9), threshold=0.3, block=2),
]


def _sampler_model(shift: bool):
    m, cfg = tiny_model(7, vocab_size=67, shift_logits=shift, max_position_embeddings=128)
    return m.to(DEVICE), cfg


def _compare_sampler(impl: str, settings: list[dict] = SAMPLER_SETTINGS) -> None:
    from diffill.model.decoder.loop import infill
    from diffill.model.decoder.spec import SamplerConfig

    g = torch.Generator().manual_seed(8)
    for shift in (False, True):
        model, cfg = _sampler_model(shift)
        for kw in settings:
            pre = torch.randint(4, 67, (9,), generator=g).tolist()
            suf = torch.randint(4, 67, (4,), generator=g).tolist()
            sc = SamplerConfig(**kw)
            got = infill(model, cfg, pre, suf, sc, select_impl=impl)
            want = infill(model, cfg, pre, suf, sc)
            assert [(r.ids, r.length, r.steps) for r in got] == [(r.ids, r.length, r.steps) for r in want]
            assert [r.score for r in got] == pytest.approx([r.score for r in want], abs=1e-5)


def test_fused_select_reference_in_sampler_matches_plain_step():
    _compare_sampler("torch")


@needs_kernel
def test_triton_select_in_sampler_matches_plain_step():
    _compare_sampler("triton", SAMPLER_SETTINGS[1:3])  # the interpreter is slow
