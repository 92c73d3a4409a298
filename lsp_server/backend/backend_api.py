r"""What a backend is: the :class:`Backend` protocol the completer, the language server and
the HTTP server talk to, the :class:`InfillAsk` it is given, the :class:`InfillResult` (its
:class:`Candidate`\ s and the step decision) it returns, and its two exceptions.
Implementations: :class:`~.backends.LocalBackend` (the model in this process) and
:class:`~.remote.RemoteBackend` (an OpenAI-compatible endpoint); :data:`.backends.BACKENDS`
names them. Kept apart from both so that neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..text.context import FimContext

if TYPE_CHECKING:  # the model side imports torch; the server imports this before `initialize`
    from ...model.budget import StepDecision

CancelFn = Callable[[], bool]
"""Returns True when the request should stop (checked between diffusion steps)."""


class Cancelled(Exception):
    """The request was cancelled (superseded, document changed, $/cancelRequest)."""


class BackendError(RuntimeError):
    """A backend could not produce candidates (bad request, remote failure, ...)."""


@dataclass(frozen=True)
class Candidate:
    """A raw middle (not post-processed) and its ranking score (higher is better).
    ``draft``: index of the draft (``infill``'s ``drafts``) this candidate verified, None for
    the model's own; ``accepted``: the draft tokens the model accepted from its start;
    ``verified``: all of it and the end of the middle (the candidate is the draft)."""

    text: str
    score: float
    tokens: int = 0
    steps: int = 0
    draft: int | None = None
    accepted: int = 0
    verified: bool = False


@dataclass(frozen=True)
class InfillAsk:
    """One model call, as the completer asks it of a backend (the context travels beside it):
    up to ``n`` middles of at most ``max_tokens`` tokens; ``steps`` (None: the backend's
    budget decides them, :mod:`diffill.model.plan`) within ``budget_ms`` (None: the
    backend's own default); ``temperature`` > 0 samples, ``seed`` makes it repeatable;
    ``drafts``: candidate middles to verify (a backend that cannot verify ignores them);
    ``cancel`` is checked between refinement steps."""

    n: int = 1
    max_tokens: int = 32
    steps: int | None = None
    budget_ms: float | None = None
    temperature: float = 0.0
    seed: int | None = None
    drafts: tuple[str, ...] = ()
    cancel: CancelFn | None = field(default=None, compare=False)


@dataclass(frozen=True)
class InfillResult:
    """A backend's answer: the candidates, best first, and the step decision they were made
    under (:class:`~diffill.model.budget.StepDecision`; None where the backend does not say,
    e.g. a remote endpoint)."""

    candidates: list[Candidate]
    decision: StepDecision | None = None


@runtime_checkable
class Backend(Protocol):
    """What the completer needs from a model, local or remote."""

    name: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text in the model's tokenizer (context budgets use this)."""
        ...

    def max_context_tokens(self, max_tokens: int) -> int | None:
        """Largest prefix + suffix the model accepts with a ``max_tokens`` hole (None: no limit)."""
        ...

    def infill(self, ctx: FimContext, ask: InfillAsk) -> InfillResult:
        """Up to ``ask.n`` candidate middles, best first, and the step decision. Raises
        :class:`Cancelled`."""
        ...

    def budget_ms(self, requested: float | None = None) -> float | None:
        """The latency budget in force for a request that asks for ``requested`` (None: the
        backend's default); None where the backend keeps no budget (a remote endpoint)."""
        ...

    def describe(self) -> dict[str, Any]:
        """``{"model", "family", "device", ...}`` for status reports."""
        ...

    def warmup(self) -> None:
        """Called once after loading, before the first request (may take a moment)."""
        ...
