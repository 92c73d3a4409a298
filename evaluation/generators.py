"""Completion sources under evaluation, behind one protocol.

A :class:`Generator` is given the editor's view of a task (document ``text`` and cursor
``offset``, see :mod:`.tasks`) and returns the text to insert at the cursor. The model is
evaluated through the same path editors use: :class:`~diffill.lsp_server.completer.Completer`
(context building, the local backend over the Engine, post-processing), with the single-line
policy for single-line holes (``multiline=False``) and the multi-line policy for spans.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from ..lsp_server.backends import load_local_backend
from ..lsp_server.completer import Completer, options_from_kwargs
from .baseline import analogy_completion


class Generator(Protocol):
    name: str

    def generate(self, text: str, offset: int, *, multiline: bool) -> str: ...

    def describe(self) -> dict[str, Any]: ...


class EmptyGenerator:
    """Inserts nothing: the floor every model must beat."""

    name = "empty"

    def generate(self, text: str, offset: int, *, multiline: bool) -> str:
        return ""

    def describe(self) -> dict[str, Any]:
        return {"kind": "empty completion"}


class BaselineGenerator:
    """The non-neural "continue by analogy" baseline (:mod:`.baseline`)."""

    name = "baseline"

    def generate(self, text: str, offset: int, *, multiline: bool) -> str:
        return analogy_completion(text[:offset], text[offset:], multiline=multiline)

    def describe(self) -> dict[str, Any]:
        return {"kind": "continue-by-analogy (most similar earlier line's successor, re-indented)"}


class CompleterGenerator:
    """The model through the editors' Completer.

    One Completer per policy shares the backend (the loaded model): ``single`` for line holes
    (``max_tokens`` = ``line_tokens``) and ``multi`` for spans (``span_tokens``). ``steps`` is
    fixed (not chosen from a latency budget) so runs are reproducible.
    """

    def __init__(
        self,
        backend: Any,
        *,
        steps: int | None,
        line_tokens: int = 32,
        span_tokens: int = 96,
        context_tokens: int = 1024,
        name: str = "model",
        language: str | None = "python",
        syntax_check: bool = True,
    ) -> None:
        self.name = name
        self.backend = backend
        self.steps = steps
        self.language = language  # the tasks' language (the harness executes Python)
        self.syntax_check = syntax_check
        common: dict[str, Any] = {"context_tokens": context_tokens, "syntax_check": syntax_check}
        if steps is not None:
            common["steps"] = steps
        self._single = Completer(
            backend, options_from_kwargs(max_tokens=line_tokens, multiline="always-single", **common)
        )
        self._multi = Completer(
            backend, options_from_kwargs(max_tokens=span_tokens, multiline="always-multi", **common)
        )

    def with_steps(self, steps: int) -> CompleterGenerator:
        """Same model and budgets, another step count (for the frontier)."""
        o = self._single.options
        return CompleterGenerator(
            self.backend,
            steps=steps,
            line_tokens=o.max_tokens,
            span_tokens=self._multi.options.max_tokens,
            context_tokens=o.context_tokens,
            name=self.name,
            language=self.language,
            syntax_check=self.syntax_check,
        )

    def generate(self, text: str, offset: int, *, multiline: bool) -> str:
        c = self._multi if multiline else self._single
        sugg = c.complete(text, offset, n=1, multiline=multiline, language=self.language)
        return sugg[0].text if sugg else ""

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": "model via Completer", "steps": self.steps,
                             "language": self.language, "syntax_check": self.syntax_check}
        sampler = getattr(getattr(self.backend, "engine", None), "sampler", None)
        if sampler is not None:
            d["block"] = sampler.block
        d["line_max_tokens"] = self._single.options.max_tokens
        d["span_max_tokens"] = self._multi.options.max_tokens
        d["context_tokens"] = self._single.options.context_tokens
        describe = getattr(self.backend, "describe", None)
        if callable(describe):
            d.update(describe())
        return d


def load_model_generator(
    model_path: str | None,
    device: str = "cpu",
    *,
    steps: int | None,
    line_tokens: int = 32,
    span_tokens: int = 96,
    context_tokens: int = 1024,
    block: int | None | str = "model",
    syntax_check: bool = True,
    recipe: str | None = None,
) -> CompleterGenerator:
    """Load a checkpoint (None: the shipped default) once and wrap it for evaluation.
    ``block``: the sampler's semi-autoregressive block (``"model"``: the checkpoint's
    ``decode_block``; None: any-order decoding)."""
    backend = load_local_backend(model_path, device, max_steps=max(steps or 16, 16), recipe=recipe)
    if block != "model":
        eng = backend.engine
        eng.sampler = dataclasses.replace(eng.sampler, block=block)
    return CompleterGenerator(
        backend,
        steps=steps,
        line_tokens=line_tokens,
        span_tokens=span_tokens,
        context_tokens=context_tokens,
        syntax_check=syntax_check,
    )
