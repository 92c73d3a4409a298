"""The second decoder: DreamOn's variable-length infilling, the expand / delete
length-control states (the first, :mod:`.loop`, decodes a hole of fixed length).

DreamOn (DreamLM/DreamOn; checkpoint Dream-org/DreamOn-v0-7B, built on Dream-Coder 7B;
arXiv 2602.01326) adds two tokens to the vocabulary and trains the model to predict
them at masked slots. While denoising, a slot committed as

* ``<|expand|>`` becomes two masked slots (the hole grows by one), and
* ``<|delete|>`` is removed (the hole shrinks by one),

so a hole that starts too short grows and one that starts too long shrinks: the model
finds the middle's length itself instead of being told it (which is what closes the
gap between fixed-length and oracle-length HumanEval-Infilling scores).

The decoding below follows the paper and the repository's description; it reuses the
first decoder's pieces (:class:`~.spec.SpecialIds`, :func:`~.canvas.canvas_start`,
:func:`~.step.token_scores`, the trimming and ranking of candidates, :func:`~.loop.trim_middle`
and :func:`~.loop.rank_candidates`). Per step, for
every row of the batch (one row per candidate starting length, right-padded, one
forward):

1. logits at every masked hole slot (read at ``p - 1`` for a shift model; the mask id is
   never predicted); ``<|expand|>`` is forbidden while the row's hole already has
   ``cap`` slots or its expand budget is spent;
2. the row commits its ``k`` most confident masked slots (ties: leftmost first), ``k`` =
   ``DreamOnConfig.transfer`` (1, the setting DreamOn was tested with), at least
   ``ceil(masked / steps_left)`` while ``SamplerConfig.steps`` has steps left, plus every
   slot above ``SamplerConfig.threshold`` in threshold mode;
3. with ``absorb_pad`` (DreamOn's ``pad_delete_to_right``): once a ``<|delete|>`` or a
   terminator is committed at slot ``j``, every still-masked slot after ``j`` is removed;
4. length control, right to left: committed ``<|delete|>`` slots are removed, committed
   ``<|expand|>`` slots become two masks (one expand costs one unit of the budget; masked
   slots past ``cap`` are dropped from the right);
5. stop when no row has a masked slot. Every step commits at least one slot and an
   expand spends budget, so a row ends within ``n + 2 * budget`` steps; and never after
   ``SamplerConfig.steps`` steps, the count the engine's step plan decided (as for any
   request): at the last of them ``<|expand|>`` is forbidden and ``k`` is every masked slot,
   so the hole is complete when the steps run out.

The engine's step plan prices a DreamOn step as what it runs: a full forward of every row's
whole canvas, no cache and no shared context (:meth:`~diffill.model.plan.StepPlan.choice_for`,
``whole_canvases``).

What it shares with the first decoder's loop (:func:`~.loop.run_steps`) and what not: it
takes the same requests (:class:`~.loop.InfillRequest`) and answers them the same way (per
request its candidates or its :class:`~.spec.InfillCancelled`); it batches the rows of
several requests (:func:`decode_dreamon`; the engine hands it a group of requests as it
hands the loop one, through :func:`decode_dreamon_with_drafts`, which verifies their drafts
first); each request's cancel callback is asked before every step and a
cancelled request's rows go while the others go on, as there; the candidates are trimmed
and ranked by the same functions (:func:`~.loop.trim_middle`, :func:`~.loop.rank_candidates`).
The loop's :class:`~.canvas.Canvas`, :class:`~.loop.Rows` and steppers are not used: they
hold a batch of fixed shape (hole slots at fixed canvas positions), which is what lets the
dual cache, the shared context and CUDA graphs run a step, and a DreamOn hole changes length
every step, moving the suffix; so each step rebuilds its canvases in Python and runs the
plain model.

The middle is the hole up to its first terminator; the score is the mean commit-time
log-probability over the middle and its terminator, as in the first decoder.
:func:`infill_dreamon_reference` is the slow, one-row, full-forward version the fast
path is tested against.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from ..config import ModelConfig
from .canvas import canvas_end, canvas_start
from .loop import InfillRequest, rank_candidates, trim_middle
from .spec import (
    Infill,
    InfillCancelled,
    SamplerConfig,
    SpecialIds,
    candidate_lengths,
    model_device,
    seed_for,
)
from .step import token_scores

MASKED = -1  # a hole slot not yet committed (kept apart from every token id)


@dataclass(frozen=True)
class DreamOnConfig:
    transfer: int = 1  # slots committed per step (DreamOn's number_transfer_tokens)
    cap: int | None = None  # longest hole (None: the largest candidate length)
    budget: int | None = None  # expands allowed per row (None: 2 * cap, DreamOn's default)

    def __post_init__(self) -> None:
        if self.transfer < 1:
            raise ValueError(f"DreamOnConfig.transfer must be >= 1, got {self.transfer}")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"DreamOnConfig.cap must be >= 1, got {self.cap}")
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"DreamOnConfig.budget must be >= 0, got {self.budget}")


@dataclass
class _Row:
    """One candidate's hole: committed ids or MASKED, the commit log-probs, its budget."""

    n0: int
    hole: list[int]
    logp: list[float]
    budget: int
    steps: int = 0
    gen: torch.Generator | None = None
    owner: int = 0  # the request it belongs to (:func:`decode_dreamon`)

    @property
    def masked(self) -> int:
        return sum(1 for t in self.hole if t == MASKED)


