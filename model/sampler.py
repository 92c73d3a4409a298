"""Masked-diffusion infill sampler.

Canvas
------
For every candidate hole length ``n`` the sampler builds::

    start prefix [MASK]*n suffix end

where ``start`` / ``end`` and the tokens that end a middle come from the family's
recipe (``cfg.recipe``, :mod:`diffill.model.recipes`: e.g. Dream's tokenizer BOS and
EOS, nothing for Open-dCoder, ``<|startoftext|>``/``<|endoftext|>`` for LLaDA); without
a recipe ``start`` = [BOS] (none when ``cfg.bos_token_id`` is None) and ``end`` = [EOS].
For a ``shift_logits`` model with neither ``start`` nor prefix, the recipe's lead token
(EOS) is put first so that slot 0 has a position ``i - 1`` to be read from. All candidate lengths are
right-padded into ONE batch ``[L, T_max]`` with a key-padding attention mask and
run in one forward per step. The LM head runs only at the ``N = max(n)`` hole
slots of each row (``[L, N, D] -> [L, N, V]``), never over the whole canvas
(slots already committed are computed too and ignored: static shapes keep the
step compilable and graph-capturable, and cost at most ``L * N`` head rows);
for ``cfg.shift_logits`` models the logit for slot position ``p`` is read from
hidden state ``p - 1``. The mask id is never predicted (its logit is -inf).

Refinement (one call to :func:`denoise_step` per step)
------------------------------------------------------
Each step predicts a token for every still-masked slot (argmax at temperature
0, Gumbel-max sampling from ``softmax(logits / T)`` otherwise) and a score, the
higher the more confident:

* ``CONFIDENCE``: probability of the predicted token;
* ``MARGIN``: top-1 minus top-2 probability;
* ``ENTROPY``: ``exp(-H(p))`` -- an order-preserving map of "lower entropy is
  better" onto ``(0, 1]`` so that one ``threshold`` scale works for all three.

(At temperature > 0 the probabilities are those of the tempered distribution.)
With ``steps_left`` steps to go and ``rem`` slots still masked, a row commits
its ``k`` best slots (ties: lower slot index first), where::

    fixed mode:      k = ceil(rem / steps_left)
    threshold mode:  k = max(ceil(rem / steps_left), #{slots with score > threshold})

So fixed mode unmasks everything by the last step; threshold mode is
Fast-dLLM's parallel decoding (the best slot plus all slots above the
threshold) with the fixed schedule as a floor, which makes ``steps`` a hard
upper bound. The threshold loop stops as soon as nothing is masked (the only
host synchronisation inside the loop, in :func:`infill`). The fixed loop runs
``min(steps, N)`` steps and never synchronises.

Semi-autoregressive blocks (``SamplerConfig.block``)
---------------------------------------------------
With ``block = B`` the hole of a row with ``n`` slots is cut into ``nb = ceil(n / B)``
blocks decoded left to right, as in LLaDA's semi-autoregressive remasking. The
``S`` steps of the loop are shared out among the blocks: at step ``s`` (0-based) the
slots of blocks ``0 .. C`` are eligible, ``C = ceil((s + 1) nb / S) - 1``, and they
must all be committed by the end of step ``floor((C + 1) S / nb) - 1``; so with
``d = floor((C + 1) S / nb) - s`` steps left before that deadline and ``r`` eligible
slots still masked, the row commits ``k = ceil(r / d)`` of them (the best by score;
threshold mode adds every eligible slot above the threshold). With ``S >= nb`` each
block gets ``S / nb`` steps (rounded); with ``S < nb`` one step covers several blocks.
``S`` is the number of steps the row's loop runs (``min(steps, n)`` in fixed mode).
When the eligible blocks are all committed before their deadline (threshold mode),
the block of the first masked slot becomes eligible at once.

Why: pad absorption plus confidence ordering lets a weak model end the middle from
the right. The far slots of a loose hole are almost surely pad, so they are the most
confident and are committed first; every pad committed makes its left neighbour's pad
more likely, and the end of the middle walks left until only the indentation is left
(measured on the shipped model: 81 of 104 HumanEval lines came back empty or
indentation-only with 16 slots and 8 steps; with ``block = 4``, 9). Inside a block the
order is still chosen by confidence. ``block = None`` (the default here; a checkpoint
may recommend one in its config, ``decode_block``, which the engine's default sampler
uses) is plain any-order decoding, exactly as before blocks existed.

Length handling
---------------
Training fills a hole of ``n`` slots holding an ``m``-token middle with the
middle followed by ``n - m`` pads. Accordingly:

* the middle returned is the hole up to (not including) the first pad/EOS;
* **pad absorption** (``SamplerConfig.absorb_pad``, default on): as soon as a
  pad/EOS is committed at slot ``j``, every slot after ``j`` becomes a committed
  pad, including slots committed earlier. The canvas the model sees next then
  has the training shape (middle, then pads only), later steps spend no work
  on tokens that trimming would throw away, and the threshold loop ends sooner.
  With it off, slots after the first pad keep being decoded and are trimmed at
  the end (the returned middle is defined the same way in both cases).

Ranking score (``Infill.score``)
--------------------------------
Each committed slot records ``log p(token)`` under the model's *untempered*
distribution at the step it was unmasked. The score of a candidate is the mean
of these values over the returned middle tokens plus the terminator (the first
pad/EOS) when the hole contains one, i.e. over ``m + 1`` slots (``n`` slots for
a hole filled to the brim). Why this one:

* Commit-time log-probs are free (computed by the step anyway) and their sum is
  the model's log-likelihood of the filling in the order it was decoded (an
  any-order autoregressive factorisation; approximate when several slots are
  committed in one step). Re-scoring the final middle instead would need one
  forward per middle token with that token masked (a masked-diffusion model
  cannot score a token it sees), far too slow for an editor.
* The terminator's log-prob is where the length decision is made: "the middle
  ends here" is what distinguishes a good length from a truncated one.
* The pads after the terminator are left out: they are forced by absorption
  (and nearly certain without it), so counting them would reward long holes
  for padding alone -- with ``n = 32`` and a 5-token middle, 26 near-zero terms
  would drown the evidence. Averaging over ``m + 1`` makes candidates with
  different ``n`` comparable: the same middle reached from two lengths gets
  (nearly) the same score, whatever ``n`` was.

Known bias: a hole filled to the brim has no terminator term (there is no slot
left to say "the middle ends here"), so it misses the one term that is usually
below average; a too-short hole is still ranked down when, as usual, the model
is less sure of the squeezed tokens themselves.

Results come back best first (ties: order of ``SamplerConfig.lengths``).
Candidates whose trimmed middle is identical to a better-ranked one are
dropped unless ``dedup=False`` is passed, so fewer than ``len(lengths)``
results may be returned.

The decode loop
---------------
One loop, :func:`run_steps`, serves :func:`infill`, the dual-cache sampler
(:func:`diffill.model.cache.infill_cached`) and the engine's batches
(:class:`diffill.model.engine.Engine`, several requests per batch, CUDA graphs):

* :class:`StepSpec` bundles what every step of a batch shares (special ids, logit shift,
  strategy, threshold, temperature, pad absorption, blocks, step count, selection
  kernel); :func:`denoise_step` is ``(model, canvas, state, steps_left, spec, noise)``.
* :class:`Rows` keeps each canvas row's request, hole length and noise generator in
  step with the canvas when a cancelled request's rows go.
* a :class:`Stepper` runs a step and lets rows go: :class:`EagerSteps` (the torch step on
  the model, or on a cache wrapper), the engine's CUDA-graph replay (static buffers; it
  freezes rows instead of dropping them).
* :func:`collect` turns the final state into each request's ranked candidates.

A family's own terminators and filler token come in through :meth:`StepSpec.of`'s
``special``; a decoder whose hole grows or shrinks between steps reuses
:func:`build_canvas` and :func:`denoise_step` (:mod:`diffill.model.dreamon`).

Drafts (draft and verify)
-------------------------
A request may carry *drafts*: candidate middles (token ids) proposed by something cheaper
than the model -- text copied from elsewhere in the buffer, a rule, an earlier suggestion
(:mod:`diffill.lsp_server.drafts` proposes them). Each draft ``d`` of ``m`` tokens gets one
more row in the same batch, of the longest candidate length ``n >= m + 1``, all masked like
any other row. Step 0 is also the draft's *verification*: from that one forward, slot
``j < m`` agrees with the draft when ``log p(d_j) >= log p(top_j) + log(draft_ratio)``
(``SamplerConfig.draft_ratio``; ``p`` the untempered marginal of the all-masked slot,
``top_j`` its likeliest token), and slot ``m`` agrees when the likeliest terminator clears
the same bar (the model must also accept that the middle ends there). The *accepted run* is
the agreeing slots from slot 0 to the first one that disagrees; those slots are committed
with the draft's tokens (slot ``m`` with that terminator), on top of what the step's normal
selection commits in that row, and the row goes on as any other. So:

* a draft accepted with its end (run ``m + 1``) is *verified*: its row is complete after one
  step. The loop reads the draft rows' outcome once after step 0 (one host sync), and a
  request with as many verified drafts as it wants (``InfillRequest.wanted``, 1 for an
  editor's ghost text; the engine asks for its ``candidates``) is finished there: its other
  rows are let go and it is answered by its verified drafts (``Infill.verified``,
  ``steps == 1``), ranked by score. Otherwise the verified drafts wait for the rest and
  everything is ranked together by score.
* a partly accepted draft keeps its accepted run and the rest is denoised as usual, so it
  needs fewer steps of its own;
* a rejected draft costs its row in the batch and nothing else.

Why this rule. A masked-diffusion model cannot score a token it sees, so checking a draft
the way an autoregressive model does (one position at a time, each seeing the ones
before) would take ``m`` forwards; all slots masked, one forward gives the marginal of
every slot at once. The bar is relative to the slot's top token (a draft token that is the
model's own first choice always passes, whatever the entropy), the run is from the hole's
start (a later token agreeing after an earlier one disagreed is not evidence for the
draft) and the end must pass too (otherwise a draft that is right but incomplete would be
committed as the whole middle). ``draft_ratio`` = 1 accepts only the model's own argmax;
small values accept what the model merely finds plausible: the candidates are then ranked
by the same score as every other candidate, so the model still chooses *between* drafts.
The checkpoint may set it (``draft_ratio`` in a diffill config.json; the shipped model's
value and why: BENCHMARKS.md, *Draft and verify*). Scores stay comparable: the committed
draft tokens record their verification-step log-probs, exactly as slots the model commits
itself. :func:`infill_reference` verifies each draft alone, step by step, with the same
rule; the tests hold the batched path to it.

Randomness
----------
Sampling noise is drawn per candidate from a generator seeded with
``(seed, n)`` (``n`` the hole length), one ``[n, V]`` uniform draw per step.
So a candidate's result does not depend on which other lengths share the batch,
the same seed reproduces the same result, and :func:`infill_reference`
reproduces the fast path token for token even at temperature > 0.
"""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

