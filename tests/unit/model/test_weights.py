"""The per-family weight-name mapping (model/weights.py)."""

from __future__ import annotations

import pytest
import torch
from diffill.model.transformer import Transformer
from diffill.model.weights import SKIP, map_name, to_checkpoint_names
from support import tiny_config


def test_map_name_hf():
    for fam in ("qwen2", "qwen3", "llama"):
        assert map_name(fam, "model.embed_tokens.weight", tied=False) == "embed_tokens.weight"
        assert map_name(fam, "model.norm.weight", tied=False) == "norm.weight"
        assert (
            map_name(fam, "model.layers.3.self_attn.q_proj.bias", tied=False)
            == "layers.3.self_attn.q_proj.bias"
        )
        assert (
            map_name(fam, "model.layers.0.self_attn.k_norm.weight", tied=True)
            == "layers.0.self_attn.k_norm.weight"
        )
        assert map_name(fam, "lm_head.weight", tied=False) == "lm_head.weight"
        assert map_name(fam, "lm_head.weight", tied=True) == SKIP
        assert map_name(fam, "model.layers.0.self_attn.rotary_emb.inv_freq", tied=False) == SKIP
        assert map_name(fam, "transformer.h.0.attn.c_attn.weight", tied=False) is None


def test_map_name_llada():
    m = {
        "model.transformer.wte.weight": "embed_tokens.weight",
        "model.transformer.ln_f.weight": "norm.weight",
        "model.transformer.ff_out.weight": "lm_head.weight",
        "model.transformer.blocks.2.q_proj.weight": "layers.2.self_attn.q_proj.weight",
        "model.transformer.blocks.2.k_proj.bias": "layers.2.self_attn.k_proj.bias",
        "model.transformer.blocks.2.attn_out.weight": "layers.2.self_attn.o_proj.weight",
        "model.transformer.blocks.2.ff_proj.weight": "layers.2.mlp.gate_proj.weight",
        "model.transformer.blocks.2.up_proj.weight": "layers.2.mlp.up_proj.weight",
        "model.transformer.blocks.2.ff_out.weight": "layers.2.mlp.down_proj.weight",
        "model.transformer.blocks.2.attn_norm.weight": "layers.2.input_layernorm.weight",
        "model.transformer.blocks.2.ff_norm.weight": "layers.2.post_attention_layernorm.weight",
    }
    for src, dst in m.items():
        assert map_name("llada", src, tied=False) == dst, src
    assert map_name("llada", "model.transformer.ff_out.weight", tied=True) == SKIP
    assert map_name("llada", "model.transformer.blocks.0.att_proj.weight", tied=False) is None


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "llada", "diffill"])
@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_names_roundtrip(family, tied):
    cfg = tiny_config(
        family=family, tie_embeddings=tied, qkv_bias=True, qk_norm=family in ("qwen3", "diffill")
    )
    with torch.device("meta"):
        names = list(Transformer(cfg).state_dict())
    ckpt_names = to_checkpoint_names(family, names, tied=tied)
    assert len(set(ckpt_names.values())) == len(names)
    for ours, theirs in ckpt_names.items():
        assert map_name(family, theirs, tied=tied) == ours
