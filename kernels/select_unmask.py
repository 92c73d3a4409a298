"""Fused select-and-unmask: one denoising step's work after the LM head.

Given the logits of the hole slots, a masked-diffusion sampler must, for every
still-masked slot, take the most likely token x0 and a score (confidence =
top-1 probability, margin = top-1 minus top-2 probability, or negative
entropy), then per canvas row unmask the ``k`` best-scoring slots plus every
slot whose score exceeds a threshold (Fast-dLLM parallel decoding) by writing
x0 into the canvas. The rules are those of :mod:`diffill.model.decoder`'s
greedy step (entropy score = exp(-H), ties broken by the lower slot index, one
banned id -- the mask token -- never predicted). In torch that is a softmax that materialises a [B, N, V]
probability tensor, a top-2, an entropy reduction, a sort and two scatters:
six or more passes over V-wide rows and a dozen launches per step.

The Triton path reads each V-wide logit row once:

1. ``_partials`` -- grid (rows, splits): each program streams one contiguous
   slice of the vocabulary of one row with an online softmax, keeping the
   running max / argmax (first index on ties, like ``torch.argmax``), the
   second-largest logit, ``s = sum exp(x - m)`` and
   ``t = sum exp(x - m) * (x - m)`` (for the entropy). The banned id counts as
   -inf without being written. Rows that are no longer masked read nothing. Splitting V keeps the GPU busy when there are only a
   few rows (a single 16-token hole is 16 rows of 150k logits).
2. ``_select`` -- grid (B,): merges the splits of the row's N slots, forms
   score and log p(x0), ranks the slots inside the row, selects
   ``rank < k or score > threshold`` among masked slots, scatters x0 into the
   canvas and clears the mask bits, all in place.

:func:`select_unmask_reference` is the slow, obviously correct torch version;
:func:`select_unmask` is the one dispatch point. Greedy only: sampling with a
temperature stays in the sampler's torch code. Both update ``canvas`` and ``masked`` in place and
return the same :class:`Selection`.

Shapes: B canvas rows, N hole slots per row (padded; pad slots are simply not
masked), V vocabulary, T canvas length.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

try:  # triton is an optional dependency (``pip install diffill[gpu]``)
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    HAVE_TRITON = False

STRATEGIES = ("confidence", "margin", "entropy")
_STRATEGY_CODE = {name: i for i, name in enumerate(STRATEGIES)}


@dataclass
class Selection:
    """What one step decided (all on the logits' device).

    x0: [B, N] int64 -- argmax token per slot (meaningful where masked).
    score: [B, N] float32 -- ranking score, -inf where the slot was not masked.
    logp: [B, N] float32 -- log-probability of x0 (0 where not masked).
    selected: [B, N] bool -- slots unmasked by this step.
    """

    x0: torch.Tensor
    score: torch.Tensor
    logp: torch.Tensor
    selected: torch.Tensor


def _check(logits: torch.Tensor, canvas: torch.Tensor, cols: torch.Tensor, masked: torch.Tensor,
           k: torch.Tensor, strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, N, V], got {tuple(logits.shape)}")
    B, N, _ = logits.shape
    if masked.shape != (B, N) or cols.shape != (B, N):
        raise ValueError(f"masked/cols must be [B, N] = {(B, N)}, got {tuple(masked.shape)}, {tuple(cols.shape)}")
    if masked.dtype != torch.bool:
        raise ValueError("masked must be a bool tensor")
    if canvas.dim() != 2 or canvas.shape[0] != B:
        raise ValueError(f"canvas must be [B, T] with B = {B}, got {tuple(canvas.shape)}")
    if k.shape != (B,):
        raise ValueError(f"k must be [B] = ({B},), got {tuple(k.shape)}")


# --------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------


def scores_reference(logits: torch.Tensor, strategy: str, ban: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (x0 [...] int64, score [...] f32, logp(x0) [...] f32), greedy.

    score: confidence = p(x0); margin = p(top1) - p(top2); entropy = exp(-H(p)).
    ``ban``: a token id treated as logit -inf (the mask token).
    """
    x = logits.float()
    if ban is not None:
        x = x.clone()
        x[..., ban] = -math.inf
    logp_all = torch.log_softmax(x, dim=-1)
    x0 = torch.argmax(x, dim=-1)
    logp = logp_all.gather(-1, x0[..., None])[..., 0]
    p = logp_all.exp()
    if strategy == "confidence":
        score = logp.exp()
    elif strategy == "margin":
        top2 = p.topk(2, dim=-1).values
        score = top2[..., 0] - top2[..., 1]
    elif strategy == "entropy":
        score = torch.exp(-torch.special.entr(p).sum(-1))  # entr(p) = -p log p, 0 at p = 0
    else:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return x0, score, logp


def select_reference(score: torch.Tensor, masked: torch.Tensor, k: torch.Tensor,
                     threshold: float | None) -> torch.Tensor:
    """Which slots to unmask: among masked slots, the ``k[b]`` best of row b (ties:
    lower slot index first) plus every slot with ``score > threshold``.

    score [B, N] (-inf where not masked), masked [B, N] bool, k [B] int -> [B, N] bool.
    """
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(score.shape[1], device=score.device).expand_as(order))
    sel = rank < k.to(rank.dtype)[:, None]
    if threshold is not None:
        sel = sel | (score > threshold)
    return sel & masked


