"""Tests for the v0 resident engine (diffill.model.engine) on a small random Transformer."""

from __future__ import annotations

import threading

import pytest
import torch
from diffill.model.asks import EngineAsk
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import InfillCancelled, SamplerConfig
from diffill.model.engine import Engine
from diffill.model.engine_options import EngineOptions
from diffill.model.loader import LoadedModel
from diffill.model.transformer import Transformer
from support import tiny_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


V = 40
BOS, EOS, PAD, MASK = 36, 37, 38, 39


def make_lm(max_pos: int = 64) -> LoadedModel:
    return tiny_lm(0, std=0.4, weak_pad=True, vocab_size=V, mask_token_id=MASK, pad_token_id=PAD,
                   eos_token_id=EOS, bos_token_id=BOS, max_position_embeddings=max_pos)


def test_engine_steps_come_from_its_step_budget():
    lm = make_lm(max_pos=512)
    eng = Engine(lm, SamplerConfig(steps=6))
    assert eng.plan is None and eng.budget.budget_ms() == 200.0  # CPU default, nothing measured
    assert eng.make_request(EngineAsk([4, 5], [6], max_tokens=8)).sampler.steps == 6  # no plan: the sampler's
    plan = eng.warmup()  # first-call overheads, then the plan: two buckets timed, the rest fitted
    assert eng.plan is plan and plan.budget_ms == 200.0 and plan.max_steps == 16
    sources = [t.source for t in plan.timings]
    # ctx 256 x holes 8..64 fit 512; the largest is timed at 3 rows, the smallest at 1 row
    assert sources.count("measured") == 1 and len(sources) == 4
    req = eng.make_request(EngineAsk([4, 5], [6], max_tokens=8))
    assert (req.sampler.steps, req.sampler.threshold) == plan.steps_for(3, 8)
    # drafts add rows, and the plan prices them: the steps for 3 lengths + 2 drafts
    drafted = eng.make_request(EngineAsk([4, 5], [6], max_tokens=8, drafts=[[7, 8], [9]]))
    assert len(drafted.drafts) == 2 and len(drafted.sampler.lengths) == 3
    assert drafted.sampler.steps == plan.steps_for(3, 8, rows=5)[0] <= req.sampler.steps
    tight = eng.make_request(EngineAsk([4, 5], [6], max_tokens=8, budget_ms=1e-3))  # nothing fits: min_steps
    assert tight.sampler.steps == 1
    # the decision comes back with the request: what chose the steps, for which budget
    _, d = eng.plan_request(EngineAsk([4, 5], [6], max_tokens=8, budget_ms=1e-3))
    assert (d.source, d.steps, d.budget_ms, d.over_budget, d.bucket) == ("plan", 1, 1e-3, True, (256, 8))
    _, d = eng.plan_request(EngineAsk([4, 5], [6], max_tokens=8, drafts=[[7, 8], [9]]))
    assert (d.steps, d.rows, d.budget_ms, d.planned) == (drafted.sampler.steps, 5, 200.0, True)
    _, d = eng.plan_request(EngineAsk([4, 5], [6], max_tokens=8, steps=3))
    assert (d.source, d.steps, d.budget_ms, d.planned) == ("request", 3, None, False)
    assert eng.make_request(EngineAsk([4, 5], [6], max_tokens=8, steps=3, budget_ms=1e-3)).sampler.steps == 3
    assert eng.make_request(EngineAsk([4, 5], [6], max_tokens=32, candidates=5)).sampler.lengths == (2, 4, 8, 16, 32)
    sampled = eng.make_request(EngineAsk([4, 5], [6], temperature=0.7, seed=3)).sampler
    assert (sampled.temperature, sampled.seed) == (0.7, 3)
    desc = eng.describe()
    assert desc["latency_budget_ms"] == 200.0 and desc["step_plan"]["fitted"] == 3
    assert Engine(lm, budget_ms=40.0, max_steps=4).describe()["latency_budget_ms"] == 40.0
    small = Engine(make_lm(max_pos=64), SamplerConfig(steps=6))  # below the smallest context
    plan = small.warmup()  # bucket: its 64 positions stand in for it
    assert plan is not None and [(t.ctx, t.hole) for t in plan.timings] == [(256, 8), (256, 16), (256, 32)]
    assert small.make_request(EngineAsk([4, 5], [6], max_tokens=8)).sampler.steps == plan.steps_for(3, 8)[0]
    tiny = Engine(make_lm(max_pos=8), SamplerConfig(steps=6))  # not even the smallest hole
    assert tiny.warmup() is None and tiny.plan is None
    assert tiny.make_request(EngineAsk([4], [], max_tokens=2)).sampler.steps == 6  # no plan: the sampler's