def length_control_ids(cfg: ModelConfig) -> tuple[int, int] | None:
    """(expand, delete) ids when the checkpoint's recipe carries them, else None."""
    r = getattr(cfg, "recipe", None)
    if r is None or r.expand is None or r.delete is None:
        return None
    return r.expand, r.delete


def _k(row: _Row, dc: DreamOnConfig, sc: SamplerConfig, step: int) -> int:
    left = sc.steps - step
    k = dc.transfer
    if left > 0:
        k = max(k, math.ceil(row.masked / left))
    return k


def _no_expand(row: _Row, cap: int, sc: SamplerConfig, step: int) -> bool:
    """``<|expand|>`` is forbidden: the hole is at its cap, the row's expand budget is spent,
    or this is the last step the request has (module doc, 5)."""
    return len(row.hole) >= cap or row.budget <= 0 or step >= sc.steps - 1


def _commit(
    row: _Row,
    preds: dict[int, tuple[int, float, float]],
    k: int,
    threshold: float | None,
    sp: SpecialIds,
    expand: int,
    delete: int,
    absorb: bool,
    cap: int,
) -> None:
    """Steps 2-4 of the module doc for one row; ``preds``: slot -> (token, score, logp)."""
    if threshold is not None:
        k = max(k, sum(1 for p in preds.values() if p[1] > threshold))
    for j in sorted(preds, key=lambda j: (-preds[j][1], j))[:k]:
        row.hole[j] = preds[j][0]
        row.logp[j] = preds[j][2]
    if absorb:
        stop = {delete, *sp.terminators}
        first = next((j for j, t in enumerate(row.hole) if t in stop), None)
        if first is not None:
            keep = [j for j in range(len(row.hole)) if j <= first or row.hole[j] != MASKED]
            row.hole = [row.hole[j] for j in keep]
            row.logp = [row.logp[j] for j in keep]
    hole: list[int] = []
    logp: list[float] = []
    for t, lp in zip(row.hole, row.logp, strict=True):
        if t == delete:
            continue
        if t == expand:
            hole += [MASKED, MASKED]
            logp += [0.0, 0.0]
            row.budget -= 1
            continue
        hole.append(t)
        logp.append(lp)
    while len(hole) > cap and MASKED in hole:  # two expands in one step near the cap
        j = len(hole) - 1 - hole[::-1].index(MASKED)
        del hole[j], logp[j]
    row.hole, row.logp = hole, logp


def _rows(sc: SamplerConfig, dc: DreamOnConfig) -> tuple[list[_Row], int]:
    lengths = candidate_lengths(sc.lengths)
    cap = dc.cap if dc.cap is not None else max(lengths)
    budget = dc.budget if dc.budget is not None else 2 * cap
    seed = sc.seed if sc.seed is not None else secrets.randbits(62)
    rows = []
    for n in lengths:
        n0 = min(n, cap)
        gen = None
        if sc.temperature > 0:
            gen = torch.Generator().manual_seed(seed_for(seed, n))
        rows.append(_Row(n, [MASKED] * n0, [0.0] * n0, budget, gen=gen))
    return rows, cap


class _Setup(NamedTuple):
    """What the fast path and the reference both start from."""

    expand: int
    delete: int
    dc: DreamOnConfig
    sp: SpecialIds
    rows: list[_Row]
    cap: int
    head: list[int]
    tail: list[int]


def _setup(cfg: ModelConfig, prefix_ids: list[int], suffix_ids: list[int], sc: SamplerConfig,
           dc: DreamOnConfig | None, who: str) -> _Setup:
    ids_ec = length_control_ids(cfg)
    if ids_ec is None:
        raise ValueError(f"{who} needs a recipe with expand/delete tokens (DreamOn)")
    dc = dc or DreamOnConfig()
    rows, cap = _rows(sc, dc)
    head = canvas_start(cfg, len(prefix_ids)) + list(prefix_ids)
    tail = list(suffix_ids) + canvas_end(cfg)
    return _Setup(ids_ec[0], ids_ec[1], dc, SpecialIds.from_config(cfg), rows, cap, head, tail)


