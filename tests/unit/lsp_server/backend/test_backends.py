"""The local backend over an :class:`InfillEngine` (fake engine: control flow only), and
the step count's independence from load with a real tiny engine."""

from __future__ import annotations

import dataclasses

from diffill.lsp_server.backend.backend_api import InfillAsk

# -- LocalBackend over an InfillEngine (fake engine: control flow only) ------------------------

class _FakeTok:
    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class _FakeEngine:
    """Implements :class:`diffill.lsp_server.backend.backends.InfillEngine`; records the calls."""

    def __init__(self, max_positions: int = 512) -> None:
        from diffill.model.config import ModelConfig

        self.tokenizer = _FakeTok()
        self.config = ModelConfig(family="diffill", vocab_size=256, hidden_size=8,
                                  intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                                  head_dim=8, mask_token_id=3, pad_token_id=2, eos_token_id=1,
                                  bos_token_id=0, max_position_embeddings=max_positions)
        self.calls: list[dict] = []
        self.warmed = 0

    def infill(self, ask):
        from diffill.model.asks import InfillOutcome
        from diffill.model.budget import StepDecision
        from diffill.model.decoder.spec import Infill

        self.calls.append({"max_tokens": ask.max_tokens, "candidates": ask.candidates,
                           "steps": ask.steps, "budget_ms": ask.budget_ms,
                           "temperature": ask.temperature, "seed": ask.seed,
                           **({"drafts": ask.drafts} if ask.drafts else {}),
                           **({"context_key": ask.context_key} if ask.context_key else {})})
        steps = ask.steps or 4
        return InfillOutcome([Infill(ids=[ord("x")], length=ask.max_tokens, score=0.0, steps=steps)],
                             StepDecision(steps, "plan" if ask.steps is None else "request", 16))

    def warmup(self):
        self.warmed += 1

    def describe(self):
        return {"model": "fake", "device": "cpu", "latency_budget_ms": 200.0}


def _ctx():
    from diffill.lsp_server.text.context import build_context

    return build_context("a = \n", 4, _FakeTok().encode_batch, budget=64)


def test_local_backend_leaves_steps_to_the_engine():
    from diffill.lsp_server.backend.backends import LocalBackend

    eng = _FakeEngine()
    b = LocalBackend(eng, step_delay_s=0)
    out = b.infill(_ctx(), InfillAsk(n=1, max_tokens=16, budget_ms=10.0))
    assert [(c.text, c.steps) for c in out.candidates] == [("x", 4)]
    assert out.decision is not None and out.decision.planned  # the engine's decision comes back
    # no steps: the engine's step budget decides, for the request's budget
    assert eng.calls[-1] == {"max_tokens": 16, "candidates": 1, "steps": None, "budget_ms": 10.0,
                             "temperature": None, "seed": None}
    # explicit steps win; no budget: the engine's
    b.infill(_ctx(), InfillAsk(n=3, max_tokens=16, steps=5))
    assert eng.calls[-1] == {"max_tokens": 16, "candidates": 3, "steps": 5, "budget_ms": None,
                             "temperature": None, "seed": None}
    b.infill(_ctx(), InfillAsk(n=1, max_tokens=16, temperature=0.5, seed=7))
    assert (eng.calls[-1]["temperature"], eng.calls[-1]["seed"]) == (0.5, 7)
    b.infill(_ctx(), InfillAsk(n=1, max_tokens=16, seed=7))  # greedy: no seed needed
    assert (eng.calls[-1]["temperature"], eng.calls[-1]["seed"]) == (None, None)
    # the document's path names the context the engine may keep for its next request
    b.infill(dataclasses.replace(_ctx(), path="/w/a.py"), InfillAsk(n=1, max_tokens=16))
    assert eng.calls[-1]["context_key"] == "/w/a.py"
    b.warmup()
    assert eng.warmed == 1
    assert b.describe() == {"backend": "local", "model": "fake", "device": "cpu",
                            "latency_budget_ms": 200.0, "model_calls": 5}
    assert b.max_context_tokens(32) == 512 - 32 - 2


def test_local_backend_steps_do_not_drift_with_load():
    """The same request gets the same steps however slow the previous ones were: the
    engine's plan is frozen at warm-up (issue 19: no server-wide running average)."""
    from diffill.lsp_server.backend.backends import LocalBackend
    from diffill.model.asks import EngineAsk
    from diffill.model.engine import Engine
    from diffill.model.plan import BucketTiming, plan_from_timings
    from support import tiny_lm

    lm = tiny_lm(0, tokenizer=_FakeTok(), vocab_size=256, hidden_size=16, intermediate_size=32,
                 num_layers=1, num_heads=2, num_kv_heads=1, max_position_embeddings=512)
    timings = [BucketTiming(ctx=256, hole=h, rows=3, full_ms=4.0, block_ms=4.0) for h in (8, 16, 32, 64)]
    eng = Engine(lm, plan=plan_from_timings(timings, 30.0))
    ctx = _ctx()

    def planned() -> int:
        return eng.make_request(EngineAsk(ctx.prefix_ids, ctx.suffix_ids, max_tokens=16)).sampler.steps

    fast = LocalBackend(eng, step_delay_s=0)
    slow = LocalBackend(eng, step_delay_s=0.02)  # every step 20 ms slower: a loaded machine
    assert planned() == 7  # 7 x 4 ms fit 30 ms; 8 would not
    before = fast.infill(ctx, InfillAsk(n=1, max_tokens=16))
    for _ in range(3):
        slow.infill(ctx, InfillAsk(n=1, max_tokens=16))
    assert fast.infill(ctx, InfillAsk(n=1, max_tokens=16)) == before and planned() == 7
    assert eng.plan.budget_ms == 30.0  # nothing re-planned


