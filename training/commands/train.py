"""``diffill train``: train diffill's own masked-diffusion model.

Thin wrapper over :mod:`diffill.training.train` (same flags as
``python -m diffill.training.train``). The default model's recipe, two phases
(a causal warm start, then masked diffusion from it with the shifted head)::

    diffill train --data data/tokens --out runs/ar --objective ar --shift-logits \\
        --fim-ratio 0 --d-model 192 --layers 6 --heads 4 --kv-heads 2 --ffn 512 \\
        --batch-tokens 4096 --lr 3e-3 --min-lr-ratio 0.3 --warmup 50 --max-time-min 35
    diffill train --data data/tokens --out runs/mdm --init-from runs/ar/latest \\
        --shift-logits --fim-ratio 0.7 --d-model 192 --layers 6 --heads 4 --kv-heads 2 \\
        --ffn 512 --batch-tokens 4096 --lr 2e-3 --warmup 100 --max-time-min 72

then further diffusion runs ``--init-from`` the previous model (the shipped one's last run
added ``--fim-ratio 0.8 --p-copy-line 0.4``; commands and figures in BENCHMARKS.md).

``diffill train --micro OUT`` builds the tiny test model (its own BPE, a few
hundred steps) used by the test-suite and the editor end-to-end checks.

Tip for a CPU shared with other work: start it with ``OMP_WAIT_POLICY=PASSIVE``
(busy-waiting OpenMP threads lose several times over when cores are contended).
"""

from __future__ import annotations

import argparse

from ..train import add_arguments, run_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        help="train diffill's own masked-diffusion model on a pre-tokenised corpus",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    return run_from_args(args)