from .config import ModelConfig
from .limits import DEFAULT_STEPS


class Strategy(enum.Enum):
    CONFIDENCE = "confidence"
    MARGIN = "margin"
    ENTROPY = "entropy"


@dataclass(frozen=True)
class SamplerConfig:
    steps: int = DEFAULT_STEPS  # fixed number of refinement steps (upper bound with threshold)
    threshold: float | None = (
        None  # each step unmask the best plus every slot with score > threshold
    )
    strategy: Strategy = Strategy.CONFIDENCE
    temperature: float = 0.0  # 0 = greedy/deterministic
    seed: int | None = None
    lengths: tuple[int, ...] = (16,)  # candidate hole lengths, batched, ranked by model score
    absorb_pad: bool = True  # once a pad/EOS is committed at slot j, the rest of the hole is pad
    block: int | None = None  # semi-autoregressive block size (None: any order), see module doc
    draft_ratio: float = 0.1  # a draft token is accepted when p(token) >= draft_ratio * p(top)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"SamplerConfig.steps must be >= 1, got {self.steps}")
        if not self.lengths or any(int(n) < 1 for n in self.lengths):
            raise ValueError(
                f"SamplerConfig.lengths must be non-empty and >= 1, got {self.lengths}"
            )
        if self.temperature < 0:
            raise ValueError(f"SamplerConfig.temperature must be >= 0, got {self.temperature}")
        if self.block is not None and int(self.block) < 1:
            raise ValueError(f"SamplerConfig.block must be >= 1 or None, got {self.block}")
        if not 0.0 <= self.draft_ratio <= 1.0:
            raise ValueError(f"SamplerConfig.draft_ratio must be in [0, 1], got {self.draft_ratio}")
        if not isinstance(self.strategy, Strategy):
            object.__setattr__(self, "strategy", Strategy(self.strategy))