def test_infill_matches_sampler_and_counts():
    lm = make_lm()
    eng = Engine(lm, SamplerConfig(steps=4), options=EngineOptions(context="row"))  # exact
    pre, suf = [1, 2, 3, 4], [5, 6]
    got = eng.infill(EngineAsk(pre, suf, max_tokens=16))
    want = infill(lm.model, lm.config, pre, suf, SamplerConfig(steps=4, lengths=(4, 8, 16)))
    assert got.candidates == want
    assert got.decision.source == "default" and got.decision.steps == 4  # no plan: the sampler's
    assert {r.length for r in got} <= {4, 8, 16}
    # explicit lengths and steps override the defaults
    got = eng.infill(EngineAsk(pre, suf, lengths=(3,), steps=2))
    assert len(got) == 1 and got[0].length == 3 and got[0].steps <= 2
    st = eng.stats()
    assert st["requests"] == 2 and st["completed"] == 2 and st["cancelled"] == 0
    assert len(st["recent_latencies_s"]) == 2 and st["last_latency_s"] is not None
    assert eng.device == torch.device("cpu") and eng.dtype == torch.float32
    assert eng.config is lm.config and eng.tokenizer is None


def test_canvas_too_long_is_rejected_not_truncated():
    eng = Engine(make_lm(max_pos=32))
    # BOS + 20 + 8 + 2 + EOS = 32 fits; one more token does not
    eng.infill(EngineAsk(list(range(20)), [1, 2], lengths=(8,), steps=2))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        eng.infill(EngineAsk(list(range(21)), [1, 2], lengths=(8,), steps=2))
    with pytest.raises(ValueError):
        eng.infill(EngineAsk([1], [2], lengths=(0,)))
    assert eng.stats()["requests"] == 1  # rejected requests never reach the model


def test_cancel_then_engine_still_works():
    eng = Engine(make_lm(), SamplerConfig(steps=6))
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(InfillCancelled):
        eng.infill(EngineAsk([1, 2], [3], max_tokens=8, cancel=cancel))
    assert not eng._lock.locked()
    with pytest.raises(InfillCancelled):
        eng.infill(EngineAsk([1, 2], [3], max_tokens=8, cancel=lambda: True))
    res = eng.infill(EngineAsk([1, 2], [3], max_tokens=8))
    assert res and all(r.length in (2, 4, 8) for r in res)
    st = eng.stats()
    assert (st["requests"], st["completed"], st["cancelled"]) == (3, 1, 2)


class _Tracking(torch.nn.Module):
    """Wraps a Transformer and records how many threads are inside a forward at once."""

    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.active = 0
        self.max_active = 0
        self.guard = threading.Lock()

    def forward_hidden(self, *a, **kw):
        with self.guard:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            return self.inner.forward_hidden(*a, **kw)
        finally:
            with self.guard:
                self.active -= 1

    def head(self, h):
        return self.inner.head(h)


def test_threads_are_serialised_and_get_their_own_answers():
    lm = make_lm()
    tracked = _Tracking(lm.model)
    lm.model = tracked
    eng = Engine(lm, SamplerConfig(steps=3))
    prompts = [([1, 2, i], [3 + i]) for i in range(6)]
    serial = [eng.infill(EngineAsk(p, s, max_tokens=8)) for p, s in prompts]
    out: list = [None] * len(prompts)

    def work(i: int) -> None:
        out[i] = eng.infill(EngineAsk(*prompts[i], max_tokens=8))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == serial
    assert tracked.max_active == 1
    assert eng.stats()["completed"] == 12
