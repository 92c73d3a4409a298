"""Robustness of the real ``diffill serve`` subprocess under hostile LSP traffic
(hypothesis): malformed frames and JSON-RPC envelopes, wrong params, random
incremental edits (out-of-range ranges included), positions outside the document,
binary and invalid UTF-8 content, lone surrogates, requests before ``initialize``
and after ``shutdown``, unknown URIs, a 10 MB document.

The server must never crash or hang, must answer every request, and must answer
with the codes the specifications give: -32700 parse error, -32600 invalid request,
-32601 method not found, -32602 invalid params, -32002 server not initialized,
-32600 after shutdown. After every example a ``diffill/status`` sentinel proves the
framing is still in sync.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from _lsp_raw import SERVE, RawClient, encode, end_position, frame, server_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.e2e]

OPTIONS = {"diffill": {"steps": 1, "maxTokens": 4, "numCandidates": 1}}
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PARSE, INVALID_REQUEST, NOT_FOUND, INVALID_PARAMS, NOT_INITIALIZED = (
    -32700, -32600, -32601, -32602, -32002)
SMALL = "def add_numbers(a, b):\n    total = a + b\n    return total\n"


def start(model_dir: Path, tmp: Path, *, extra_env: dict[str, str] | None = None) -> RawClient:
    return RawClient([*SERVE, "--model", str(model_dir)], env=server_env(extra_env),
                     stderr_path=tmp / "server.err")


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    c = start(model_dir, tmp_path_factory.mktemp("fuzz"))
    c.initialize(OPTIONS)
    st_ = c.wait_loaded()
    assert st_["loaded"], st_
    yield c
    assert c.request("diffill/status")["result"]["in_flight"] == 0  # nothing left behind
    assert c.shutdown() == 0
    assert c.proc.returncode == 0


_sentinels = itertools.count(10_000_000)


def sentinel(c: RawClient, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Send a status request; return every response that came before its answer."""
    rid = f"sentinel-{next(_sentinels)}"
    c.send({"jsonrpc": "2.0", "id": rid, "method": "diffill/status"})
    before = list(c.backlog)
    c.backlog.clear()
    end = time.monotonic() + timeout
    while True:
        msg = c.next_message(max(0.0, end - time.monotonic()))
        assert msg is not None, f"server hung: no answer to {rid}"
        if "method" in msg:
            continue
        if msg.get("id") == rid:
            assert "result" in msg and msg["result"]["version"], msg
            return before
        before.append(msg)


def error_codes(msgs: list[dict[str, Any]]) -> list[int]:
    return [m["error"]["code"] for m in msgs if "error" in m]


# ----------------------------------------------------------------------------- lifecycle


def test_lifecycle_errors(model_dir: Path, tmp_path: Path):
    c = start(model_dir, tmp_path)
    try:
        res = c.request("textDocument/completion", {"textDocument": {"uri": "file:///x.py"},
                                                     "position": {"line": 0, "character": 0}})
        assert res["error"]["code"] == NOT_INITIALIZED and res["id"] == 1
        c.notify("textDocument/didOpen", {"textDocument": {  # dropped before initialize
            "uri": "file:///x.py", "languageId": "python", "version": 1, "text": "x"}})
        assert c.request("diffill/status")["error"]["code"] == NOT_INITIALIZED
        c.initialize(OPTIONS)
        again = c.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        assert again["error"]["code"] == INVALID_REQUEST
        st_ = c.request("diffill/status")["result"]
        assert st_["version"]
        assert c.request("shutdown")["result"] is None
        after = c.request("diffill/status")
        assert after["error"]["code"] == INVALID_REQUEST
        after = c.request("textDocument/completion", {"textDocument": {"uri": "file:///x.py"},
                                                       "position": {"line": 0, "character": 0}})
        assert after["error"]["code"] == INVALID_REQUEST
        c.notify("exit")
        assert c.proc.wait(30) == 0
    finally:
        c.kill()


def test_exit_without_shutdown_is_code_1(model_dir: Path, tmp_path: Path):
    c = start(model_dir, tmp_path)
    try:
        c.initialize(OPTIONS)
        c.notify("exit")
        assert c.proc.wait(30) == 1
    finally:
        c.kill()


