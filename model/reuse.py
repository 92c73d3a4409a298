"""A document's context keys/values, kept from one request to the next (reuse across keystrokes).

Between two completion requests in an editor the context barely changes: a character was
typed, so the prefix grew by a token or two (or its last token was re-tokenized) and the
suffix is what it was. With one context per request (:class:`~diffill.model.cache.SharedContext`)
a request's first call computes the whole canvas of its longest row -- on a CPU most of a
request's cost when the steps are few. Here the engine keeps, per document (an opaque key the
caller gives: ``InfillRequest.context_key``), the context keys/values of the last request's
representative row (:class:`Kept`), and the next request of that document starts from them:

* the new context is matched against the kept one (:func:`match_runs`): the longest common
  start and end of the prefix part and of the suffix part, with :mod:`difflib` for what is
  left in between (an edit inside the window, a window start that slid);
* tokens found are *reused*: their keys/values as kept, the keys re-rotated to the positions
  the tokens now sit at (RoPE: ``K(p + d) = R(d) K(p)``, exact for the rotation);
* the tokens not found (the ones typed, usually 1-3) are *recomputed*: they run with the
  hole's slots as one block against the reused keys/values in the request's first call
  (:class:`ReusedContext`), and join the context for the calls after it;
* the request's later calls run only the hole's block against that context, with no
  refresh inside the request.

An approximation, for a bidirectional model: a reused token's states were computed next to
the previous request's tokens (its prefix one or two tokens shorter, its hole), and the
context is not refreshed while the request runs. So the policy bounds how stale it may get
(:class:`ReusePolicy`): more than ``far`` context tokens to recompute, or ``full_every``
reuses in a row, and the request computes its context in full instead (as without reuse),
which the next one reuses again. The agreement with the exact path was measured on held-out
tasks, the defaults chosen from it (BENCHMARKS.md, *Reuse across keystrokes*).
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .cache import ONCE, SharedContext, active_block, context_positions, shift_keys
from .decoder.canvas import Canvas
from .transformer import KVContext

MIN_RUN = 4
"""Shortest run of tokens reused from the middle of a window (:func:`match_runs`); the
runs at the very start and end of a part are taken at any length."""


@dataclass(frozen=True)
class ReusePolicy:
    """When a kept context may be reused: at most ``far`` context tokens recomputed, and at
    most ``full_every`` reuses in a row before a request computes its context in full."""

    far: int = 32
    full_every: int = 8

    def __post_init__(self) -> None:
        if self.far < 0 or self.full_every < 0:
            raise ValueError("ReusePolicy: far and full_every must be >= 0")


@dataclass
class Kept:
    """One document's context from its last request: the representative row's context
    tokens before its block (``prefix``, the start tokens included) and after it
    (``suffix``, the end tokens included; ``suffix[0]`` at canvas position ``suffix_at``),
    and per layer its context (k, v) [Hkv, len(prefix) + len(suffix), Dh] in that order,
    keys rotated to those positions. ``reuses``: requests served from it since its context
    was last computed in full."""

    prefix: list[int]
    suffix: list[int]
    suffix_at: int
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    reuses: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


@dataclass(frozen=True)
class ReusePlan:
    """How a request's context comes from a :class:`Kept` one: canvas positions ``reused``
    [R] taking kept entries ``source`` [R] (keys moved by ``reused - old positions``,
    ``delta`` [R]), and canvas positions ``recomputed`` [C]."""

    reused: torch.Tensor
    source: torch.Tensor
    delta: torch.Tensor
    recomputed: torch.Tensor


def _common_start(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def match_runs(old: Sequence[int], new: Sequence[int], min_run: int = MIN_RUN,
               ) -> list[tuple[int, int, int]]:
    """Runs ``(new_start, old_start, length)`` of ``new`` that equal ``old`` at
    ``old_start``, in order and not overlapping: the common start and the common end (any
    length; the usual keystroke leaves nothing else), and between them
    :class:`difflib.SequenceMatcher`'s matching blocks of ``min_run`` tokens or more."""
    a = _common_start(old, new)
    rest = min(len(old), len(new)) - a
    z = _common_start(old[::-1][:rest], new[::-1][:rest])
    runs: list[tuple[int, int, int]] = [(0, 0, a)] if a else []
    mid_old, mid_new = old[a:len(old) - z], new[a:len(new) - z]
    if mid_old and mid_new:
        sm = difflib.SequenceMatcher(None, mid_old, mid_new, autojunk=False)
        runs += [(a + j, a + i, n) for i, j, n in sm.get_matching_blocks() if n >= min_run]
    if z:
        runs.append((len(new) - z, len(old) - z, z))
    return runs


