"""THE decode loop, :func:`run_steps` (package doc, *The decode loop*), and what feeds and
reads it: a request as the loop sees it (:class:`InfillRequest`, checked by
:func:`check_request`), the rows of a batch (:class:`Rows`), the steppers (:class:`Stepper`,
:class:`EagerSteps`), the candidates of each request, trimmed and ranked (:func:`collect`);
:func:`decode` (requests -> candidates) and :func:`infill` (one request) put them together."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..config import ModelConfig
from .canvas import Canvas, DenoiseState, build_canvas, initial_state, stack_canvases
from .spec import (
    Infill,
    InfillCancelled,
    SamplerConfig,
    SpecialIds,
    StepSpec,
    candidate_lengths,
    model_device,
    seed_for,
)
from .step import DraftRows, denoise_step


@dataclass
class InfillRequest:
    """One request as the decode loop (and the engine's batching) sees it. ``drafts``:
    candidate middles (token ids, no terminator) to verify (module doc, *Drafts*); each
    takes one more row of the longest candidate length. ``wanted``: the request is finished
    after the verification step once that many of its drafts are verified. ``context_key``:
    see the field."""

    prefix_ids: list[int]
    suffix_ids: list[int]
    sampler: SamplerConfig
    cancel: Callable[[], bool] | None = None
    drafts: tuple[tuple[int, ...], ...] = ()
    wanted: int = 1
    #: the document the request completes in (opaque): the engine may start from the
    #: context it kept from that document's last request (:mod:`diffill.model.reuse`)
    context_key: str | None = None

    def row_lengths(self) -> list[int]:
        """The hole length of each of the request's rows: the candidate lengths, then one
        row of the longest per draft."""
        lengths = candidate_lengths(self.sampler.lengths)
        return lengths + [max(lengths)] * len(self.drafts)


@dataclass
class Rows:
    """Per canvas row of a batch: the request it belongs to (-1: a filler row that pads the
    batch to a shape bucket, or a row let go under a stepper that keeps every row), its hole
    length (0 for filler), its noise generator (temperature > 0), the request's draft it
    verifies (-1: none) and how many draft tokens were accepted. :meth:`take` keeps them in
    step with the canvas when rows go."""

    owner: list[int]
    length: list[int]
    gen: list[torch.Generator | None]
    draft: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    verified: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.owner)
        self.draft = self.draft or [-1] * n
        self.accepted = self.accepted or [0] * n
        self.verified = self.verified or [False] * n

    def take(self, keep: Sequence[int]) -> Rows:
        return Rows(*([col[r] for r in keep] for col in (
            self.owner, self.length, self.gen, self.draft, self.accepted, self.verified)))

    def pad_to(self, L: int) -> Rows:
        n = L - len(self.owner)
        return Rows(self.owner + [-1] * n, self.length + [0] * n, self.gen + [None] * n,
                    self.draft + [-1] * n, self.accepted + [0] * n, self.verified + [False] * n)


def batch_rows(requests: Sequence[InfillRequest], device: torch.device | str) -> Rows:
    """The rows of ``requests`` in order (:meth:`InfillRequest.row_lengths` of each), with
    the noise generators seeded per (request seed, hole length, draft) when the request
    samples."""
    rows = Rows([], [], [])
    for i, req in enumerate(requests):
        sc = req.sampler
        seed = None
        if sc.temperature > 0:
            seed = sc.seed if sc.seed is not None else secrets.randbits(62)
        lengths = req.row_lengths()
        n_model = len(lengths) - len(req.drafts)
        for r, n in enumerate(lengths):
            d = r - n_model if r >= n_model else -1
            rows.owner.append(i)
            rows.length.append(n)
            rows.draft.append(d)
            rows.accepted.append(0)
            rows.verified.append(False)
            rows.gen.append(None if seed is None else
                            torch.Generator(device=device).manual_seed(seed_for(seed, n, d)))
    return rows


def draft_tensor(rows: Rows, requests: Sequence[InfillRequest], N: int,
                 device: torch.device | str) -> DraftRows | None:
    """The batch's :class:`DraftRows` (None when no row verifies a draft)."""
    if all(d < 0 for d in rows.draft):
        return None
    L = len(rows.owner)
    tokens = torch.zeros((L, N), dtype=torch.long)
    length = torch.full((L,), -1, dtype=torch.long)
    for r, (o, d) in enumerate(zip(rows.owner, rows.draft, strict=True)):
        if d >= 0:
            ids = requests[o].drafts[d]
            tokens[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            length[r] = len(ids)
    return DraftRows(tokens.to(device), length.to(device))


class Stepper(Protocol):
    """How the loop runs a step and lets rows go. :class:`EagerSteps` (the step as torch
    code, on the model or a :class:`~diffill.model.cache.DualCache`); the engine's CUDA-graph
    replay is another."""

    def step(self, canvas: Canvas, state: DenoiseState, s: int,
             noise: torch.Tensor | None, draft: DraftRows | None = None) -> DenoiseState:
        """Step ``s`` (0-based) of ``canvas`` from ``state`` (``draft``: the verification
        step of the rows that carry a draft, step 0 only)."""
        ...

    def drop(self, canvas: Canvas, state: DenoiseState,
             keep: list[int]) -> tuple[Canvas, DenoiseState, list[int]]:
        """Rows not in ``keep`` are no longer wanted: returns the canvas and state to go on
        with and the rows they hold (``keep``, or every row for a stepper whose shapes are
        fixed and which freezes the others instead)."""
        ...


class EagerSteps:
    """:func:`denoise_step` on ``forward`` (the model, or a cache wrapper around it);
    ``on_drop(idx)`` is told which rows stay when rows go (a cache keeps per-row keys)."""

    def __init__(self, forward: Any, spec: StepSpec,
                 on_drop: Callable[[torch.Tensor], None] | None = None) -> None:
        self.forward = forward
        self.spec = spec
        self.on_drop = on_drop

    def step(self, canvas: Canvas, state: DenoiseState, s: int,
             noise: torch.Tensor | None, draft: DraftRows | None = None) -> DenoiseState:
        return denoise_step(self.forward, canvas, state, self.spec.total_steps - s, self.spec,
                            noise, draft)

    def drop(self, canvas: Canvas, state: DenoiseState,
             keep: list[int]) -> tuple[Canvas, DenoiseState, list[int]]:
        idx = torch.tensor(keep, device=state.ids.device)
        if self.on_drop is not None:
            self.on_drop(idx)
        return canvas.rows(idx), state.rows(idx), keep


@dataclass
class Decoded:
    """What the loop leaves: the final canvas, state and rows, and the requests cancelled
    (request index -> the exception to raise for it)."""

    canvas: Canvas
    state: DenoiseState
    rows: Rows
    cancelled: dict[int, InfillCancelled]


@dataclass
class Batch:
    """What the loop carries from step to step, for the rows of the batch: the canvas, the
    state, the rows, the noise buffer [L, N, V] (temperature > 0) and the drafts the rows
    verify. :meth:`keep` lets rows go from all of them at once."""

    canvas: Canvas
    state: DenoiseState
    rows: Rows
    noise: torch.Tensor | None = None
    draft: DraftRows | None = None

    def keep(self, stepper: Stepper, keep: list[int]) -> None:
        """Only the rows ``keep`` go on (``stepper.drop``); a stepper that keeps every row
        (fixed shapes) freezes the others, and their owner becomes -1."""
        self.canvas, self.state, kept = stepper.drop(self.canvas, self.state, keep)
        if len(kept) < len(self.rows.owner):
            idx = torch.tensor(kept, device=self.state.ids.device)
            if self.noise is not None:
                self.noise = self.noise[idx]
            if self.draft is not None:
                self.draft = self.draft.rows(idx)
        wanted = set(keep)
        self.rows = self.rows.take(kept)
        for r, k in enumerate(kept):
            if k not in wanted:
                self.rows.owner[r] = -1


def run_steps(stepper: Stepper, canvas: Canvas, state: DenoiseState, rows: Rows, spec: StepSpec,
              cancels: Sequence[Callable[[], bool] | None], *, vocab_size: int,
              draft: DraftRows | None = None, wanted: Sequence[int] = ()) -> Decoded:
    """THE decode loop, shared by :func:`infill`, the dual-cache sampler and the engine.

    Before each step every live request's ``cancels[i]()`` is asked; a cancelled request's
    rows are let go (``stepper.drop``) and the others go on. With temperature > 0 each row
    draws its ``[n, V]`` uniform noise from its own generator. The loop runs
    ``spec.loop_steps`` steps; in threshold mode it stops once nothing is masked, its only
    host synchronisation.

    ``draft`` (rows verifying drafts): step 0 is their verification step; then one host
    synchronisation reads what each draft row accepted; a request with ``wanted[i]``
    (default 1) verified drafts is finished (its other rows are let go), and the loop stops
    when no request is left.
    """
    live = sorted({o for o in rows.owner if o >= 0})
    cancelled: dict[int, InfillCancelled] = {}
    b = Batch(canvas, state, rows, draft=draft)
    if spec.temperature > 0:  # rows' unused slots keep zeros (never selected)
        L, N = canvas.valid.shape
        b.noise = torch.zeros((L, N, vocab_size), dtype=torch.float32, device=state.ids.device)
    for s in range(spec.loop_steps(max(rows.length, default=0))):
        gone = [i for i in live if cancels[i] is not None and cancels[i]()]
        if gone:
            for i in gone:
                cancelled[i] = InfillCancelled(f"infill cancelled before step {s + 1}")
            live = [i for i in live if i not in gone]
            if not live:
                break
            b.keep(stepper, [r for r, o in enumerate(b.rows.owner) if o in live])
        if b.noise is not None:
            for r, g in enumerate(b.rows.gen):
                if g is not None:
                    n = b.rows.length[r]
                    b.noise[r, :n] = torch.rand((n, vocab_size), generator=g, device=b.noise.device)
        verifying = b.draft if s == 0 else None
        b.state = stepper.step(b.canvas, b.state, s, b.noise, verifying)
        if verifying is not None:
            # the one host synchronisation of the draft rows: what each one accepted
            acc, ver = draft_outcome(b.canvas, b.state, verifying, spec.terminators)
            acc_l, ver_l = acc.tolist(), ver.tolist()
            got: dict[int, int] = {}
            for r, d in enumerate(b.rows.draft):
                if d >= 0 and b.rows.owner[r] >= 0:
                    b.rows.accepted[r], b.rows.verified[r] = acc_l[r], ver_l[r]
                    got[b.rows.owner[r]] = got.get(b.rows.owner[r], 0) + ver_l[r]
            finished = {o for o, k in got.items()
                        if k > 0 and k >= (wanted[o] if o < len(wanted) else 1)}
            if finished:  # the verified drafts are the answer: the other rows go
                b.keep(stepper, [r for r, o in enumerate(b.rows.owner)
                                 if o >= 0 and (o not in finished or b.rows.verified[r])])
                if not any(o >= 0 and o not in finished for o in b.rows.owner):
                    break
        # the one host synchronisation of the loop (threshold mode only)
        if spec.threshold is not None and not bool(b.state.masked.any()):
            break
    return Decoded(b.canvas, b.state, b.rows, cancelled)


def draft_outcome(canvas: Canvas, state: DenoiseState, draft: DraftRows,
                  terminators: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """After the verification step: per row, the draft tokens accepted from slot 0 (the
    leading committed slots that hold the draft) [L] long, and whether the draft was
    verified -- all of it committed and a terminator committed right after it [L] bool."""
    hole = state.ids.gather(1, canvas.hole_pos)
    N = hole.shape[1]
    slot = torch.arange(N, device=hole.device)[None, :]
    m = draft.length[:, None]
    done = ~state.masked & canvas.valid
    same = done & (hole == draft.tokens) & (slot < m)
    accepted = same.long().cumprod(1).sum(1)
    is_term = torch.zeros_like(done)
    for t in terminators:
        is_term |= hole == t
    end = (done & is_term & (slot == m)).any(1)
    verified = (draft.length >= 0) & (accepted == draft.length) & end
    return accepted, verified


def collect(out: Decoded, n_requests: int, terminators: tuple[int, ...], *,
            dedup: bool = True) -> list[list[Infill] | InfillCancelled]:
    """Per request: its candidates, best first (one host transfer for the whole batch), or
    the :class:`InfillCancelled` it ended with. A request with a fully accepted draft keeps
    only its verified drafts (the loop let its other rows go after step 0)."""
    hole = out.state.ids.gather(1, out.canvas.hole_pos).tolist()
    logp = out.state.logp.tolist()
    steps = out.state.steps.tolist()
    cands: list[list[Infill]] = [[] for _ in range(n_requests)]
    rows = out.rows
    for r, (o, n) in enumerate(zip(rows.owner, rows.length, strict=True)):
        if o >= 0 and o not in out.cancelled:
            mid, score = trim_middle(hole[r][:n], logp[r][:n], terminators)
            d = rows.draft[r]
            # a verified draft took one step (with absorb_pad off its row may have decoded
            # slots after its end meanwhile; trimming drops them)
            cands[o].append(Infill(ids=mid, length=n, score=score,
                                   steps=1 if rows.verified[r] else int(steps[r]),
                                   draft=None if d < 0 else d, accepted=rows.accepted[r],
                                   verified=rows.verified[r]))
    return [out.cancelled[i] if i in out.cancelled
            else rank_candidates(cands[i], list(range(len(cands[i]))), dedup)
            for i in range(n_requests)]


def decode(model: Any, cfg: ModelConfig, requests: Sequence[InfillRequest], *,
           select_impl: str | None = None, dedup: bool = True,
           stepper: Callable[[Canvas, StepSpec], Stepper] | None = None,
           ) -> list[list[Infill] | InfillCancelled]:
    """Requests that share their decoding rules as one batch: canvases, :func:`run_steps`,
    the candidates. ``stepper(canvas, spec)`` (default: :class:`EagerSteps` on ``model``)
    may put a cache around the model."""
    spec = StepSpec.of(cfg, requests[0].sampler, select_impl=select_impl)
    device = model_device(model)
    for r in requests:
        check_request(cfg, r)
    cvs = [build_canvas(cfg, r.prefix_ids, r.suffix_ids, r.row_lengths(), device) for r in requests]
    cv = stack_canvases(cvs, spec.pad_id)
    steps = stepper(cv, spec) if stepper is not None else EagerSteps(model, spec)
    rows = batch_rows(requests, device)
    out = run_steps(steps, cv, initial_state(cv), rows, spec, [r.cancel for r in requests],
                    vocab_size=cfg.vocab_size,
                    draft=draft_tensor(rows, requests, cv.hole_pos.shape[1], device),
                    wanted=[r.wanted for r in requests])
    return collect(out, len(requests), spec.terminators, dedup=dedup)


def trim_middle(
    hole: list[int], logp: list[float], terminators: tuple[int, ...]
) -> tuple[list[int], float]:
    """hole tokens [n] and their commit log-probs -> (middle, mean log-prob over middle + terminator)."""
    end = len(hole)
    for j, t in enumerate(hole):
        if t in terminators:
            end = j
            break
    counted = logp[: min(end + 1, len(hole))]
    return hole[:end], float(sum(counted) / len(counted))


def rank_candidates(cands: list[Infill], order: list[int], dedup: bool) -> list[Infill]:
    idx = sorted(range(len(cands)), key=lambda i: (-cands[i].score, order[i]))
    out: list[Infill] = []
    seen: set[tuple[int, ...]] = set()
    for i in idx:
        key = tuple(cands[i].ids)
        if dedup and key in seen:
            continue
        seen.add(key)
        out.append(cands[i])
    return out


def _check_ids(ids: Sequence[int], vocab: int, what: str) -> None:
    for i in ids:
        if not 0 <= i < vocab:
            raise ValueError(f"{what} holds token id {i}, outside the vocabulary [0, {vocab})")


def draft_problem(cfg: ModelConfig, draft: Sequence[int], hole: int) -> str | None:
    """Why ``draft`` cannot be verified in a hole of ``hole`` slots, None when it can: its
    ids inside the vocabulary, 1 to ``hole - 1`` of them (the end of the middle needs a
    slot), no terminator and no mask id. The one rule: :func:`check_request` raises it, the
    engine's ``usable_drafts`` leaves such drafts out."""
    for t in draft:
        if not 0 <= t < cfg.vocab_size:
            return f"holds token id {t}, outside the vocabulary [0, {cfg.vocab_size})"
    if not draft or len(draft) + 1 > hole:
        return (f"has {len(draft)} tokens; a draft needs 1 to {hole - 1} "
                f"(the longest hole is {hole} slots, one for the end of the middle)")
    sp = SpecialIds.from_config(cfg)
    if any(t == sp.mask or t in sp.terminators for t in draft):
        return "holds the mask id or a terminator"
    return None


def check_request(cfg: ModelConfig, req: InfillRequest) -> None:
    """Token ids inside the vocabulary; every draft passes :func:`draft_problem`. Raises
    ValueError."""
    _check_ids(req.prefix_ids, cfg.vocab_size, "prefix_ids")
    _check_ids(req.suffix_ids, cfg.vocab_size, "suffix_ids")
    if not req.drafts:
        return
    n = max(candidate_lengths(req.sampler.lengths))
    for i, d in enumerate(req.drafts):
        problem = draft_problem(cfg, d, n)
        if problem is not None:
            raise ValueError(f"drafts[{i}] {problem}")


@torch.inference_mode()
def infill(
    model: Any,
    cfg: ModelConfig,
    prefix_ids: list[int],
    suffix_ids: list[int],
    sc: SamplerConfig,
    cancel: Callable[[], bool] | None = None,
    *,
    dedup: bool = True,
    select_impl: str | None = None,
    drafts: Sequence[Sequence[int]] = (),
    wanted: int = 1,
) -> list[Infill]:
    """Fill the hole between prefix and suffix; best candidate first (see module doc).

    All candidate lengths (and one row per draft in ``drafts``, module doc *Drafts*) run in
    one batch, one forward per step (:func:`run_steps`); with ``wanted`` drafts verified the
    request ends after its first step.
    Raises :class:`InfillCancelled` if ``cancel()`` returns True before a step.
    ``select_impl``: see :class:`StepSpec` (None: the plain torch step).
    """
    req = InfillRequest(prefix_ids, suffix_ids, sc, cancel, tuple(tuple(d) for d in drafts), wanted)
    (res,) = decode(model, cfg, [req], select_impl=select_impl, dedup=dedup)
    if isinstance(res, InfillCancelled):
        raise res
    return res
