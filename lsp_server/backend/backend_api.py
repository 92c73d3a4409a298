"""What a backend is: the :class:`Backend` protocol the completer, the language server and
the HTTP server talk to, the :class:`Candidate` it returns, and its two exceptions.
Implementations: :class:`~.backends.LocalBackend` (the model in this process) and
:class:`~.remote.RemoteBackend` (an OpenAI-compatible endpoint); :data:`.backends.BACKENDS`
names them. Kept apart from both so that neither imports the other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..text.context import FimContext

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

    def infill(
        self,
        ctx: FimContext,
        *,
        n: int,
        max_tokens: int,
        steps: int | None = None,
        latency_budget_ms: float | None = None,
        cancel: CancelFn | None = None,
        drafts: Sequence[str] = (),
    ) -> list[Candidate]:
        """Up to ``n`` candidate middles, best first. ``drafts``: candidate middles to verify
        (a backend that cannot verify ignores them). Raises :class:`Cancelled`."""
        ...

    def describe(self) -> dict[str, Any]:
        """``{"model", "family", "device", ...}`` for status reports."""
        ...

    def warmup(self) -> None:
        """Called once after loading, before the first request (may take a moment)."""
        ...