def plan_reuse(kept: Kept, prefix: Sequence[int], suffix: Sequence[int], suffix_at: int,
               policy: ReusePolicy, device: torch.device | str = "cpu") -> ReusePlan | None:
    """The plan for a new context (its tokens before and after the block, ``suffix[0]`` at
    ``suffix_at``), or None when the policy says compute it in full: ``full_every`` reuses
    already, more than ``far`` tokens to recompute, or nothing to reuse."""
    if kept.reuses >= policy.full_every:
        return None
    reused: list[int] = []
    source: list[int] = []
    delta: list[int] = []
    covered_pre = [False] * len(prefix)
    for nb, ob, n in match_runs(kept.prefix, prefix):
        for i in range(n):
            reused.append(nb + i)
            source.append(ob + i)
            delta.append(nb - ob)
            covered_pre[nb + i] = True
    covered_suf = [False] * len(suffix)
    base = len(kept.prefix)
    for nb, ob, n in match_runs(kept.suffix, suffix):
        for i in range(n):
            reused.append(suffix_at + nb + i)
            source.append(base + ob + i)
            delta.append((suffix_at + nb) - (kept.suffix_at + ob))
            covered_suf[nb + i] = True
    recomputed = [p for p, c in enumerate(covered_pre) if not c]
    recomputed += [suffix_at + i for i, c in enumerate(covered_suf) if not c]
    if not reused or len(recomputed) > policy.far:
        return None
    t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return ReusePlan(t(reused), t(source), t(delta), t(recomputed))


def context_parts(ids: torch.Tensor, ctx_pos: torch.Tensor, block_start: int,
                  ) -> tuple[list[int], list[int], int]:
    """A row's context tokens before and after its block (``ids`` [T] canvas ids,
    ``ctx_pos`` [S] its context positions) and the position of the first one after."""
    pos = ctx_pos.tolist()
    tok = ids[ctx_pos].tolist()
    cut = next((i for i, p in enumerate(pos) if p > block_start), len(pos))
    return tok[:cut], tok[cut:], (pos[cut] if cut < len(pos) else len(pos) + 1)


