"""Dual KV cache: reuse the prefix/suffix keys and values across denoising steps.

Between two steps of an infill only the hole changes (a few slots go from
[MASK] to a token); the prefix and the suffix -- usually >95% of the canvas --
stay the same. Their keys and values do move a little, because every position
attends to the hole, but slowly (Fast-dLLM, "dual cache": reuse them and
refresh every few steps; 3-11x faster at the same accuracy on LLaDA).

:class:`DualCache` wraps a model for :func:`diffill.model.decoder.step.denoise_step`
(:func:`cached_steps` hands it to the decode loop):

* on a *refresh* call (the first one, then every ``refresh_every`` calls) it
  runs the full canvas ``[L, T]`` with ``return_kv=True`` and keeps each
  layer's keys/values of the *context* positions (everything outside the
  active block) -- ``[L, Hkv, S, Dh]`` per layer, rotary already applied;
* on the other calls it runs only the *active block* ``[L, NB]`` -- the hole
  slots, plus the position just before the hole for ``shift_logits`` models,
  whose hidden state predicts slot 0 -- with ``ctx=KVContext(context kv)``
  and the block's absolute positions as position ids.

``refresh_every=1`` is exactly the uncached sampler (every call is a full
forward). Larger values trade some agreement with it for speed; ``diffill
bench`` and ``BENCHMARKS.md`` report both.

The wrapper returns hidden states shaped like the full canvas ``[L, T, D]``
so that the sampler's step is unchanged; on cached calls only the rows at the
active block are filled (the rest are zeros and are never read: the sampler
gathers the hole's source positions only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .config import ModelConfig
from .decoder.canvas import Canvas
from .decoder.loop import EagerSteps, InfillRequest, decode
from .decoder.spec import Infill, InfillCancelled, SamplerConfig, StepSpec
from .transformer import KVContext, Transformer, apply_rotary, rotary_cos_sin

ONCE = 1 << 30
"""A refresh period no request reaches: the context is computed at the first step only."""


def active_block(canvas: Canvas, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions recomputed on cached steps: (block_pos [L, NB] long, block_attn [L, NB] bool).

    Non-shift models: the hole slots (NB = N). Shift models: the position before
    slot 0 followed by the hole slots (NB = N + 1). Hole slots past a row's length
    (``valid`` False) sit on padding positions and are masked out as keys.
    """
    pos, valid = canvas.hole_pos, canvas.valid
    if not shift:
        return pos, valid
    before = pos[:, :1] - 1
    if bool((before < 0).any()):
        raise ValueError("a shift_logits canvas needs a token before the hole")
    return torch.cat((before, pos), 1), torch.cat((torch.ones_like(valid[:, :1]), valid), 1)


def context_positions(T: int, block_pos: torch.Tensor) -> torch.Tensor:
    """All canvas positions outside the block, in order: [L, T - NB] long."""
    L = block_pos.shape[0]
    in_block = torch.zeros(L, T, dtype=torch.bool, device=block_pos.device)
    in_block.scatter_(1, block_pos, True)
    if int(in_block.sum(1).min()) != block_pos.shape[1]:
        raise ValueError("block positions must be distinct within each row")
    cols = torch.arange(T, device=block_pos.device).expand(L, T)
    return cols[~in_block].view(L, T - block_pos.shape[1])


