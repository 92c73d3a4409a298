"""What a decode is asked and what it answers: the decoding rules (:class:`SamplerConfig`,
:class:`Strategy`), the special ids a family's recipe gives the decoder (:class:`SpecialIds`),
what every step of a batch shares (:class:`StepSpec`), the candidates (:class:`Infill`) and
:class:`InfillCancelled`; the seeds of the per-row noise. The rules themselves: the package
doc (:mod:`diffill.model.decoder`)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ModelConfig
from ..limits import DEFAULT_STEPS


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
    vocab: int = 0  # the head's width, for :func:`~.step.score_slots`' pieces (0: unknown, one piece)

    @classmethod
    def of(cls, cfg: ModelConfig, sc: SamplerConfig, *, select_impl: str | None = None,
           special: SpecialIds | None = None) -> StepSpec:
        """The spec of a request: ``cfg``'s special ids (or a family recipe's ``special``)
        and ``sc``'s rules."""
        sp = special if special is not None else SpecialIds.from_config(cfg)
        return cls(sp.mask, sp.pad, sp.terminators, cfg.shift_logits, sc.strategy,
                   None if sc.threshold is None else float(sc.threshold), sc.temperature,
                   sc.absorb_pad, sc.block, sc.steps, select_impl, float(sc.draft_ratio),
                   cfg.vocab_size)

    def loop_steps(self, longest_hole: int) -> int:
        """Steps the loop runs: all of them in threshold mode (it may stop early), else
        ``min(steps, longest hole)`` (one slot per step at least)."""
        return self.total_steps if self.threshold is not None else min(self.total_steps, longest_hole)


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


def model_device(model: Any) -> torch.device:
    """The device of the model's weights (a model without any: its ``device``, else CPU)."""
    for p in model.parameters():
        return p.device
    return torch.device(getattr(model, "device", "cpu"))


def seed_for(seed: int, n: int, draft: int = -1) -> int:
    """Per-candidate generator seed: depends on the request seed, the hole length and the
    draft the row verifies (-1: none) only."""
    return (seed * 1_000_003 + n * 7919 + (draft + 1) * 104_729) % (2**63 - 1)
