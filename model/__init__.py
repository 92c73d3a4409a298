"""The diffusion language model, inference only: configs, transformer, checkpoint
loading, tokenizer, infill decoder, resident engine, step plan. Speaks token ids.

Public API (kept stable)::

    from diffill.model import load_model
    lm = load_model(path, device="cpu", dtype=None)
    lm.model      # nn.Module: forward(input_ids[B,T], attention_mask=None) -> logits[B,T,V]
    lm.tokenizer  # diffill.model.tokenizer.Tokenizer
    lm.config     # diffill.model.config.ModelConfig (mask_token_id, shift_logits, ...)

The loader's names are imported on first use (PEP 562): the loader imports torch, and the
text side imports the torch-free facts (:mod:`.limits`, :mod:`.recipes`, :mod:`.config`)
at ``initialize``, before any model is loaded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import ConfigError, ModelConfig, read_config

if TYPE_CHECKING:
    from .loader import CheckpointError, LoadedModel, default_model_path, load_model

_FROM_LOADER = ("CheckpointError", "LoadedModel", "default_model_path", "load_model")

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LoadedModel",
    "ModelConfig",
    "default_model_path",
    "load_model",
    "read_config",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_LOADER:
        return getattr(importlib.import_module(".loader", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
