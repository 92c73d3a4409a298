"""Checkpoint tensor names -> :class:`~diffill.model.transformer.Transformer` names.

Every family stores the same math under different names. This module maps one
checkpoint name to the Transformer's own ``state_dict`` name (or says the
tensor is a known harmless extra to skip). It reads names only, never tensors,
so the loader can validate a whole checkpoint from its headers before it
allocates anything.

Families and their layouts (``N`` = layer index):

* ``qwen2`` / ``qwen3`` / ``llama`` (Hugging Face layout; Dream, DiffuCoder,
  Open-dCoder and CoDA use it too)::

      model.embed_tokens.weight                      -> embed_tokens.weight
      model.layers.N.<rest>                          -> layers.N.<rest>
      model.norm.weight                              -> norm.weight
      lm_head.weight                                 -> lm_head.weight (skipped when tied)

  where ``<rest>`` is ``self_attn.{q,k,v,o}_proj.{weight,bias}``,
  ``self_attn.{q,k}_norm.weight``, ``mlp.{gate,up,down}_proj.weight``,
  ``input_layernorm.weight``, ``post_attention_layernorm.weight`` -- the
  Transformer uses these names already.

* ``llada`` (LLaDA 8B / 1.5, OLMo-derived ``LLaDALlamaBlock``)::

      model.transformer.wte.weight                   -> embed_tokens.weight
      model.transformer.blocks.N.q_proj.*            -> layers.N.self_attn.q_proj.*
      model.transformer.blocks.N.k_proj.*            -> layers.N.self_attn.k_proj.*
      model.transformer.blocks.N.v_proj.*            -> layers.N.self_attn.v_proj.*
      model.transformer.blocks.N.attn_out.weight     -> layers.N.self_attn.o_proj.weight
      model.transformer.blocks.N.ff_proj.weight      -> layers.N.mlp.gate_proj.weight
      model.transformer.blocks.N.up_proj.weight      -> layers.N.mlp.up_proj.weight
      model.transformer.blocks.N.ff_out.weight       -> layers.N.mlp.down_proj.weight
      model.transformer.blocks.N.attn_norm.weight    -> layers.N.input_layernorm.weight
      model.transformer.blocks.N.ff_norm.weight      -> layers.N.post_attention_layernorm.weight
      model.transformer.ln_f.weight                  -> norm.weight
      model.transformer.ff_out.weight                -> lm_head.weight (absent when tied)

  In LLaDA's block the MLP is ``ff_out(act(ff_proj(x)) * up_proj(x))`` with
  ``act`` = SiLU, so ``ff_proj`` is the gate and ``up_proj`` the linear branch.

* ``diffill``: the Transformer's own ``state_dict`` names, no prefix; no
  ``lm_head.weight`` when the head is tied.
"""

from __future__ import annotations

import re

# Tensors some exporters write that carry no learned state (recomputed at run time).
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LLADA_BLOCK = re.compile(r"^model\.transformer\.blocks\.(\d+)\.([a-z_]+)\.(weight|bias)$")

_LLADA_BLOCK_PARTS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ff_norm": "post_attention_layernorm",
}

HF_FAMILIES = ("qwen2", "qwen3", "llama")
SKIP = ""  # returned for tensors that are deliberately ignored


def head_names(family: str) -> tuple[str, ...]:
    """Checkpoint names that hold the output head (a duplicate of the embedding
    when the model ties them)."""
    if family in HF_FAMILIES:
        return ("lm_head.weight",)
    if family == "llada":
        return ("model.transformer.ff_out.weight",)
    if family == "diffill":
        return ("lm_head.weight",)
    raise ValueError(f"unknown model family {family!r}")


def map_name(family: str, name: str, *, tied: bool) -> str | None:
    """Checkpoint tensor ``name`` -> Transformer state_dict name.

    Returns :data:`SKIP` (the empty string) for a tensor to ignore (a known
    harmless extra, or a duplicate head of a tied model) and ``None`` for a
    name this family does not know (the loader reports it as unexpected).
    """
    if name.endswith(_HARMLESS_SUFFIXES):
        return SKIP
    if name in head_names(family):
        return SKIP if tied else "lm_head.weight"
    if family in HF_FAMILIES:
        return _map_hf(name)
    if family == "llada":
        return _map_llada(name)
    if family == "diffill":
        return name
    raise ValueError(f"unknown model family {family!r}")


def _map_hf(name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "embed_tokens.weight"
    if name == "model.norm.weight":
        return "norm.weight"
    m = _HF_LAYER.match(name)
    if m:
        return f"layers.{m.group(1)}.{m.group(2)}"
    return None


def _map_llada(name: str) -> str | None:
    if name == "model.transformer.wte.weight":
        return "embed_tokens.weight"
    if name == "model.transformer.ln_f.weight":
        return "norm.weight"
    m = _LLADA_BLOCK.match(name)
    if m and m.group(2) in _LLADA_BLOCK_PARTS:
        return f"layers.{m.group(1)}.{_LLADA_BLOCK_PARTS[m.group(2)]}.{m.group(3)}"
    return None


def to_checkpoint_names(family: str, state_dict_names: list[str], *, tied: bool) -> dict[str, str]:
    """Inverse mapping used by tests and by writers: Transformer name -> the name
    a checkpoint of ``family`` stores it under."""
    out: dict[str, str] = {}
    for n in state_dict_names:
        out[n] = _inverse(family, n)
    return out


def _inverse(family: str, n: str) -> str:
    if family == "diffill":
        return n
    if n == "lm_head.weight":
        return head_names(family)[0]
    if family in HF_FAMILIES:
        return f"model.{n}"
    if family == "llada":
        if n == "embed_tokens.weight":
            return "model.transformer.wte.weight"
        if n == "norm.weight":
            return "model.transformer.ln_f.weight"
        m = re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", n)
        if m:
            for k, v in _LLADA_BLOCK_PARTS.items():
                if v == m.group(2):
                    return f"model.transformer.blocks.{m.group(1)}.{k}.{m.group(3)}"
        raise ValueError(f"no LLaDA name for {n!r}")
    raise ValueError(f"unknown model family {family!r}")
