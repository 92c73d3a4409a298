"""What a request to the engine is, in token ids, and its defaults: :class:`EngineAsk` (one
infill request as :meth:`~diffill.model.engine.Engine.infill` takes it), :class:`InfillOutcome`
(its answer: the candidates and the step decision they ran under), the one candidate-length
policy (:func:`default_lengths`) and the decoding a checkpoint recommends
(:func:`default_sampler`).

Candidate hole lengths (the one policy, :func:`default_lengths`). When the caller gives
none, ``max_tokens`` and the number of distinct middles wanted (``candidates``) are turned
into ``max(3, candidates)`` lengths halving down from ``max_tokens``: ``(max_tokens // 4,
max_tokens // 2, max_tokens)`` for up to three candidates (values < 1 dropped, duplicates
removed), ``max_tokens // 8`` and so on for more. Because pads inside the hole are
trimmed, a candidate length is only an upper bound on the middle; three geometrically
spaced bounds cover a short completion (a few tokens), a line and a small block at a batch
of three rows, and the sampler ranks them by the model's own score. The hole never
exceeds ``max_tokens``, so neither does the middle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .budget import StepDecision
from .decoder.spec import Infill, SamplerConfig

DEFAULT_CANDIDATES = 3


def default_lengths(max_tokens: int, candidates: int = 1) -> tuple[int, ...]:
    """Candidate hole lengths for a token budget and the number of distinct middles wanted
    (see module doc): ``max(3, candidates)`` lengths halving down from ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    count = max(DEFAULT_CANDIDATES, candidates)
    return tuple(sorted({max_tokens >> i for i in range(count)} - {0}))


def default_sampler(cfg: Any) -> SamplerConfig:
    """The decoding a checkpoint recommends: its ``decode_block`` and ``draft_ratio``
    (config.json), the sampler's defaults otherwise."""
    sc = SamplerConfig(block=cfg.decode_block)
    ratio = getattr(cfg, "draft_ratio", None)
    return sc if ratio is None else dataclasses.replace(sc, draft_ratio=float(ratio))


@dataclass(frozen=True)
class EngineAsk:
    """One infill request in token ids, as :meth:`Engine.infill` takes it (the language
    server's :class:`~diffill.lsp_server.backend.backend_api.InfillAsk` once tokenized).

    ``lengths`` (candidate hole lengths) overrides the ones derived from ``max_tokens`` and
    ``candidates`` (:func:`default_lengths`); ``steps`` overrides the step plan's choice for
    ``budget_ms`` (None: the engine's budget, :class:`~.budget.StepBudget`); ``temperature`` /
    ``seed`` override the sampler's; ``drafts``: candidate middles to verify;
    ``context_key`` names the document, whose kept context the request may start from
    (:attr:`Engine.reuse_context`); ``cancel`` is checked between steps."""

    prefix_ids: Sequence[int]
    suffix_ids: Sequence[int]
    max_tokens: int = 32
    lengths: tuple[int, ...] | None = None
    candidates: int = 1
    steps: int | None = None
    budget_ms: float | None = None
    temperature: float | None = None
    seed: int | None = None
    cancel: Callable[[], bool] | None = None
    drafts: Sequence[Sequence[int]] = ()
    context_key: str | None = None


@dataclass(frozen=True)
class InfillOutcome(Sequence[Infill]):
    """:meth:`Engine.infill`'s answer: the candidates, best first, and the step decision
    they were made under (:meth:`~.budget.StepBudget.decide`). It reads as the sequence of its
    candidates, for the callers that want only those."""

    candidates: list[Infill]
    decision: StepDecision

    def __getitem__(self, i: Any) -> Any:
        return self.candidates[i]

    def __len__(self) -> int:
        return len(self.candidates)