def select_unmask_reference(
    logits: torch.Tensor,
    canvas: torch.Tensor,
    cols: torch.Tensor,
    masked: torch.Tensor,
    k: torch.Tensor,
    threshold: float | None = None,
    strategy: str = "confidence",
    ban: int | None = None,
) -> Selection:
    """Slow, obviously correct select-and-unmask (see module docstring).

    logits [B, N, V]; canvas [B, T] int64 (updated in place: canvas[b, cols[b, i]] = x0[b, i]
    where selected); cols [B, N] int64 canvas column of each slot; masked [B, N] bool
    (updated in place: selected slots become False); k [B] int tokens to unmask per row
    (more are unmasked when their score exceeds ``threshold``); ``ban``: token id never
    predicted.
    """
    _check(logits, canvas, cols, masked, k, strategy)
    x0, score, logp = scores_reference(logits, strategy, ban)
    score = torch.where(masked, score, torch.full_like(score, -math.inf))
    logp = torch.where(masked, logp, torch.zeros_like(logp))
    sel = select_reference(score, masked, k, threshold)
    cols = cols.long()
    current = canvas.gather(1, cols)
    canvas.scatter_(1, cols, torch.where(sel, x0.to(canvas.dtype), current))
    masked &= ~sel
    return Selection(x0=x0, score=score, logp=logp, selected=sel)


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------


