"""Text-level completion API: buffer + cursor offset -> post-processed suggestions.

Used by the language server, ``diffill complete``, the evaluation harness and the
HTTP server::

    completer = make_completer("path/to/checkpoint", device="cpu", max_tokens=32)
    [s.text for s in completer.complete(source, offset, n=3)]
    completer.run(source, offset, CompletionAsk(n=3, temperature=0.5, seed=1)).suggestions

A :class:`CompletionAsk` is one editor request at the text level, built once by its caller
(the language server, the HTTP server, ``diffill complete``); the completer turns it into the
backend's :class:`~.backend_api.InfillAsk` for each model call, and the step decision of the
last call comes back on the :class:`CompletionResult`.

A :class:`Suggestion` is what to insert at the cursor; ``replace_right`` > 0 means
it also replaces that many characters right of the cursor on the cursor line
(auto-closed characters the suggestion reproduces, see :mod:`.postprocess`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..backend.backends import BACKENDS, Backend, CancelFn, Cancelled, Candidate, InfillAsk
from ..drafting.drafts import propose
from ..drafting.query import Draft, DraftQuery
from ..text import languages, treesitter
from ..text.context import FimContext, Snippet, build_context, comment_prefix
from ..text.postprocess import AUTO_CLOSED, Processed, dedupe, postprocess
from ..text.scope import NameCheck
from ..text.syntax import SyntaxGuard
from .options import WIRE_NAMES, CompletionOptions, merge_options

if TYPE_CHECKING:  # the model side imports torch; only the type is needed here
    from ...model.budget import StepDecision

MODEL = "model"
"""``Suggestion.source`` of the model's own candidates."""


@dataclass
class Suggestion:
    """``source``: ``"model"``, or the draft source (:mod:`.drafts`) of a candidate that
    verified a draft; ``verified``: the model accepted that whole draft in its first step."""

    text: str
    score: float
    replace_right: int = 0
    raw: str = field(default="", repr=False)
    source: str = MODEL
    verified: bool = False


@dataclass(frozen=True)
class CompletionAsk:
    """One editor request, as its caller builds it once: ``n`` suggestions; ``multiline``
    (None: the options' policy decides); ``steps`` (None: the options', else the backend's
    budget decides); ``temperature`` > 0 samples (``seed`` makes it repeatable);
    ``budget_ms``, the request's latency budget (None: the options' ``latencyBudgetMs``,
    else the backend's default); ``cancel``, checked between refinement steps."""

    n: int = 1
    multiline: bool | None = None
    steps: int | None = None
    temperature: float = 0.0
    seed: int | None = None
    budget_ms: float | None = None
    cancel: CancelFn | None = field(default=None, compare=False)


@dataclass
class CompletionResult:
    """Suggestions plus what produced them (for logs, status and the CLI's --json):
    ``drafts`` are those sent to the model with the last model call, ``decision`` the step
    decision of that call (None: no model call, or a backend that does not say),
    ``model_calls`` how many calls the request made, ``budget_ms`` its latency budget in
    force (None: the backend keeps none)."""

    suggestions: list[Suggestion]
    context: FimContext
    candidates: list[Candidate]
    drafts: list[Draft] = field(default_factory=list)
    decision: StepDecision | None = None
    model_calls: int = 0
    budget_ms: float | None = None
    steps_asked: int | None = None  # the steps the model calls were asked for (None: planned)

    @property
    def planned(self) -> bool:
        """Whether the budget chose the steps (not the request or the options)."""
        return self.decision.planned if self.decision is not None else self.steps_asked is None


MAX_HEAL_CHARS = 32
_HEAL_TAIL = re.compile(r"(?: ?\w+|(?<=\S) )\Z")  # \Z: "$" also matches before a final "\n"



