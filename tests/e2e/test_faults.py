"""Faults in the real ``diffill serve`` subprocess: a missing checkpoint, a corrupt
(truncated) checkpoint, running out of memory (a real address-space limit set on the
running server with ``prlimit`` while it loads a model; inside a model call through
the test hook ``DIFFILL_DEBUG_FAULT=MemoryError:1``), a model call that raises
(``RuntimeError``). Each time the user gets a clear ``window/showMessage``, the server
stays up and answers every request, and later requests work once the fault is gone
(a fixed ``modelPath``, the one-shot injected fault used up, the limit lifted).

Why not a memory limit during a model call: a tiny model's forward needs so little
memory that the allocator serves it from what earlier calls freed, so no limit makes
it fail reliably; a model load always needs fresh address space.
"""

from __future__ import annotations

import resource
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from _lsp_raw import SERVE, RawClient, end_position, server_env

pytestmark = [pytest.mark.e2e]

OPTIONS = {"diffill": {"steps": 2, "maxTokens": 8, "numCandidates": 1}}
DOC = "def add_numbers(a, b):\n    total = a + b\n    return "
ERROR = 1  # MessageType.Error


def start(model: Path, tmp: Path, env: dict[str, str] | None = None) -> RawClient:
    c = RawClient([*SERVE, "--model", str(model), "--log-file", str(tmp / "server.log")],
                  env=server_env(env), stderr_path=tmp / "server.err")
    c.initialize(OPTIONS)
    return c


def errors_shown(c: RawClient) -> list[str]:
    c.drain(0.1)
    return [n["params"]["message"] for n in c.notifications
            if n.get("method") == "window/showMessage" and n["params"]["type"] == ERROR]


def complete(c: RawClient, uri: str = "file:///faults/doc.py", text: str = DOC) -> dict[str, Any]:
    c.open(uri, text)
    line, char = end_position(text)
    res = c.wait_for(c.completion_async(uri, line, char), 120)
    assert "result" in res, res  # never an error response, never silence
    return res["result"]


def new_texts(result: dict[str, Any]) -> list[str]:
    """The completion items' texts (the scripted checkpoint answers DOC with "total")."""
    return [item["textEdit"]["newText"] for item in result["items"]]


def switch_model(c: RawClient, model: Path) -> dict[str, Any]:
    c.notify("workspace/didChangeConfiguration", {"settings": {"diffill": {"modelPath": str(model)}}})
    time.sleep(0.2)
    return c.wait_loaded()


def test_missing_checkpoint(model_dir: Path, tmp_path: Path):
    missing = tmp_path / "no-such-checkpoint"
    c = start(missing, tmp_path)
    try:
        st = c.wait_loaded()
        assert not st["loaded"] and "no-such-checkpoint" in st["error"]
        shown = errors_shown(c)
        assert any("cannot load model" in m and "no-such-checkpoint" in m for m in shown), shown
        assert complete(c)["items"] == []  # answered, empty: no model
        st = switch_model(c, model_dir)  # the fault clears: a good path
        assert st["loaded"] and st["error"] is None
        assert new_texts(complete(c, "file:///faults/after.py")) == ["total"]
        assert c.request("diffill/status")["result"]["model_requests"] >= 1
        assert c.shutdown() == 0
    finally:
        c.kill()


def test_corrupt_checkpoint(model_dir: Path, tmp_path: Path):
    bad = tmp_path / "corrupt"
    shutil.copytree(model_dir, bad)
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated mid-tensor
    c = start(bad, tmp_path)
    try:
        st = c.wait_loaded()
        assert not st["loaded"] and st["error"]
        shown = errors_shown(c)
        assert any("cannot load model" in m and "model.safetensors" in m for m in shown), shown
        assert complete(c)["items"] == []
        st = switch_model(c, model_dir)
        assert st["loaded"] and st["error"] is None
        assert new_texts(complete(c, "file:///faults/after.py")) == ["total"]
        assert c.shutdown() == 0
    finally:
        c.kill()


