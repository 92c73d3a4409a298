"""llama-server's ``/infill`` contract on diffill serve-http (lsp_server/http/llama_infill.py),
tried with clients written here from the documented contract: requests shaped as
llama.vim (ggml-org/llama.vim ``autoload/llama.vim``) and llama.vscode (``src/llama-server.ts``)
send them -- the FIM request with ``response_fields``, ``input_extra`` chunks, the idle
warm-up with ``n_predict: 0`` -- and what they read back (``content``, flat
``timings/...`` keys, ``tokens_cached``, ``truncated``; the nested object for
llama.vscode), plus errors in llama-server's shape.

Over the scripted checkpoint (tests/support/scripted_model.py): after
``def add_numbers(a, b):\\n    total = a + b\\n    return`` it writes `` total``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import msgspec
import pytest
from aiohttp import ClientSession
from diffill.lsp_server.backend.backends import LocalBackend
from diffill.lsp_server.completion.completer import Completer
from diffill.lsp_server.http.http_wire import cut_at_indent
from diffill.lsp_server.http.llama_infill import TokenCache, pick_fields, timings
from diffill.lsp_server.text.context import Snippet
from support.http_serving import OPTS

ABOVE = "def add_numbers(a, b):\n    total = a + b\n"
CURSOR_LINE = "    return "
BELOW = "\n\n\ndef greet_user(name):\n    message = \"hello \" + name\n"
TOKEN = "llama-key-0123456789"
CHUNKS = [
    {"filename": "utils.py", "text": "def helper(x):\n    return x * 2\n", "time": [1, 2]},
    {"filename": "notes/readme.py", "text": "# the add_numbers helper sums two numbers\n"},
]
LLAMA_VIM_FIELDS = [
    "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
    "tokens_cached",
]

class SpyBackend(LocalBackend):
    """The local backend, recording the prefix each model call saw."""

    def __init__(self, engine, **kw) -> None:
        super().__init__(engine, **kw)
        self.prefixes: list[str] = []

    def infill(self, ctx, ask):
        self.prefixes.append(ctx.prefix)
        return super().infill(ctx, ask)


class LlamaVim:
    """What llama.vim sends (autoload/llama.vim, ``llama#fim`` and ``s:ring_update``),
    with its ``api_key`` as a bearer token."""

    def __init__(self, client: ClientSession, api_key: str = "") -> None:
        self.client = client
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    async def post(self, body: dict) -> tuple[int, dict]:
        async with self.client.post("/infill", data=json.dumps(body), headers=self.headers) as r:
            return r.status, await r.json()

    async def fim(self, above: str, cursor_line_prefix: str, suffix: str, extra: list[dict],
                  *, n_predict: int = 128, t_max_predict_ms: int = 250, n_indent: int = 4,
                  stop: list[str] | None = None) -> tuple[int, dict]:
        return await self.post({
            "input_prefix": above, "input_suffix": suffix, "input_extra": extra,
            "prompt": cursor_line_prefix, "n_predict": n_predict, "stop": stop or [],
            "n_indent": n_indent, "top_k": 40, "top_p": 0.90, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": t_max_predict_ms,
            "response_fields": LLAMA_VIM_FIELDS,
        })

    async def ring_update(self, extra: list[dict]) -> tuple[int, dict]:
        return await self.post({
            "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "stream": False, "samplers": [],
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
            "response_fields": [""],
        })


def reference(backend, extra: list[dict], max_tokens: int):
    """The slow reference: the language server's own text path (Completer.run) on the
    same document and extra context."""
    opts = msgspec.structs.replace(OPTS, max_tokens=max_tokens, extra_context=True)
    snippets = [Snippet(path=c["filename"], text=c["text"]) for c in extra]
    text = ABOVE + CURSOR_LINE + BELOW
    return Completer(backend, opts).run(text, len(ABOVE + CURSOR_LINE), snippets=snippets)


# ----------------------------------------------------------------------------- llama.vim


async def test_llama_vim_gets_the_suggestion_and_flat_timings(serve, backend):
    client, _ = await serve(backend, token=TOKEN)
    vim = LlamaVim(client, TOKEN)
    status, out = await vim.fim(ABOVE, CURSOR_LINE, BELOW, CHUNKS)
    assert status == 200, out
    assert set(out) == set(LLAMA_VIM_FIELDS)  # just what it asked for, nested ones flat
    ref = reference(backend, CHUNKS, 128)
    assert out["content"] == ref.suggestions[0].text == "total"
    assert out["timings/prompt_n"] == ref.context.prefix_tokens + ref.context.suffix_tokens
    assert out["timings/predicted_n"] == 1 and out["truncated"] is False
    assert out["timings/predicted_ms"] > 0 and out["timings/prompt_ms"] > 0
    assert out["timings/predicted_per_second"] == pytest.approx(
        1000 * out["timings/predicted_n"] / out["timings/predicted_ms"], rel=1e-2)
    assert out["timings/prompt_per_token_ms"] == pytest.approx(
        out["timings/prompt_ms"] / out["timings/prompt_n"], rel=1e-2)


async def test_input_extra_reaches_the_models_context(serve, backend):
    spy = SpyBackend(backend.engine)
    client, _ = await serve(spy)
    vim = LlamaVim(client)
    status, with_extra = await vim.fim(ABOVE, CURSOR_LINE, BELOW, CHUNKS)
    assert status == 200, with_extra
    seen = spy.prefixes[-1]
    # written as the context builder writes other files: a commented path line, the text,
    # in front of the cursor's own prefix
    block = "# path: utils.py\ndef helper(x):\n    return x * 2\n"
    assert block in seen and "# path: notes/readme.py\n" in seen
    assert seen.index(block) < seen.index("def add_numbers")
    assert seen == reference(backend, CHUNKS, 128).context.prefix[: len(seen)]
    status, without = await vim.fim(ABOVE, CURSOR_LINE, BELOW, [])
    assert "path:" not in spy.prefixes[-1]
    assert with_extra["timings/prompt_n"] > without["timings/prompt_n"]
    assert with_extra["content"] == without["content"] == "total"


async def test_idle_warm_up_is_answered_at_once_and_prepares_the_next_request(serve, backend,
                                                                              caplog):
    # every diffusion step takes 0.5 s here: a warm-up that ran the model could not be fast
    slow = LocalBackend(backend.engine, step_delay_s=0.5)
    client, front = await serve(slow, token=TOKEN)
    vim = LlamaVim(client, TOKEN)
    caplog.set_level(logging.INFO, logger="diffill.http.access")
    before = slow.model_calls
    t0 = time.monotonic()
    status, out = await vim.ring_update(CHUNKS)
    took = time.monotonic() - t0
    assert status == 200 and out == {}  # response_fields [""]: nothing asked, nothing sent
    assert took < 0.4, took
    for _ in range(100):  # the chunks are tokenized in the background
        if front.llama.cache is not None and len(front.llama.cache) >= len(CHUNKS):
            break
        await asyncio.sleep(0.02)
    assert len(front.llama.cache) >= len(CHUNKS)
    assert slow.model_calls == before and front.counters["infill_warmups"] == 1
    # one a second while the user reads: logged at DEBUG, not INFO
    assert not [r for r in caplog.records if r.name == "diffill.http.access"]
    status, out = await vim.fim(ABOVE, CURSOR_LINE, BELOW, CHUNKS, t_max_predict_ms=1000)
    assert status == 200 and out["content"] == "total"
    ref = reference(backend, CHUNKS, 128)
    assert out["tokens_cached"] == ref.context.header_tokens > 0  # the extras, from the cache
    assert out["timings/prompt_n"] == ref.context.prefix_tokens + ref.context.suffix_tokens


def test_token_cache_keeps_only_extra_context_blocks(backend):
    cache = TokenCache(backend.encode_batch)
    snippets = [Snippet("a.py", "x = 1\n"), Snippet("b.py", "y = 2")]
    encode, hits = cache.view(snippets)
    blocks = ["# path: a.py\nx = 1\n", "# path: b.py\ny = 2\n"]
    qwen = "<|file_sep|>a.py\nx = 1\n"  # the Qwen2.5-Coder repository format of a block
    texts = [*blocks, qwen, "".join(blocks), "def cursor_window():\n    pass\n"]
    first = encode(texts)
    assert first == backend.encode_batch(texts) and hits == [0]
    assert len(cache) == 3  # the blocks in either format; not the joined header, not the window
    assert encode(texts) == first and hits[0] == sum(len(x) for x in first[:3])


# ----------------------------------------------------------------------------- llama.vscode


async def test_llama_vscode_shapes_with_its_api_key(serve, backend):
    client, _ = await serve(backend, token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    # updateExtraContext: n_predict 0, samplers [], t_max_predict_ms 1, no response_fields
    warm = {"input_prefix": "", "input_suffix": "", "input_extra": CHUNKS, "prompt": "",
            "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 1}
    async with client.post("/infill", json=warm, headers=headers) as r:
        assert r.status == 200
        out = await r.json()
        assert out["content"] == "" and out["tokens_predicted"] == 0
    body = {"input_prefix": ABOVE, "input_suffix": BELOW, "input_extra": CHUNKS,
            "prompt": CURSOR_LINE, "n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}
    async with client.post("/infill", json=body, headers=headers) as r:
        assert r.status == 200 and r.headers["X-Request-Id"]
        out = await r.json()
    assert out["content"] == "total" and out["stop"] is True and out["stop_type"] == "eos"
    assert out["tokens_predicted"] == 1 and out["tokens_evaluated"] == out["timings"]["prompt_n"]
    assert set(out["timings"]) == set(timings(0, 0, 0, 0))
    assert out["truncated"] is False and isinstance(out["tokens_cached"], int)
    gs = out["generation_settings"]
    assert gs["n_predict"] == 128 and gs["t_max_predict_ms"] == 2500 and gs["n_indent"] == 4
    async with client.post("/infill", json=body) as r:  # no api key
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        err = (await r.json())["error"]
        assert err == {"code": 401, "type": "authentication_error", "message": err["message"]}
        assert TOKEN not in err["message"]


async def test_props_and_health_as_the_clients_probe_them(serve, backend):
    client, _ = await serve(backend, token=TOKEN, model_names=["micro"])
    async with client.get("/health") as r:  # no token needed, as llama-server
        assert r.status == 200 and (await r.json())["status"] == "ok"
    async with client.get("/v1/health") as r:
        assert r.status == 200
    async with client.get("/props") as r:
        assert r.status == 401
        assert (await r.json())["error"]["type"] == "authentication_error"
    async with client.get("/props", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200
        props = await r.json()
    assert props["default_generation_settings"]["n_ctx"] > 0
    assert props["total_slots"] == 4 and props["model_path"] == "micro"
    assert "t_max_prompt_ms" in props["diffill"]["ignored"]
    assert "input_extra" in props["diffill"]["honoured"]


# ----------------------------------------------------------------------------- fields and errors


async def test_stop_n_indent_and_n_predict(serve, backend):
    client, front = await serve(backend)
    vim = LlamaVim(client)
    status, out = await vim.post({"input_prefix": ABOVE, "prompt": CURSOR_LINE,
                                  "input_suffix": BELOW, "stop": ["o"]})
    assert status == 200 and out["content"] == "t"
    assert (out["stop_type"], out["stopping_word"]) == ("word", "o")
    status, out = await vim.post({"input_prefix": ABOVE, "prompt": CURSOR_LINE,
                                  "input_suffix": BELOW, "n_predict": 100_000})
    assert status == 200 and out["generation_settings"]["n_predict"] == front.max_tokens_limit
    status, out = await vim.post({"input_prefix": ABOVE, "prompt": CURSOR_LINE,
                                  "input_suffix": BELOW, "n_predict": 1})
    assert status == 200 and out["content"] == "total" and out["stop_type"] == "limit"


def test_cut_at_indent_and_pick_fields():
    assert cut_at_indent("x = 1\n    y\nz\n", 4) == ("x = 1\n    y\n", True)
    assert cut_at_indent("x = 1\n\n    y\n", 4) == ("x = 1\n\n    y\n", False)
    assert cut_at_indent("x\n", 0) == ("x\n", False)
    answer = {"content": "c", "timings": {"prompt_n": 3}, "truncated": False}
    assert pick_fields(answer, ["content", "timings/prompt_n", "timings/nope", "x/y", ""]) == {
        "content": "c", "timings/prompt_n": 3}


@pytest.mark.parametrize("body, status, param_word", [
    (b"{", 400, "malformed"),
    (b'{"n_predict": "128"}', 400, "n_predict"),
    (b'{"input_extra": [{"filename": "a.py"}]}', 400, "text"),
    (b'{"input_extra": "a.py"}', 400, "input_extra"),
    (b'{"stream": true}', 400, "stream"),
    (b'{"stop": [' + b'"s", ' * 16 + b'"s"]}', 400, "stop"),
    (b'{"temperature": -1}', 400, "temperature"),
    (b'{"model": "gpt-4o"}', 404, "model"),
])
async def test_errors_are_llama_server_shaped(serve, backend, body, status, param_word):
    client, _ = await serve(backend)
    async with client.post("/infill", data=body,
                           headers={"Content-Type": "application/json"}) as r:
        assert r.status == status
        out = await r.json()
    err = out["error"]
    assert set(err) == {"code", "message", "type"} and err["code"] == status
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert param_word in err["message"]


async def test_a_full_queue_is_429_with_retry_after_in_llama_shape(serve, backend):
    client, front = await serve(backend, max_queue=1)
    front.pending = 1
    try:
        async with client.post("/infill", json={"prompt": "x"}) as r:
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
            assert (await r.json())["error"]["code"] == 429
    finally:
        front.pending = 0
