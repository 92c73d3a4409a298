"""VS Code (code-server 4.139 = VS Code OSS 1.139, in headless Debian Chromium driven by
playwright-core) with the editors/vscode extension installed from its .vsix, against the
real ``diffill serve`` + the scripted checkpoint (local engine): typing ``v`` at
``    result = [`` shows the ghost text `` * v for v in values]``, Tab inserts it.

``tests/e2e/editors/vscode_driver.js`` opens the file with Quick Open, types at a line, waits
until ghost text is in the DOM, takes a screenshot, presses Tab in the browser and reads the
document back (the extension writes what it received and each document change to
``$DIFFILL_VSCODE_TRACE`` when that is set). The document after Tab must be the document
before it with the shown inline item applied, and the ghost text in the DOM must be that item.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "editors"))
import editor_harness as h  # noqa: E402

CHROMIUM = shutil.which("chromium")
EXT_DIR = h.EDITORS / "vscode"
NODE = h.NODE_BIN / "node"

pytestmark = pytest.mark.e2e


def _need_tools() -> None:
    h.need(NODE.exists(), f"node 24 not installed ({h.INSTALL_HINT})")
    h.need(h.CODE_SERVER.exists(), f"code-server not installed ({h.INSTALL_HINT})")
    h.need(CHROMIUM is not None, f"chromium not installed ({h.INSTALL_HINT})")
    h.need((h.DRIVER_MODULES / "playwright-core").exists(), f"playwright-core not installed ({h.INSTALL_HINT})")
    h.need((EXT_DIR / "node_modules" / ".bin" / "vsce").exists(),
           f"editors/vscode dependencies not installed ({h.INSTALL_HINT})")


SCREENSHOT = os.environ.get("DIFFILL_VSCODE_SCREENSHOT")  # e.g. docs/vscode-ghost.png


def _node_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "PATH": f"{h.NODE_BIN}{os.pathsep}{env.get('PATH', '')}"}


@pytest.fixture(scope="module")
def vsix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Package the extension with vsce (its vscode:prepublish script compiles it first)."""
    _need_tools()
    out = tmp_path_factory.mktemp("vsix") / "diffill.vsix"
    bin_ = EXT_DIR / "node_modules" / ".bin"
    with h.isolated_env(out.parent / "env") as env:
        env = _node_env(env)
        h.run(
            [str(bin_ / "vsce"), "package", "--allow-missing-repository", "--out", str(out)],
            cwd=EXT_DIR, env=env, timeout=180,
        )
    return out


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"code-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"code-server did not answer {url} within {timeout} s")


def _run_code_server_and_driver(
    env: dict[str, str], vsix: Path, user_data: Path, ext_dir: Path, ws: Path, cfg: dict[str, object]
) -> subprocess.CompletedProcess[str]:
    """Install the .vsix, start code-server on a free port, run the browser driver."""
    cs = [str(h.CODE_SERVER), "--user-data-dir", str(user_data), "--extensions-dir", str(ext_dir)]
    h.run([*cs, "--install-extension", str(vsix)], env=env, timeout=120)
    port = h.free_port()
    log_path = user_data.parent / "code-server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [*cs, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}", "--disable-telemetry",
             "--disable-update-check", "--disable-workspace-trust", str(ws)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        try:
            _wait_http(f"http://127.0.0.1:{port}/healthz", server, 60)
            driver_cfg = user_data.parent / "driver.json"
            driver_cfg.write_text(json.dumps({**cfg, "url": f"http://127.0.0.1:{port}/?folder={ws}"}))
            return subprocess.run(
                [str(NODE), str(h.DRIVERS / str(cfg.get("driver", "vscode_driver.js"))), str(driver_cfg)],
                capture_output=True, text=True, timeout=240,
                env={**env, "NODE_PATH": str(h.DRIVER_MODULES)},
            )
        finally:
            _stop_group(server)


# The workbench quiet (no start page, trust prompt, updates, tips, chat, second side bar).
QUIET_WORKBENCH = {
    "workbench.startupEditor": "none",
    "security.workspace.trust.enabled": False,
    "extensions.autoUpdate": False,
    "extensions.autoCheckUpdates": False,
    "telemetry.telemetryLevel": "off",
    "chat.disableAIFeatures": True,
    "workbench.tips.enabled": False,
    "workbench.secondarySideBar.defaultVisibility": "hidden",
}