class DualCache:
    """Model wrapper with prefix/suffix KV reuse for one batch of canvases.

    Exposes ``forward_hidden(ids [L,T], attn [L,T]) -> (hidden [L,T,D], None)``,
    ``head`` and ``parameters`` -- what :func:`~diffill.model.decoder.step.denoise_step`
    needs. Each ``forward_hidden`` call is one step; calls 0, r, 2r, ... refresh.
    """

    def __init__(self, model: Any, canvas: Canvas, *, shift: bool, refresh_every: int) -> None:
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
        self.model = model
        self.refresh_every = refresh_every
        self.block_pos, self.block_attn = active_block(canvas, shift)
        T = canvas.ids.shape[1]
        self.ctx_pos = context_positions(T, self.block_pos)  # [L, S]
        # canvas.attn None = every position of every row is real (no masks at all, so
        # attention may take its mask-free fast kernels)
        self.ctx_mask = None if canvas.attn is None else canvas.attn.gather(1, self.ctx_pos)
        if canvas.attn is None:
            self.block_attn = None
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.calls = 0
        self.refreshes = 0
        self.shift = shift
        #: True / False forces the next calls to refresh / to run the block (CUDA-graph
        #: capture records each kind once); None follows the schedule
        self.force_refresh: bool | None = None

    def rebind(self, canvas: Canvas) -> None:
        """Point the cache at another canvas of the same shape, in place (so tensors
        captured in a CUDA graph stay valid). The context kv is stale until the next refresh."""
        block_pos, block_attn = active_block(canvas, self.shift)
        self.block_pos.copy_(block_pos)
        self.block_attn.copy_(block_attn)
        self.ctx_pos.copy_(context_positions(canvas.ids.shape[1], block_pos))
        self.ctx_mask.copy_(canvas.attn.gather(1, self.ctx_pos))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.head(hidden)

    def head_pieces(self, hidden: torch.Tensor) -> Any:
        """The model's ``head_pieces`` (None where it has none: a stand-in model)."""
        pieces = getattr(self.model, "head_pieces", None)
        return None if pieces is None else pieces(hidden)

    def parameters(self):
        return self.model.parameters()

    def _keep_context(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        k0 = kv[0][0]
        idx = self.ctx_pos[:, None, :, None].expand(-1, k0.shape[1], -1, k0.shape[3])
        self.kv = [(k.gather(2, idx), v.gather(2, idx)) for k, v in kv]

    def forward_hidden(self, ids: torch.Tensor, attn: torch.Tensor | None = None,
                       **_: Any) -> tuple[torch.Tensor, None]:
        """ids [L, T], attn [L, T] -> hidden [L, T, D] (only block rows filled on cached calls)."""
        refresh = self.kv is None or self.calls % self.refresh_every == 0
        if self.force_refresh is not None:
            refresh = self.force_refresh
        self.calls += 1
        if refresh:
            self.refreshes += 1
            hidden, kv = self.model.forward_hidden(ids, attn, return_kv=True)
            self._keep_context(kv)
            return hidden, None
        block_ids = ids.gather(1, self.block_pos)
        hb, _ = self.model.forward_hidden(block_ids, self.block_attn, position_ids=self.block_pos,
                                          ctx=KVContext(self.kv, self.ctx_mask))
        hidden = hb.new_zeros(ids.shape[0], ids.shape[1], hb.shape[-1])
        hidden.scatter_(1, self.block_pos[..., None].expand(-1, -1, hb.shape[-1]), hb)
        return hidden, None

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these canvas rows (e.g. after a request in a batch was cancelled)."""
        self.block_pos = self.block_pos[rows]
        self.block_attn = None if self.block_attn is None else self.block_attn[rows]
        self.ctx_pos = self.ctx_pos[rows]
        self.ctx_mask = None if self.ctx_mask is None else self.ctx_mask[rows]
        if self.kv is not None:
            self.kv = [(k[rows], v[rows]) for k, v in self.kv]


def cached_steps(model: Any, canvas: Canvas, spec: StepSpec, *, refresh_every: int) -> EagerSteps:
    """The decode loop's stepper with the dual cache: steps on a :class:`DualCache` around
    ``model``, which lets go of the rows the loop drops."""
    cache = DualCache(model, canvas, shift=spec.shift, refresh_every=refresh_every)
    return EagerSteps(cache, spec, on_drop=cache.select_rows)


@torch.inference_mode()
def infill_cached(
    model: Any,
    cfg: ModelConfig,
    prefix_ids: list[int],
    suffix_ids: list[int],
    sc: SamplerConfig,
    cancel: Callable[[], bool] | None = None,
    *,
    refresh_every: int = 4,
    dedup: bool = True,
    shared: bool = False,
    drafts: Sequence[Sequence[int]] = (),
) -> list[Infill]:
    """:func:`diffill.model.decoder.loop.infill` with the dual KV cache (same loop, rules and
    results format; with ``refresh_every=1`` the same tokens). ``shared``: one context per
    request (:class:`SharedContext`) instead of one per row."""
    if refresh_every < 1:
        raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
    make = shared_steps if shared else cached_steps
    req = InfillRequest(prefix_ids, suffix_ids, sc, cancel, tuple(tuple(d) for d in drafts))
    (res,) = decode(model, cfg, [req], dedup=dedup,
                    stepper=lambda cv, spec: make(model, cv, spec, refresh_every=refresh_every))
    if isinstance(res, InfillCancelled):
        raise res
    return res


# --------------------------------------------------------------------------- shared context


def context_groups(canvas: Canvas) -> torch.Tensor:
    """Per row, the row whose context keys/values it may share: [L] long.

    Rows share a context when their tokens outside the hole are the same -- same start,
    prefix, suffix and end, the hole starting at the same position (the candidate rows and
    the draft rows of one request). Within a group the representative is the row with the
    longest hole (the first one when several tie: the longest candidate, ahead of the drafts
    of that length). A row without a valid slot (a filler row) is its own group."""
    ids = canvas.ids.tolist()
    L, T = canvas.ids.shape
    lens = [T] * L if canvas.attn is None else canvas.attn.sum(1).tolist()
    n = canvas.valid.sum(1).tolist()
    start = canvas.hole_pos[:, 0].tolist()
    keys: list[tuple | None] = []
    best: dict[tuple, int] = {}
    for r in range(L):
        if n[r] == 0:
            keys.append(None)
            continue
        s, e = start[r], start[r] + n[r]
        key = (s, tuple(ids[r][:s]), tuple(ids[r][e:lens[r]]))
        keys.append(key)
        if key not in best or n[r] > n[best[key]]:
            best[key] = r
    keyed = [r if k is None else best[k] for r, k in enumerate(keys)]
    return torch.tensor(keyed, dtype=torch.long, device=canvas.ids.device)


def shift_keys(k: torch.Tensor, delta: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Rotary keys moved by ``delta`` positions: k [L, Hkv, S, Dh] (rotary applied at
    position p), delta [L, S] long -> the keys as if computed at p + delta (RoPE:
    R(p + d) k = R(d) R(p) k, exact for the rotation)."""
    cos, sin = rotary_cos_sin(delta, head_dim, theta, k.dtype)
    return apply_rotary(k, cos, sin)


class SharedContext(DualCache):
    """The dual cache with one context per request instead of one per row.

    The candidate rows and draft rows of a request (:func:`context_groups`) hold the same
    prefix and suffix; only the hole differs (its length and its tokens). On a refresh
    call only each group's representative row -- its longest hole -- runs the full canvas
    (``[R, T]``, R = requests); its context keys/values are handed to every row of the
    group, the keys re-rotated by the row's own offset (a row with a hole ``d`` slots
    shorter has its suffix ``d`` positions to the left: ``K(p - d) = R(-d) K(p)``), and
    the other rows run only their hole block against them. Cached calls are the dual
    cache's (every row's block against its context).

    Exact where a row's canvas equals its representative's (the draft rows at the
    verification step: all masked, the longest length); an approximation elsewhere, since
    the context's own states were computed next to the representative's hole, not the
    row's (measured: BENCHMARKS.md, *One context per request*). ``refresh_every=1`` still
    refreshes the context (one row per request) on every call.
    """

    def __init__(self, model: Any, canvas: Canvas, *, shift: bool, refresh_every: int,
                 groups: torch.Tensor | None = None) -> None:
        super().__init__(model, canvas, shift=shift, refresh_every=refresh_every)
        self.rep = context_groups(canvas) if groups is None else groups
        cfg = model.config
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta
        self.n_valid = canvas.valid.sum(1)
        self.shared_rows = 0  # rows that took a shared context on the last refresh
        #: after a refresh of a batch of one request: its representative row's canvas ids
        #: [T], context positions [S], first block position and per-layer context (k, v)
        #: [Hkv, S, Dh] (:mod:`diffill.model.reuse` keeps it for the document's next request)
        self.last_context: tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                 list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def _context_forward(self, ids: torch.Tensor, attn: torch.Tensor | None, reps: torch.Tensor,
                         ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The representatives' hidden states [R, T, D] and per-layer (k, v) [R, Hkv, T, Dh]
        on a refresh: their whole canvases (:class:`diffill.model.reuse.ReusedContext`
        computes them from a kept context instead). Only the context positions' k/v and
        the block positions' hidden states are read."""
        hr, kv = self.model.forward_hidden(ids[reps], None if attn is None else attn[reps],
                                           return_kv=True)
        return hr, kv

    def forward_hidden(self, ids: torch.Tensor, attn: torch.Tensor | None = None,
                       **_: Any) -> tuple[torch.Tensor, None]:
        refresh = self.kv is None or self.calls % self.refresh_every == 0
        if self.force_refresh is not None:
            refresh = self.force_refresh
        if not refresh:
            return super().forward_hidden(ids, attn)
        self.calls += 1
        self.refreshes += 1
        L = ids.shape[0]
        reps = torch.unique(self.rep)  # sorted
        hr, kv = self._context_forward(ids, attn, reps)
        # each row's context: its representative's, keys moved to the row's own positions
        where = torch.empty(L, dtype=torch.long, device=ids.device)
        where[reps] = torch.arange(reps.numel(), device=ids.device)
        src = where[self.rep]  # [L] index into the representatives' forward
        rep_ctx = self.ctx_pos[self.rep]  # [L, S] the representative's context positions
        delta = self.ctx_pos - rep_ctx
        k0 = kv[0][0]
        idx = rep_ctx[:, None, :, None].expand(-1, k0.shape[1], -1, k0.shape[3])
        moved = bool((delta != 0).any())
        one = reps.numel() == 1  # one request: every row's context is one gather, shared
        self.kv = []
        for k, v in kv:
            if one:  # its values (and keys not moved) are views of it, not a copy per row
                kc, vc = (t.gather(2, idx[:1]).expand(L, -1, -1, -1) for t in (k, v))
            else:
                kc, vc = k[src].gather(2, idx), v[src].gather(2, idx)
            if moved:
                kc = shift_keys(kc, delta, self.head_dim, self.theta)
            self.kv.append((kc, vc))
        others = (self.rep != torch.arange(L, device=ids.device)).nonzero().flatten()
        self.shared_rows = int(others.numel())
        if reps.numel() == 1:  # one request: what a later request of its document may reuse
            r = int(reps[0])
            self.last_context = (ids[r], self.ctx_pos[r], self.block_pos[r, 0],
                                 [(k[r], v[r]) for k, v in self.kv])
        hidden = hr.new_zeros(L, ids.shape[1], hr.shape[-1])
        hidden[reps] = hr
        del hr, kv, k, v  # the whole canvases' keys/values: only the gathered context is read
        if others.numel():
            bp = self.block_pos[others]
            a, n = int(others[0]), int(others.numel())
            rows = slice(a, a + n) if int(others[-1]) == a + n - 1 else others  # a range: views
            ctx = KVContext([(k[rows], v[rows]) for k, v in self.kv],
                            None if self.ctx_mask is None else self.ctx_mask[others])
            hb, _ = self.model.forward_hidden(
                ids[others].gather(1, bp), None if self.block_attn is None else self.block_attn[others],
                position_ids=bp, ctx=ctx)
            sub = hidden[others]
            sub.scatter_(1, bp[..., None].expand(-1, -1, hb.shape[-1]), hb)
            hidden[others] = sub
        return hidden, None

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these rows; a group whose representative went takes its longest
        remaining row as the next one (its context is that of the last refresh until then)."""
        old = self.rep[rows].tolist()
        n = self.n_valid[rows].tolist()
        super().select_rows(rows)
        self.n_valid = self.n_valid[rows]
        new: dict[int, int] = {}
        for i, g in enumerate(old):
            if g not in new or n[i] > n[new[g]]:
                new[g] = i
        kept = {int(r): i for i, r in enumerate(rows.tolist())}
        self.rep = torch.tensor([kept[g] if g in kept else new[g] for g in old],
                                dtype=torch.long, device=self.block_pos.device)


def shared_steps(model: Any, canvas: Canvas, spec: StepSpec, *, refresh_every: int,
                 groups: torch.Tensor | None = None) -> EagerSteps:
    """The decode loop's stepper with one context per request (:class:`SharedContext`;
    ``groups``: :func:`context_groups` of ``canvas`` when already known)."""
    cache = SharedContext(model, canvas, shift=spec.shift, refresh_every=refresh_every,
                          groups=groups)
    return EagerSteps(cache, spec, on_drop=cache.select_rows)


def supports_shared_context(model: Any) -> bool:
    """Whether ``model`` takes a :class:`KVContext` and position ids (the Transformer does;
    a stand-in model in a test may not)."""
    return isinstance(model, Transformer) or bool(getattr(model, "supports_kv_context", False))
