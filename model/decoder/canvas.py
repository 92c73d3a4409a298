"""The canvas ``start prefix [MASK]*n suffix end`` (package doc, *Canvas*): its tokens, a
batch of them padded to one shape (:class:`Canvas`, :func:`build_canvas`, :func:`pad_canvas`,
:func:`stack_canvases`) and the loop's state over it (:class:`DenoiseState`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ..config import ModelConfig
from .spec import SpecialIds


def canvas_start(cfg: ModelConfig, n_prefix: int) -> list[int]:
    """The ids put before the prefix: the recipe's start ([BOS] without a recipe), or for
    a shift model with neither start nor prefix, the lead token (so hole slot 0 has a
    position to be read from)."""
    sp = SpecialIds.from_config(cfg)
    if sp.start:
        return list(sp.start)
    if cfg.shift_logits and n_prefix == 0 and sp.lead is not None:
        return [sp.lead]
    return []


def canvas_end(cfg: ModelConfig) -> list[int]:
    """The ids put after the suffix: the recipe's end ([EOS] without a recipe)."""
    return list(SpecialIds.from_config(cfg).end)


def canvas_length(cfg: ModelConfig, n_prefix: int, n_suffix: int, n_hole: int) -> int:
    """Length of the canvas ``start prefix [MASK]*n suffix end``."""
    return len(canvas_start(cfg, n_prefix)) + n_prefix + n_hole + n_suffix + len(canvas_end(cfg))


class Canvas(NamedTuple):
    """Batched canvases of L rows (N = max hole length).

    ids [L, T] long, attn [L, T] bool (True = real token; None = every position of every
    row is real, so attention may take its mask-free kernels), hole_pos [L, N] long
    (canvas position of hole slot j; slots j >= n_r point at unique padding positions of
    row r), valid [L, N] bool (j < n_r).
    """

    ids: torch.Tensor
    attn: torch.Tensor | None
    hole_pos: torch.Tensor
    valid: torch.Tensor

    def rows(self, idx: torch.Tensor) -> Canvas:
        """These rows only (idx [L'] long)."""
        return Canvas(*(None if t is None else t[idx] for t in self))


class DenoiseState(NamedTuple):
    """Loop state. ids [L, T]; masked [L, N] bool (valid and still masked);
    logp [L, N] commit-time log-prob (0 where not committed); steps [L] long
    (steps run while the row still had masked slots)."""

    ids: torch.Tensor
    masked: torch.Tensor
    logp: torch.Tensor
    steps: torch.Tensor

    def rows(self, idx: torch.Tensor) -> DenoiseState:
        return DenoiseState(*(t[idx] for t in self))


def initial_state(cv: Canvas) -> DenoiseState:
    """Every valid slot masked, nothing committed. (A row whose slots start pre-filled --
    a draft to verify -- is a state whose ``ids`` hold the tokens and whose ``masked`` is
    False there; the loop takes any such state.)"""
    L, N = cv.valid.shape
    dev = cv.ids.device
    return DenoiseState(cv.ids, cv.valid.clone(), torch.zeros((L, N), dtype=torch.float32, device=dev),
                        torch.zeros((L,), dtype=torch.long, device=dev))


def build_canvas(
    cfg: ModelConfig,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    lengths: Sequence[int],
    device: torch.device | str = "cpu",
) -> Canvas:
    sp = SpecialIds.from_config(cfg)
    start = canvas_start(cfg, len(prefix_ids))
    head = start + list(prefix_ids)
    tail = list(suffix_ids) + list(sp.end)
    s = len(head)
    n_max = max(lengths)
    T = s + n_max + len(tail)
    L = len(lengths)
    ids = torch.full((L, T), sp.pad, dtype=torch.long)
    attn = torch.zeros((L, T), dtype=torch.bool)
    hole_pos = torch.empty((L, n_max), dtype=torch.long)
    valid = torch.zeros((L, n_max), dtype=torch.bool)
    head_t = torch.tensor(head, dtype=torch.long)
    tail_t = torch.tensor(tail, dtype=torch.long)
    for r, n in enumerate(lengths):
        row = torch.cat((head_t, torch.full((n,), sp.mask, dtype=torch.long), tail_t))
        ids[r, : row.numel()] = row
        attn[r, : row.numel()] = True
        hole_pos[r, :n] = torch.arange(s, s + n)
        # the row is n_max - n shorter than T: its padding tail hosts the unused slots
        hole_pos[r, n:] = torch.arange(row.numel(), row.numel() + n_max - n)
        valid[r, :n] = True
    return Canvas(ids.to(device), attn.to(device), hole_pos.to(device), valid.to(device))


def pad_canvas(cv: Canvas, pad_id: int, T: int, N: int | None = None, L: int | None = None) -> Canvas:
    """Pad a canvas to T columns, N slots, L rows.

    New columns are padding (attention mask False). New slots are invalid and
    sit on fresh padding columns, so ``T`` must leave room: ``T >= T0 + (N - N0)``.
    New rows hold one real token (so that no attention row is empty) and no valid slot.
    """
    L0, T0 = cv.ids.shape
    N0 = cv.hole_pos.shape[1]
    N = N0 if N is None else N
    L = L0 if L is None else L
    if T < T0 + (N - N0) or N < N0 or L < L0:
        raise ValueError(f"cannot pad canvas [{L0}, {T0}] with {N0} slots to [{L}, {T}] with {N}")
    dev = cv.ids.device
    ids = torch.full((L, T), pad_id, dtype=cv.ids.dtype, device=dev)
    attn = torch.zeros((L, T), dtype=torch.bool, device=dev)
    hole_pos = torch.empty((L, N), dtype=torch.long, device=dev)
    valid = torch.zeros((L, N), dtype=torch.bool, device=dev)
    ids[:L0, :T0] = cv.ids
    attn[:L0, :T0] = True if cv.attn is None else cv.attn
    hole_pos[:L0, :N0] = cv.hole_pos
    valid[:L0, :N0] = cv.valid
    if N > N0:
        hole_pos[:L0, N0:] = torch.arange(T0, T0 + N - N0, device=dev)
    if L > L0:
        attn[L0:, 0] = True
        hole_pos[L0:] = torch.arange(T - N, T, device=dev)
    return Canvas(ids, attn, hole_pos, valid)


def stack_canvases(cvs: Sequence[Canvas], pad_id: int,
                   shape: Callable[[int, int, int], tuple[int, int, int]] | None = None) -> Canvas:
    """Pad every request's canvas to one shape and stack the rows. ``shape(L, T, N)`` may
    round the natural shape up (the engine's shape buckets); rows added at the end are
    filler (:func:`pad_canvas`)."""
    N = max(c.hole_pos.shape[1] for c in cvs)
    T = max(c.ids.shape[1] + N - c.hole_pos.shape[1] for c in cvs)
    L = sum(c.ids.shape[0] for c in cvs)
    Lb, T, N = shape(L, T, N) if shape is not None else (L, T, N)
    cv = Canvas(*(torch.cat(ts, 0) for ts in zip(*(pad_canvas(c, pad_id, T, N) for c in cvs),
                                                    strict=True)))
    return pad_canvas(cv, pad_id, T, N, Lb) if Lb > L else cv