class ReusedContext(SharedContext):
    """:class:`SharedContext` for a batch of one request whose context comes from a kept
    one (:func:`plan_reuse`): the first call runs the recomputed context tokens and the
    representative row's block against the reused keys/values and hands the context to the
    request's rows as a refresh would; the later calls run only the blocks (no refresh)."""

    def __init__(self, model: Any, canvas: Canvas, *, shift: bool, kept: Kept, plan: ReusePlan,
                 groups: torch.Tensor | None = None) -> None:
        super().__init__(model, canvas, shift=shift, refresh_every=ONCE, groups=groups)
        if torch.unique(self.rep).numel() != 1:
            raise ValueError("a reused context serves a batch of one request")
        self.kept, self.plan = kept, plan

    def _context_forward(self, ids: torch.Tensor, attn: torch.Tensor | None, reps: torch.Tensor,
                         ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        # the only refresh (period ONCE): the first call
        r = int(reps[0])
        plan = self.plan
        ext = torch.cat((plan.recomputed, self.block_pos[r]))  # [E] canvas positions
        moved = bool((plan.delta != 0).any())
        ctx = []
        for k, v in self.kept.kv:
            k_old, v_old = k[:, plan.source][None], v[:, plan.source][None]  # [1, Hkv, R, Dh]
            if moved:
                k_old = shift_keys(k_old, plan.delta[None], self.head_dim, self.theta)
            ctx.append((k_old, v_old))
        ext_mask = None if self.block_attn is None else torch.cat(
            (torch.ones_like(plan.recomputed, dtype=torch.bool), self.block_attn[r]))[None]
        he, kve = self.model.forward_hidden(ids[r, ext][None], ext_mask, position_ids=ext[None],
                                            ctx=KVContext(ctx), return_kv=True)
        T = ids.shape[1]
        hidden = he.new_zeros(1, T, he.shape[-1])
        hidden[0, ext] = he[0]
        kv = []
        for (k_old, v_old), (k_new, v_new) in zip(ctx, kve, strict=True):
            kf = k_new.new_zeros(1, k_new.shape[1], T, k_new.shape[3])
            vf = v_new.new_zeros(1, v_new.shape[1], T, v_new.shape[3])
            kf[:, :, plan.reused], vf[:, :, plan.reused] = k_old, v_old
            kf[:, :, ext], vf[:, :, ext] = k_new, v_new
            kv.append((kf, vf))
        return hidden, kv


class ContextStore:
    """The kept contexts of the last ``size`` documents (least recently used goes first)."""

    def __init__(self, size: int = 4, policy: ReusePolicy | None = None) -> None:
        self.size = size
        self.policy = policy if policy is not None else ReusePolicy()
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self.reused = 0  # requests whose context came from a kept one
        self.computed = 0  # requests with a key that computed their context in full
        self.recomputed_tokens = 0  # context tokens recomputed by the reusing requests

    def get(self, key: str) -> Kept | None:
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
        return kept

    def plan(self, key: str, canvas: Canvas, shift: bool, groups: torch.Tensor,
             ) -> tuple[Kept | None, ReusePlan | None]:
        """The kept context of document ``key`` and the plan for ``canvas`` (a batch of one
        request; ``groups``: its :func:`~diffill.model.cache.context_groups`) to start from
        it, or (kept, None) when it must be computed in full; counted in :meth:`stats`."""
        kept = self.get(key)
        plan = None
        if kept is not None:
            r = int(groups[0])  # one request: every row's representative
            block, _ = active_block(canvas.rows(groups[:1]), shift)
            ctx_pos = context_positions(canvas.ids.shape[1], block)[0]
            prefix, suffix, at = context_parts(canvas.ids[r], ctx_pos, int(block[0, 0]))
            plan = plan_reuse(kept, prefix, suffix, at, self.policy, canvas.ids.device)
        if plan is None:
            self.computed += 1
        else:
            self.reused += 1
            self.recomputed_tokens += int(plan.recomputed.numel())
        return kept, plan

    def put(self, key: str, shared: SharedContext, *, reused: bool) -> None:
        """Keep the context ``shared`` last handed out (nothing when it has none)."""
        if shared.last_context is None or self.size <= 0:
            return
        ids, ctx_pos, start, kv = shared.last_context
        prefix, suffix, suffix_at = context_parts(ids, ctx_pos, int(start))
        prev = self._kept.get(key)
        reuses = (prev.reuses + 1) if (reused and prev is not None) else 0
        copy = [(k.contiguous().clone(), v.contiguous().clone()) for k, v in kv]
        self._kept[key] = Kept(prefix, suffix, suffix_at, copy, reuses)
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def drop(self, key: str) -> None:
        self._kept.pop(key, None)

    def stats(self) -> dict[str, int]:
        return {"context_reused": self.reused, "context_computed": self.computed,
                "context_recomputed_tokens": self.recomputed_tokens,
                "context_kept_bytes": sum(k.nbytes for k in self._kept.values())}