class InfillCancelled(Exception):
    """Raised by :func:`infill` when the cancel callback returns True between steps."""


@dataclass
class Infill:
    ids: list[int]  # the middle, trimmed (pad/eos removed, nothing after the first pad/eos)
    length: int  # hole length n of the canvas it came from
    score: float  # ranking score, higher is better (mean commit-time log-prob, see module doc)
    steps: int  # steps actually run for this candidate
    draft: int | None = None  # index of the request's draft this row verified (None: model only)
    accepted: int = 0  # draft tokens the verification step accepted (from the hole's start)
    verified: bool = False  # the whole draft and the end of the middle were accepted


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class SpecialIds:
    """The ids the sampler needs, from the family recipe (``cfg.recipe``,
    :mod:`diffill.model.recipes`) when the loader resolved one, else from the config's
    special ids."""

    mask: int
    pad: int  # filler written after the first terminator and used for batch padding
    terminators: tuple[int, ...]  # ids that end the middle
    bos: int | None
    eos: int | None
    start: tuple[int, ...] = ()  # canvas tokens before the prefix
    end: tuple[int, ...] = ()  # canvas tokens after the suffix
    lead: int | None = None  # first token of a shift model's canvas with no start, no prefix

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> SpecialIds:
        if cfg.mask_token_id is None:
            raise ValueError(
                "ModelConfig.mask_token_id is None; a masked-diffusion model needs one"
            )
        r = cfg.recipe
        if r is not None:
            return cls(r.mask, r.filler, r.terminators, cfg.bos_token_id, cfg.eos_token_id,
                       r.start, r.end, r.lead)
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
        if pad is None:
            raise ValueError("ModelConfig has neither pad_token_id nor eos_token_id")
        terms = tuple(sorted({i for i in (cfg.pad_token_id, cfg.eos_token_id) if i is not None}))
        bos, eos = cfg.bos_token_id, cfg.eos_token_id
        return cls(cfg.mask_token_id, pad, terms, bos, eos,
                   () if bos is None else (bos,), () if eos is None else (eos,),
                   eos if eos is not None else pad)


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