def partial_word(text: str, offset: int) -> str:
    """The text before ``offset`` that token healing backs off over: the word being typed
    with the space before it (BPE tokenizers attach a space to the word after it: " total"
    is one token, so a prefix ending in "to" or in "return " ends on a token the model
    rarely saw there), or a lone space after a non-space. "" when the cursor is inside a
    word or the word is longer than ``MAX_HEAL_CHARS``."""
    if offset < len(text) and (text[offset].isalnum() or text[offset] == "_"):
        return ""
    m = _HEAL_TAIL.search(text[max(0, offset - MAX_HEAL_CHARS - 2):offset])
    word = m.group(0) if m else ""
    return word if len(word) <= MAX_HEAL_CHARS else ""


def heal(cands: Sequence[Candidate], word: str) -> list[Candidate]:
    """Candidates generated from the start of ``word``: keep those that reproduce it and
    more, minus the word (what is left to insert at the cursor)."""
    return [
        dataclasses.replace(c, text=c.text[len(word):])
        for c in cands
        if c.text.startswith(word) and len(c.text) > len(word)
    ]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


_DEF = re.compile(r"[ \t]*(?:async[ \t]+def|def|class)\b")


def _block_floor(lines_above: Sequence[str]) -> int:
    """Indentation of the innermost ``def``/``class`` header enclosing the last of
    ``lines_above`` (-1 when none): a line at that depth or shallower leaves its body."""
    code = [ln for ln in lines_above if ln.strip() and not ln.lstrip().startswith("#")]
    if not code:
        return -1
    bound = len(_indent(code[-1]))
    if _DEF.match(code[-1]) and code[-1].rstrip().endswith(":"):
        return bound
    for ln in reversed(code[:-1]):
        ind = len(_indent(ln))
        if ind < bound:
            if _DEF.match(ln):
                return ind
            bound = ind
            if ind == 0:
                break
    return -1


def reindented(draft: str, ctx: FimContext) -> list[str]:
    """``draft`` (a text to insert at the cursor, on a line holding only indentation left of
    it and nothing right of it) shifted as a block into the cursor's own block: its first line
    at the depth of the last non-blank line before the cursor (one level deeper when that
    line opens a block with ``:``), or else at the depth of the next non-blank line after
    the cursor when that depth is still inside the function or class holding the line before
    (a dedent that stays in it). A depth that leaves that ``def``/``class`` is never tried: a
    block shifted out of the function the cursor is in parses between two functions, and is
    wrong there (it was the README example's suggestion: the body of ``mean`` at column 0
    after ``variance``). Nothing when the cursor line holds code, when a line would lose
    characters other than indentation, or when the draft already starts at those depths."""
    if ctx.line_prefix.strip() or ctx.line_suffix.strip() or not draft.strip():
        return []
    typed = ctx.line_prefix
    full = typed + draft
    lines = full.split("\n")
    start = _indent(lines[0])
    unit = "\t" if start.startswith("\t") or typed.startswith("\t") else " "
    below = next((ln for ln in ctx.after_line.split("\n") if ln.strip()), None)
    before = ctx.prefix[ctx.header_chars: len(ctx.prefix) - len(typed)].split("\n")
    above = next((ln for ln in reversed(before) if ln.strip()), None)
    floor = _block_floor(before)
    depths: list[str] = []
    if above is not None:
        step = (unit * 4 if unit == " " else unit) if above.rstrip().endswith(":") else ""
        depths.append(_indent(above) + step)
    if below is not None and len(_indent(below)) > floor and (
            above is None or not above.rstrip().endswith(":")):
        depths.append(_indent(below))
    out: list[str] = []
    for depth in depths:
        if depth == start or len(depth) == len(start):
            continue
        shift = len(depth) - len(start)
        moved = []
        for ln in lines:
            ind = _indent(ln)
            if not ln.strip():
                moved.append("")
            elif shift < 0 and len(ind) < -shift:
                break
            else:
                moved.append(unit * (len(ind) + shift) + ln.lstrip(" \t"))
        else:
            text = "\n".join(moved)
            if text.startswith(typed) and text[len(typed):].strip() and text[len(typed):] not in out:
                out.append(text[len(typed):])
    return out


