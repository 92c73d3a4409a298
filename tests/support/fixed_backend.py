"""A backend for completer tests that answers every request with the same texts: no model,
control flow only (the completer's ranking, guard and post-processing over known answers)."""

from __future__ import annotations

from typing import Any

from diffill.lsp_server.backend.backends import Candidate, InfillResult


class FixedBackend:
    """Answers each infill with ``answers``, best first (scores 0, -1, ...); a text's tokens
    are its characters' code points."""

    name = "scripted"

    def __init__(self, answers: list[str]):
        self.answers = answers

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens: int) -> int | None:
        return None

    def infill(self, ctx: Any, ask: Any) -> InfillResult:
        return InfillResult([Candidate(text=t, score=-float(i)) for i, t in enumerate(self.answers)])

    def budget_ms(self, requested: float | None = None) -> float | None:
        return requested

    def describe(self) -> dict[str, Any]:
        return {}
