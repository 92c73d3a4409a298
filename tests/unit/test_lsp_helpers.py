"""Pure helpers of the language server: position encodings, scheduler, typed-ahead cache,
LSP item construction, latency percentiles."""

from __future__ import annotations

import asyncio
import threading

import pytest
from diffill.lsp_server.backends import Cancelled
from diffill.lsp_server.completer import Suggestion
from diffill.lsp_server.encoding import (
    LineIndex,
    PositionError,
    column_to_index,
    index_to_column,
)
from diffill.lsp_server.items import completion_items, inline_items, typed_word
from diffill.lsp_server.scheduler import (
    LatencyStats,
    Scheduler,
    Superseded,
    TypeaheadCache,
    percentile,
)
from lsprotocol import types

LINE = 'x = "a😀é" + na'  # 😀: 4 utf-8 bytes, 2 utf-16 units; é: 2 utf-8 bytes


# -- encodings --------------------------------------------------------------------------------

@pytest.mark.parametrize("enc", ["utf-8", "utf-16", "utf-32"])
def test_column_round_trip(enc):
    for i in range(len(LINE) + 1):
        col = index_to_column(LINE, i, enc)
        assert column_to_index(LINE, col, enc) == i
        expected = {"utf-8": len(LINE[:i].encode()), "utf-16": len(LINE[:i].encode("utf-16-le")) // 2,
                    "utf-32": i}[enc]
        assert col == expected


def test_column_inside_a_character_rounds_down_and_past_end_clamps():
    emoji = LINE.index("😀")
    assert column_to_index(LINE, index_to_column(LINE, emoji, "utf-16") + 1, "utf-16") == emoji
    assert column_to_index(LINE, index_to_column(LINE, emoji, "utf-8") + 3, "utf-8") == emoji
    assert column_to_index(LINE, 999, "utf-16") == len(LINE)


def test_line_index_resolve():
    idx = LineIndex("ab\n" + LINE + "\r\nlast\n")
    cur = idx.resolve(1, index_to_column(LINE, len(LINE), "utf-8"), "utf-8")
    assert (cur.row, cur.col, cur.line) == (1, len(LINE), LINE)
    assert idx.source[cur.offset - 2: cur.offset] == "na"
    assert idx.resolve(3, 0, "utf-16").offset == len(idx.source)  # empty line after final newline
    with pytest.raises(PositionError):
        idx.resolve(4, 0, "utf-16")
    with pytest.raises(PositionError):
        LineIndex("no newline").resolve(1, 0, "utf-16")
    assert LineIndex("").resolve(0, 5, "utf-8").offset == 0


# -- items ------------------------------------------------------------------------------------

def test_typed_word():
    assert typed_word("    return tot") == "tot"
    assert typed_word("f(") == ""
    assert typed_word("é_x1") == "é_x1"


@pytest.mark.parametrize("enc", ["utf-8", "utf-16", "utf-32"])
def test_completion_item_ranges_and_fields(enc):
    col = len(LINE)
    items = completion_items(
        [Suggestion("me)", 1.0, replace_right=0), Suggestion("me\n    x", 0.5)],
        row=3, col=col, line=LINE, encoding=enc, markdown=True, language="python",
    )
    first = items[0]
    start = index_to_column(LINE, col - 2, enc)
    assert first.text_edit.range == types.Range(
        start=types.Position(line=3, character=start),
        end=types.Position(line=3, character=index_to_column(LINE, col, enc)),
    )
    assert first.text_edit.new_text == "name)" == first.filter_text == first.label
    assert first.documentation.value == "```python\nname)\n```"
    assert first.kind == types.CompletionItemKind.Text and first.sort_text == "0000"
    assert first.insert_text_format == types.InsertTextFormat.PlainText
    assert items[1].kind == types.CompletionItemKind.Snippet and items[1].label == "name \u2026"
    plain = completion_items([Suggestion("x", 0.0)], row=0, col=0, line="", encoding=enc, markdown=False)
    assert plain[0].documentation == "x"


