"""Syntax guard cost per completion request: statement-local check vs the whole-buffer rule.

Simulates a user working through the functions of a few standard-library modules: for
every line of a function body, an empty line is opened above it (the cursor at its
indentation) and three candidate lines (drawn from the same file, deterministic) are
judged, as the Completer does for one request. Both rules see the same requests in the
same process, interleaved, and must agree; prints ms per request and the ratio.

    python scripts/bench_syntax_guard.py [--modules argparse,typing,...]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import random
import statistics
import time

from diffill.lsp_server.text.syntax import SyntaxGuard


def requests(src: str, rng: random.Random, max_functions: int):
    lines = src.splitlines(keepends=True)
    tree = ast.parse(src)
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    funcs = [f for f in funcs if f.end_lineno - f.lineno >= 6]
    rng.shuffle(funcs)
    pool = [ln.strip() for ln in lines if ln.strip()]
    for f in funcs[:max_functions]:
        for li in range(f.lineno, f.end_lineno):  # 0-based index of the body lines
            line = lines[li]
            indent = line[: len(line) - len(line.lstrip(" "))]
            text = "".join(lines[:li]) + indent + "\n" + "".join(lines[li:])
            off = sum(len(x) for x in lines[:li]) + len(indent)
            cands = [rng.choice(pool) for _ in range(3)]
            yield text, off, cands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", default="argparse,typing,dataclasses,textwrap,json.decoder")
    ap.add_argument("--functions", type=int, default=6, help="functions per module")
    args = ap.parse_args()
    print(f"{'module':<14} {'KB':>6} {'requests':>8} {'whole ms':>9} {'local ms':>9} {'ratio':>6}")
    for name in args.modules.split(","):
        src = inspect.getsource(importlib.import_module(name))
        fast, whole = [], []
        for text, off, cands in requests(src, random.Random(name), args.functions):
            g1 = SyntaxGuard(text, off, language="python")
            g2 = SyntaxGuard(text, off, language="python")
            t0 = time.perf_counter()
            a = [g1.keeps(c) for c in cands]
            t1 = time.perf_counter()
            b = [g2.keeps_whole(c) for c in cands]
            t2 = time.perf_counter()
            if a != b:
                raise SystemExit(f"{name}: the rules disagree at offset {off}: {a} vs {b} for {cands}")
            fast.append((t1 - t0) * 1000)
            whole.append((t2 - t1) * 1000)
        fm, wm = statistics.median(fast), statistics.median(whole)
        print(f"{name:<14} {len(src) / 1000:6.0f} {len(fast):8d} {wm:9.2f} {fm:9.2f} {wm / fm:6.1f}x")


if __name__ == "__main__":
    main()