def _finish(rows: list[_Row], sp: SpecialIds, dedup: bool) -> list[Infill]:
    cands = []
    for r in rows:
        hole = [sp.pad if t == MASKED else t for t in r.hole]
        mid, score = trim_middle(hole, r.logp, sp.terminators) if hole else ([], 0.0)
        cands.append(Infill(ids=mid, length=r.n0, score=score, steps=r.steps))
    return rank_candidates(cands, list(range(len(rows))), dedup)


@torch.inference_mode()
def decode_dreamon(model: Any, cfg: ModelConfig, requests: Sequence[InfillRequest], *,
                   dc: DreamOnConfig | None = None, dedup: bool = True,
                   ) -> list[list[Infill] | InfillCancelled]:
    """Expand/delete decoding of requests that share their decoding rules (one
    :class:`~.spec.StepSpec`, as the engine groups them): one row per candidate starting
    length of each request, every row of every request in one forward per step (right-padded
    canvases, each with its own prefix and suffix). Per request: its candidates, best first,
    or the :class:`~.spec.InfillCancelled` it ended with (its ``cancel`` is asked before
    every step while it has a masked slot; its rows go, the others go on).

    model: ``forward_hidden(ids [L,T], attention_mask [L,T]) -> (hidden [L,T,D], _)`` and
    ``head(hidden [..., D]) -> logits [..., V]``. Raises ValueError when the checkpoint has
    no length-control tokens. Drafts (``InfillRequest.drafts``) are not read here (the
    engine verifies them first, on a fixed canvas)."""
    setups = [_setup(cfg, r.prefix_ids, r.suffix_ids, r.sampler, dc, "DreamOn decoding")
              for r in requests]
    expand, delete, dc, sp = setups[0].expand, setups[0].delete, setups[0].dc, setups[0].sp
    sc = requests[0].sampler  # strategy, temperature and steps: the same for every request
    rows: list[_Row] = []
    for i, su in enumerate(setups):
        for r in su.rows:
            r.owner = i
            rows.append(r)
    cancelled: dict[int, InfillCancelled] = {}
    dev = model_device(model)
    step = 0
    while step < sc.steps:
        for i, req in enumerate(requests):
            if (i not in cancelled and req.cancel is not None
                    and any(r.masked for r in rows if r.owner == i) and req.cancel()):
                cancelled[i] = InfillCancelled(f"infill cancelled before step {step + 1}")
        live = [r for r in rows if r.masked and r.owner not in cancelled]
        if not live:
            break
        canvases = [setups[r.owner].head + [sp.mask if t == MASKED else t for t in r.hole]
                    + setups[r.owner].tail for r in live]
        T = max(len(c) for c in canvases)
        ids = torch.full((len(live), T), sp.pad, dtype=torch.long)
        attn = torch.zeros((len(live), T), dtype=torch.bool)
        for i, c in enumerate(canvases):
            ids[i, : len(c)] = torch.tensor(c)
            attn[i, : len(c)] = True
        ids, attn = ids.to(dev), attn.to(dev)
        hidden, _ = model.forward_hidden(ids, None if bool(attn.all()) else attn)
        slots = [[j for j, t in enumerate(r.hole) if t == MASKED] for r in live]
        shift = 1 if cfg.shift_logits else 0
        src = [(i, len(setups[r.owner].head) + j - shift)
               for i, (r, js) in enumerate(zip(live, slots, strict=True)) for j in js]
        rr = torch.tensor([i for i, _ in src], device=dev)
        pp = torch.tensor([p for _, p in src], device=dev).clamp_min(0)
        logits = model.head(hidden[rr, pp]).float()  # [M, V], M = masked slots of all rows
        logits[:, sp.mask] = float("-inf")
        noise = None
        if sc.temperature > 0:
            noise = torch.cat([torch.rand((len(js), logits.shape[-1]), generator=r.gen)
                               for r, js in zip(live, slots, strict=True)]).to(dev)
        at = 0
        for r, js in zip(live, slots, strict=True):
            if _no_expand(r, setups[r.owner].cap, sc, step):
                logits[at : at + len(js), expand] = float("-inf")
            at += len(js)
        tok, score, logp = (t.tolist() for t in token_scores(logits, sc.strategy, sc.temperature,
                                                              noise))
        at = 0
        for r, js in zip(live, slots, strict=True):
            preds = {j: (tok[at + q], score[at + q], logp[at + q]) for q, j in enumerate(js)}
            at += len(js)
            r.steps += 1
            rsc = requests[r.owner].sampler
            _commit(r, preds, _k(r, dc, rsc, step), rsc.threshold, sp, expand, delete,
                    rsc.absorb_pad, setups[r.owner].cap)
        step += 1
    return [cancelled[i] if i in cancelled else _finish(su.rows, sp, dedup)
            for i, su in enumerate(setups)]


