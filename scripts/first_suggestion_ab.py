"""Time to the first suggestion, side by side: an older revision of diffill against this
working tree, in one run, interleaved (a busy spell of the machine hits both alike).

    python scripts/first_suggestion_ab.py --before ad97452 --runs 5 [--json out.json]

The older revision is unpacked from git (``git archive``) into a temporary folder laid out
as the ``diffill`` package its pyproject.toml describes, and its processes run with that
folder first on ``PYTHONPATH`` (same interpreter and packages). Each run starts one fresh
``diffill complete --json`` and one fresh ``diffill serve`` per side (see
``diffill bench --first``); medians. Phases an older ``diffill complete`` does not report
are shown as ``-``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import tomllib
from diffill.evaluation.commands.bench import first_complete, first_document, first_serve

ROOT = Path(__file__).resolve().parent.parent
COMPLETE_KEYS = ("wall_s", "import_s", "load_s", "warmup_ms", "complete_ms", "startup_exit_s", "steps")
SERVE_KEYS = ("initialize_s", "loaded_s", "first_answer_ms", "first_suggestion_s")


def unpack(rev: str, dest: Path) -> Path:
    """``rev`` of this repository as an importable ``diffill`` package under ``dest``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                          capture_output=True).stdout
    src = dest / "src"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(src, filter="data")
    cfg = tomllib.loads((src / "pyproject.toml").read_text())
    dirs = cfg["tool"]["setuptools"]["package-dir"]
    pkg_root = dest / "pkg"
    for name, folder in sorted(dirs.items()):  # parents before children
        target = pkg_root.joinpath(*name.split("."))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(src / folder, target_is_directory=True)
    return pkg_root


def median(xs: list[Any]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git revision to compare against")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default=str(ROOT / "model" / "default_model"))
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    text, targets = first_document()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        k: {"complete": [], "serve": []} for k in ("before", "after")}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="diffill-ab-") as tmp:
        envs = {"before": dict(os.environ, PYTHONPATH=str(unpack(args.before, Path(tmp)))),
                "after": dict(os.environ)}
        src = Path(tmp) / "first.py"
        src.write_text(text)
        for i in range(args.runs):
            for side, env in envs.items():
                c = first_complete(args.model, src, *targets[0], env=env)
                s = first_serve(args.model, targets, text, env=env)
                runs[side]["complete"].append(c)
                runs[side]["serve"].append(s)
                print(f"{side} #{i + 1}: complete {c['wall_s']:.2f} s (load {c['load_s']:.3f} s, "
                      f"completion {c['complete_ms']:.0f} ms); serve loaded {s['loaded_s']:.2f} s, "
                      f"first suggestion {s['first_suggestion_s']} s", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"before": args.before, "runs": args.runs,
                           "load_average": [list(load_before), list(os.getloadavg())]}
    for side in ("before", "after"):
        c, s = runs[side]["complete"], runs[side]["serve"]
        out[side] = {
            "complete": {k: median([r.get(k) for r in c]) for k in COMPLETE_KEYS}
            | {"suggested": sum(r["suggested"] for r in c)},
            "serve": {k: median([r.get(k) for r in s]) for k in SERVE_KEYS}
            | {"suggested": sum(r["first_suggestion_s"] is not None for r in s)},
        }
    print(f"medians of {args.runs} runs, load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'':28} {'before':>9} {'after':>9} {'ratio':>7}")
    for part, keys in (("complete", COMPLETE_KEYS), ("serve", SERVE_KEYS)):
        for k in keys:
            b, a = out["before"][part][k], out["after"][part][k]
            ratio = f"{b / a:.1f}x" if b and a else "-"
            fb = "-" if b is None else f"{b:g}"
            fa = "-" if a is None else f"{a:g}"
            print(f"{part + ' ' + k:28} {fb:>9} {fa:>9} {ratio:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps({**out, "all": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