def _check_ids(ids: Sequence[int], vocab: int, what: str) -> None:
    for i in ids:
        if not 0 <= i < vocab:
            raise ValueError(f"{what} holds token id {i}, outside the vocabulary [0, {vocab})")


def candidate_lengths(lengths: Sequence[int]) -> list[int]:
    """Validated, de-duplicated candidate lengths in the order given."""
    out: list[int] = []
    for n in lengths:
        n = int(n)
        if n < 1:
            raise ValueError(f"hole lengths must be >= 1, got {n}")
        if n not in out:
            out.append(n)
    if not out:
        raise ValueError("at least one hole length is needed")
    return out


def _model_device(model: Any) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device(getattr(model, "device", "cpu"))


def seed_for(seed: int, n: int, draft: int = -1) -> int:
    """Per-candidate generator seed: depends on the request seed, the hole length and the
    draft the row verifies (-1: none) only."""
    return (seed * 1_000_003 + n * 7919 + (draft + 1) * 104_729) % (2**63 - 1)


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
rows x 64 slots x 152k on the 0.5B shape is 117 MB each, ~250 MB over the weights."""


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
    slots in pieces of at most ``max_bytes`` of fp32 logits (the first piece is 16 slots: the
    vocabulary is known after it), so the whole ``[L, N, V]`` is never held. Each slot's
    scores depend on its own logits only, so the pieces give what one piece would (the
    reference: ``max_bytes`` larger than the batch). ``draft_ids`` [L, N]: the token whose
    log-prob each slot reports for :func:`accept_drafts` (drafts only)."""
    L, N, D = h.shape
    flat = h.reshape(L * N, D)
    nz = None if noise is None else noise.reshape(L * N, -1)
    ds = None if draft_ids is None else draft_ids.reshape(L * N, 1)
    terms = torch.tensor(spec.terminators, device=h.device) if ds is not None else None
    parts: list[tuple[torch.Tensor, ...]] = []
    start, size = 0, 16
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
        vocab = logits.shape[-1]
        del logits, logp_all
        start, size = stop, max(1, max_bytes // (4 * vocab))
    cols = [torch.cat(c) for c in zip(*parts, strict=True)]
    shaped = [c.reshape(L, N, *c.shape[1:]) for c in cols]
    return SlotScores(*shaped)


# --------------------------------------------------------------------------- fast path


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


@dataclass(frozen=True)
class StepSpec:
    """What every step of one batch shares: the special ids, the model's logit shift and
    the decoding rules. Built once per batch (:meth:`of`); hashable, so a CUDA graph can be
    keyed by it. ``threshold`` None: fixed mode (module doc). ``total_steps``:
    ``SamplerConfig.steps`` (the step index is ``total_steps - steps_left``).
    ``select_impl``: None = the torch selection in :func:`denoise_step`; ``'auto'`` /
    ``'triton'`` / ``'torch'`` = the fused select-and-unmask of
    :mod:`diffill.kernels.select_unmask` (greedy steps only)."""

    mask_id: int
    pad_id: int  # filler written after the first committed terminator
    terminators: tuple[int, ...]
    shift: bool
    strategy: Strategy = Strategy.CONFIDENCE
    threshold: float | None = None
    temperature: float = 0.0
    absorb_pad: bool = True
    block: int | None = None
    total_steps: int = DEFAULT_STEPS
    select_impl: str | None = None
    draft_ratio: float = 0.1

    @classmethod
    def of(cls, cfg: ModelConfig, sc: SamplerConfig, *, select_impl: str | None = None,
           special: SpecialIds | None = None) -> StepSpec:
        """The spec of a request: ``cfg``'s special ids (or a family recipe's ``special``)
        and ``sc``'s rules."""
        sp = special if special is not None else SpecialIds.from_config(cfg)
        return cls(sp.mask, sp.pad, sp.terminators, cfg.shift_logits, sc.strategy,
                   None if sc.threshold is None else float(sc.threshold), sc.temperature,
                   sc.absorb_pad, sc.block, sc.steps, select_impl, float(sc.draft_ratio))

    def loop_steps(self, longest_hole: int) -> int:
        """Steps the loop runs: all of them in threshold mode (it may stop early), else
        ``min(steps, longest hole)`` (one slot per step at least)."""
        return self.total_steps if self.threshold is not None else min(self.total_steps, longest_hole)


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
    from ..kernels.select_unmask import select_unmask  # imports triton (0.3 s): fused steps only

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


# --------------------------------------------------------------------------- the decode loop


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
    noise = None
    if spec.temperature > 0:  # rows' unused slots keep zeros (never selected)
        L, N = canvas.valid.shape
        noise = torch.zeros((L, N, vocab_size), dtype=torch.float32, device=state.ids.device)

    def let_go(keep: list[int]) -> None:
        nonlocal canvas, state, rows, noise, draft
        canvas, state, kept = stepper.drop(canvas, state, keep)
        wanted = set(keep)
        if len(kept) < len(rows.owner):
            idx = torch.tensor(kept, device=state.ids.device)
            if noise is not None:
                noise = noise[idx]
            if draft is not None:
                draft = draft.rows(idx)
        rows = rows.take(kept)
        for r, k in enumerate(kept):  # a stepper that keeps every row freezes the others
            if k not in wanted:
                rows.owner[r] = -1

    for s in range(spec.loop_steps(max(rows.length, default=0))):
        gone = [i for i in live if cancels[i] is not None and cancels[i]()]
        if gone:
            for i in gone:
                cancelled[i] = InfillCancelled(f"infill cancelled before step {s + 1}")
            live = [i for i in live if i not in gone]
            if not live:
                break
            let_go([r for r, o in enumerate(rows.owner) if o in live])
        if noise is not None:
            for r, g in enumerate(rows.gen):
                if g is not None:
                    n = rows.length[r]
                    noise[r, :n] = torch.rand((n, vocab_size), generator=g, device=noise.device)
        verifying = draft if s == 0 else None
        state = stepper.step(canvas, state, s, noise, verifying)
        if verifying is not None:
            # the one host synchronisation of the draft rows: what each one accepted
            acc, ver = draft_outcome(canvas, state, verifying, spec.terminators)
            acc_l, ver_l = acc.tolist(), ver.tolist()
            got: dict[int, int] = {}
            for r, d in enumerate(rows.draft):
                if d >= 0 and rows.owner[r] >= 0:
                    rows.accepted[r], rows.verified[r] = acc_l[r], ver_l[r]
                    got[rows.owner[r]] = got.get(rows.owner[r], 0) + ver_l[r]
            finished = {o for o, k in got.items()
                        if k > 0 and k >= (wanted[o] if o < len(wanted) else 1)}
            if finished:  # the verified drafts are the answer: the other rows go
                let_go([r for r, o in enumerate(rows.owner)
                        if o >= 0 and (o not in finished or rows.verified[r])])
                if not any(o >= 0 and o not in finished for o in rows.owner):
                    break
        # the one host synchronisation of the loop (threshold mode only)
        if spec.threshold is not None and not bool(state.masked.any()):
            break
    return Decoded(canvas, state, rows, cancelled)


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
    device = _model_device(model)
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


# --------------------------------------------------------------------------- reference


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
    device = _model_device(model)
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
