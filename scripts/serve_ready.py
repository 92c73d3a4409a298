"""How soon ``diffill serve --model DIR`` is ready, and its peak memory (issue 25).

    python scripts/serve_ready.py DIR [--wait-plan] [--session during-plan|after-plan] [--stderr FILE]

Starts the server on pipes (the raw LSP client of ``tests/e2e/_lsp_raw.py``), sends
``initialize``, polls ``diffill/status`` every 50 ms until it says ``loaded``, then opens a
small Python file and asks for one inline completion. Prints one JSON line: seconds from the
start to the ``initialize`` answer, to ``loaded`` (and the server's CPU seconds then, all its
threads), the first completion's latency, the load average, and the server's ``VmHWM`` /
``VmRSS`` after the completion (MB). ``--wait-plan``: then waits for the step plan measured in
the background (its log line) and prints the memory again. ``--session after-plan`` (or
``during-plan``: before the plan is waited for, while it runs): the side-by-side bench's
editing session (``diffill bench --vs-llamacpp``: the first 72 lines of ``shlex.py``, a
statement emptied, ~640 context tokens): a cold inline completion at the hole, then one after
each of the statement's first 5 characters typed; prints the latencies (ms) and the memory
again. The environment is passed on as it is (``XDG_CACHE_HOME`` / ``DIFFILL_INT8_CACHE``
choose the int8 weights cache).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from _lsp_raw import RawClient, end_position  # noqa: E402

TEXT = ("import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n"
        "        return [l.rstrip() for l in f]\n\n\ndef count_words(path):\n"
        "    total = 0\n    for line in read_lines(path):\n        ")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_mb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS", "RssAnon", "RssFile")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) // 1024
    return out


def _session(c: RawClient, typed: int = 5) -> dict[str, object]:
    """The side-by-side bench's editing session on ``c`` (module doc): latencies and memory."""
    from diffill.evaluation.keystroke import shlex_case

    case = shlex_case()
    uri = "file:///tmp/diffill-serve-session.py"
    c.open(uri, case.prefix + case.suffix)
    line, col = case.cursor

    def ask(character: int) -> float:
        t = time.monotonic()
        c.wait_for(c.inline_async(uri, line, character), timeout=600)
        return round((time.monotonic() - t) * 1e3)

    cold = ask(col)
    keys = []
    for i, ch in enumerate(case.middle[:typed]):
        at = {"line": line, "character": col + i}
        c.change(uri, i + 2, [{"range": {"start": at, "end": at}, "text": ch}])
        keys.append(ask(col + i + 1))
    return {"session_cold_ms": cold, "session_keystrokes_ms": keys, **_memory_mb(c.pid)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--wait-plan", action="store_true")
    ap.add_argument("--session", choices=("during-plan", "after-plan"), default=None)
    ap.add_argument("--stderr", type=Path, default=None)
    args = ap.parse_args()
    err = args.stderr or Path(tempfile.mkstemp(prefix="diffill-serve-", suffix=".log")[1])
    t0 = time.monotonic()
    c = RawClient([sys.executable, "-m", "diffill.cli", "serve", "--model", args.model],
                  env=dict(os.environ), stderr_path=err)
    try:
        c.initialize()
        t_init = time.monotonic() - t0
        while True:
            st = c.request("diffill/status")["result"]
            if st["loaded"] or st["error"]:
                break
            time.sleep(0.05)
        t_loaded, cpu = time.monotonic() - t0, _cpu_s(c.pid)
        if st["error"]:
            print(json.dumps({"error": st["error"]}))
            return 1
        uri = "file:///tmp/diffill-serve-ready.py"
        c.open(uri, TEXT)
        t1 = time.monotonic()
        c.wait_for(c.inline_async(uri, *end_position(TEXT)), timeout=600)
        res = {"initialize_s": round(t_init, 2), "loaded_s": round(t_loaded, 2),
               "cpu_at_loaded_s": round(cpu, 2), "first_completion_s": round(time.monotonic() - t1, 2),
               "loadavg": round(os.getloadavg()[0], 2), **_memory_mb(c.pid)}
        print(json.dumps(res), flush=True)
        if args.session == "during-plan":
            print(json.dumps(_session(c)), flush=True)
        if args.wait_plan:
            while "step plan measured in the background in" not in err.read_text() and \
                    "background step plan failed" not in err.read_text():
                time.sleep(1)
            print(json.dumps({"plan_at_s": round(time.monotonic() - t0, 1), **_memory_mb(c.pid)}))
        if args.session == "after-plan":
            print(json.dumps(_session(c)), flush=True)
    finally:
        c.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
