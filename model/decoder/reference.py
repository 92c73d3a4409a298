"""The slow, obviously correct decoder the fast one is held to (:func:`infill_reference`):
one candidate at a time, a full forward per step, Python loops over slots; same rules, same
results, token for token (at temperature > 0 too: same seeds)."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..config import ModelConfig
from .canvas import canvas_start
from .loop import InfillRequest, check_request, rank_candidates, trim_middle
from .spec import Infill, InfillCancelled, SamplerConfig, SpecialIds, model_device, seed_for
from .step import token_scores


@torch.inference_mode()
def infill_reference(
    model: Any,
    cfg: ModelConfig,
    prefix_ids: list[int],
    suffix_ids: list[int],
    sc: SamplerConfig,
    cancel: Callable[[], bool] | None = None,
    *,
    dedup: bool = True,
    drafts: Sequence[Sequence[int]] = (),
    wanted: int = 1,
) -> list[Infill]:
    """Slow, obviously correct version of :func:`infill`: one candidate at a time (each
    draft verified alone), a full forward (full-vocabulary logits at every position) per
    step, Python loops over slots. Same rules, same results."""
    req = InfillRequest(list(prefix_ids), list(suffix_ids), sc, cancel,
                        tuple(tuple(d) for d in drafts), wanted)
    check_request(cfg, req)
    seed = sc.seed if sc.seed is not None else secrets.randbits(62)
    lengths = req.row_lengths()
    n_model = len(lengths) - len(req.drafts)
    cands = [_reference_row(model, cfg, req, n, seed, r - n_model if r >= n_model else -1)
             for r, n in enumerate(lengths)]
    verified = [c for c in cands if c.verified]
    if verified and len(verified) >= wanted:  # answered by its verified drafts alone
        cands = verified
    return rank_candidates(cands, list(range(len(cands))), dedup)


def _reference_row(model: Any, cfg: ModelConfig, req: InfillRequest, n: int, seed: int,
                   d: int) -> Infill:
    """One candidate of :func:`infill_reference`: hole length ``n``, verifying draft ``d``
    (-1: none) at its first step."""
    sc, cancel = req.sampler, req.cancel
    sp = SpecialIds.from_config(cfg)
    device = model_device(model)
    V = cfg.vocab_size
    draft = list(req.drafts[d]) if d >= 0 else None
    head = canvas_start(cfg, len(req.prefix_ids)) + list(req.prefix_ids)
    tail = list(req.suffix_ids) + list(sp.end)
    canvas = head + [sp.mask] * n + tail
    s0 = len(head)
    masked = [True] * n
    logps = [0.0] * n
    gen = torch.Generator(device=device).manual_seed(seed_for(seed, n, d))
    steps_run = 0
    accepted, verified = 0, False
    for s in range(sc.steps):
        if cancel is not None and cancel():
            raise InfillCancelled(f"infill cancelled before step {s + 1}")
        noise = None
        if sc.temperature > 0:
            noise = torch.rand((n, V), generator=gen, device=device)
        rem = sum(masked)
        if rem == 0:
            break
        steps_run += 1
        logits_all = model(torch.tensor([canvas], device=device))[0].float()  # [T, V]
        preds: dict[int, tuple[int, float, float]] = {}
        full: dict[int, torch.Tensor] = {}
        for j in range(n):
            if not masked[j]:
                continue
            pos = s0 + j - 1 if cfg.shift_logits else s0 + j
            lg = logits_all[pos].clone()
            lg[sp.mask] = float("-inf")
            full[j] = torch.log_softmax(lg, dim=-1)
            tok, score, lp = token_scores(
                lg, sc.strategy, sc.temperature, None if noise is None else noise[j]
            )
            preds[j] = (int(tok), float(score), float(lp))
        if sc.block is None:
            k = math.ceil(rem / (sc.steps - s))
        else:  # blocks 0..cur are eligible and due by the end of step deadline - 1
            S = sc.steps if sc.threshold is not None else min(sc.steps, n)
            nb = math.ceil(n / sc.block)
            first = min(preds)  # a block finished early (threshold) hands over at once
            cur = min(max(math.ceil((s + 1) * nb / S) - 1, first // sc.block), nb - 1)
            deadline = (cur + 1) * S // nb
            preds = {j: p for j, p in preds.items() if j < (cur + 1) * sc.block}
            k = math.ceil(len(preds) / max(1, deadline - s))
        if sc.threshold is not None:
            k = max(k, sum(1 for p in preds.values() if p[1] > sc.threshold))
        ranked = sorted(preds, key=lambda j: (-preds[j][1], j))
        commit = {j: preds[j] for j in ranked[:k]}
        if draft is not None and s == 0:  # the draft's accepted run, as the draft wrote it
            bar = math.log(sc.draft_ratio) if sc.draft_ratio > 0 else float("-inf")
            for j in range(min(len(draft) + 1, n)):
                lp = full[j]
                if j < len(draft):
                    tok, lpt = draft[j], float(lp[draft[j]])
                else:
                    tok = max(sp.terminators, key=lambda t: (float(lp[t]), -sp.terminators.index(t)))
                    lpt = float(lp[tok])
                if not lpt >= float(lp.max()) + bar:
                    break
                commit[j] = (tok, 0.0, lpt)
        for j, (tok, _, lp) in commit.items():
            canvas[s0 + j] = tok
            logps[j] = lp
            masked[j] = False
        if sc.absorb_pad:
            first = next(
                (j for j in range(n) if not masked[j] and canvas[s0 + j] in sp.terminators),
                None,
            )
            if first is not None:
                for j in range(first + 1, n):
                    canvas[s0 + j] = sp.pad
                    logps[j] = 0.0
                    masked[j] = False
        if draft is not None and s == 0:
            hole = canvas[s0 : s0 + n]
            while accepted < len(draft) and not masked[accepted] and hole[accepted] == draft[accepted]:
                accepted += 1
            m = len(draft)
            verified = accepted == m and not masked[m] and hole[m] in sp.terminators
            if verified:
                break
    mid, score = trim_middle(canvas[s0 : s0 + n], logps, sp.terminators)
    return Infill(ids=mid, length=n, score=score, steps=steps_run,
                  draft=None if d < 0 else d, accepted=accepted, verified=verified)