def _partials_kernel(
    logits_ptr, stride_row, masked_ptr,
    m_ptr, s_ptr, t_ptr, b2_ptr, idx_ptr,
    V, chunk, n_splits, ban,
    BLOCK_V: tl.constexpr,
):
    """One (row, split): online max/argmax/second-max/sum-exp/entropy over
    logits[row, split*chunk : (split+1)*chunk]."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    out = row * n_splits + split
    is_masked = tl.load(masked_ptr + row) != 0
    start = split * chunk
    stop = tl.minimum(start + chunk, V)
    stop = tl.where(is_masked, stop, start)  # unmasked rows read nothing
    offs = tl.arange(0, BLOCK_V)
    neg_inf = float("-inf")
    m = tl.full((), neg_inf, tl.float32)
    b2 = tl.full((), neg_inf, tl.float32)
    s = tl.zeros((), tl.float32)
    t = tl.zeros((), tl.float32)
    idx = tl.full((), 0, tl.int32)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    for off in range(start, stop, BLOCK_V):
        cur = off + offs
        x = tl.load(row_ptr + cur, mask=cur < stop, other=neg_inf).to(tl.float32)
        x = tl.where(cur == ban, neg_inf, x)
        c1, ci = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        c2 = tl.max(tl.where(offs == ci, neg_inf, x), 0)
        # top-2 merge: strict '>' keeps the earlier index on ties (torch.argmax semantics)
        take = c1 > m
        b2 = tl.maximum(tl.minimum(m, c1), tl.maximum(b2, c2))
        idx = tl.where(take, off + ci.to(tl.int32), idx)
        m_new = tl.maximum(m, c1)
        ref = tl.where(m_new > neg_inf, m_new, 0.0)
        alpha = tl.exp(m - ref)
        delta = tl.where(m > neg_inf, m - ref, 0.0)
        e = tl.exp(x - ref)
        ex = e * tl.where(x > neg_inf, x - ref, 0.0)  # p log p -> 0 at x = -inf
        t = alpha * (t + delta * s) + tl.sum(ex, 0)
        s = s * alpha + tl.sum(e, 0)
        m = m_new
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)
    tl.store(t_ptr + out, t)
    tl.store(b2_ptr + out, b2)
    tl.store(idx_ptr + out, idx)


def _select_kernel(
    m_ptr, s_ptr, t_ptr, b2_ptr, idx_ptr,
    masked_ptr, k_ptr, cols_ptr, canvas_ptr, stride_canvas,
    x0_ptr, score_ptr, logp_ptr, sel_ptr,
    N, n_splits, threshold,
    STRATEGY: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """One canvas row: merge splits, score, rank, select, scatter."""
    b = tl.program_id(0)
    neg_inf = float("-inf")
    slots = tl.arange(0, BLOCK_N)
    splits = tl.arange(0, BLOCK_S)
    slot_ok = slots < N
    rows = b * N + slots
    is_masked = (tl.load(masked_ptr + rows, mask=slot_ok, other=0) != 0) & slot_ok
    pidx = rows[:, None] * n_splits + splits[None, :]
    pmask = slot_ok[:, None] & (splits[None, :] < n_splits)
    pm = tl.load(m_ptr + pidx, mask=pmask, other=neg_inf)
    ps = tl.load(s_ptr + pidx, mask=pmask, other=0.0)
    pt = tl.load(t_ptr + pidx, mask=pmask, other=0.0)
    pb2 = tl.load(b2_ptr + pidx, mask=pmask, other=neg_inf)
    pidx_tok = tl.load(idx_ptr + pidx, mask=pmask, other=0)
    best, jstar = tl.max(pm, 1, return_indices=True, return_indices_tie_break_left=True)
    ref = tl.where(best > neg_inf, best, 0.0)
    w = tl.exp(pm - ref[:, None])
    delta = tl.where(pm > neg_inf, pm - ref[:, None], 0.0)
    s = tl.sum(ps * w, 1)
    t = tl.sum(w * (pt + delta * ps), 1)
    is_star = splits[None, :] == jstar[:, None]
    x0 = tl.sum(tl.where(is_star, pidx_tok, 0), 1)
    second = tl.maximum(tl.max(pb2, 1), tl.max(tl.where(is_star, neg_inf, pm), 1))
    s_safe = tl.where(s > 0, s, 1.0)
    logp = -tl.log(s_safe)
    if STRATEGY == 0:
        score = 1.0 / s_safe
    elif STRATEGY == 1:
        score = (1.0 - tl.exp(second - ref)) / s_safe
    else:
        score = tl.exp(t / s_safe - tl.log(s_safe))  # exp(-entropy)
    score = tl.where(is_masked, score, neg_inf)
    logp = tl.where(is_masked, logp, 0.0)
    # rank inside the row: strictly better scores, ties broken by lower slot index
    better = (score[None, :] > score[:, None]) | (
        (score[None, :] == score[:, None]) & (slots[None, :] < slots[:, None])
    )
    better = better & slot_ok[None, :]
    rank = tl.sum(better.to(tl.int32), 1)
    kb = tl.load(k_ptr + b)
    sel = is_masked & ((rank < kb) | (score > threshold))
    col = tl.load(cols_ptr + rows, mask=slot_ok, other=0)
    tl.store(canvas_ptr + b.to(tl.int64) * stride_canvas + col, x0.to(tl.int64), mask=sel)
    tl.store(masked_ptr + rows, (is_masked & ~sel).to(tl.int8), mask=slot_ok)
    tl.store(x0_ptr + rows, x0.to(tl.int64), mask=slot_ok)
    tl.store(score_ptr + rows, score, mask=slot_ok)
    tl.store(logp_ptr + rows, logp, mask=slot_ok)
    tl.store(sel_ptr + rows, sel.to(tl.int8), mask=slot_ok)


def interpret_requested() -> bool:
    """True when ``TRITON_INTERPRET=1`` is set: Triton kernels run in Triton's CPU
    interpreter (slow; for tests on machines without a GPU). Triton reads the
    variable when it is imported, so it must be set before the first import."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if HAVE_TRITON:
    _partials = triton.jit(_partials_kernel)
    _select = triton.jit(_select_kernel)
    #: whether the kernels were built for Triton's CPU interpreter
    INTERPRETED = not isinstance(_partials, triton.runtime.JITFunction)
