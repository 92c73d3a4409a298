"""Shared fixtures (helpers importable by every test: ``tests/support.py``, the one
tiny-model builder and the tiny checkpoint writers).

The tests mirror the code: ``tests/unit/<folder>/test_<module>.py`` for ``<folder>/<module>.py``
(``tests/unit/test_cli.py`` and ``test_layout.py`` for the root package and the floor plan),
``tests/e2e/`` (real servers, real editors) and ``tests/gpu/`` (skipped without CUDA).

``model_dir`` = ``scripted_model_dir`` (session scope): a real diffill checkpoint folder
(config.json, model.safetensors, the shipped tokenizer.json) whose weights are written by
``tests/support/scripted_model.py`` so that it answers the prompts of its ``RULES`` with
fixed middles and leaves every other hole empty, with margins no CPU's floating point can
overturn. Every test that loads a real model (server, editors, HTTP, CLI, soak, ...) runs
it and states the completion it expects. Built in seconds; treat the folder as read-only.

``micro_model_dir`` (session scope): a real diffill checkpoint folder
(config.json, model.safetensors, tokenizer.json) of a micro model trained on the
committed micro corpus (``tests/fixtures/micro_corpus.py``) with its own tiny
BPE. It memorises that corpus well enough to fill most of its lines back in exactly;
``tests/unit/training/test_train_learning.py`` checks that, with a tolerance for what
differs between machines. Nothing else may assert on what it writes. Treat the folder as
read-only.

Training it takes minutes (5.5 on a shared 2-core box, 9 on another), so it is cached
across sessions under ``$DIFFILL_TEST_CACHE`` (default
``<system tmp>/diffill-test-cache``) in a folder named after a hash of
everything that determines it (corpus, training/data/model code, torch and numpy
versions, the ATen CPU kernel level and the CPU model, the thread count).
``DIFFILL_TEST_CACHE=off`` disables that cache (the model is then
built once per session under pytest's tmp dir). Concurrent sessions are safe:
each builds in its own temporary folder and renames it into place atomically.

Outside pytest the same models come from ``python tests/support/scripted_model.py OUT``
and ``python -m diffill.training.train --micro OUT`` (checkpoint in ``OUT/model``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import torch
from diffill.lsp_server.backend.backends import LocalBackend, load_local_backend
from diffill.training.train import train_micro_model
from support import FIXTURES, ROOT, write_diffill_checkpoint
from support.scripted_model import build_scripted_model

MICRO_CORPUS = FIXTURES / "micro_corpus.py"
_KEY_FILES = ("training/train.py", "training/data.py", "model/transformer.py", "model/config.py",
              "model/attention.py")
MICRO_THREADS = 1  # training threads: part of what determines the micro model


def micro_corpus_text() -> str:
    return MICRO_CORPUS.read_text()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _micro_key() -> str:
    """Hash of what decides the trained weights: training floating point differs between
    ATen kernel levels (AVX-512 / AVX2 / default), CPU models and thread counts."""
    import numpy

    h = hashlib.sha256()
    h.update(micro_corpus_text().encode())
    for rel in _KEY_FILES:
        p = ROOT / rel
        h.update(rel.encode())
        h.update(p.read_bytes() if p.is_file() else b"")
    for part in (torch.__version__, tokenizers.__version__, numpy.__version__,
                 torch.backends.cpu.get_cpu_capability(), cpu_model(), platform.machine(),
                 f"threads={MICRO_THREADS}"):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def build_micro_model(cache_root: Path) -> Path:
    """The micro checkpoint folder under ``cache_root`` (built if missing)."""
    final = cache_root / f"micro-{_micro_key()}"
    ckpt = final / "model"
    if (ckpt / "model.safetensors").is_file() and (ckpt / "config.json").is_file():
        return ckpt
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="building-", dir=cache_root))
    try:
        train_micro_model(tmp, micro_corpus_text(), threads=MICRO_THREADS)
        try:
            tmp.rename(final)
        except OSError:  # another session finished first: use theirs
            if not (ckpt / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return ckpt


@pytest.fixture(scope="session")
def micro_corpus() -> str:
    """The text the micro model was trained on."""
    return micro_corpus_text()


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained micro diffill checkpoint folder (read-only; see module doc)."""
    setting = os.environ.get("DIFFILL_TEST_CACHE", "")
    if setting.lower() in ("off", "0", "no", "false"):
        root = tmp_path_factory.mktemp("micro-model")
    else:
        root = Path(setting) if setting else Path(tempfile.gettempdir()) / "diffill-test-cache"
    return build_micro_model(root)


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted checkpoint folder (read-only; answers: ``scripted_model.RULES``)."""
    return build_scripted_model(tmp_path_factory.mktemp("scripted-model"))


@pytest.fixture(scope="session")
def model_dir(scripted_model_dir: Path) -> Path:
    """The checkpoint folder tests that load a real model use: the scripted one, whose
    answers are certain on any CPU (module doc)."""
    return Path(scripted_model_dir)


@pytest.fixture(scope="module")
def backend(model_dir: Path) -> LocalBackend:
    """``model_dir`` loaded in a ``LocalBackend``, one per test module (the HTTP front tests
    serve it; a module that needs another backend defines its own fixture of this name)."""
    return load_local_backend(str(model_dir))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op thread is faster, and far faster on a busy machine
    (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def tiny_ckpt(tmp_path: Path) -> tuple[Path, Any]:
    """A random tiny diffill checkpoint folder (with provenance) and the model it holds."""
    folder = tmp_path / "ckpt"
    model = write_diffill_checkpoint(folder, provenance={"corpus": "unit-test", "steps": 3})
    return folder, model
