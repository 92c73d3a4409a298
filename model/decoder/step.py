"""One refinement step, :func:`denoise_step` (package doc, *Refinement*): the scores of the
hole slots (:func:`token_scores`, read in pieces by :func:`score_slots`), the
semi-autoregressive block schedule, the fused select-and-unmask kernel's entry, and draft
verification (:func:`accept_drafts`; :func:`verify_drafts` on whole logits is its
reference). Pure tensor code without host synchronisation, so a step can be compiled and
captured in a CUDA graph."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from ..quant import PACK_ROWS
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
box); 3 x 32 in two and 3 x 64 in four were no slower than one piece. Where the head comes by
vocabulary pieces (a CPU: ``Transformer.head_pieces``) the bound holds a slot piece's logits for
one vocabulary piece instead (up to 1024 slots a piece), and no whole-vocabulary row is held."""


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
                max_bytes: int = SCORE_BYTES,
                pieces: Callable[[torch.Tensor], Iterator[tuple[int, torch.Tensor]] | None] | None = None,
                ) -> SlotScores:
    """:func:`token_scores` of ``head(h)`` (h [L, N, D]; the mask id banned), computed over the
    slots in pieces of at most ``max_bytes`` of fp32 logits (``spec.vocab`` wide; 0: one
    piece), so the whole ``[L, N, V]`` is never held. Each slot's scores depend on its own
    logits only, so the pieces give what one piece gives (the reference: ``max_bytes`` larger
    than the batch). ``draft_ids`` [L, N]: the token whose log-prob each slot reports for
    :func:`accept_drafts` (drafts only).

    ``pieces``: the head by vocabulary pieces (``Transformer.head_pieces``: hidden -> (first id,
    logits [c, at most PACK_ROWS]) in order, or None where the head is one piece). Then the
    scores are read as the pieces come (:func:`_streamed_scores`, an online log-sum-exp): no
    ``[slots, V]`` logits or log-probs are held at all, and the slot pieces are sized by the
    vocabulary piece (the head's weights are read once per slot piece)."""
    L, N, D = h.shape
    flat = h.reshape(L * N, D)
    nz = None if noise is None else noise.reshape(L * N, -1)
    ds = None if draft_ids is None else draft_ids.reshape(L * N)
    terms = torch.tensor(spec.terminators, device=h.device) if ds is not None else None
    parts: list[tuple[torch.Tensor, ...]] = []
    size = max(1, max_bytes // (4 * spec.vocab)) if spec.vocab > 0 else L * N
    streams = pieces is not None and pieces(flat[:0]) is not None  # (no slot: nothing computed)
    if streams:
        size = max(size, max_bytes // (4 * PACK_ROWS))
    start = 0
    while start < L * N:
        stop = min(start + size, L * N)
        x = flat[start:stop]
        nzc = None if nz is None else nz[start:stop]
        dsc = None if ds is None else ds[start:stop]
        if streams:
            parts.append(_streamed_scores(pieces(x), spec, nzc, dsc, terms))
        else:
            logits = head(x).float()  # [c, V]
            logits[:, spec.mask_id] = float("-inf")
            tok, score, lp, logp_all = _token_scores(logits, spec.strategy, spec.temperature, nzc)
            part: tuple[torch.Tensor, ...] = (tok, score, lp)
            if dsc is not None and terms is not None:
                part += (logp_all.max(-1).values, logp_all.gather(-1, dsc[:, None])[:, 0],
                         logp_all.index_select(-1, terms))
            parts.append(part)
            del logits, logp_all
        start = stop
    cols = [torch.cat(c) for c in zip(*parts, strict=True)]
    shaped = [c.reshape(L, N, *c.shape[1:]) for c in cols]
    return SlotScores(*shaped)


_FLOOR = -1e30
"""The running maxima's start (finite: rescaling by ``exp(m_old - m_new)`` never meets
``-inf - -inf``); every real logit is above it."""


def _streamed_scores(stream: Iterator[tuple[int, torch.Tensor]], spec: StepSpec,
                     noise: torch.Tensor | None, ds: torch.Tensor | None,
                     terms: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """:func:`_token_scores` (and the draft columns of :func:`score_slots`) of c slots from
    their logits in vocabulary pieces, read once each as they come: running maxima and
    rescaled sums of exponentials (the log-sum-exp of the logits, and of the tempered logits
    at temperature > 0), the running best of the selection logits (the argmax; at temperature
    > 0 the logits / T plus Gumbel noise), the two best tempered logits (margin) and the
    rescaled sum of ``exp(l - m) * l`` (entropy). The same values as the whole tensors up to
    rounding; ties go to the lowest id, as ``argmax`` does (a later piece must beat, not
    equal). ``noise`` [c, V]; ``ds`` [c] draft ids; ``terms`` [K] terminator ids."""
    strategy, temp, mask_id = spec.strategy, spec.temperature, spec.mask_id
    assert temp == 0 or noise is not None, "temperature > 0 needs noise"
    entropy = strategy is Strategy.ENTROPY
    raw: _Sums | None = None  # of the logits
    tempered: _Sums | None = None  # of the logits / T (temperature > 0; else ``raw``)
    best = tok = raw_tok = q_tok = top1 = top2 = lp_draft = lp_terms = None
    for lo, piece in stream:
        z = piece.float()
        n = z.shape[1]
        if lo <= mask_id < lo + n:
            z[:, mask_id - lo] = float("-inf")
        z = z.clamp_min(_FLOOR)  # the banned id too: exp(_FLOOR - m) is 0 all the same
        q = z / temp if temp > 0 else z
        sel = q + _gumbel(noise[:, lo:lo + n]) if noise is not None and temp > 0 else q
        bv, bi = sel.max(1)
        if best is None:
            best, tok = bv, bi + lo
            raw_tok, q_tok = z.gather(1, bi[:, None])[:, 0], q.gather(1, bi[:, None])[:, 0]
        else:
            win = bv > best  # ties: the earlier piece's id, the lowest
            best, tok = torch.where(win, bv, best), torch.where(win, bi + lo, tok)
            raw_tok = torch.where(win, z.gather(1, bi[:, None])[:, 0], raw_tok)
            q_tok = torch.where(win, q.gather(1, bi[:, None])[:, 0], q_tok)
        zmax = z.max(1).values if sel is not z else bv  # greedy: the argmax's value is the max
        raw = _fold(raw, z, zmax, entropy and temp == 0)
        if temp > 0:  # dividing by T > 0 keeps the maximum element: max(z) / T is max(z / T)
            tempered = _fold(tempered, q, zmax / temp, entropy)
        if strategy is Strategy.MARGIN:
            k = min(2, n)
            pv = q.topk(k, dim=1).values
            cand = pv if top1 is None else torch.cat((top1[:, None], top2[:, None], pv), 1)
            if cand.shape[1] < 2:
                cand = torch.cat((cand, torch.full_like(cand, _FLOOR)), 1)
            two = cand.topk(2, dim=1).values
            top1, top2 = two[:, 0], two[:, 1]
        if ds is not None:
            here = (ds >= lo) & (ds < lo + n)
            got = z.gather(1, (ds - lo).clamp(0, n - 1)[:, None])[:, 0]
            lp_draft = torch.where(here, got, got.new_full(got.shape, _FLOOR) if lp_draft is None
                                   else lp_draft)
        if terms is not None:
            here_t = (terms >= lo) & (terms < lo + n)
            got_t = z.index_select(1, (terms - lo).clamp(0, n - 1))
            lp_terms = torch.where(here_t[None], got_t, got_t.new_full(got_t.shape, _FLOOR)
                                   if lp_terms is None else lp_terms)
    assert raw is not None and tok is not None, "a head with no vocabulary"
    tempered = raw if tempered is None else tempered
    lse = raw.m + torch.log(raw.s)
    lq = tempered.m + torch.log(tempered.s)
    if strategy is Strategy.CONFIDENCE:
        score = torch.exp(q_tok - lq)
    elif strategy is Strategy.MARGIN:
        score = torch.exp(top1 - lq) - torch.exp(top2 - lq)
    elif strategy is Strategy.ENTROPY:
        score = torch.exp(tempered.t / tempered.s - lq)  # exp(sum q log q) = exp(-H)
    else:  # pragma: no cover
        raise ValueError(f"unknown strategy {strategy}")
    out: tuple[torch.Tensor, ...] = (tok, score, raw_tok - lse)
    if ds is not None and terms is not None:
        out += (raw.m - lse, lp_draft - lse, lp_terms - lse[:, None])
    return out


class _Sums(NamedTuple):
    """Running over vocabulary pieces, per slot: the maximum ``m``, the sum of exp(l - m)
    ``s`` and (entropy only, else None) the sum of exp(l - m) * l ``t``."""

    m: torch.Tensor
    s: torch.Tensor
    t: torch.Tensor | None


def _fold(acc: _Sums | None, z: torch.Tensor, zmax: torch.Tensor, weighted: bool) -> _Sums:
    """``acc`` with the piece z [c, n] (its row maxima ``zmax``) folded in: one exp per logit,
    the sums so far rescaled to the new maximum."""
    m = zmax if acc is None else torch.maximum(acc.m, zmax)
    e = torch.exp(z - m[:, None])
    s, t = e.sum(1), (e * z).sum(1) if weighted else None
    if acc is None:
        return _Sums(m, s, t)
    r = torch.exp(acc.m - m)
    return _Sums(m, acc.s * r + s, None if t is None else acc.t * r + t)


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
        sc = score_slots(model.head, h, spec, noise, None if draft is None else draft_ids(draft),
                         pieces=getattr(model, "head_pieces", None))
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