def run_vscode(vsix: Path, scripted_model_dir: Path, tmp: Path, ws: Path, editor: dict[str, object],
               cfg: dict[str, object]) -> dict[str, Any]:
    """One driver run on code-server with the extension serving the checkpoint on the CPU:
    user settings ``QUIET_WORKBENCH`` and ``editor``, the extension's trace and the driver's
    result in ``tmp``; the result, which must say ``ok``."""
    user_data = tmp / "user-data"
    (user_data / "User").mkdir(parents=True)
    settings = {
        **QUIET_WORKBENCH,
        **editor,
        "diffill.serverCommand": h.serve_cmd(tmp),
        "diffill.modelPath": h.model_path(scripted_model_dir),
        "diffill.device": "cpu",
    }
    (user_data / "User" / "settings.json").write_text(json.dumps(settings, indent=1))
    trace = tmp / "trace.jsonl"
    result = tmp / "result.json"
    with h.isolated_env(tmp, DIFFILL_VSCODE_TRACE=str(trace)) as env:
        p = _run_code_server_and_driver(_node_env(env), vsix, user_data, tmp / "extensions", ws, {
            **cfg, "chromium": CHROMIUM, "trace": str(trace), "result": str(result), "timeoutMs": 150_000,
        })
    assert result.exists(), f"driver wrote no result (rc={p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    r: dict[str, Any] = json.loads(result.read_text())
    assert r["ok"], f"{r.get('error')}\n{p.stdout[-2000:]}\n{h.tail(tmp / 'server.log')}"
    return r


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop code-server and the processes it started (its own session): extension hosts
    and the language server must be gone before the private TMPDIR is removed."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_vscode_ghost_text_accepted_with_tab(vsix: Path, scripted_model_dir: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    text = h.SAMPLE
    (ws / "demo.py").write_text(text)
    row, col = h.position_of(text, h.GHOST_SPOT)
    typed_text = h.GHOST_TYPED
    r = run_vscode(vsix, scripted_model_dir, tmp_path, ws, {
        "editor.inlineSuggest.enabled": True,
        # Only the inline path: no suggest widget competing for Tab.
        "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
        "editor.suggestOnTriggerCharacters": False,
    }, {
        "fileName": "demo.py",
        "original": text,
        "spot": {"line": row, "col": col, "typeText": typed_text},
        "screenshot": str(Path(SCREENSHOT).resolve() if SCREENSHOT else tmp_path / "ghost.png"),
    })

    # The inline item VS Code showed (as received through vscode-languageclient).
    shown = r["shownItem"]
    assert shown and shown["items"], r
    item = shown["items"][0]
    insert = item["insertText"]
    h.expect(insert, h.GHOST)
    assert insert.strip(), insert  # VS Code shows no whitespace-only ghost text
    typed = text.split("\n")[row]
    typed = typed[:col] + typed_text + typed[col:]
    assert r["textBeforeAccept"].split("\n")[row] == typed
    assert shown["position"] == [row, col + len(typed_text)]

    # Ghost text in the DOM is that item: its pieces (inline spans for the first line, a view
    # zone for further lines) read in order are the item's text, up to layout whitespace.
    def squash(s: str) -> str:
        return re.sub(r"\s+", "", s)

    assert "".join(r["ghostDom"]).strip(), r["ghostDom"]
    assert squash("".join(r["ghostDom"])) == squash(insert), (r["ghostDom"], insert)

    # Tab put exactly the item into the document.
    rng = {
        "start": {"line": item["range"][0], "character": item["range"][1]},
        "end": {"line": item["range"][2], "character": item["range"][3]},
    }
    assert r["textAfterAccept"] == h.apply_edit(r["textBeforeAccept"], rng, insert)
    h.expect(r["textAfterAccept"].split("\n")[row], h.GHOST_LINE)

    # The status bar item shows the server's latency once a completion ran.
    assert any(re.search(r"diffill \d+ ms", s) for s in r["statusBar"]), r["statusBar"]

    # "diffill: Toggle" turned the server's `enabled` option off through didChangeConfiguration.
    assert r["serverEnabledAfterToggle"] is False
    assert "diffill off" in r["statusBarAfterToggle"]
