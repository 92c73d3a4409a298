"""Tiny checkpoints laid out as each family publishes them (sizes shrunk, weights ours).

Each writer puts into a folder the files the family's hub repository has, with the
published ``config.json`` keys and special-token ids and the published tokenizer
layout: Dream / Dream-Coder / DiffuCoder / DreamOn ship the slow tokenizer
(``vocab.json`` + ``merges.txt`` + ``added_tokens.json`` + ``tokenizer_config.json`` +
``tokenization_dream.py``, no ``tokenizer.json``) and sharded safetensors; Open-dCoder
and CoDA ship ``tokenizer.json``; LLaDA its own vocabulary and key names. The Qwen
families use the real Qwen2 vocabulary (:mod:`_qwen_vocab`).

Weights: random, or *scripted* (:func:`script_weights`) so that the model's answer is
certain on any CPU: attention outputs are zero, and layer 0's MLP maps the embedding of
each scripted input token to the embedding of the tokens it should predict, so the
logits at a position depend on one token only (the one at ``p - 1`` for a shift model)
with margins of tens of nats.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffill.model.config import ModelConfig, read_config
from diffill.model.tokenizer import build_slow_bpe
from diffill.model.transformer import Transformer
from diffill.model.weights import to_checkpoint_names
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from support.qwen_vocab import write_qwen2_files

# Qwen2.5's added tokens, ids 151643.. (tokenizer_config.json added_tokens_decoder of the
# Qwen2.5 / Qwen2.5-Coder repositories); <tool_call> and </tool_call> are not special.
QWEN25_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
)
QWEN3_EXTRA = ("<tool_response>", "</tool_response>", "<think>", "</think>")
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
               "</think>"}

HIDDEN = 32
SHAPE = dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


@dataclass
class Written:
    folder: Path
    family: str
    added: dict[str, int] = field(default_factory=dict)


def _added(base: int, names: tuple[str, ...]) -> dict[str, int]:
    return {n: base + i for i, n in enumerate(names)}


def _tokenizer_config(added: dict[str, int], **named: str | None) -> dict:
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": t not in NOT_SPECIAL}
            for t, i in added.items()
        },
        **{k: v for k, v in named.items()},
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
    }


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False), encoding="utf-8")


def _qwen_tokenizer(folder: Path, added: dict[str, int], *, fast: bool, **named: str | None) -> bool:
    if not write_qwen2_files(folder):
        return False
    _write_json(folder / "tokenizer_config.json", _tokenizer_config(added, **named))
    if fast:  # the tokenizers-format file, as Qwen2.5-Coder / Qwen3 repositories publish it
        build_slow_bpe(folder).save(str(folder / "tokenizer.json"))
    else:
        _write_json(folder / "added_tokens.json", added)
        (folder / "tokenization_dream.py").write_text(
            "# the family's slow tokenizer class (remote code); diffill does not run it\n")
    return True


def _dream_config(vocab: int, **ids: int | None) -> dict:
    return {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "model_type": "Dream",
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": False,
        "use_sliding_window": False,
        "vocab_size": vocab,
        **SHAPE,
        **ids,
    }


# --------------------------------------------------------------------------- families

DREAM_TOKENS = QWEN25_ADDED + ("<|beginoftext|>", "<|mask|>")  # 151665, 151666


def _write_dream_layout(folder: Path, name: str, extra: tuple[str, ...], bos_id: int) -> Written | None:
    """A Dream-family checkpoint's files: the slow Qwen tokenizer with ``DREAM_TOKENS`` and
    ``extra`` added (from 151643), its bos / eos = pad / mask tokens, and a Dream config of
    152064 rows whose bos is ``bos_id`` (eos = pad = 151643, mask 151666)."""
    added = _added(151643, DREAM_TOKENS + extra)
    if not _qwen_tokenizer(folder, added, fast=False, bos_token="<|beginoftext|>",
                           eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                           mask_token="<|mask|>"):
        return None
    _write_json(folder / "config.json", _dream_config(
        152064, bos_token_id=bos_id, eos_token_id=151643, pad_token_id=151643,
        mask_token_id=151666))
    return Written(folder, name, added)


def write_dream_coder(folder: Path) -> Written | None:
    """Dream-org/Dream-Coder-v0-Instruct-7B's layout (config bos 151665, eos = pad = 151643)."""
    return _write_dream_layout(folder, "dream", (), bos_id=151665)


def write_diffucoder_instruct(folder: Path) -> Written | None:
    """apple/DiffuCoder-7B-Instruct's layout: config bos = eos = pad = 151643, mask 151666;
    the tokenizer carries <|dlm_pad|> (its id here, 151667, is the test's choice)."""
    return _write_dream_layout(folder, "diffucoder-instruct", ("<|dlm_pad|>",), bos_id=151643)


def write_dreamon(folder: Path) -> Written | None:
    """Dream-org/DreamOn-v0-7B: Dream-Coder plus <|expand|> and <|delete|> (ids here the
    test's choice; the recipe finds them by name)."""
    return _write_dream_layout(folder, "dreamon", ("<|expand|>", "<|delete|>"), bos_id=151665)


