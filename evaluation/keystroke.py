"""The next keystroke through ``diffill serve``, end to end: what a user waits for while typing.

:func:`bench_keystrokes` starts ``diffill serve`` on stdio (the model given, its defaults),
opens a document, asks for a completion at a cursor (the cold request), then types the
given characters one at a time (``textDocument/didChange``, an incremental edit at the
cursor) and asks for a completion after each -- as an editor asks on every keystroke.
Per request: the wall time from request to answer, and the server's own counters after the
run (``diffill/status``: how many requests reused their document's context,
:mod:`diffill.model.reuse`). ``env`` passes e.g. ``DIFFILL_REUSE=off`` for the exact path,
so the two run side by side (:func:`compare_reuse`).

Typed characters that continue a shown suggestion (or a verified draft of the document's
own lines) are answered from the server's typed-ahead cache without the model, in a few ms;
each keystroke is marked by whether it reached the model (``diffill/status``
``model_requests`` before and after), and ``model_keystroke_p50_ms`` is taken over those.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .lsp_client import StdioClient

COLD, KEY = "cold_ms", "keystroke_ms"
HOLE_STATEMENT = "self.pushback = deque()"
FILE_LINES = 72


@dataclasses.dataclass(frozen=True)
class Case:
    prefix: str
    middle: str
    suffix: str
    line: int  # 1-based line number of the hole

    @property
    def cursor(self) -> tuple[int, int]:
        """The hole's (0-based line, character): the end of the prefix."""
        return self.prefix.count("\n"), len(self.prefix) - self.prefix.rfind("\n") - 1

    def typed(self, k: int) -> Case:
        """The same hole after the user typed the middle's first ``k`` characters."""
        return Case(self.prefix + self.middle[:k], self.middle[k:], self.suffix, self.line)


def shlex_case(text: str | None = None, lines: int = FILE_LINES,
               statement: str = HOLE_STATEMENT) -> Case:
    """The benchmark's file: the first ``lines`` lines of ``text`` (default: this Python's
    ``shlex.py``) with the line holding ``statement`` emptied after its indentation."""
    if text is None:
        text = Path(shlex.__file__).read_text(encoding="utf-8")
    kept = text.splitlines(keepends=True)[:lines]
    for i, line in enumerate(kept):
        if line.strip() == statement:
            indent = line[: len(line) - len(line.lstrip())]
            return Case("".join(kept[:i]) + indent, statement,
                        line[len(indent) + len(statement):] + "".join(kept[i + 1:]), i + 1)
    raise ValueError(f"no line {statement!r} in the first {lines} lines")


def bench_keystrokes(model: str, text: str, row: int, col: int, typed: str, *,
                     env: dict[str, str] | None = None, device: str = "cpu",
                     threads: int | None = None, load_timeout: float = 900.0,
                     log=print) -> dict[str, Any]:
    """One server, one document: a completion at (row, col), then one after each character
    of ``typed`` is inserted at the cursor. Returns the times (ms), the server's ready time
    (start to ``diffill/status`` loaded) and its counters."""

    argv = [sys.executable, "-m", "diffill.cli", "serve", "--model", model, "--device", device,
            *(["--threads", str(threads)] if threads else [])]
    t_start = time.monotonic()
    client = StdioClient(argv, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        client.initialize()
        client.wait_loaded(load_timeout)
        ready_s = time.monotonic() - t_start
        uri = "file:///bench/keystrokes.py"
        client.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": text}})

        def ask(c: int) -> float:
            t = time.perf_counter()
            client.request("textDocument/completion", {"textDocument": {"uri": uri},
                                                       "position": {"line": row, "character": c}},
                           timeout=load_timeout)
            return (time.perf_counter() - t) * 1e3

        def model_requests() -> int:
            return int((client.request("diffill/status", None) or {}).get("model_requests") or 0)

        cold = ask(col)
        keys: list[float] = []
        by_model: list[bool] = []  # whether the keystroke reached the model (not the cache)
        for i, ch in enumerate(typed):
            at = {"line": row, "character": col + i}
            client.notify("textDocument/didChange", {
                "textDocument": {"uri": uri, "version": i + 2},
                "contentChanges": [{"range": {"start": at, "end": at}, "text": ch}]})
            before = model_requests()
            keys.append(ask(col + i + 1))
            by_model.append(model_requests() > before)
        status = client.request("diffill/status", None) or {}
    finally:
        client.close()
    log(f"ready {ready_s:.1f} s, cold {cold:.0f} ms, keystrokes "
        + " ".join(f"{k:.0f}" for k in keys) + " ms")
    model_keys = [k for k, m in zip(keys, by_model, strict=True) if m]
    return {"ready_s": round(ready_s, 2), COLD: round(cold, 1), KEY: [round(k, 1) for k in keys],
            "keystroke_by_model": by_model,
            "keystroke_p50_ms": round(statistics.median(keys), 1) if keys else None,
            "model_keystroke_p50_ms": round(statistics.median(model_keys), 1) if model_keys else None,
            "model_requests": status.get("model_requests"),
            "context_reused": status.get("context_reused"),
            "context_computed": status.get("context_computed")}


def compare_reuse(model: str, text: str, row: int, col: int, typed: str, *, repeats: int = 1,
                  log=print) -> dict[str, Any]:
    """:func:`bench_keystrokes` with the context kept across requests (the default) and
    without (``DIFFILL_REUSE=off``), interleaved ``repeats`` times; p50 of each and the ratio."""
    runs: dict[str, list[dict[str, Any]]] = {"reuse": [], "exact": []}
    for _ in range(repeats):
        for name, env in (("exact", {"DIFFILL_REUSE": "off"}), ("reuse", {})):
            log(f"-- {name}")
            runs[name].append(bench_keystrokes(model, text, row, col, typed, env=env, log=log))
    out: dict[str, Any] = {"runs": runs}
    for name, rs in runs.items():
        model_keys = [k for r in rs for k, m in zip(r[KEY], r["keystroke_by_model"], strict=True) if m]
        out[name] = {"cold_p50_ms": statistics.median(r[COLD] for r in rs),
                     "keystroke_p50_ms": statistics.median(k for r in rs for k in r[KEY]),
                     "model_keystrokes": len(model_keys),
                     "model_keystroke_p50_ms": statistics.median(model_keys) if model_keys else None,
                     "ready_p50_s": statistics.median(r["ready_s"] for r in rs)}
    a, b = out["exact"]["model_keystroke_p50_ms"], out["reuse"]["model_keystroke_p50_ms"]
    out["model_keystroke_ratio"] = round(a / b, 2) if a and b else None
    return out


def main() -> None:
    """``python -m diffill.evaluation.keystroke MODEL``: the standard library's ``shlex.py``
    (its first 72 lines), the statement ``self.pushback = deque()`` emptied, the cursor
    after its indentation, its first 5 characters typed; exact vs reused, side by side."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    case = shlex_case()
    res = compare_reuse(args.model, case.prefix + case.suffix, *case.cursor, case.middle[:5],
                        repeats=args.repeats)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
