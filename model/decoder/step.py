"""One refinement step, :func:`denoise_step` (package doc, *Refinement*): the scores of the
hole slots (:func:`token_scores`, read in pieces by :func:`score_slots`), the
semi-autoregressive block schedule, the fused select-and-unmask kernel's entry, and draft
verification (:func:`accept_drafts`; :func:`verify_drafts` on whole logits is its
reference). Pure tensor code without host synchronisation, so a step can be compiled and
captured in a CUDA graph."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .canvas import Canvas, DenoiseState
from .spec import StepSpec, Strategy


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    """Uniform [0, 1) noise -> standard Gumbel noise."""
    return -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))


def token_scores(
    logits: torch.Tensor, strategy: Strategy, temperature: float, noise: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [..., V] (fp32, mask id already -inf); noise [..., V] uniform or None.

    Returns (token [...] long, score [...] float, logp [...] float): the predicted
    token, its strategy score (higher = more confident) and its untempered log-prob.
    """
    tok, score, logp, _ = _token_scores(logits, strategy, temperature, noise)
    return tok, score, logp


def _token_scores(
    logits: torch.Tensor, strategy: Strategy, temperature: float, noise: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`token_scores` and the untempered log-probs of the whole vocabulary [..., V]."""
    logp_all = torch.log_softmax(logits, dim=-1)
    if temperature > 0:
        scaled = logits / temperature
        logq = torch.log_softmax(scaled, dim=-1)
        assert noise is not None, "temperature > 0 needs noise"
        tok = (scaled + _gumbel(noise)).argmax(dim=-1)
    else:
        logq = logp_all
        tok = logits.argmax(dim=-1)
    # only the entropy needs every probability: exp over the whole vocabulary was ~0.6 s of
    # a 0.5B-shape CPU step (4 rows x 32 slots x 152k)
    if strategy is Strategy.CONFIDENCE:
        score = logq.gather(-1, tok[..., None])[..., 0].exp()
    elif strategy is Strategy.MARGIN:
        top2 = logq.topk(2, dim=-1).values.exp()
        score = top2[..., 0] - top2[..., 1]
    elif strategy is Strategy.ENTROPY:
        q = logq.exp()
        score = torch.exp((q * logq.clamp_min(-1e30)).sum(-1))  # exp(-H)
    else:  # pragma: no cover
        raise ValueError(f"unknown strategy {strategy}")
    return tok, score, logp_all.gather(-1, tok[..., None])[..., 0], logp_all


SCORE_BYTES = 32 << 20
"""The most fp32 logits one step holds at once: the LM head and the scoring run over a
batch's hole slots in pieces of at most this many bytes (:func:`score_slots`). Whole, the
``[rows x slots x vocab]`` logits and their log-softmax were the peak of a CPU request: 3
rows x 64 slots x 152k on the 0.5B shape is 117 MB each. Each piece reads the head's weights
again (136 MB in int8 on that shape), so pieces are not small: a keystroke's 3 x 16 slots
are one piece there (split in two they cost +50% in the head, 78 -> 117 ms on the 2-core
box); 3 x 32 in two and 3 x 64 in four were no slower than one piece."""


class SlotScores(NamedTuple):
    """What one step reads from the head at every hole slot [L, N]: the predicted token, its
    strategy score and untempered log-prob; for draft verification (else None) the best
    log-prob, the log-prob of the draft's token and of each terminator [L, N, K]."""

    tok: torch.Tensor
    score: torch.Tensor
    logp: torch.Tensor
    top: torch.Tensor | None = None
    lp_draft: torch.Tensor | None = None
    lp_terms: torch.Tensor | None = None


def score_slots(head: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, spec: StepSpec,
                noise: torch.Tensor | None = None, draft_ids: torch.Tensor | None = None, *,
                max_bytes: int = SCORE_BYTES) -> SlotScores:
    """:func:`token_scores` of ``head(h)`` (h [L, N, D]; the mask id banned), computed over the
    slots in pieces of at most ``max_bytes`` of fp32 logits (``spec.vocab`` wide; 0: one
    piece), so the whole ``[L, N, V]`` is never held. Each slot's scores depend on its own
    logits only, so the pieces give what one piece gives (the reference: ``max_bytes`` larger
    than the batch). ``draft_ids`` [L, N]: the token whose log-prob each slot reports for
    :func:`accept_drafts` (drafts only)."""
    L, N, D = h.shape
    flat = h.reshape(L * N, D)
    nz = None if noise is None else noise.reshape(L * N, -1)
    ds = None if draft_ids is None else draft_ids.reshape(L * N, 1)
    terms = torch.tensor(spec.terminators, device=h.device) if ds is not None else None
    parts: list[tuple[torch.Tensor, ...]] = []
    size = max(1, max_bytes // (4 * spec.vocab)) if spec.vocab > 0 else L * N
    start = 0
    while start < L * N:
        stop = min(start + size, L * N)
        logits = head(flat[start:stop]).float()  # [c, V]
        logits[:, spec.mask_id] = float("-inf")
        tok, score, lp, logp_all = _token_scores(logits, spec.strategy, spec.temperature,
                                                 None if nz is None else nz[start:stop])
        part: tuple[torch.Tensor, ...] = (tok, score, lp)
        if ds is not None:
            part += (logp_all.max(-1).values, logp_all.gather(-1, ds[start:stop])[:, 0],
                     logp_all.index_select(-1, terms))
        parts.append(part)
        del logits, logp_all
        start = stop
    cols = [torch.cat(c) for c in zip(*parts, strict=True)]
    shaped = [c.reshape(L, N, *c.shape[1:]) for c in cols]
    return SlotScores(*shaped)


def block_schedule(
    masked: torch.Tensor,
    valid: torch.Tensor,
    steps_left: int | torch.Tensor,
    block: int,
    total_steps: int,
    *,
    fixed: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eligible slots [L, N] and slots to commit k [L] for semi-autoregressive blocks
    (module doc). Per row: ``n`` valid slots, ``S = min(total_steps, n)`` in fixed mode
    (the steps that row's loop runs) else ``total_steps``; static shapes, no host sync."""
    n = valid.sum(1)  # [L]
    S = n.clamp(max=total_steps) if fixed else torch.full_like(n, total_steps)
    S = S.clamp_min(1)
    nb = torch.div(n + block - 1, block, rounding_mode="floor").clamp_min(1)
    s = total_steps - steps_left
    if not torch.is_tensor(s):
        s = torch.full_like(n, int(s))
    cur = torch.div((s + 1) * nb + S - 1, S, rounding_mode="floor") - 1  # last eligible block
    first = masked.int().argmax(1)  # first still-masked slot (0 when none)
    cur = torch.minimum(torch.maximum(cur, torch.div(first, block, rounding_mode="floor")), nb - 1)
    left = (torch.div((cur + 1) * S, nb, rounding_mode="floor") - s).clamp_min(1)
    slot = torch.arange(masked.shape[1], device=masked.device)
    elig = masked & (slot[None, :] < ((cur + 1) * block)[:, None])
    r = elig.sum(1)
    k = torch.div(r + left - 1, left, rounding_mode="floor")
    return elig, k


def fused_select_unmask() -> Callable[..., Any]:
    """:func:`diffill.kernels.select_unmask.select_unmask`, imported on first use."""
    from ...kernels.select_unmask import select_unmask  # imports triton (0.3 s): fused steps only

    return select_unmask


class DraftRows(NamedTuple):
    """The drafts of a batch, one per canvas row: tokens [L, N] long (the draft in slots
    ``0 .. m-1``; anything after), length [L] long (``m``; -1 for a row with no draft)."""

    tokens: torch.Tensor
    length: torch.Tensor

    def rows(self, idx: torch.Tensor) -> DraftRows:
        return DraftRows(self.tokens[idx], self.length[idx])


def draft_ids(draft: DraftRows) -> torch.Tensor:
    """[L, N]: the draft's token at its slots ``j < m``, 0 elsewhere (a valid id to read)."""
    slot = torch.arange(draft.tokens.shape[1], device=draft.tokens.device)[None, :]
    return torch.where(slot < draft.length[:, None], draft.tokens,
                       torch.zeros_like(draft.tokens)).clamp_min(0)


def verify_drafts(logits: torch.Tensor, draft: DraftRows, spec: StepSpec
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`accept_drafts` on one step's whole logits [L, N, V] (fp32, mask id -inf): the
    slow reference of the pieces :func:`score_slots` reads."""
    logp_all = torch.log_softmax(logits, dim=-1)
    terms = torch.tensor(spec.terminators, device=logits.device)
    return accept_drafts(logp_all.max(-1).values,
                         logp_all.gather(-1, draft_ids(draft)[..., None])[..., 0],
                         logp_all.index_select(-1, terms), draft, spec)


def accept_drafts(top: torch.Tensor, lp_draft: torch.Tensor, lp_terms: torch.Tensor,
                  draft: DraftRows, spec: StepSpec
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verification rule (module doc, *Drafts*) on one step of canvases whose hole is all
    masked, from each slot's best log-prob ``top`` [L, N], the log-prob of the draft's token
    ``lp_draft`` [L, N] (:func:`draft_ids`) and of each terminator ``lp_terms`` [L, N, K].

    Slot ``j < m`` agrees when ``log p(d_j) >= log p(top_j) + log(draft_ratio)``; slot ``m``
    (the end of the middle) when the likeliest terminator clears the same bar. The accepted
    run is the agreeing slots from slot 0 up to the first disagreeing one. Returns (sel [L, N]
    bool: the run's slots of draft rows, tok [L, N]: the draft tokens and at slot ``m`` the
    likeliest terminator, logp [L, N]: their log-probs)."""
    bar = top + (math.log(spec.draft_ratio) if spec.draft_ratio > 0 else float("-inf"))
    L, N = top.shape
    slot = torch.arange(N, device=top.device)[None, :]
    m = draft.length[:, None]  # [L, 1]
    terms = torch.tensor(spec.terminators, device=top.device)
    lp_end, which = lp_terms.max(-1)  # ties: the first terminator listed
    tok = torch.where(slot < m, draft_ids(draft), terms[which])
    lp = torch.where(slot < m, lp_draft, lp_end)
    agree = (lp >= bar) & (slot <= m)
    run = agree.long().cumprod(1).sum(1)  # [L] slots accepted from slot 0
    sel = (slot < run[:, None]) & (m >= 0)
    return sel, tok, lp


def denoise_step(
    model: Any,
    canvas: Canvas,
    state: DenoiseState,
    steps_left: int | torch.Tensor,
    spec: StepSpec,
    noise: torch.Tensor | None = None,
    draft: DraftRows | None = None,
) -> DenoiseState:
    """One refinement step over the whole batch; pure (returns a new state).

    model: forward_hidden(ids [L,T], attention_mask [L,T] | None) -> (hidden [L,T,D], _),
    head(hidden [..., D]) -> logits [..., V]. noise: [L, N, V] uniform in [0, 1) when
    ``spec.temperature`` > 0 (at temperature > 0 the torch selection below always runs,
    whatever ``spec.select_impl`` says). ``steps_left``: an int, or [L] long (CUDA graphs).
    ``draft``: the first step of rows that verify a draft (module doc, *Drafts*): such a
    row also commits the draft's accepted run (the torch selection runs).
    No host synchronisation.
    """
    ids, masked, logp, steps = state
    hidden, _ = model.forward_hidden(ids, canvas.attn)
    src = canvas.hole_pos - 1 if spec.shift else canvas.hole_pos  # [L, N]
    src = src.clamp_min(0)
    h = hidden.gather(1, src[..., None].expand(-1, -1, hidden.shape[-1]))  # [L, N, D]
    rem = masked.sum(1)  # [L]
    if spec.block is None:
        elig = masked
        k = torch.div(rem + steps_left - 1, steps_left, rounding_mode="floor")
    else:
        elig, k = block_schedule(masked, canvas.valid, steps_left, spec.block, spec.total_steps,
                                 fixed=spec.threshold is None)
    hole = ids.gather(1, canvas.hole_pos)
    if spec.select_impl is not None and spec.temperature == 0 and draft is None:
        L, N = masked.shape
        new_masked = elig.clone()
        res = fused_select_unmask()(  # the logits in the model's dtype, read once
            model.head(h), hole, torch.arange(N, device=hole.device).expand(L, N), new_masked, k,
            spec.threshold, spec.strategy.value, ban=spec.mask_id, impl=spec.select_impl,
        )
        sel = res.selected
        logp = torch.where(sel, res.logp, logp)
        masked = masked & ~sel
    else:
        sc = score_slots(model.head, h, spec, noise, None if draft is None else draft_ids(draft))
        tok, score, tok_logp = sc.tok, sc.score, sc.logp
        if spec.threshold is not None:
            k = torch.maximum(k, ((score > spec.threshold) & elig).sum(1))
        score = score.masked_fill(~elig, float("-inf"))
        order = torch.sort(score, dim=1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(
            1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
        )
        sel = (rank < k[:, None]) & elig  # [L, N]
        if draft is not None:  # the draft's accepted run is committed too, as the draft wrote it
            dsel, dtok, dlp = accept_drafts(sc.top, sc.lp_draft, sc.lp_terms, draft, spec)
            dsel &= masked
            sel |= dsel
            tok = torch.where(dsel, dtok, tok)
            tok_logp = torch.where(dsel, dlp, tok_logp)
        hole = torch.where(sel, tok, hole)
        logp = torch.where(sel, tok_logp, logp)
        masked = masked & ~sel
    if spec.absorb_pad:
        is_term = torch.zeros_like(masked)
        for t in spec.terminators:
            is_term |= hole == t
        is_term &= canvas.valid & ~masked
        c = is_term.long().cumsum(1)
        after = (c - is_term.long()) > 0  # strictly after the first committed terminator
        after &= canvas.valid
        hole = torch.where(after, torch.full_like(hole, spec.pad_id), hole)
        logp = logp.masked_fill(after, 0.0)
        masked = masked & ~after
    ids = ids.scatter(1, canvas.hole_pos, hole)
    return DenoiseState(ids, masked, logp, steps + (rem > 0).long())
