"""The OpenAI completion routes of diffill serve-http (lsp_server/http/http_openai.py): the
response shape and its consistency with the language server's text path, the token-healing
header, choices' indices, the openai client, the steps every answer reports."""

from __future__ import annotations

import msgspec
import pytest
from diffill.lsp_server.backend.backends import LocalBackend
from diffill.lsp_server.completion.completer import Completer
from diffill.lsp_server.completion.options import CompletionOptions
from diffill.model.engine import Engine
from support.http_serving import (
    OPTS,
    PROMPT,
    SUFFIX,
    TOKEN,
    base_url,
    post,
)


async def test_response_shape_and_consistency_with_the_lsp_text_path(serve, backend):
    client, _ = await serve(backend)
    resp, out = await post(client, {"prompt": PROMPT, "suffix": SUFFIX, "max_tokens": 16},
                           headers={"X-Request-Id": "req-42"})
    assert resp.status == 200, out
    assert resp.headers["X-Request-Id"] == "req-42"
    assert out["id"].startswith("cmpl-") and out["object"] == "text_completion"
    assert isinstance(out["created"], int) and out["model"] == "diffill"
    [choice] = out["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == "total"
    # the same text path as the language server: context -> model -> post-processing
    opts = msgspec.structs.replace(OPTS, max_tokens=16)
    completer = Completer(backend, opts)
    res = completer.run(PROMPT + SUFFIX, len(PROMPT))
    assert [s.text for s in res.suggestions] == ["total"]
    u = out["usage"]
    assert u["prompt_tokens"] == res.context.prefix_tokens + res.context.suffix_tokens > 0
    assert u["completion_tokens"] == len(backend.encode_batch(["total"])[0]) == 1
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


async def test_healing_header_turns_server_side_token_healing_off(serve, backend):
    """A client that healed already (the openai backend) sends X-Diffill-Token-Healing: 0:
    the hole stays at the cursor, as Completer with token_healing off."""
    client, _ = await serve(backend)
    body = {"prompt": PROMPT, "suffix": SUFFIX, "max_tokens": 16}
    _, out = await post(client, body, headers={"X-Diffill-Token-Healing": "0"})
    opts = msgspec.structs.replace(OPTS, max_tokens=16, token_healing=False)
    res = Completer(backend, opts).run(PROMPT + SUFFIX, len(PROMPT))
    assert out["choices"][0]["text"] == res.suggestions[0].text == "total"  # asked from "return "
    assert out["usage"]["prompt_tokens"] == res.context.prefix_tokens + res.context.suffix_tokens
    healed = Completer(backend, msgspec.structs.replace(OPTS, max_tokens=16)).run(
        PROMPT + SUFFIX, len(PROMPT))
    assert healed.context.prefix_tokens != res.context.prefix_tokens  # PROMPT ends in a space


async def test_n_and_prompt_lists_index_choices(serve, backend):
    client, _ = await serve(backend)
    resp, out = await post(client, {"prompt": [PROMPT, "def f(x):\n    return "], "suffix": "\n",
                                    "n": 3, "max_tokens": 8})
    assert resp.status == 200, out
    # prompt p owns indices p*n .. p*n+n-1; the script answers the first prompt ("total", the
    # same from all three hole lengths, merged) and has nothing for the second (one empty choice)
    got = [(c["index"], c["text"]) for c in out["choices"]]
    assert got == [(0, "total"), (3, "")]


async def test_openai_client_lists_retrieves_and_completes(serve, backend):
    import openai  # the dev extra installs it
    client, _ = await serve(backend, token=TOKEN, model_names=["micro", "diffill"])
    oa = openai.AsyncOpenAI(base_url=base_url(client) + "/v1", api_key=TOKEN, max_retries=0)
    try:
        assert [m.id async for m in oa.models.list()] == ["micro", "diffill"]
        m = await oa.models.retrieve("micro")
        assert m.id == "micro" and m.object == "model"
        with pytest.raises(openai.NotFoundError):
            await oa.models.retrieve("gpt-4o")
        c = await oa.completions.create(model="micro", prompt=PROMPT, max_tokens=8,
                                        temperature=0, extra_body={"suffix": SUFFIX, "steps": 2})
        assert c.choices[0].finish_reason in ("stop", "length")
        assert c.model_extra["diffill"]["steps_planned"] == 2
        with pytest.raises(openai.BadRequestError) as e:
            await oa.completions.create(model="micro", prompt=PROMPT, max_tokens=1000)
        assert e.value.body["param"] == "max_tokens"
    finally:
        await oa.close()


async def test_every_answer_reports_its_steps(serve, backend):
    client, _ = await serve(backend)  # OPTS: the server's --steps 2
    _, out = await post(client, {"prompt": [PROMPT, "def f(x):\n    return "], "max_tokens": 8})
    d = out["diffill"]
    assert {k: v for k, v in d.items() if k != "steps"} == {
        "steps_planned": 2, "steps_from": "server", "latency_budget_ms": None, "max_steps": None}
    assert len(d["steps"]) == 2 and all(1 <= s <= 2 for s in d["steps"])  # a middle may end early
    _, out = await post(client, {"prompt": PROMPT, "max_tokens": 8, "steps": 3})
    d = out["diffill"]
    assert d["steps_planned"] == 3 and d["steps_from"] == "request" and 1 <= d["steps"][0] <= 3
    budget = LocalBackend(Engine(backend.engine.lm, budget_ms=1234.0))  # the engine owns it
    client, _ = await serve(budget, options=CompletionOptions())
    _, out = await post(client, {"prompt": PROMPT, "max_tokens": 8})
    d = out["diffill"]
    assert d["steps_from"] == "latency_budget" and d["latency_budget_ms"] == 1234.0
    assert d["steps_planned"] is None  # chosen inside the backend
    assert 1 <= d["steps"][0] <= d["max_steps"] == CompletionOptions().max_steps
