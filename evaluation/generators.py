"""Completion sources under evaluation, behind one protocol.

A :class:`Generator` is given the editor's view of a task (document ``text`` and cursor
``offset``, see :mod:`.tasks`) and returns the text to insert at the cursor. The model is
evaluated through the same path editors use: :class:`~diffill.lsp_server.completion.completer.Completer`
(context building, the local backend over the Engine, post-processing), with the single-line
policy for single-line holes (``multiline=False``) and the multi-line policy for spans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..lsp_server.backend.backends import load_local_backend
from ..lsp_server.completion.completer import Completer, CompletionAsk, options_from_kwargs
from ..lsp_server.text.context import Snippet
from ..model.limits import DEFAULT_MAX_STEPS
from .baseline import analogy_completion


@dataclass(frozen=True)
class Generated:
    """What a generator inserted and how (``info``: e.g. the model's steps and calls, the
    drafts it was sent and whether a verified one answered; see :func:`.runner.draft_metrics`)."""

    text: str
    info: dict[str, Any] = field(default_factory=dict)


class Generator(Protocol):
    name: str

    def generate(self, text: str, offset: int, *, multiline: bool) -> str | Generated: ...

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
    fixed (not chosen from a latency budget) so runs are reproducible. ``drafts``: draft and
    verify on (the server's default) or the model alone; :meth:`generate` reports the steps,
    model calls and drafts of each completion.
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
        drafts: bool = False,
        options: dict[str, Any] | None = None,
        keystroke: int = 0,
    ) -> None:
        self.name = name
        #: > 0: each completion is asked as the next keystroke -- first the same request with
        #: the ``keystroke`` characters before the cursor not yet typed (its answer thrown
        #: away), then the real one, both under one document path, as an editor asks
        #: (what a model side that keeps the document's context, model/reuse.py, then reuses)
        self.keystroke = keystroke
        self.options = dict(options or {})  # more completion options (Python names)
        self.backend = backend
        self.steps = steps
        self.language = language  # the tasks' language (the harness executes Python)
        self.syntax_check = syntax_check
        self.drafts = drafts
        common: dict[str, Any] = {"context_tokens": context_tokens, "syntax_check": syntax_check,
                                  "drafts": drafts, **self.options}
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
        return self._like(steps=steps)

    def with_drafts(self, drafts: bool = True, name: str = "model+drafts") -> CompleterGenerator:
        """Same model, budgets and steps, with draft and verify on (or off)."""
        return self._like(drafts=drafts, name=name)

    def _like(self, **changes: Any) -> CompleterGenerator:
        o = self._single.options
        kw: dict[str, Any] = {
            "steps": self.steps, "line_tokens": o.max_tokens,
            "span_tokens": self._multi.options.max_tokens, "context_tokens": o.context_tokens,
            "name": self.name, "language": self.language, "syntax_check": self.syntax_check,
            "drafts": self.drafts, "options": self.options, "keystroke": self.keystroke}
        return CompleterGenerator(self.backend, **{**kw, **changes})

    def with_options(self, name: str, **options: Any) -> CompleterGenerator:
        """Same model, budgets and steps, with more completion options (Python names)."""
        return self._like(name=name, options={**self.options, **options})

    def generate(self, text: str, offset: int, *, multiline: bool, path: str | None = None,
                 snippets: Sequence[Snippet] = (), workspace: Sequence[str] = ()) -> Generated:
        """The top suggestion; ``snippets`` (extra context) and ``workspace`` (chunks for
        the draft sources) as the server gathers them (:mod:`diffill.lsp_server.project.gather`)."""
        c = self._multi if multiline else self._single
        k = min(self.keystroke, offset)
        if k > 0:
            path = path or "task.py"
            c.run(text[:offset - k] + text[offset:], offset - k, CompletionAsk(multiline=multiline),
                  language=self.language, path=path, snippets=snippets, workspace=workspace)
        res = c.run(text, offset, CompletionAsk(multiline=multiline), language=self.language,
                    path=path, snippets=snippets, workspace=workspace)
        top = res.suggestions[0] if res.suggestions else None
        info: dict[str, Any] = {
            "steps": max((x.steps for x in res.candidates), default=0),
            "drafts": [d.source for d in res.drafts],
            "draft_verified": bool(top is not None and top.verified),
            "source": top.source if top is not None else None,
            "model_calls": res.model_calls,
        }
        return Generated(top.text if top is not None else "", info)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": "model via Completer", "steps": self.steps,
                             "language": self.language, "syntax_check": self.syntax_check,
                             "drafts": self.drafts}
        if self.keystroke:
            d["keystroke"] = self.keystroke
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
    draft_ratio: float | None = None,
    keystroke: int = 0,
) -> CompleterGenerator:
    """Load a checkpoint (None: the shipped default) once and wrap it for evaluation (the
    model alone; :meth:`CompleterGenerator.with_drafts` shares it with drafts on).
    ``block``: the sampler's semi-autoregressive block (``"model"``: the checkpoint's
    ``decode_block``; None: any-order decoding). ``draft_ratio``: the verification bar
    instead of the checkpoint's. ``keystroke``: :class:`CompleterGenerator`'s."""
    backend = load_local_backend(model_path, device,
                                 max_steps=max(steps or DEFAULT_MAX_STEPS, DEFAULT_MAX_STEPS),
                                 recipe=recipe)
    eng = backend.engine
    if block != "model":
        eng.sampler = dataclasses.replace(eng.sampler, block=block)
    if draft_ratio is not None:
        eng.sampler = dataclasses.replace(eng.sampler, draft_ratio=float(draft_ratio))
    return CompleterGenerator(
        backend,
        steps=steps,
        line_tokens=line_tokens,
        span_tokens=span_tokens,
        context_tokens=context_tokens,
        syntax_check=syntax_check,
        keystroke=keystroke,
    )