# ----------------------------------------------------------------------------- malformed traffic

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                         st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
methods = st.sampled_from(["textDocument/completion", "textDocument/inlineCompletion",
                           "textDocument/didOpen", "textDocument/didChange", "diffill/status",
                           "workspace/didChangeConfiguration", "$/cancelRequest", "no/such"])


@st.composite
def bad_frames(draw) -> tuple[bytes, set[int] | None]:
    """(bytes to write, the acceptable error codes: at least one of them must come back;
    None = nothing may come back (a notification); an empty set = anything, a result too)."""
    kind = draw(st.sampled_from([
        "binary", "bad_json", "not_object", "bad_version", "bad_method", "bad_id", "no_method",
        "scalar_params", "bad_params", "notification_params", "bad_length", "short_length",
        "invalid_utf8_string",
    ]))
    if kind == "binary":
        body = draw(st.binary(min_size=1, max_size=300))
        try:
            value = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return frame(body), {PARSE}
        return frame(body), {INVALID_REQUEST} if not isinstance(value, dict) else set()
    if kind == "bad_json":
        text = draw(st.sampled_from(['{"jsonrpc": "2.0", "id": 1,', "{'a': 1}", "{", "nul",
                                     '{"a": 1}}', "\x00"]))
        return frame(text.encode()), {PARSE}
    if kind == "not_object":
        value = draw(st.one_of(json_scalars, st.lists(json_values, max_size=3)))
        return frame(encode(value)), {INVALID_REQUEST}
    rid = draw(st.integers(1, 10**6))
    if kind == "bad_version":
        version = draw(st.one_of(st.none(), st.just("1.0"), st.integers()))
        msg = {"id": rid, "method": "diffill/status"} | ({} if version is None else {"jsonrpc": version})
        return frame(encode(msg)), {INVALID_REQUEST}
    if kind == "bad_method":
        method = draw(st.one_of(st.integers(), st.none(), st.lists(st.integers(), max_size=2)))
        return frame(encode({"jsonrpc": "2.0", "id": rid, "method": method})), {INVALID_REQUEST}
    if kind == "bad_id":
        bad = draw(st.one_of(st.floats(allow_nan=False), st.booleans(), st.lists(st.integers()),
                             st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
        return frame(encode({"jsonrpc": "2.0", "id": bad, "method": "diffill/status"})), {INVALID_REQUEST}
    if kind == "no_method":
        return frame(encode({"jsonrpc": "2.0", "id": rid})), {INVALID_REQUEST}
    if kind == "scalar_params":
        params = draw(json_scalars.filter(lambda v: v is not None))
        return frame(encode({"jsonrpc": "2.0", "id": rid, "method": draw(methods),
                             "params": params})), {INVALID_REQUEST}
    if kind == "bad_params":
        method = draw(methods.filter(lambda m: not m.startswith(("textDocument/did", "$/",
                                                                 "workspace/"))))
        params = draw(st.dictionaries(st.sampled_from(["textDocument", "position", "context", "x"]),
                                      json_values, max_size=3))
        ok = {"no/such": {NOT_FOUND}, "diffill/status": set()}.get(method, {INVALID_PARAMS})
        return frame(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})), ok
    if kind == "notification_params":
        params = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=3))
        return frame(encode({"jsonrpc": "2.0", "method": draw(methods), "params": params})), None
    if kind == "bad_length":
        value = draw(st.sampled_from([b"abc", b"-5", b"", b"1e3", b"0x10", b" 12 34"]))
        return b"Content-Length: " + value + b"\r\n\r\n" + b'{"jsonrpc": "2.0"}', {PARSE}
    if kind == "short_length":
        body = encode({"jsonrpc": "2.0", "id": rid, "method": "diffill/status"})
        cut = draw(st.integers(1, len(body) - 1))
        return b"Content-Length: %d\r\n\r\n" % cut + body, {PARSE}
    # a JSON string with raw invalid UTF-8 inside
    body = b'{"jsonrpc": "2.0", "id": %d, "method": "diffill/status", "params": {"x": "\xff\xfe"}}' % rid
    return frame(body), {PARSE}