@pytest.mark.parametrize("fault", ["MemoryError:1", "RuntimeError:2"])
def test_injected_model_fault_is_shown_and_cleared(model_dir: Path, tmp_path: Path, fault: str):
    kind, count = fault.split(":")
    c = start(model_dir, tmp_path, {"DIFFILL_DEBUG_FAULT": fault})
    try:
        assert c.wait_loaded()["loaded"]
        for k in range(int(count)):
            assert complete(c, f"file:///faults/f{k}.py")["items"] == []
        shown = errors_shown(c)
        assert any(kind in m and "DIFFILL_DEBUG_FAULT" in m for m in shown), shown
        assert len(shown) == 1  # the same fault again is not shown twice in a row
        st = c.request("diffill/status")["result"]
        assert st["errors"] == int(count) and st["loaded"]
        res = complete(c, "file:///faults/later.py")  # one-shot faults are used up: works again
        st = c.request("diffill/status")["result"]
        assert st["errors"] == int(count) and st["model_requests"] >= 1, (st, res)
        assert new_texts(res) == ["total"]
        assert c.shutdown() == 0
    finally:
        c.kill()


def _vm_size(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def _big_checkpoint(like: Path, out: Path) -> Path:
    """A random checkpoint, larger than ``like``, with its tokenizer."""
    import msgspec
    from diffill.model.config import DiffillDialect, read_config
    from diffill.model.transformer import Transformer
    from safetensors.torch import save_file

    cfg = msgspec.structs.replace(read_config(like)[0], hidden_size=256, intermediate_size=1024,
                                  num_layers=4, num_heads=4, num_kv_heads=4, head_dim=64)
    model = Transformer(cfg)
    model.init_weights(seed=0)
    out.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    dialect = DiffillDialect.from_model_config(cfg, {"test": "random, for the out-of-memory test"})
    (out / "config.json").write_bytes(msgspec.json.encode(dialect))
    shutil.copy(like / "tokenizer.json", out / "tokenizer.json")
    return out


def test_out_of_memory_under_an_address_space_limit(model_dir: Path, tmp_path: Path):
    """A real address-space limit: RLIMIT_AS is set on the running server (prlimit) to the
    address space it already uses, then it is asked to load a bigger model. The load is
    refused for want of memory before it starts (model/loader.py check_address_space: the
    Rust readers of safetensors and tokenizers abort the process on a failed allocation --
    CI saw the server die with SIGABRT in the tokenizer's thread), the user is told, the
    server keeps answering; once the limit is lifted, loading works again and so do
    completions."""
    big = _big_checkpoint(model_dir, tmp_path / "big")
    c = start(model_dir, tmp_path)
    try:
        assert c.wait_loaded()["loaded"]
        complete(c, "file:///faults/warm.py")  # imports and first-call allocations done
        soft, hard = resource.prlimit(c.pid, resource.RLIMIT_AS)
        resource.prlimit(c.pid, resource.RLIMIT_AS, (_vm_size(c.pid), hard))
        try:
            st = switch_model(c, big)
            answer = complete(c, "file:///faults/during.py")
        finally:
            resource.prlimit(c.pid, resource.RLIMIT_AS, (soft, hard))
        assert not st["loaded"] and st["error"], st
        assert answer["items"] == []
        shown = errors_shown(c)
        assert any("cannot load model" in m and str(big) in m and
                   ("memory" in m.lower() or "allocate" in m.lower()) for m in shown), shown
        st = switch_model(c, model_dir)  # the limit is gone: loading works again
        assert st["loaded"] and st["error"] is None, st
        assert new_texts(complete(c, "file:///faults/after.py")) == ["total"]
        assert c.request("diffill/status")["result"]["model_requests"] >= 2
        assert c.shutdown() == 0
    finally:
        c.kill()