def decode_dreamon_with_drafts(
    model: Any, cfg: ModelConfig, batch: Sequence[InfillRequest],
    verify: Callable[[list[InfillRequest]], list[list[Infill] | InfillCancelled]],
) -> list[list[Infill] | BaseException]:
    """DreamOn's decoding of the engine's batch (:func:`decode_dreamon`: the rows of all its
    requests in one forward per step). Each request's drafts are verified first, by the first
    decoder's rule on a fixed canvas of the longest starting length (one forward of
    ``verify``, the engine's batch of the first decoder): ``wanted`` verified drafts answer; otherwise DreamOn decodes as usual
    and the verified drafts are ranked with its candidates (a partly accepted draft is
    not carried over: the hole it would sit in changes length)."""
    out: list[list[Infill] | BaseException | None] = [None] * len(batch)
    verified: list[list[Infill]] = [[] for _ in batch]
    for i, req in enumerate(batch):
        if req.drafts:
            sc = replace(req.sampler, steps=1, threshold=None,
                                     lengths=(max(req.sampler.lengths),))
            (res,) = verify([replace(req, sampler=sc)])
            if isinstance(res, InfillCancelled):
                out[i] = res
                continue
            verified[i] = [c for c in res if c.verified]
            if len(verified[i]) >= req.wanted:
                out[i] = verified[i]
    rest = [i for i, o in enumerate(out) if o is None]
    own = decode_dreamon(model, cfg, [batch[i] for i in rest]) if rest else []
    for i, res in zip(rest, own, strict=True):
        if isinstance(res, InfillCancelled):
            out[i] = res
        else:
            both = verified[i] + res
            out[i] = rank_candidates(both, list(range(len(both))), True)
    return [o for o in out if o is not None]  # every request has its answer


def infill_dreamon(
    model: Any,
    cfg: ModelConfig,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    sc: SamplerConfig,
    cancel: Callable[[], bool] | None = None,
    *,
    dc: DreamOnConfig | None = None,
    dedup: bool = True,
) -> list[Infill]:
    """Expand/delete decoding of the hole between prefix and suffix, one row per candidate
    starting length (``sc.lengths``), all rows in one forward per step; best first
    (:func:`decode_dreamon` of one request). Raises :class:`~.spec.InfillCancelled` when
    ``cancel()`` returns True before a step, ValueError when the checkpoint has no
    length-control tokens."""
    req = InfillRequest(list(prefix_ids), list(suffix_ids), sc, cancel)
    (res,) = decode_dreamon(model, cfg, [req], dc=dc, dedup=dedup)
    if isinstance(res, InfillCancelled):
        raise res
    return res


@torch.inference_mode()
def infill_dreamon_reference(
    model: Any,
    cfg: ModelConfig,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    sc: SamplerConfig,
    *,
    dc: DreamOnConfig | None = None,
    dedup: bool = True,
) -> list[Infill]:
    """Slow version of :func:`infill_dreamon`: one row at a time, a full forward
    (``model(ids) -> logits [1, T, V]``) at every step, slot by slot. Same rules, same
    results."""
    expand, delete, dc, sp, rows, cap, head, tail = _setup(cfg, prefix_ids, suffix_ids, sc, dc,
                                                           "infill_dreamon_reference")
    dev = model_device(model)
    for r in rows:
        step = 0
        while step < sc.steps and r.masked:
            canvas = head + [sp.mask if t == MASKED else t for t in r.hole] + tail
            logits_all = model(torch.tensor([canvas], device=dev))[0].float()
            slots = [j for j, t in enumerate(r.hole) if t == MASKED]
            noise = None
            if sc.temperature > 0:
                noise = torch.rand((len(slots), logits_all.shape[-1]), generator=r.gen).to(dev)
            preds = {}
            for q, j in enumerate(slots):
                lg = logits_all[max(0, len(head) + j - (1 if cfg.shift_logits else 0))].clone()
                lg[sp.mask] = float("-inf")
                if _no_expand(r, cap, sc, step):
                    lg[expand] = float("-inf")
                t, s, lp = token_scores(lg, sc.strategy, sc.temperature,
                                        None if noise is None else noise[q])
                preds[j] = (int(t), float(s), float(lp))
            r.steps += 1
            _commit(r, preds, _k(r, dc, sc, step), sc.threshold, sp, expand, delete,
                    sc.absorb_pad, cap)
            step += 1
    return _finish(rows, sp, dedup)