def detect_eol(ctx: FimContext) -> str:
    """The document's newline, judged from the context windows."""
    sample = ctx.prefix[-2000:] + ctx.suffix[:2000]
    return "\r\n" if "\r\n" in sample else "\n"


def finish(
    cands: Sequence[Candidate],
    ctx: FimContext,
    *,
    policy: str,
    multiline: bool | None,
    n: int,
    guard: SyntaxGuard | None = None,
    drafts: Sequence[Draft] = (),
) -> list[Suggestion]:
    """Post-process raw candidates, drop empty ones, duplicates and (with ``guard``) those
    that break a buffer that parses; best first (by the model's score, the one ranking of
    model-only and draft-seeded candidates alike), at most n. ``drafts``: those the
    candidates' ``draft`` indexes (for ``Suggestion.source``)."""
    comment = comment_prefix(ctx.language)
    lang = languages.lookup(ctx.language)
    scoped = lang is not None and lang.name != "python"  # Python: its rules, unchanged
    eol = detect_eol(ctx)
    body = ctx.prefix[ctx.header_chars:]
    scored: list[tuple[Processed, Candidate]] = []
    for c in cands:
        p = postprocess(
            c.text,
            line_prefix=ctx.line_prefix,
            line_suffix=ctx.line_suffix,
            after_line=ctx.after_line,
            prefix=body,
            multiline=multiline,
            policy=policy,
            comment=comment,
            eol=eol,
            scope=scoped,
            auto_closed=languages.auto_closed(lang) if scoped else AUTO_CLOSED,
        )
        if p is not None and (guard is None or guard.keeps(p.text, p.replace_right)):
            scored.append((p, c))
    scored.sort(key=lambda pc: -pc[1].score)
    kept = dedupe([p for p, _ in scored])
    by_text = {p.text: c for p, c in reversed(scored)}
    out = []
    for p in kept[:n]:
        c = by_text[p.text]
        source = drafts[c.draft].source if c.draft is not None and c.draft < len(drafts) else MODEL
        out.append(Suggestion(text=p.text, score=c.score, replace_right=p.replace_right,
                              raw=c.text, source=source if c.verified else MODEL,
                              verified=c.verified))
    return out


def _wanted(sn: Snippet, o: CompletionOptions) -> bool:
    """Whether the options let this kind of extra context into the header."""
    flag = {"definition": o.definitions_context, "workspace": o.workspace_context,
            "recent": o.recent_context}.get(sn.kind)
    return o.extra_context if flag is None else flag


