"""The request shapes other editors' OpenAI-compatible completion clients send, each
tried against diffill serve-http as docs/editors.md sets them up:

* Continue, ``tabAutocompleteModel`` / ``autocomplete`` role with ``provider: openai``:
  FIM through ``{apiBase}fim/completions`` (``prompt`` + ``suffix``, ``stream: true``,
  chunks read as ``choices[0].delta.content``, ``Authorization`` and ``x-api-key``), and
  its legacy-completions path (the hole in StarCoder's FIM tokens inside ``prompt``, a
  dozen ``stop`` strings, ``stream: true``, chunks read as ``choices[0].text``);
* Zed, ``edit_predictions.provider = "open_ai_compatible_api"``: the hole in the tokens
  of its ``prompt_format`` inside ``prompt``, posted to the full ``api_url``;
* Tabby, ``[model.completion.http] kind = "openai/completion"``: ``{api_endpoint}/completions``
  with ``prompt`` + ``suffix``, ``stream: true``, ``presence_penalty``, read as SSE
  ``choices[].text``.

Over the scripted checkpoint: after ``def add_numbers(a, b):\\n    total = a + b\\n    return``
it writes `` total``.
"""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from aiohttp import ClientSession
from diffill.lsp_server.completion.options import CompletionOptions
from diffill.lsp_server.http.http_connection import HttpConfig, Listener
from diffill.lsp_server.http.http_server import HttpFront
from diffill.lsp_server.text.fim_prompt import split_fim_prompt

PREFIX = "def add_numbers(a, b):\n    total = a + b\n    return "
SUFFIX = "\n\n\ndef greet_user(name):\n    message = \"hello \" + name\n"
TOKEN = "client-key-42-abcdef"
OPTS = CompletionOptions(steps=2)

@pytest_asyncio.fixture
async def client(backend):
    front = HttpFront(OPTS, HttpConfig(token=TOKEN, model_names=["diffill"]), backend=backend)
    listener = Listener(front)
    url = await listener.start("127.0.0.1", 0)
    session = ClientSession(base_url=url)
    yield session
    await session.close()
    await listener.close()


async def sse(resp) -> list[dict]:
    """The ``data:`` events of a server-sent-event answer, up to ``[DONE]``."""
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events, done = [], False
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        events.append(json.loads(data))
    assert done, "the stream ends with data: [DONE]"
    return events


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_continue_fim_route_streams_delta_content(client):
    body = {"model": "diffill", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 64,
            "temperature": 0.01, "top_p": None, "frequency_penalty": None,
            "presence_penalty": None, "stop": ["\n\n", "```"], "stream": True}
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               "x-api-key": TOKEN, **AUTH}
    async with client.post("/v1/fim/completions", data=json.dumps(body), headers=headers) as r:
        assert r.status == 200
        events = await sse(r)
    text = "".join(e["choices"][0]["delta"]["content"] for e in events)
    assert text == "total"
    assert all(e["object"] == "text_completion" and e["model"] == "diffill" for e in events)


async def test_continue_legacy_completions_with_a_fim_template_prompt(client):
    # Continue's template for a model name it does not know (StarCoder's tokens), its stops
    prompt = f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"
    stops = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>",
             "</fim_middle>", "</code>", "\n\n", "\r\n\r\n", "/src/", "#- coding: utf-8", "```"]
    body = {"model": "diffill", "prompt": prompt, "max_tokens": 64, "temperature": 0.01,
            "stop": stops, "stream": True}
    async with client.post("/v1/completions", json=body, headers=AUTH) as r:
        assert r.status == 200
        events = await sse(r)
    assert "".join(e["choices"][0]["text"] for e in events) == "total"
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("prompt_format, prompt", [
    ("qwen", f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"),
    ("star_coder", f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"),
    ("code_llama", f"<PRE> {PREFIX} <SUF>{SUFFIX} <MID>"),
    ("deepseek_coder", f"<\uff5cfim\u2581begin\uff5c>{PREFIX}<\uff5cfim\u2581hole\uff5c>{SUFFIX}"
                       "<\uff5cfim\u2581end\uff5c>"),
    ("codestral", f"[SUFFIX]{SUFFIX}[PREFIX]{PREFIX}"),
])
async def test_zed_open_ai_compatible_edit_prediction(client, prompt_format, prompt):
    body = {"model": "diffill", "prompt": prompt, "max_tokens": 64, "temperature": 0.0,
            "stop": ["<|endoftext|>"]}
    async with client.post("/v1/completions", json=body, headers=AUTH) as r:
        out = await r.json()
        assert r.status == 200, out
    assert out["choices"][0]["text"] == "total"
    split = split_fim_prompt(prompt)
    assert split is not None and (split.prefix, split.suffix, split.format) == (
        PREFIX, SUFFIX, prompt_format)


async def test_tabby_openai_completion_connector(client):
    body = {"model": "diffill", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 64,
            "temperature": 0.1, "stream": True, "presence_penalty": 0.0}
    async with client.post("/v1/completions", json=body, headers=AUTH) as r:
        assert r.status == 200
        events = await sse(r)
    assert [c["text"] for e in events for c in e["choices"]] == ["total"]


async def test_a_refused_stream_is_a_plain_json_error(client):
    async with client.post("/v1/completions", json={"prompt": PREFIX, "stream": True}) as r:
        assert r.status == 401 and r.headers["Content-Type"].startswith("application/json")
        assert (await r.json())["error"]["code"] == "invalid_api_key"


def test_plain_prompts_are_not_split():
    for prompt in (PREFIX, "x = '<fim_prefix>'", "<fim_prefix>a<fim_suffix>b",  # no middle
                   "<fim_prefix>a<fim_suffix>b<fim_middle>c",  # not ending at the hole
                   "<|fim_prefix|>a<|fim_prefix|>b<|fim_suffix|>c<|fim_middle|>"):
        assert split_fim_prompt(prompt) is None, prompt
    head = "<|repo_name|>r\n<|file_sep|>a.py\nx = 1\n"
    split = split_fim_prompt(head + "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>\n")
    assert split is not None and split.prefix == head + "def f():" and split.suffix == "\n"
