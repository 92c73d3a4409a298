"""Scoring in the evaluation runner: the draft-and-verify figures from the generators' info."""

from __future__ import annotations

import pytest
from diffill.evaluation.generators import Generated
from diffill.evaluation.runner import Output, draft_metrics, generate
from diffill.evaluation.tasks import InfillTask


def out(steps: int, drafts=(), verified=False, source=None, calls=1) -> Output:
    return Output("t", "x", 0.01, info={"steps": steps, "drafts": list(drafts),
                                         "draft_verified": verified, "source": source,
                                         "model_calls": calls})


def test_draft_metrics():
    outs = [out(1, ["lookup"], True, "lookup"), out(1, ["analogy"], True, "analogy"),
            out(8, ["lookup"]), out(8, calls=2)]
    m = draft_metrics(outs, [True, False, False, True])
    assert m["steps_mean"] == 4.5 and m["model_calls_mean"] == 1.25
    assert m["draft_offered"] == 0.75 and m["draft_accepted"] == 0.5
    assert m["draft_accept_rate"] == pytest.approx(2 / 3)
    assert m["draft_wrong_rate"] == 0.5  # of the two accepted drafts, one was not the target
    assert m["draft_steps_mean"] == 1.0
    assert m["draft_accepted_by_source"] == {"lookup": 1, "analogy": 1}


def test_no_info_no_draft_metrics():
    assert draft_metrics([Output("t", "x", 0.01)], [True]) == {}
    assert "draft_offered" not in draft_metrics([out(3)], [True])


def test_generate_keeps_the_info_of_a_generated():
    class G:
        name = "g"

        def generate(self, text, offset, *, multiline):
            return Generated("y", {"steps": 2})

        def describe(self):
            return {}

    t = InfillTask("t/0", "def f(x):\n", "", "    return x\n", "", "")
    (o,) = generate(G(), [t])
    assert (o.insert, o.info) == ("y", {"steps": 2})


def test_keystroke_asks_the_same_document_twice_and_the_second_reuses(scripted_model_dir, monkeypatch):
    """``diffill eval --keystroke K``: each completion is asked first with K characters not
    yet typed, then for real, under one document path; on a CPU the second request starts
    from the first one's kept context (model/reuse.py), and the answer is the real one's."""
    from diffill.evaluation.generators import load_model_generator

    monkeypatch.delenv("DIFFILL_REUSE", raising=False)
    gen = load_model_generator(str(scripted_model_dir), steps=2, keystroke=3)
    text = "def add_numbers(a, b):\n    total = a + b\n    return "
    got = gen.generate(text, len(text), multiline=False)
    st = gen.backend.engine.stats()
    assert got.info["model_calls"] == 1  # the real request's own calls (the first is not counted)
    assert st["context_reused"] >= 1 and st["context_computed"] >= 1
    assert gen.describe()["keystroke"] == 3
    assert gen.with_drafts().keystroke == 3