class Completer:
    """Context building + backend call + post-processing, with no editor state."""

    def __init__(self, backend: Backend, options: CompletionOptions | None = None) -> None:
        self.backend = backend
        self.options = options or CompletionOptions()

    def context_budget(self) -> int:
        o = self.options
        limit = self.backend.max_context_tokens(o.max_tokens)
        return o.context_tokens if limit is None else min(o.context_tokens, limit)

    def build(
        self,
        text: str,
        offset: int,
        *,
        language: str | None = None,
        path: str | None = None,
        snippets: Sequence[Snippet] = (),
        repo: str | None = None,
    ) -> FimContext:
        """The context (:func:`.context.build_context`); the header in the loaded family's
        cross-file format (the backend's ``cross_file``: ``model/recipes.py``)."""
        o = self.options
        return build_context(
            text,
            offset,
            self.backend.encode_batch,
            budget=self.context_budget(),
            prefix_fraction=o.prefix_fraction,
            language=language,
            path=path,
            snippets=[sn for sn in snippets if _wanted(sn, o)],
            extra_fraction=o.extra_context_fraction,
            header_format=getattr(self.backend, "cross_file", "comment"),
            repo=repo,
        )

    def run(
        self,
        text: str,
        offset: int,
        ask: CompletionAsk = CompletionAsk(),
        *,
        language: str | None = None,
        path: str | None = None,
        snippets: Sequence[Snippet] = (),
        others: Sequence[str] = (),
        recalled: Sequence[str] = (),
        workspace: Sequence[str] = (),
        repo: str | None = None,
    ) -> CompletionResult:
        """Like :meth:`complete`, for the request ``ask``, also returning the context, the raw
        candidates and the step decision. Raises :class:`~diffill.lsp_server.backend.backends.Cancelled`.

        Token healing (option ``token_healing``): with the cursor right after a partial
        word, the model first fills the hole from the word's start; candidates that
        reproduce the typed part keep the rest. When none does (a new name the model
        cannot guess), the hole at the cursor is filled as usual (a second model call).

        Drafts (option ``drafts``): candidate middles from :func:`.drafts.propose` (this
        buffer, ``others`` -- the texts of the other open documents -- and ``recalled``,
        earlier suggestions for this document) go to the model with the request and are
        verified in its first step (:mod:`diffill.model.decoder`, *Drafts*; ``workspace``:
        chunks of workspace files like the code here, searched after the buffer and the
        open documents); a draft that
        post-processing or the syntax guard would drop is not sent. When only verified
        drafts came back and none survives post-processing, the model runs again without
        them, unless the request's budget is spent.

        One latency budget for the whole request (not per model call): the first call gets
        it whole, a later one what is left (:class:`_Calls`)."""
        o = self.options
        n = max(ask.n, 1)
        multiline = ask.multiline
        calls = _Calls(self, ask)
        word = partial_word(text, offset) if o.token_healing else ""
        guard = SyntaxGuard(text, offset, language=language, path=path) if o.syntax_check else None
        drafts: list[Draft] | None = None if o.drafts else []
        policy = o.multiline
        if multiline is None and policy == "auto":  # the tree decides where it can (None: the text rule)
            multiline = treesitter.multiline_at(text, offset, language, path)

        def checked(ctx: FimContext) -> list[Draft]:
            nonlocal drafts
            if drafts is None:
                drafts = self.drafts_for(text, offset, ctx, multiline=multiline, guard=guard,
                                         others=others, recalled=recalled, workspace=workspace)
            return drafts

        if word:
            # Token healing: the hole starts at the beginning of the word being typed.
            start = offset - len(word)
            hctx = self.build(text[:start] + text[offset:], start, language=language, path=path,
                              snippets=snippets, repo=repo)
            # seen from the real cursor (the ids stay what the model saw, without the word)
            ctx = dataclasses.replace(hctx, prefix=hctx.prefix + word,
                                      line_prefix=hctx.line_prefix + word,
                                      suffix_end=hctx.suffix_end + len(word))
            ds = checked(ctx)
            cands, sugg = self._verified(
                hctx, calls, [word + d.text for d in ds], lambda raw: heal(raw, word),
                lambda cs: finish(cs, ctx, policy=policy, multiline=multiline, n=n, guard=guard,
                                  drafts=ds))
            if sugg:
                return calls.result(sugg, ctx, cands, ds)
        ctx = self.build(text, offset, language=language, path=path, snippets=snippets, repo=repo)
        ds = checked(ctx)
        cands, sugg = self._verified(
            ctx, calls, [d.text for d in ds], list,
            lambda cs: finish(cs, ctx, policy=policy, multiline=multiline, n=n, guard=guard,
                              drafts=ds))
        return calls.result(sugg, ctx, cands, ds)

    def drafts_for(self, text: str, offset: int, ctx: FimContext, *, multiline: bool | None,
                   guard: SyntaxGuard | None, others: Sequence[str] = (),
                   recalled: Sequence[str] = (), workspace: Sequence[str] = ()) -> list[Draft]:
        """The drafts worth sending for the cursor at ``offset``: proposed
        (:func:`.drafts.propose`; a span when the multi-line policy allows several lines
        here), as post-processing would show them. A draft that post-processing or the
        syntax guard drops is cut back to its longest run of whole first lines that is kept
        (a copied block whose last lines break the file still offers its first ones), or
        left out. When no draft is kept at all, the drafts are tried once more shifted to the
        depth of the code around the cursor (:func:`reindented`: a block copied from another
        depth); only then, since a shifted copy is weaker evidence than a draft as found and
        the model cannot tell a right draft from a wrong one (on held-out seed 1, shifted
        variants beside the others cost one exact line in 200, as a fallback they cost none
        and raised span edit similarity 0.348 -> 0.356). With the syntax guard on (Python), a
        draft as found or shifted that reads a name nothing binds where it would land
        (:mod:`.scope`) is left out whole: it was copied from another scope."""
        multi = multiline if multiline is not None else (
            self.options.multiline != "always-single" and not ctx.line_suffix.strip())
        q = DraftQuery(text=text, offset=offset, others=tuple(others), recalled=tuple(recalled),
                       workspace=tuple(workspace), multiline=bool(multi))
        proposed = propose(q)
        names = NameCheck(guard) if guard is not None else None
        kept: list[Draft] = []
        for shift in (False, True):
            for d in proposed:
                for variant in reindented(d.text, ctx) if shift else (d.text,):
                    if names is not None and names.unbound(variant, ctx.line_prefix):
                        continue  # a copy from another scope: it reads names unbound here
                    shown = self._kept_head(variant, ctx, multiline, guard)
                    if shown is not None:
                        if all(shown != x.text for x in kept):
                            kept.append(Draft(shown, d.source))
                        break
            if kept:
                break
        return kept

    def _kept_head(self, draft: str, ctx: FimContext, multiline: bool | None,
                   guard: SyntaxGuard | None) -> str | None:
        """``draft``'s longest run of whole first lines that post-processing and the guard
        keep, as they would show it (None: not even its first line)."""
        lines = draft.split("\n")
        for k in range(len(lines), 0, -1):
            head = "\n".join(lines[:k])
            if not head.strip():
                continue
            got = finish([Candidate(text=head, score=0.0)], ctx, policy=self.options.multiline,
                         multiline=multiline, n=1, guard=guard)
            if got and got[0].replace_right == 0:
                return got[0].text
        return None

    def _verified(self, ctx: FimContext, calls: _Calls, drafts: list[str],
                  cut: Callable[[list[Candidate]], list[Candidate]],
                  show: Callable[[list[Candidate]], list[Suggestion]],
                  ) -> tuple[list[Candidate], list[Suggestion]]:
        """The model's candidates with ``drafts`` verified, ``cut`` (token healing's, or as
        they are), and the suggestions ``show`` makes of them; when all came back verified
        (the request finished at its first step) and none is shown, the model runs again
        without drafts, unless the request's budget is spent (:class:`_Calls`)."""
        raw = calls.infill(ctx, drafts)
        cands = cut(raw)
        sugg = show(cands) if cands else []
        if drafts and raw and all(c.verified for c in raw) and not sugg and not calls.spent():
            cands = cut(calls.infill(ctx))
            sugg = show(cands) if cands else []
        return cands, sugg

    def complete(
        self,
        text: str,
        offset: int,
        *,
        n: int = 1,
        multiline: bool | None = None,
        cancel: CancelFn | None = None,
        language: str | None = None,
        path: str | None = None,
    ) -> list[Suggestion]:
        """Suggestions for the hole at character ``offset`` of ``text``, best first
        (``language``: the LSP language id, e.g. ``python``; with ``path``, it decides the
        comment syntax and whether the syntax guard applies)."""
        return self.run(text, offset, CompletionAsk(n=n, multiline=multiline, cancel=cancel),
                        language=language, path=path).suggestions