def _real_engine():
    from diffill.model.engine import Engine
    from support import tiny_lm

    lm = tiny_lm(0, tokenizer=_FakeTok(), vocab_size=256, hidden_size=16, intermediate_size=32,
                 num_layers=1, num_heads=2, num_kv_heads=1, max_position_embeddings=512)
    return Engine(lm, budget_ms=200.0)


def test_a_quick_cpu_model_is_planned_before_it_is_ready():
    """The shipped-model case: the tiny warm-up request is quick, the plan measured in place."""
    from diffill.lsp_server.backend.backends import LocalBackend

    b = LocalBackend(_real_engine(), step_delay_s=0)
    b.warmup()
    assert b.plan_thread is None
    plan = b.engine.plan
    assert plan is not None and not any(t.source == "provisional" for t in plan.timings)


def _held_background_plan(monkeypatch):
    """A LocalBackend on a real engine, warmed up as a slow CPU model (provisional plan, the
    real plan on a background thread), whose background measurement waits until the returned
    event is set; ``ran`` records that it went on."""
    import threading

    from diffill.lsp_server.backend import backends
    from diffill.model import measure as measure_mod

    monkeypatch.setattr(backends, "QUICK_PLAN_MS", -1.0)  # every model counts as slow
    monkeypatch.setattr(backends, "BACKGROUND_PLAN_PARAMS", 0)  # and as big
    release, ran = threading.Event(), []
    real = measure_mod.measure_plan

    def held(*a, **kw):
        release.wait(30)
        ran.append(True)
        return real(*a, **kw)

    monkeypatch.setattr(measure_mod, "measure_plan", held)
    b = backends.LocalBackend(_real_engine(), step_delay_s=0)
    b.warmup()
    return b, release, ran


def test_a_slow_cpu_model_is_ready_on_a_provisional_plan(monkeypatch):
    """Issue 25: a model whose tiny request is slow is ready at once on a provisional plan
    (never more steps than the measured one) and planned in the background."""
    b, release, _ = _held_background_plan(monkeypatch)
    prov = b.engine.plan
    assert prov is not None and all(t.source == "provisional" for t in prov.timings)
    assert b.describe()["step_plan"]["provisional"] is True
    out = b.infill(_ctx(), InfillAsk(n=1, max_tokens=16))  # answered while the plan is measured
    assert out.candidates and b.plan_thread is not None and b.plan_thread.is_alive()
    release.set()
    b.plan_thread.join(60)
    measured = b.engine.plan
    assert measured is not prov and not any(t.source == "provisional" for t in measured.timings)
    assert b.describe()["step_plan"]["provisional"] is False
    for c in prov.choices:  # the provisional plan's steps never exceed the measured plan's
        assert c.steps <= measured.choice(c.ctx, c.hole).steps or c.steps == prov.min_steps


def test_the_background_plan_stops_at_its_next_layer(monkeypatch):
    """stop_plan (also run at exit: a thread inside a torch op at interpreter exit aborts the
    process) ends the background plan between two layers; the provisional plan stays."""
    b, release, ran = _held_background_plan(monkeypatch)
    prov = b.engine.plan
    b._plan_stop.set()
    release.set()
    b.stop_plan()
    assert ran and not b.plan_thread.is_alive()
    assert b.engine.plan is prov  # the measurement was stopped, not installed
    # and the hooks are gone: requests still run
    assert b.infill(_ctx(), InfillAsk(n=1, max_tokens=16)).candidates


def test_requests_first_waits_for_the_last_request_and_its_clock_leaves_the_wait_out():
    import threading
    import time

    import pytest
    from diffill.lsp_server.backend.backends import RequestsFirst, _PlanStopped

    first, stop = RequestsFirst(), threading.Event()
    first.give_way(stop)  # none in flight: at once
    assert first.waited_s == 0.0 and not first.busy
    first.enter()
    first.enter()
    first.leave()
    assert first.busy  # one of two still in flight
    done = threading.Event()

    def job():
        first.give_way(stop)
        done.set()

    t = threading.Thread(target=job)
    c0 = first.clock()
    t.start()
    deadline = time.monotonic() + 30
    while not first.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.waiting and not done.is_set()
    time.sleep(0.2)
    first.leave()
    t.join(30)
    assert done.is_set() and not first.waiting and first.waited_s >= 0.2
    assert first.clock() - c0 < first.waited_s  # the wait is not on the clock
    first.enter()  # a stop ends a wait
    stop.set()
    with pytest.raises(_PlanStopped):
        first.give_way(stop)


def test_the_background_plan_gives_way_to_a_request_in_flight(monkeypatch):
    """Issue 25: while a request is in flight the background plan waits before its next
    layer op (the request has the cores and the memory), and carries on after it."""
    import time

    b, release, _ = _held_background_plan(monkeypatch)
    prov = b.engine.plan
    b.requests_first.enter()  # a request is in flight when the plan starts its first step
    release.set()
    deadline = time.monotonic() + 30
    while not b.requests_first.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.requests_first.waiting and b.plan_thread.is_alive() and b.engine.plan is prov
    b.requests_first.leave()
    b.plan_thread.join(60)
    assert not b.plan_thread.is_alive() and b.engine.plan is not prov
    assert b.requests_first.waited_s > 0
    out = b.infill(_ctx(), InfillAsk(n=1, max_tokens=16))  # counted in and out again
    assert out.candidates and not b.requests_first.busy