def test_inline_items_extend_over_auto_closed_and_selected_range():
    line = 'print("a😀", )'
    cur = line.index(")")
    items = inline_items([Suggestion("x)", 0.0, replace_right=1)], row=0, start=cur, end=cur,
                         line=line, encoding="utf-16")
    assert items[0].insert_text == "x)"
    assert items[0].range.start.character == cur + 1  # the emoji counts 2 in utf-16
    assert items[0].range.end.character == cur + 2
    sel = inline_items([Suggestion("(1)", 0.0)], row=0, start=0, end=2, line="pr", encoding="utf-8",
                       lead="print")
    assert sel[0].insert_text == "print(1)"
    assert (sel[0].range.start.character, sel[0].range.end.character) == (0, 2)


# -- typed-ahead cache ------------------------------------------------------------------------

def test_typeahead_cache_hits_and_misses():
    c = TypeaheadCache()
    c.store("u", 3, "    x = ", "", [Suggestion("foo(bar)", 1.0), Suggestion("fizz", 0.5)])
    assert c.lookup("u", 3, "    x = ", "")[1] == [Suggestion("foo(bar)", 1.0), Suggestion("fizz", 0.5)]
    typed, hits = c.lookup("u", 3, "    x = fo", "")
    assert typed == "fo" and [h.text for h in hits] == ["o(bar)"]
    assert [h.text for h in c.lookup("u", 3, "    x = f", "")[1]] == ["oo(bar)", "izz"]
    assert c.lookup("u", 3, "    x = fox", "") is None       # typed text diverges
    assert c.lookup("u", 3, "    x = foo(bar)", "") is None  # nothing left
    assert c.lookup("u", 4, "    x = fo", "") is None        # other line
    assert c.lookup("v", 3, "    x = fo", "") is None        # other document
    assert c.lookup("u", 3, "    x = fo", ")") is None       # text right of the cursor changed
    assert c.lookup("u", 3, "    y = ", "") is None          # not an extension
    c.forget("u")
    assert c.lookup("u", 3, "    x = ", "") is None


# -- scheduler --------------------------------------------------------------------------------

async def test_scheduler_runs_off_loop_and_supersedes():
    s = Scheduler()
    started = threading.Event()
    loop_thread = threading.get_ident()

    def slow(cancel):
        assert threading.get_ident() != loop_thread
        started.set()
        for _ in range(500):
            if cancel():
                raise Cancelled("stop")
            threading.Event().wait(0.01)
        return "slow done"

    first = asyncio.ensure_future(s.run("doc", slow))
    while not started.is_set():
        await asyncio.sleep(0.01)
    second = asyncio.ensure_future(s.run("doc", lambda cancel: "second"))
    with pytest.raises(Superseded):
        await first
    assert await second == "second"
    # other keys do not supersede each other
    assert await s.run("a", lambda c: c()) is False
    s.shutdown()


async def test_scheduler_task_cancellation_stops_worker_and_stale_check():
    s = Scheduler()
    seen = {}
    started = threading.Event()

    def job(cancel):
        started.set()
        for _ in range(500):
            if cancel():
                seen["stopped"] = True
                raise Cancelled("stop")
            threading.Event().wait(0.01)
        return "finished"

    task = asyncio.ensure_future(s.run("doc", job))
    while not started.is_set():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await s.run("other", lambda c: "after") == "after"  # worker free again: job stopped
    assert seen == {"stopped": True}
    version = {"v": 1}

    def edited_meanwhile(cancel):
        version["v"] = 2  # the document changes while the job runs
        if cancel():
            raise Cancelled("stale")
        return "ran"

    with pytest.raises(Superseded):
        await s.run("doc", edited_meanwhile, stale=lambda: version["v"] != 1)
    s.shutdown()


# -- stats, lengths ---------------------------------------------------------------------------

def test_percentiles_and_stats():
    assert percentile([], 50) is None
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile(range(1, 101), 95) == 95
    st = LatencyStats()
    st.count("requests")
    st.add(10.0, 8.0)
    st.add(20.0)
    summary = st.summary()
    assert summary["requests"] == 1 and summary["p50_ms"] == 10.0 and summary["model_p50_ms"] == 8.0
    assert (summary["last_ms"], summary["last_model_ms"], summary["cache_hits"]) == (20.0, 8.0, 0)


# -- logging ----------------------------------------------------------------------------------

