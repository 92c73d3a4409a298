"""The scripted checkpoint (tests/support/scripted_model.py) that the server, editor and
HTTP tests run: its answers do not depend on how the sampler or the engine decodes, and
its script is checked before it is built."""

from __future__ import annotations

import pytest
import torch
from diffill.model import load_model
from diffill.model.asks import EngineAsk
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import SamplerConfig, Strategy
from diffill.model.engine import Engine
from diffill.model.engine_options import EngineOptions
from support.scripted_model import RULES, Rule, ScriptError, compile_rules, load_shipped_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lm(scripted_model_dir):
    return load_model(scripted_model_dir)


def middle(lm, prompt: str, sc: SamplerConfig, suffix: str = "\n") -> str:
    tok = lm.tokenizer
    return tok.decode(infill(lm.model, lm.config, tok.encode(prompt), tok.encode(suffix), sc)[0].ids)


SCHEDULES = [
    SamplerConfig(steps=1, lengths=(16,)),
    SamplerConfig(steps=3, lengths=(4, 8, 16)),
    SamplerConfig(steps=16, lengths=(12, 24), strategy=Strategy.MARGIN),
    SamplerConfig(steps=8, lengths=(16,), strategy=Strategy.ENTROPY, absorb_pad=False),
    SamplerConfig(steps=8, lengths=(16,), threshold=0.9),
    SamplerConfig(steps=6, lengths=(16,), block=2),
]


@pytest.mark.parametrize("sc", SCHEDULES, ids=lambda sc: f"{sc.steps}steps-{sc.strategy.value}")
def test_every_rule_gets_its_answer_however_it_is_decoded(lm, sc: SamplerConfig):
    for rule in RULES:
        if len(lm.tokenizer.encode(rule.answer)) < min(sc.lengths):
            assert middle(lm, rule.prompt, sc) == rule.answer, rule
    # a prompt that ends like a rule's, after other text: the same answer
    assert middle(lm, "x = 1\n\n\n" + RULES[1].prompt, sc) == RULES[1].answer


def test_other_holes_stay_empty(lm):
    sc = SamplerConfig(steps=4, lengths=(8, 16))
    for prompt in ("def f(x):\n    return", "x = [1, 2,", "", "import os\n", "def add_numbers(a, b):\n"):
        assert middle(lm, prompt, sc) == "", prompt


def test_engine_fast_paths_give_the_same_answers(lm):
    tok = lm.tokenizer
    for opts in (EngineOptions(), EngineOptions(refresh_every=3), EngineOptions(buckets=True)):
        eng = Engine(lm, options=opts)
        for rule in RULES:
            res = eng.infill(EngineAsk(tok.encode(rule.prompt), tok.encode("\n"), max_tokens=16, steps=4))
            assert tok.decode(res[0].ids) == rule.answer, (opts, rule)


def test_margins_leave_no_room_for_rounding(lm):
    """Logit margins at the hole: >= 8 for answer tokens, >= 40 for the pads after them,
    where float32 sums of these sizes round at ~1e-5."""
    tok = lm.tokenizer
    for rule in RULES:
        prefix, answer = tok.encode(rule.prompt), tok.encode(rule.answer)
        n = len(answer) + 3
        ids = torch.tensor([[tok.bos_id, *prefix, *[tok.mask_id] * n, tok.eos_id]])
        with torch.no_grad():
            logits = lm.model(ids)[0, 1 + len(prefix): 1 + len(prefix) + n]
        logits[:, tok.mask_id] = -float("inf")
        top = logits.topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == answer + [tok.pad_id] * 3
        gap = (top.values[:, 0] - top.values[:, 1]).tolist()
        assert min(gap[: len(answer)]) > 7.99 and min(gap[len(answer):]) > 39.9, gap


def test_a_script_that_cannot_be_answered_exactly_is_refused():
    tok = load_shipped_tokenizer()
    # after "    " the first rule writes "message =", where the second starts: its answer
    # would follow only when those slots happen to be decoded first
    with pytest.raises(ScriptError, match="votes for"):
        compile_rules(tok, [Rule("def g(name):\n    message =", ' "hi"'), Rule("def g(name):\n   ", " message =")])
    with pytest.raises(ScriptError, match="votes for"):  # two answers for one prompt
        compile_rules(tok, [Rule("def g(x):\n    return", " x"), Rule("def g(x):\n    return", " 1")])
    with pytest.raises(ScriptError, match="empty answer"):
        compile_rules(tok, [Rule("def g(x):\n    return", "")])