@FUZZ
@given(bad_frames())
def test_malformed_messages_get_spec_errors_and_the_stream_recovers(server: RawClient, case):
    data, ok = case
    server.write(data)
    answers = sentinel(server)
    codes = error_codes(answers)
    if ok is None:
        assert answers == [], answers
    elif ok:
        assert len(answers) == 1 and codes and set(codes) <= ok, (data[:200], answers)
    for m in answers:
        assert m.get("jsonrpc") == "2.0" and set(m) <= {"jsonrpc", "id", "result", "error"}


def test_oversized_message_is_skipped(server: RawClient):
    from diffill.lsp_server.protocol.jsonrpc import MAX_MESSAGE_BYTES

    n = MAX_MESSAGE_BYTES + 1
    server.write(b"Content-Length: %d\r\n\r\n" % n)
    chunk = b" " * (1 << 20)
    left = n
    while left:
        server.write(chunk[: min(left, len(chunk))])
        left -= min(left, len(chunk))
    assert error_codes(sentinel(server, timeout=120)) == [PARSE]


def test_unknown_method_and_unknown_uri(server: RawClient):
    assert server.request("no/such/method", {})["error"]["code"] == NOT_FOUND
    for method in ("textDocument/completion", "textDocument/inlineCompletion"):
        res = server.request(method, {"textDocument": {"uri": "file:///never/opened.py"},
                                      "position": {"line": 3, "character": 4},
                                      "context": {"triggerKind": 1}})
        assert "result" in res, res
        assert res["result"]["items"] == []


# ----------------------------------------------------------------------------- random edits

edit_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["\n", "\r\n", "\t", "\x00", "\U0001f600", "é\u0301", "    return ", "\ufeff"])


@st.composite
def edits(draw) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.integers(0, 9)) == 0:  # a full replacement now and then
            out.append({"text": draw(st.text(max_size=80))})
            continue
        a = (draw(st.integers(-2, 12)), draw(st.integers(-2, 40)))
        b = (draw(st.integers(-2, 12)), draw(st.integers(-2, 40)))
        out.append({"range": {"start": {"line": a[0], "character": a[1]},
                              "end": {"line": b[0], "character": b[1]}},
                    "text": draw(edit_text)})
    return out


_uris = itertools.count()


@FUZZ
@given(edits(), st.lists(st.tuples(st.integers(-1, 15), st.integers(-1, 60), st.booleans()),
                         min_size=1, max_size=4))
def test_random_edits_and_positions(server: RawClient, changes, positions):
    uri = f"file:///fuzz/{next(_uris)}.py"
    server.open(uri, SMALL)
    version = 1
    for ch in changes:
        version += 1
        server.change(uri, version, [ch])
    pending = []
    for line, char, inline in positions:
        send = server.inline_async if inline else server.completion_async
        pending.append((send(uri, line, char), line, char))
    for rid, line, char in pending:
        res = server.wait_for(rid, 60)
        if line < 0 or char < 0:  # not a uinteger: the params do not fit the type
            assert res.get("error", {}).get("code") == INVALID_PARAMS, res
        elif "error" in res:  # a line past the end of the document
            assert res["error"]["code"] == INVALID_PARAMS, res
        else:
            assert isinstance(res["result"]["items"], list)
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    sentinel(server)


def test_binary_content_and_lone_surrogates(server: RawClient):
    uri = "file:///fuzz/binary.py"
    text = "".join(chr(i) for i in range(0, 0x250)) + "\ndef f(x):\n    return "
    server.open(uri, text)
    line, char = end_position(text)
    res = server.wait_for(server.completion_async(uri, line, char), 60)
    assert "result" in res, res
    # a lone surrogate (legal JSON, impossible in UTF-8) stands for one UTF-16 unit
    body = (b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": '
            b'{"uri": "file:///fuzz/sur.py", "languageId": "python", "version": 1, '
            b'"text": "a\\ud800b = 1\\nx = \\udfff"}}}')
    server.write(frame(body))
    res = server.wait_for(server.completion_async("file:///fuzz/sur.py", 0, 2), 60)
    assert "result" in res, res
    res = server.wait_for(server.completion_async("file:///fuzz/sur.py", 1, 5), 60)
    assert "result" in res, res
    assert error_codes(sentinel(server)) == []