def write_open_dcoder(folder: Path) -> Written | None:
    """fredzzp/open-dcoder-0.5B: Qwen2.5-Coder-0.5B shape (tied head), tokenizer.json with
    the mask token <M> added."""
    added = _added(151643, QWEN25_ADDED + ("<M>",))
    if not _qwen_tokenizer(folder, added, fast=True, eos_token="<|endoftext|>",
                           pad_token="<|endoftext|>", mask_token="<M>", bos_token=None):
        return None
    _write_json(folder / "config.json", {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151643, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_sliding_window": False, "vocab_size": 151936, **SHAPE})
    return Written(folder, "open-dcoder", added)


def write_coda(folder: Path) -> Written | None:
    """Salesforce CoDA: Qwen3 shape with a separate lm_head; config.json has no bos/eos,
    mask 151669; tokenizer_config.json names <|im_end|> as eos and bos."""
    added = _added(151643, QWEN25_ADDED + QWEN3_EXTRA + ("<|mask|>",))
    if not _qwen_tokenizer(folder, added, fast=True, bos_token="<|im_end|>",
                           eos_token="<|im_end|>", pad_token="<|endoftext|>",
                           mask_token="<|mask|>"):
        return None
    _write_json(folder / "config.json", {
        "architectures": ["CoDALanguageModel"], "model_type": "CoDA", "hidden_act": "silu",
        "head_dim": 8, "mask_token_id": 151669, "pad_token_id": 151643, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 151936, **SHAPE})
    return Written(folder, "coda", added)


LLADA_SPECIAL = {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336,
                 "<|eot_id|>": 126348, "<|start_header_id|>": 126346,
                 "<|end_header_id|>": 126347}


def write_llada(folder: Path) -> Written:
    """GSAI-ML/LLaDA-8B-Instruct: own config keys, 126464 ids, tokenizer.json with
    <|startoftext|> 126080, <|endoftext|> 126081, mask 126336, <|eot_id|> 126348 (the other
    ids hold words of this test's own)."""
    folder.mkdir(parents=True, exist_ok=True)
    V = 126464
    by_id = {i: t for t, i in LLADA_SPECIAL.items()}
    vocab = {by_id.get(i, f"w{i}"): i for i in range(V)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(LLADA_SPECIAL))
    tok.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", {
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "mask_token": "<|mdm_mask|>"})
    _write_json(folder / "config.json", {
        "architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu",
        "block_type": "llama", "d_model": HIDDEN, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2,
        "mlp_hidden_size": 64, "embedding_size": V, "vocab_size": V, "include_bias": False,
        "include_qkv_bias": False, "layer_norm_type": "rms", "mask_token_id": 126336,
        "eos_token_id": 126081, "pad_token_id": 126081, "bos_token_id": 126080,
        "max_sequence_length": 512, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
        "weight_tying": False, "torch_dtype": "bfloat16", "alibi": False, "rope": True,
        "scale_logits": False, "input_emb_norm": False, "attention_layer_norm": False,
        "block_group_size": 1})
    return Written(folder, "llada", dict(LLADA_SPECIAL))


WRITERS = {
    "dream": write_dream_coder,
    "diffucoder-instruct": write_diffucoder_instruct,
    "dreamon": write_dreamon,
    "open-dcoder": write_open_dcoder,
    "coda": write_coda,
    "llada": write_llada,
}


# --------------------------------------------------------------------------- weights


def script_weights(model: Transformer, rules: dict[int, dict[int, float]], seed: int = 0) -> None:
    """Make ``model`` predict, after (shift) or at (no shift) a token ``a`` of ``rules``,
    the tokens ``rules[a]`` with strengths (``8``: certain, ``< 1``: weak; the input token
    itself keeps a logit of a few nats, so weak rules are for inputs that are never
    predicted, like the mask)."""
    D = model.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    tokens = sorted({a for a in rules} | {t for r in rules.values() for t in r})
    if len(tokens) > D:
        raise ValueError(f"{len(tokens)} scripted tokens do not fit hidden size {D}")
    basis = {t: k for k, t in enumerate(tokens)}
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        emb = model.embed_tokens.weight
        for t, k in basis.items():
            emb[t].zero_()
            emb[t, k] = 1.0
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        mlp = model.layers[0].mlp
        mlp.gate_proj.weight.zero_()
        mlp.up_proj.weight.zero_()
        g = 2.0
        act = math.sqrt(D) * g * (1 / (1 + math.exp(-math.sqrt(D) * g))) * math.sqrt(D)
        for u, (a, targets) in enumerate(rules.items()):
            mlp.gate_proj.weight[u, basis[a]] = g
            mlp.up_proj.weight[u, basis[a]] = 1.0
            for t, d in targets.items():
                mlp.down_proj.weight[basis[t], u] = d / act
        model.norm.weight.fill_(6.0)
        if model.lm_head is not None:
            model.lm_head.weight.copy_(emb)


def write_weights(w: Written, *, rules: dict[int, dict[int, float]] | None = None,
                  shards: int = 1, seed: int = 0) -> tuple[Transformer, ModelConfig]:
    """Random (or scripted) weights for the folder's config.json, saved in bf16 under the
    family's tensor names, in ``shards`` files with an index when > 1."""
    cfg, _ = read_config(w.folder)
    model = Transformer(cfg)
    if rules is None:
        model.init_weights(seed=seed)
    else:
        script_weights(model, rules, seed)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    names = to_checkpoint_names(cfg.family, list(state), tied=cfg.tie_embeddings)
    tensors = {names[k]: v for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    if shards == 1:
        save_file(tensors, str(w.folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        keys = sorted(tensors)
        per = math.ceil(len(keys) / shards)
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: tensors[k] for k in keys[s * per : (s + 1) * per]}
            save_file(part, str(w.folder / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in part})
        _write_json(w.folder / "model.safetensors.index.json",
                    {"metadata": {"total_size": sum(t.numel() * 2 for t in tensors.values())},
                     "weight_map": weight_map})
    return model.float().eval(), cfg
