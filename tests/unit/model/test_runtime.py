"""CPU threading (model/runtime.py): the default, the precedence of --threads /
DIFFILL_THREADS / OMP_NUM_THREADS, no-op on CUDA, and the engine's ensure step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from diffill.model import runtime


@pytest.fixture(autouse=True)
def _restore(monkeypatch: pytest.MonkeyPatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(runtime, "_configured", None)
    monkeypatch.delenv("DIFFILL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("cores", "want"), [(None, 1), (1, 1), (2, 1), (3, 1), (4, 2), (6, 3),
                                             (8, 4), (16, 4), (128, 4)])
def test_default_is_half_the_cores_between_1_and_4(cores, want):
    assert runtime.default_cpu_threads(cores) == want


def test_precedence():
    r = runtime.resolve_cpu_threads
    assert r(None, cpu_count=8, env={}) == 4
    assert r(3, cpu_count=8, env={"DIFFILL_THREADS": "2", "OMP_NUM_THREADS": "1"}) == 3
    assert r(None, cpu_count=8, env={"DIFFILL_THREADS": "2", "OMP_NUM_THREADS": "1"}) == 2
    assert r(None, cpu_count=8, env={"OMP_NUM_THREADS": "6"}) is None  # torch already read it
    assert r(None, cpu_count=8, env={"DIFFILL_THREADS": " "}) == 4
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="DIFFILL_THREADS"):
            r(None, cpu_count=8, env={"DIFFILL_THREADS": bad})
    with pytest.raises(ValueError):
        r(0, cpu_count=8, env={})


def test_configure_sets_torch_threads_and_is_a_no_op_on_cuda(monkeypatch: pytest.MonkeyPatch):
    torch.set_num_threads(1)
    assert runtime.configure_cpu_threads(2, "cuda:0") is None
    assert torch.get_num_threads() == 1 and runtime.configured_cpu_threads() is None
    assert runtime.configure_cpu_threads(2, "cpu") == 2
    assert torch.get_num_threads() == 2 and runtime.configured_cpu_threads() == 2
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 16)
    assert runtime.configure_cpu_threads(None, torch.device("cpu")) == 4
    assert torch.get_num_threads() == 4


def test_ensure_applies_the_default_once_and_never_raises_the_count(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 16)  # default 4
    torch.set_num_threads(6)
    assert runtime.ensure_cpu_threads("cpu") == 4 and torch.get_num_threads() == 4
    torch.set_num_threads(3)
    assert runtime.ensure_cpu_threads("cpu") is None  # configured already
    assert torch.get_num_threads() == 3
    monkeypatch.setattr(runtime, "_configured", None)
    torch.set_num_threads(1)  # a test or host program lowered it: kept
    assert runtime.ensure_cpu_threads("cpu") == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(runtime, "_configured", None)
    monkeypatch.setenv("DIFFILL_THREADS", "2")  # --threads of serve / serve-http
    assert runtime.ensure_cpu_threads("cpu") == 2 and torch.get_num_threads() == 2
    monkeypatch.setattr(runtime, "_configured", None)
    assert runtime.ensure_cpu_threads("cuda") is None and runtime.configured_cpu_threads() is None


def test_cli_threads_option_reaches_the_environment(monkeypatch: pytest.MonkeyPatch):
    import argparse

    from diffill.lsp_server.commands import add_threads_option, check_threads, threads_to_env

    p = argparse.ArgumentParser()
    add_threads_option(p)
    assert check_threads(p.parse_args(["--threads", "0"])) is not None
    args = p.parse_args(["--threads", "3"])
    assert check_threads(args) is None
    threads_to_env(args)
    import os

    assert os.environ["DIFFILL_THREADS"] == "3"


def test_one_malloc_arena_is_set_in_a_fresh_process_unless_the_user_chose():
    """serve and serve-http keep one glibc arena (lsp_server.commands.one_malloc_arena); a
    user's MALLOC_ARENA_MAX wins. Run in a child: mallopt changes the whole process."""
    code = "from diffill.lsp_server.commands import one_malloc_arena as f; print(f())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "True"  # glibc (Debian)
    out = subprocess.run([sys.executable, "-P", "-c", code], env={**env, "MALLOC_ARENA_MAX": "4"},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
