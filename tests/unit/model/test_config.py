"""config.json dialects -> ModelConfig, and the errors for configs we cannot run."""

from __future__ import annotations

import json

import msgspec
import pytest
from diffill.model.config import ConfigError, DiffillDialect, parse_config, read_config
from support import tiny_config

QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "torch_dtype": "bfloat16",
    "rope_scaling": None,
    "use_sliding_window": False,
}

LLADA = {
    "architectures": ["LLaDAModelLM"],
    "model_type": "llada",
    "activation_type": "silu",
    "block_type": "llama",
    "layer_norm_type": "rms",
    "d_model": 4096,
    "n_heads": 32,
    "n_kv_heads": 32,
    "n_layers": 32,
    "mlp_hidden_size": 12288,
    "mlp_ratio": 4,
    "vocab_size": 126464,
    "embedding_size": 126464,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "weight_tying": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "rope": True,
    "alibi": False,
    "scale_logits": False,
    "input_emb_norm": False,
    "attention_layer_norm": False,
    "block_group_size": 1,
    "max_sequence_length": 4096,
}


def test_qwen2_transformers4_style():
    cfg, _ = parse_config(QWEN2)
    assert cfg.family == "qwen2" and cfg.shift_logits and cfg.qkv_bias and not cfg.qk_norm
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (14, 2, 64)
    assert cfg.rope_theta == 1e6 and cfg.tie_embeddings
    assert cfg.torch_dtype == "bfloat16" and cfg.eos_token_id == 151643
    assert cfg.mask_token_id is None  # resolved from the tokenizer later


def test_transformers5_rope_parameters_and_dtype():
    raw = {k: v for k, v in QWEN2.items() if k not in ("rope_theta", "torch_dtype", "rope_scaling")}
    raw["rope_parameters"] = {"rope_theta": 12345.0, "rope_type": "default"}
    raw["dtype"] = "float16"
    cfg, _ = parse_config(raw)
    assert cfg.rope_theta == 12345.0
    assert cfg.torch_dtype == "float16"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.rope_type"),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            "rope_parameters.rope_type",
        ),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"hidden_size": "big"}, "hidden_size"),
    ],
)
def test_hf_unsupported_or_bad(changes, field):
    with pytest.raises(ConfigError) as ei:
        parse_config({**QWEN2, **changes}, "ckpt/config.json")
    msg = str(ei.value)
    assert msg.startswith("ckpt/config.json: ") and field in msg


def test_qwen3_and_llama_and_dream():
    q3, _ = parse_config(
        {**QWEN2, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 128}
    )
    assert q3.family == "qwen3" and q3.qk_norm and not q3.qkv_bias and q3.head_dim == 128
    ll, _ = parse_config(
        {
            **QWEN2,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": True,
        }
    )
    assert ll.family == "llama" and ll.qkv_bias and not ll.qk_norm
    dream, _ = parse_config(
        {**QWEN2, "model_type": "Dream", "architectures": ["DreamModel"], "mask_token_id": 151666}
    )
    assert dream.family == "qwen2" and dream.mask_token_id == 151666 and dream.shift_logits
    # no model_type: the architecture name decides
    arch, _ = parse_config(
        {k: v for k, v in QWEN2.items() if k != "model_type"}
        | {"architectures": ["Qwen3ForCausalLM"]}
    )
    assert arch.family == "qwen3"


def test_llada_defaults_and_quirks():
    cfg, _ = parse_config(LLADA)
    assert cfg.family == "llada" and cfg.shift_logits is False
    assert cfg.mask_token_id == 126336  # LLaDA's mask id when config.json does not name one
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (126081, 126081, 126080)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.head_dim) == (
        4096,
        12288,
        32,
        128,
    )
    assert cfg.rope_theta == 500000.0 and not cfg.tie_embeddings and not cfg.qkv_bias
    small, _ = parse_config(
        {
            **LLADA,
            "mlp_hidden_size": None,
            "mlp_ratio": 2,
            "n_kv_heads": None,
            "multi_query_attention": True,
        }
    )
    assert small.intermediate_size == 8192 and small.num_kv_heads == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_type", "sequential"),
        ("activation_type", "swiglu"),
        ("layer_norm_type", "gemma_rms"),
        ("rope", False),
        ("alibi", True),
        ("scale_logits", True),
        ("input_emb_norm", True),
        ("attention_layer_norm", True),
        ("include_bias", True),
    ],
)
def test_llada_unsupported_switches(field, value):
    with pytest.raises(ConfigError, match=rf"^x/config\.json: field {field}="):
        parse_config({**LLADA, field: value}, "x/config.json")


def test_diffill_dialect_roundtrip(tmp_path):
    cfg = tiny_config(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=3, head_dim=16,
                      rope_theta=5000.0, max_position_embeddings=512)
    d = DiffillDialect.from_model_config(cfg, {"seed": 1})
    (tmp_path / "config.json").write_bytes(msgspec.json.encode(d))
    back, dialect = read_config(tmp_path)
    assert dialect.provenance == {"seed": 1}
    assert back.replace(architectures=[], torch_dtype=None) == cfg
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["typo_field"] = 1
    with pytest.raises(ConfigError, match="typo_field"):
        parse_config(raw)
    # the recommended decoding block travels with the weights and is checked
    assert back.decode_block is None and raw["decode_block"] is None
    del raw["typo_field"]
    assert parse_config({**raw, "decode_block": 4})[0].decode_block == 4
    with pytest.raises(ConfigError, match="config.json: field decode_block"):
        parse_config({**raw, "decode_block": 0})


def test_unknown_architecture_lists_supported():
    with pytest.raises(
        ConfigError, match=r"unknown architecture.*supported model_type values: .*llada"
    ):
        parse_config({"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