def test_pygls_log_records_never_carry_buffers():
    import io
    import logging

    from diffill.lsp_server.server import RedactBuffers

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(RedactBuffers())
    logger = logging.getLogger("pygls.protocol.test_redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        params = types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri="file:///a.py", language_id="python", version=1, text="SECRET_BUFFER"))
        logger.warning('Unknown message "%s"', params)
        logger.warning("raw %s", '{"text": "SECRET_BUFFER"}')
        logger.warning("id %s method %s", 7, "textDocument/completion")
    finally:
        logger.removeHandler(handler)
    out = buf.getvalue()
    assert "SECRET_BUFFER" not in out
    assert "<DidOpenTextDocumentParams redacted>" in out and "id 7 method textDocument/completion" in out


# -- LocalBackend over an InfillEngine (fake engine: control flow only) ------------------------

class _FakeTok:
    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class _FakeEngine:
    """Implements :class:`diffill.lsp_server.backends.InfillEngine`; records the calls."""

    def __init__(self, max_positions: int = 512) -> None:
        from diffill.model.config import ModelConfig

        self.tokenizer = _FakeTok()
        self.config = ModelConfig(family="diffill", vocab_size=256, hidden_size=8,
                                  intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                                  head_dim=8, mask_token_id=3, pad_token_id=2, eos_token_id=1,
                                  bos_token_id=0, max_position_embeddings=max_positions)
        self.calls: list[dict] = []
        self.warmed = 0

    def infill(self, prefix_ids, suffix_ids, *, max_tokens, candidates=1, steps=None,
               budget_ms=None, temperature=None, seed=None, cancel=None):
        from diffill.model.sampler import Infill

        self.calls.append({"max_tokens": max_tokens, "candidates": candidates, "steps": steps,
                           "budget_ms": budget_ms, "temperature": temperature, "seed": seed})
        return [Infill(ids=[ord("x")], length=max_tokens, score=0.0, steps=steps or 4)]

    def warmup(self):
        self.warmed += 1

    def describe(self):
        return {"model": "fake", "device": "cpu", "latency_budget_ms": 200.0}


def _ctx():
    from diffill.lsp_server.context import build_context

    return build_context("a = \n", 4, _FakeTok().encode_batch, budget=64)


def test_local_backend_leaves_steps_to_the_engine():
    from diffill.lsp_server.backends import LocalBackend

    eng = _FakeEngine()
    b = LocalBackend(eng, step_delay_s=0)
    out = b.infill(_ctx(), n=1, max_tokens=16, latency_budget_ms=10.0)
    assert [(c.text, c.steps) for c in out] == [("x", 4)]
    # no steps: the engine's step budget decides, for the request's budget
    assert eng.calls[-1] == {"max_tokens": 16, "candidates": 1, "steps": None, "budget_ms": 10.0,
                             "temperature": None, "seed": None}
    b.infill(_ctx(), n=3, max_tokens=16, steps=5)  # explicit steps win; no budget: the engine's
    assert eng.calls[-1] == {"max_tokens": 16, "candidates": 3, "steps": 5, "budget_ms": None,
                             "temperature": None, "seed": None}
    b.infill(_ctx(), n=1, max_tokens=16, temperature=0.5, seed=7)
    assert (eng.calls[-1]["temperature"], eng.calls[-1]["seed"]) == (0.5, 7)
    b.infill(_ctx(), n=1, max_tokens=16, temperature=0.0, seed=7)  # greedy: no seed needed
    assert (eng.calls[-1]["temperature"], eng.calls[-1]["seed"]) == (None, None)
    b.warmup()
    assert eng.warmed == 1
    assert b.describe() == {"backend": "local", "model": "fake", "device": "cpu",
                            "latency_budget_ms": 200.0, "model_calls": 4}
    assert b.max_context_tokens(32) == 512 - 32 - 2


def test_local_backend_steps_do_not_drift_with_load():
    """The same request gets the same steps however slow the previous ones were: the
    engine's plan is frozen at warm-up (issue 19: no server-wide running average)."""
    from pathlib import Path

    import torch
    from diffill.lsp_server.backends import LocalBackend
    from diffill.model.engine import Engine
    from diffill.model.loader import LoadedModel
    from diffill.model.plan import BucketTiming, plan_from_timings
    from diffill.model.transformer import Transformer

    cfg = _FakeEngine().config.replace(hidden_size=16, intermediate_size=32, num_heads=2,
                                       num_kv_heads=1, head_dim=8)
    model = Transformer(cfg)
    model.init_weights(seed=0, std=0.3)
    lm = LoadedModel(model=model.eval(), tokenizer=_FakeTok(), config=cfg, path=Path("."),
                     provenance={}, device=torch.device("cpu"), dtype=torch.float32)
    timings = [BucketTiming(ctx=256, hole=h, rows=3, full_ms=4.0, block_ms=4.0) for h in (8, 16, 32, 64)]
    eng = Engine(lm, plan=plan_from_timings(timings, 30.0))
    ctx = _ctx()

    def planned() -> int:
        return eng.make_request(ctx.prefix_ids, ctx.suffix_ids, max_tokens=16).sampler.steps

    fast = LocalBackend(eng, step_delay_s=0)
    slow = LocalBackend(eng, step_delay_s=0.02)  # every step 20 ms slower: a loaded machine
    assert planned() == 7  # 7 x 4 ms fit 30 ms; 8 would not
    before = fast.infill(ctx, n=1, max_tokens=16)
    for _ in range(3):
        slow.infill(ctx, n=1, max_tokens=16)
    assert fast.infill(ctx, n=1, max_tokens=16) == before and planned() == 7
    assert eng.plan.budget_ms == 30.0  # nothing re-planned


# -- token healing (mock backend: control flow only) ---------------------------------------------

class _ScriptedBackend:
    """Answers each infill with the next scripted list of raw middles; records contexts."""

    name = "scripted"

    def __init__(self, *answers: list[str]):
        self.answers = list(answers)
        self.seen = []

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def max_context_tokens(self, max_tokens):
        return None

    def infill(self, ctx, *, n, max_tokens, steps=None, latency_budget_ms=None, cancel=None, **kw):
        from diffill.lsp_server.backends import Candidate

        self.seen.append((ctx.prefix, ctx.suffix))
        self.kwargs = {"steps": steps, **kw}
        return [Candidate(text=t, score=-float(i)) for i, t in enumerate(self.answers.pop(0))]

    def describe(self):
        return {}


def test_partial_word_boundaries():
    from diffill.lsp_server.completer import partial_word

    assert partial_word("    return to", 13) == " to"
    assert partial_word("    return ", 11) == " "
    assert partial_word("    ", 4) == ""  # indentation is not healed
    assert partial_word("f(a", 3) == "a"
    assert partial_word("abcd", 2) == ""  # inside a word
    assert partial_word("x = " + "y" * 40, 44) == ""  # too long


def test_token_healing_fills_from_the_word_start():
    from diffill.lsp_server.completer import Completer

    text = "def f(a):\n    return to\n"
    b = _ScriptedBackend([" total", " other", " to"])
    res = Completer(b).run(text, text.index("to\n") + 2, n=3)
    assert b.seen == [("def f(a):\n    return", "\n")]  # the hole starts before " to"
    assert [s.text for s in res.suggestions] == ["tal"]  # " other" and a bare " to" dropped
    assert res.context.line_prefix == "    return to"


def test_token_healing_falls_back_when_nothing_matches():
    from diffill.lsp_server.completer import Completer
    from diffill.lsp_server.options import CompletionOptions

    text = "x = myna\n"
    b = _ScriptedBackend(["foo"], ["me = 1"])
    res = Completer(b).run(text, 8, n=1)
    assert b.seen == [("x =", "\n"), ("x = myna", "\n")]
    assert [s.text for s in res.suggestions] == ["me = 1"]
    off = Completer(b, CompletionOptions(token_healing=False))
    b.answers.append(["bar"])
    off.run(text, 8)
    assert b.seen[-1] == ("x = myna", "\n")


def test_run_passes_steps_and_backend_kwargs():
    from diffill.lsp_server.completer import Completer

    b = _ScriptedBackend(["1"])
    Completer(b).run("x = (\n", 5, steps=3, backend_kwargs={"temperature": 0.5, "seed": 7})
    assert b.kwargs == {"steps": 3, "temperature": 0.5, "seed": 7}