else:  # pragma: no cover
    _partials = _select = None
    INTERPRETED = False


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose_splits(rows: int, vocab: int, block_v: int, target_programs: int = 512) -> int:
    """How many vocabulary slices per row so that about ``target_programs``
    programs run (at least one BLOCK_V chunk each, at most 64 slices)."""
    max_splits = max(1, min(64, triton.cdiv(vocab, block_v) if HAVE_TRITON else 1))
    return max(1, min(max_splits, -(-target_programs // max(rows, 1))))


def select_unmask_triton(
    logits: torch.Tensor,
    canvas: torch.Tensor,
    cols: torch.Tensor,
    masked: torch.Tensor,
    k: torch.Tensor,
    threshold: float | None = None,
    strategy: str = "confidence",
    ban: int | None = None,
    *,
    block_v: int = 1024,
    splits: int | None = None,
) -> Selection:
    """Triton select-and-unmask (greedy only); same contract as the reference.

    Runs on CUDA tensors, or on CPU tensors when Triton was imported with
    ``TRITON_INTERPRET=1``. ``canvas`` (int64) and ``masked`` must be contiguous.
    """
    _check(logits, canvas, cols, masked, k, strategy)
    if not canvas.is_contiguous() or not masked.is_contiguous():
        raise ValueError("canvas and masked must be contiguous (they are updated in place)")
    if not triton_usable(logits.device):
        raise RuntimeError(
            f"the Triton kernels cannot run on {logits.device} here (no triton, or CPU without "
            "TRITON_INTERPRET=1 set before triton was imported)"
        )
    if canvas.dtype != torch.int64:
        raise ValueError("canvas must be int64")
    B, N, V = logits.shape
    R = B * N
    flat = logits.reshape(R, V)
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    n_splits = splits or choose_splits(R, V, block_v)
    chunk = triton.cdiv(triton.cdiv(V, n_splits), block_v) * block_v
    n_splits = triton.cdiv(V, chunk)
    dev = logits.device
    m = torch.empty(R * n_splits, device=dev, dtype=torch.float32)
    s = torch.empty_like(m)
    t = torch.empty_like(m)
    b2 = torch.empty_like(m)
    idx = torch.empty(R * n_splits, device=dev, dtype=torch.int32)
    mask_i8 = masked.view(torch.int8)  # bool and int8 share storage layout
    _partials[(R, n_splits)](flat, flat.stride(0), mask_i8, m, s, t, b2, idx, V, chunk, n_splits,
                              -1 if ban is None else int(ban), BLOCK_V=block_v)
    x0 = torch.empty(B, N, device=dev, dtype=torch.int64)
    score = torch.empty(B, N, device=dev, dtype=torch.float32)
    logp = torch.empty(B, N, device=dev, dtype=torch.float32)
    sel = torch.empty(B, N, device=dev, dtype=torch.bool)
    thr = math.inf if threshold is None else float(threshold)
    _select[(B,)](m, s, t, b2, idx, mask_i8, k.to(torch.int32).contiguous(),
                   cols.long().contiguous(), canvas, canvas.stride(0),
                   x0, score, logp, sel.view(torch.int8), N, n_splits, thr,
                   STRATEGY=_STRATEGY_CODE[strategy], BLOCK_N=max(16, _next_pow2(N)),
                   BLOCK_S=max(2, _next_pow2(n_splits)))
    return Selection(x0=x0, score=score, logp=logp, selected=sel)


# --------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------

_IMPLS = ("auto", "triton", "torch")


def triton_usable(device: torch.device | str) -> bool:
    """Whether :func:`select_unmask` would take the Triton path for tensors on ``device``."""
    if not HAVE_TRITON:
        return False
    dev = torch.device(device)
    return (dev.type == "cuda" and not INTERPRETED) or (dev.type == "cpu" and INTERPRETED)


def select_unmask(
    logits: torch.Tensor,
    canvas: torch.Tensor,
    cols: torch.Tensor,
    masked: torch.Tensor,
    k: torch.Tensor,
    threshold: float | None = None,
    strategy: str = "confidence",
    ban: int | None = None,
    impl: str = "auto",
) -> Selection:
    """The one dispatch point: the Triton kernels on CUDA (or on CPU when Triton
    runs its interpreter), the torch reference otherwise. ``impl`` forces
    'triton' or 'torch'. Same contract as :func:`select_unmask_reference`."""
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    use_triton = impl == "triton" or (
        impl == "auto" and triton_usable(logits.device) and canvas.is_contiguous()
        and masked.is_contiguous() and canvas.dtype == torch.int64
    )
    if use_triton:
        return select_unmask_triton(logits, canvas, cols, masked, k, threshold, strategy, ban)
    return select_unmask_reference(logits, canvas, cols, masked, k, threshold, strategy, ban)
