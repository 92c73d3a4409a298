"""How far the learning check's figures move between machines: retrain the micro model
under several settings and score it the way ``tests/unit/training/test_train_learning.py``
does.

    python tests/support/learning_spread.py OUT_DIR [--seeds 0,1] [--threads 1,2]

Each run trains in a subprocess with the given torch thread count and
``ATEN_CPU_CAPABILITY`` (``default`` / ``avx2`` / ``avx512``: which vectorised ATen kernels
run, i.e. the floating point of another x86-64 CPU), then prints one JSON line:
``{"seed", "threads", "capability", "exact", "empty", "seconds"}`` with ``exact`` the
number of the 10 masked lines restored exactly and ``empty`` the number of the 10 empty
holes filled with nothing (the two learning tests' counts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent


def score(folder: Path, corpus: str) -> dict[str, int]:
    sys.path.insert(0, str(TESTS / "unit" / "training"))
    from diffill.model import load_model
    from test_train_learning import empty_hole_count, exact_line_count

    lm = load_model(folder)
    return {"exact": exact_line_count(lm, corpus), "empty": empty_hole_count(lm, corpus)}


def one(out: Path, seed: int, threads: int) -> None:
    import torch
    from diffill.training.train import train_micro_model

    torch.set_num_threads(threads)
    corpus = (TESTS / "fixtures" / "micro_corpus.py").read_text()
    t0 = time.perf_counter()
    ckpt = train_micro_model(out, corpus, seed=seed, threads=threads)
    took = time.perf_counter() - t0
    print(json.dumps({"seed": seed, "threads": threads,
                      "capability": torch.backends.cpu.get_cpu_capability(),
                      **score(ckpt, corpus), "seconds": round(took, 1)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seeds", default="0")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--capabilities", default="default,avx2,native")
    p.add_argument("--one", nargs=2, type=int, metavar=("SEED", "THREADS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        return one(Path(a.out), *a.one)
    for cap in a.capabilities.split(","):
        for seed in (int(s) for s in a.seeds.split(",")):
            for threads in (int(t) for t in a.threads.split(",")):
                env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
                if cap != "native":
                    env["ATEN_CPU_CAPABILITY"] = cap
                env["OMP_NUM_THREADS"] = str(threads)
                run = Path(a.out) / f"{cap}-s{seed}-t{threads}"
                subprocess.run([sys.executable, __file__, str(run), "--one", str(seed), str(threads)],
                               env=env, check=True)


if __name__ == "__main__":
    main()
