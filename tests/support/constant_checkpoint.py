"""Checkpoints whose answer is certain on any CPU: the model predicts one token at every
position whatever the input (for tests of the CLI and the benchmarks that need a known
suggestion, or a known empty one).

Every embedding is e0, attention and MLP write nothing (``o_proj`` and ``down_proj`` are
zero), so each position's hidden state stays e0; the final norm keeps only dimension 0 and
the untied head maps it to the chosen token alone (logit ``10 * sqrt(hidden)``, every
other logit exactly 0). Ranking, ties and floating point cannot change the argmax.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import torch
from diffill.model.config import DiffillDialect
from diffill.model.transformer import Transformer
from safetensors.torch import save_file
from tokenizers import decoders

from support import make_tokenizer, tiny_config

PAD_ID = 2  # make_tokenizer: <|bos|> 0, <|eos|> 1, <|pad|> 2, <|mask|> 3, then w0, w1, ...


def word_id(i: int) -> int:
    """The id of the word ``w{i}``."""
    return 4 + i


def write_constant_checkpoint(folder: Path, token_id: int, *, fuse: bool = False) -> Path:
    """A diffill checkpoint folder whose model writes only ``token_id``. ``fuse``: the
    tokenizer decodes without spaces between tokens (``w7w7w7``: one Python name)."""
    cfg = tiny_config(tie_embeddings=False)
    with torch.no_grad():
        model = Transformer(cfg)
        for p in model.parameters():
            p.zero_()
        model.embed_tokens.weight[:, 0] = 1.0
        for name, p in model.named_parameters():
            if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")):
                p.fill_(1.0)
        model.norm.weight[0] = 1.0
        model.lm_head.weight[token_id, 0] = 10.0
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_bytes(msgspec.json.encode(DiffillDialect.from_model_config(cfg, {})))
    tok = make_tokenizer(cfg.vocab_size)
    if fuse:
        tok.decoder = decoders.Fuse()
    tok.save(str(folder / "tokenizer.json"))
    return folder