# ----------------------------------------------------------------------------- huge documents


def test_ten_megabyte_document_is_cut_to_the_budget(server: RawClient, model_dir: Path, capsys):
    opts = server.request("diffill/status")["result"]["options"]
    max_pos = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    budget = min(opts["contextTokens"], max_pos - opts["maxTokens"] - 2)  # what the model can take
    prefix_budget = round(budget * opts["prefixFraction"])
    body = "".join(f"def helper_{i}(value):\n    return value * {i % 97}\n\n\n" for i in range(240_000))
    assert len(body) > 10_000_000
    big = body + SMALL.replace("return total\n", "return ")
    small = big[-3000:]  # the same neighbourhood of the cursor: the same model input
    small = small[small.index("\n") + 1:]
    timings: dict[str, list[float]] = {"small": [], "big": []}
    digests: dict[str, str] = {}
    for name, text in (("small", small), ("big", big)):
        uri = f"file:///fuzz/{name}.py"
        server.open(uri, text)
        line, char = end_position(text)
        for _ in range(5):
            t0 = time.perf_counter()
            res = server.wait_for(server.completion_async(uri, line, char), 120)
            timings[name].append(time.perf_counter() - t0)
            assert "result" in res, res
            char -= 1  # a new position each time: no typed-ahead cache hit
        ctx = server.request("diffill/status")["result"]["last_context"]
        assert ctx["uri"] == uri
        used = ctx["prefix_tokens"] + ctx["suffix_tokens"]
        assert used <= budget
        assert ctx["prefix_tokens"] >= prefix_budget - 16, (ctx, prefix_budget)  # filled, then cut
        digests[name] = ctx["digest"]
    assert digests["big"] == digests["small"]  # the 10 MB document was cut to the same window
    ratio = statistics.median(timings["big"]) / statistics.median(timings["small"])
    with capsys.disabled():
        print(f"\n[fuzz] context used on the 10 MB doc: {ctx['prefix_tokens']} + "
              f"{ctx['suffix_tokens']} tokens (budget {budget}); completion latency, median of 5: "
              f"{len(small)}-char doc holding the same window "
              f"{statistics.median(timings['small']) * 1000:.1f} ms, 10 MB doc "
              f"{statistics.median(timings['big']) * 1000:.1f} ms, ratio {ratio:.2f}")


def test_tcp_transport_has_the_same_framing(model_dir: Path, tmp_path: Path):
    """``diffill serve --tcp``: garbage, a request before initialize, a bad header, then a
    clean shutdown/exit (exit code 0)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "diffill.cli", "serve", "--model",
                             str(model_dir), "--tcp", f"127.0.0.1:{port}"], env=server_env(),
                            stderr=open(tmp_path / "tcp.err", "wb"))  # noqa: SIM115
    try:
        for _ in range(300):
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("the TCP server did not listen")
        msg = {"jsonrpc": "2.0", "id": 1, "method": "diffill/status"}
        conn.sendall(frame(b"{bad") + frame(encode(msg))
                     + frame(encode({"jsonrpc": "2.0", "id": 2, "method": "initialize",
                                     "params": {"capabilities": {}}}))
                     + b"Content-Length: zz\r\n\r\n{}"
                     + frame(encode({"jsonrpc": "2.0", "id": 3, "method": "shutdown"})))
        conn.settimeout(60)
        data = b""
        while b'"id": 3' not in data or not data.endswith(b"}"):
            chunk = conn.recv(1 << 16)
            assert chunk, data
            data += chunk
        bodies = [json.loads(part[: part.rindex(b"}") + 1])
                  for part in data.split(b"\r\n\r\n")[1:]]
        got = [(b.get("id"), b["error"]["code"] if "error" in b else "ok") for b in bodies]
        assert got == [(None, PARSE), (1, NOT_INITIALIZED), (2, "ok"), (None, PARSE), (3, "ok")]
        conn.sendall(frame(encode({"jsonrpc": "2.0", "method": "exit"})))
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
