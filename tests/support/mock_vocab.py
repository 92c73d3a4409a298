"""The sampler tests' mock vocabulary: 16 tokens, 0..11 ordinary, then the specials; a one-layer
config over it (``mock_cfg``) and logits that give chosen tokens chosen probabilities
(``logits_from_probs``), for models whose every answer the test designs."""

from __future__ import annotations

import math
from typing import Any

import torch
from diffill.model.config import ModelConfig

V = 16
BOS, EOS, PAD, MASK = 12, 13, 14, 15
NEG = -1e4  # "impossible" logit (exp underflows to 0 in fp32)


def mock_cfg(**kw: Any) -> ModelConfig:
    """A diffill config of one layer and one head, every width ``V``, the ids above; ``kw``
    changes fields (default 256 positions)."""
    base: dict[str, Any] = dict(
        family="diffill",
        vocab_size=V,
        hidden_size=V,
        intermediate_size=V,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=V,
        mask_token_id=MASK,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        max_position_embeddings=256,
    )
    base.update(kw)
    return ModelConfig(**base)


def logits_from_probs(probs: dict[int, float]) -> torch.Tensor:
    """Logits over ``V`` whose softmax is ``probs`` (token -> probability); ``NEG`` elsewhere."""
    out = torch.full((V,), NEG)
    for t, p in probs.items():
        out[t] = math.log(p)
    return out
