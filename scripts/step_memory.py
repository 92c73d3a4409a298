"""Memory of one CPU step at the step plan's largest point, in-process (issue 25).

    python scripts/step_memory.py DIR [--ctx 1024] [--hole 32] [--rows 3] [--threads 1]
    LD_PRELOAD=/tmp/libmalloc_peak.so python scripts/step_memory.py DIR   # + bytes in use

Loads the checkpoint as ``diffill serve`` does (one malloc arena, int8 weights on a CPU),
then on a worker thread, as the server's plan runs it: the smallest step (1 row), and one
step of ``--rows`` rows with a ``--ctx``-token context and a ``--hole``-slot hole, one
context per request (``measure_bucket``). Prints one JSON line per point: resident
``VmRSS`` / ``VmHWM`` (MiB) and, with ``scripts/malloc_peak.c`` preloaded, the bytes in use
through malloc and their peak during that step (MiB): the step's own need, against what the
heap keeps besides."""

from __future__ import annotations

import argparse
import ctypes
import json
import threading
from pathlib import Path


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) // 1024
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--hole", type=int, default=32)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from diffill.lsp_server.commands import one_malloc_arena

    one_malloc_arena()
    import torch
    from diffill.model import load_model
    from diffill.model.measure import measure_bucket

    torch.set_num_threads(args.threads)
    lib = ctypes.CDLL(None)
    shim = hasattr(lib, "malloc_peak_max")
    if shim:
        lib.malloc_peak_now.restype = lib.malloc_peak_max.restype = ctypes.c_long

    def point(name: str, **extra: object) -> None:
        row: dict[str, object] = {"point": name, **_status(), **extra}
        if shim:
            row["in_use_mib"] = lib.malloc_peak_now() >> 20
            row["in_use_peak_mib"] = lib.malloc_peak_max() >> 20
        print(json.dumps(row), flush=True)

    lm = load_model(args.model)
    point("loaded", weights=lm.model.weights)

    def steps() -> None:
        with torch.inference_mode():
            measure_bucket(lm.model, lm.config, 64, 8, rows=1, shared=True, repeats=1, warmup=0,
                           overhead=False)
            point("smallest step")
            if shim:
                lib.malloc_peak_reset()
            t = measure_bucket(lm.model, lm.config, args.ctx, args.hole, rows=args.rows,
                               shared=True, repeats=1, warmup=0, overhead=False)
            point(f"{args.ctx} x {args.hole} x {args.rows} step", step_ms=round(t.full_ms))

    worker = threading.Thread(target=steps)
    worker.start()
    worker.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
