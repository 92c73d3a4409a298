"""The diffusion language model, inference only: configs, transformer, checkpoint
loading, tokenizer, infill sampler, resident engine, step plan. Speaks token ids.

Public API (kept stable)::

    from diffill.model import load_model
    lm = load_model(path, device="cpu", dtype=None)
    lm.model      # nn.Module: forward(input_ids[B,T], attention_mask=None) -> logits[B,T,V]
    lm.tokenizer  # diffill.model.tokenizer.Tokenizer
    lm.config     # diffill.model.config.ModelConfig (mask_token_id, shift_logits, ...)
"""

from .config import ConfigError, ModelConfig, read_config
from .loader import CheckpointError, LoadedModel, default_model_path, load_model

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LoadedModel",
    "ModelConfig",
    "default_model_path",
    "load_model",
    "read_config",
]
