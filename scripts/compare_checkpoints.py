"""Held-out loss of several checkpoints on the SAME batches (fixed windows, canvases and masks).

    python scripts/compare_checkpoints.py --data DATA/tokens --tokenizer DATA/tokenizer/tokenizer.json \\
        model/default_model runs/v3/final

Prints, per checkpoint and per FIM hole-size prior (``p_tight_hole`` 0 and 0.5), the mean
per-row diffusion loss (the training ELBO, see ``diffill.training.data``) of plain windows, of
FIM canvases and of both. Each model is read with its own head (shifted or not).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from diffill.model import load_model
from diffill.training.data import FIM, PLAIN, DataConfig, TokenSource, heldout_batches
from diffill.training.train import diffusion_loss
from tokenizers import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--data", required=True, help="token folder (heldout.bin / heldout.idx.npy)")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(args.tokenizer)
    val = TokenSource.from_files(args.data, "heldout")
    sets = {p: heldout_batches(val, tok, DataConfig(fim_ratio=0.5, p_tight_hole=p), args.rows,
                               args.batches, seed=args.seed) for p in (0.0, 0.5)}
    for path in args.checkpoints:
        model = load_model(path).model
        for p, batches in sets.items():
            rows: dict[int, list[float]] = {PLAIN: [], FIM: []}
            with torch.no_grad():
                for b in batches:
                    _, aux = diffusion_loss(model, b.torch(), False)
                    for r, k in zip(aux["rows"].tolist(), b.kind, strict=True):
                        rows[int(k)].append(r)
            print(f"{path}  p_tight_hole={p}:  plain {np.mean(rows[PLAIN]):.3f} ({len(rows[PLAIN])} rows)"
                  f"  fim {np.mean(rows[FIM]):.3f} ({len(rows[FIM])})"
                  f"  all {np.mean(rows[PLAIN] + rows[FIM]):.3f}", flush=True)


if __name__ == "__main__":
    main()