class _Calls:
    """The model calls of one :meth:`Completer.run`: each call's :class:`InfillAsk` made from
    the request's :class:`CompletionAsk` and the options, the calls counted, the last step
    decision kept -- and one latency budget for them all.

    One budget per editor request: the budget in force (the ask's, else the options'
    ``latencyBudgetMs``, else the backend's default: ``Backend.budget_ms``) is the request's,
    not each call's. Its deadline starts with :meth:`Completer.run`. The first model call
    gets the whole budget, so the usual request (one call) gets the same steps whatever the
    machine's load, as the step plan promises (``docs/step-budget.md``). A later call (token
    healing's plain pass, the rerun without drafts) gets what is left, in whole ms (a few
    distinct budgets: the step budget derives and keeps one plan per budget), and never less
    than one step's share of the budget (budget / ``maxSteps``): below that the plan gives
    the fewest steps anyway and says it is over budget. The rerun without drafts is skipped
    when less than that share is left (its first result stands: a rerun then would only
    overshoot); token healing's plain pass is the answer itself and always runs. A backend
    that keeps no budget (a remote endpoint) gets the request's own, or none, every call."""

    def __init__(self, completer: Completer, ask: CompletionAsk) -> None:
        o = completer.options
        self.backend = completer.backend
        self.ask = ask
        self.max_tokens = o.max_tokens
        self.steps = o.steps if ask.steps is None else ask.steps
        self.requested = o.latency_budget_ms if ask.budget_ms is None else ask.budget_ms
        self.budget_ms = self.backend.budget_ms(self.requested)  # the request's, in force
        self.floor_ms = None if self.budget_ms is None else self.budget_ms / o.max_steps
        self.start = time.monotonic()
        self.count = 0
        self.decision: StepDecision | None = None

    def left_ms(self) -> float | None:
        """What is left of the request's budget (None: no budget kept)."""
        if self.budget_ms is None:
            return None
        return self.budget_ms - (time.monotonic() - self.start) * 1000.0

    def call_budget(self) -> float | None:
        """The budget of the next model call (class doc)."""
        left = self.left_ms()
        if left is None or self.floor_ms is None:
            return self.requested
        if self.count == 0:
            return self.budget_ms
        return max(self.floor_ms, float(math.floor(left)))

    def spent(self) -> bool:
        """Less than one step's share of the budget is left (class doc)."""
        left = self.left_ms()
        return left is not None and self.floor_ms is not None and left < self.floor_ms

    def infill(self, ctx: FimContext, drafts: Sequence[str] = ()) -> list[Candidate]:
        ask = self.ask
        if ask.cancel is not None and ask.cancel():
            raise Cancelled("cancelled before the model ran")
        budget = self.call_budget()
        self.count += 1
        got = self.backend.infill(ctx, InfillAsk(
            n=max(ask.n, 1), max_tokens=self.max_tokens, steps=self.steps, budget_ms=budget,
            temperature=ask.temperature, seed=ask.seed, drafts=tuple(drafts), cancel=ask.cancel))
        self.decision = got.decision
        return list(got.candidates)

    def result(self, sugg: list[Suggestion], ctx: FimContext, cands: list[Candidate],
               drafts: Sequence[Draft]) -> CompletionResult:
        return CompletionResult(sugg, ctx, cands, list(drafts), self.decision, self.count,
                                self.budget_ms, self.steps)


def options_from_kwargs(**opts: object) -> CompletionOptions:
    """Python-named option values (``max_tokens=...``) -> validated options; a bad
    value raises ValueError naming the field."""
    py_to_wire = {v: k for k, v in WIRE_NAMES.items()}
    raw = {}
    for k, v in opts.items():
        if k not in py_to_wire:
            raise ValueError(f"unknown completion option {k!r}")
        raw[py_to_wire[k]] = v
    options, errors = merge_options(CompletionOptions(), raw)
    if errors:
        raise ValueError("; ".join(errors))
    return options


def make_completer(model_path: str | None = None, device: str = "cpu", **opts: object) -> Completer:
    """A :class:`Completer` over a local model (``model_path`` None: the shipped default),
    or over the backend named by ``backend=`` (e.g. ``"openai"`` with ``remote_url=``)."""
    options = options_from_kwargs(model_path=model_path, device=device, **opts)
    backend = BACKENDS[options.backend](
        options.model_path, options.device, max_steps=options.max_steps, options=options
    )
    return Completer(backend, options)


__all__ = [
    "CompletionAsk",
    "CompletionResult",
    "Completer",
    "Suggestion",
    "finish",
    "make_completer",
]
