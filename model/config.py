"""Model configuration: one normalised :class:`ModelConfig` for every family.

Checkpoints arrive with their own ``config.json`` dialect. Each family has a
msgspec Struct that mirrors the keys it really writes (so that a typo or a
wrong type is reported with the field's name), and a ``to_model_config``
method that normalises it. Family quirks -- the mask token id, whether the
logit for position *i* is read at *i - 1* (``shift_logits``), pad/eos/bos
ids, rotary theta, tied head -- live here and nowhere else.

Families:

=========  ============================================  =====  ==========
family     checkpoints                                   shift  mask id
=========  ============================================  =====  ==========
qwen2      Dream 7B, Dream-Coder 7B, DiffuCoder 7B,       yes    config /
           Open-dCoder 0.5B (Qwen2 / Qwen2.5 shapes)             tokenizer
qwen3      CoDA 1.7B (q_norm / k_norm, separate lm_head)  yes    151669
llama      plain Llama-shaped checkpoints                 yes    tokenizer
llada      LLaDA 8B / 1.5 (own key names)                 no     126336
diffill    diffill's own default model                    no     config
=========  ============================================  =====  ==========
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from .recipes import CanvasRecipe


class ConfigError(ValueError):
    """A config.json that cannot be understood; the message names file and field."""


class ModelConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Normalised architecture + special-token description used by the transformer
    and the sampler. Every field is explicit; nothing is inferred later."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    # Special tokens. ``None`` means "resolve from the tokenizer".
    mask_token_id: int | None = None
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    bos_token_id: int | None = None
    # Dream-style models predict token i from hidden state i-1.
    shift_logits: bool = False
    # Semi-autoregressive block the checkpoint decodes best with (``SamplerConfig.block``;
    # the engine's default sampler uses it). None: plain any-order decoding.
    decode_block: int | None = None
    # Draft verification bar the checkpoint is tuned for (``SamplerConfig.draft_ratio``; the
    # engine's default sampler uses it). None: the sampler's default.
    draft_ratio: float | None = None
    # Free-form provenance/architecture names kept for ``diffill info``.
    architectures: list[str] = []
    torch_dtype: str | None = None
    model_type: str = ""
    # The family's infilling recipe resolved to ids (model/recipes.py), set by the loader.
    # None: the canvas follows the special ids above ([BOS] prefix masks suffix [EOS]).
    recipe: CanvasRecipe | None = None

    @property
    def num_params_estimate(self) -> int:
        d, f, L, V = self.hidden_size, self.intermediate_size, self.num_layers, self.vocab_size
        hd = self.head_dim
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * d * f
        emb = V * d * (1 if self.tie_embeddings else 2)
        return L * (attn + mlp + 2 * d) + emb + d

    def replace(self, **changes: Any) -> ModelConfig:
        return msgspec.structs.replace(self, **changes)


def _first_int(v: int | list[int] | None) -> int | None:
    if isinstance(v, list):
        return int(v[0]) if v else None
    return v


# --------------------------------------------------------------------------- HF dialects


class _HFBase(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    architectures: list[str] = []
    model_type: str = ""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    mask_token_id: int | None = None
    pad_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | list[int] | None = None
    torch_dtype: str | None = None
    dtype: str | None = None  # transformers >= 5 writes ``dtype`` instead of ``torch_dtype``
    attention_bias: bool | None = None
    hidden_act: str = "silu"
    # transformers >= 5 moves rope_theta into rope_parameters; older configs use rope_scaling.
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    use_sliding_window: bool = False


class Qwen2Dialect(_HFBase, kw_only=True):
    """Qwen2 / Qwen2.5 and the Dream family (``DreamModel`` reuses these keys)."""

    def to_model_config(self) -> ModelConfig:
        return _hf_common(self, family="qwen2", qkv_bias=True, qk_norm=False, shift=True)


class Qwen3Dialect(_HFBase, kw_only=True):
    """Qwen3 (CoDA): per-head RMSNorm on q and k, explicit head_dim (CoDA keeps a separate lm_head)."""

    def to_model_config(self) -> ModelConfig:
        bias = bool(self.attention_bias) if self.attention_bias is not None else False
        return _hf_common(self, family="qwen3", qkv_bias=bias, qk_norm=True, shift=True)


class LlamaDialect(_HFBase, kw_only=True):
    def to_model_config(self) -> ModelConfig:
        bias = bool(self.attention_bias) if self.attention_bias is not None else False
        return _hf_common(self, family="llama", qkv_bias=bias, qk_norm=False, shift=True)


def _hf_rope_theta(c: _HFBase) -> float:
    """rope_theta from ``rope_parameters`` (transformers >= 5) or the top-level key;
    only plain (unscaled) rotary embeddings are supported."""
    theta = float(c.rope_theta)
    for key in ("rope_parameters", "rope_scaling"):
        rp = getattr(c, key)
        if not rp:
            continue
        kind = rp.get("rope_type", rp.get("type", "default"))
        if kind not in (None, "default"):
            raise ConfigError(f"field {key}.rope_type={kind!r} is not supported (only 'default' rotary)")
        if "rope_theta" in rp:
            theta = float(rp["rope_theta"])
    return theta


def _hf_common(c: _HFBase, *, family: str, qkv_bias: bool, qk_norm: bool, shift: bool) -> ModelConfig:
    if c.hidden_size % c.num_attention_heads and c.head_dim is None:
        raise ConfigError(
            f"hidden_size={c.hidden_size} is not divisible by num_attention_heads={c.num_attention_heads}"
        )
    if c.hidden_act not in ("silu", "swish"):
        raise ConfigError(f"field hidden_act={c.hidden_act!r} is not supported (only 'silu')")
    if c.use_sliding_window:
        raise ConfigError("field use_sliding_window=true is not supported (full attention only)")
    return ModelConfig(
        family=family,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads or c.num_attention_heads,
        head_dim=c.head_dim or c.hidden_size // c.num_attention_heads,
        rope_theta=_hf_rope_theta(c),
        rms_norm_eps=float(c.rms_norm_eps),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        tie_embeddings=bool(c.tie_word_embeddings),
        max_position_embeddings=c.max_position_embeddings,
        mask_token_id=c.mask_token_id,
        pad_token_id=_first_int(c.pad_token_id),
        eos_token_id=_first_int(c.eos_token_id),
        bos_token_id=_first_int(c.bos_token_id),
        shift_logits=shift,
        architectures=list(c.architectures),
        torch_dtype=c.torch_dtype or c.dtype,
        model_type=c.model_type.lower(),
    )


class LLaDADialect(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """LLaDA's OLMo-derived keys (d_model, n_layers, ...). Predicts tokens in place."""

    architectures: list[str] = []
    model_type: str = "llada"
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    mlp_hidden_size: int | None = None
    mlp_ratio: int = 4
    vocab_size: int
    embedding_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    weight_tying: bool = False
    include_bias: bool = False
    include_qkv_bias: bool = False
    max_sequence_length: int = 4096
    mask_token_id: int = 126336
    pad_token_id: int | None = 126081
    eos_token_id: int | None = 126081
    bos_token_id: int | None = 126080
    # OLMo/LLaDA switches; only the values LLaDA 8B / 1.5 use are supported.
    block_type: str = "llama"
    activation_type: str = "silu"
    layer_norm_type: str = "rms"
    rope: bool = True
    alibi: bool = False
    scale_logits: bool = False
    input_emb_norm: bool = False
    attention_layer_norm: bool = False
    block_group_size: int = 1
    multi_query_attention: bool | None = None
    torch_dtype: str | None = None

    def _check_supported(self) -> None:
        want = {
            "block_type": "llama",
            "activation_type": "silu",
            "layer_norm_type": "rms",
            "rope": True,
            "alibi": False,
            "scale_logits": False,
            "input_emb_norm": False,
            "attention_layer_norm": False,
            "block_group_size": 1,
            "include_bias": False,  # biases on every linear layer; the Transformer has q/k/v bias only
        }
        for name, ok in want.items():
            got = getattr(self, name)
            if got != ok:
                raise ConfigError(f"field {name}={got!r} is not supported (diffill supports {ok!r})")

    def to_model_config(self) -> ModelConfig:
        self._check_supported()
        return ModelConfig(
            family="llada",
            vocab_size=self.embedding_size or self.vocab_size,
            hidden_size=self.d_model,
            intermediate_size=self.mlp_hidden_size or self.mlp_ratio * self.d_model,
            num_layers=self.n_layers,
            num_heads=self.n_heads,
            num_kv_heads=self.n_kv_heads or (1 if self.multi_query_attention else self.n_heads),
            head_dim=self.d_model // self.n_heads,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=bool(self.include_qkv_bias),
            qk_norm=False,
            tie_embeddings=bool(self.weight_tying),
            max_position_embeddings=self.max_sequence_length,
            mask_token_id=self.mask_token_id,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            shift_logits=False,
            architectures=list(self.architectures),
            torch_dtype=self.torch_dtype,
            model_type=self.model_type.lower(),
        )


class DiffillDialect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """diffill's own small default family: written by ``diffill train``, strict keys."""

    architectures: list[str] = msgspec.field(default_factory=lambda: ["DiffillForMaskedDiffusion"])
    model_type: str = "diffill"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = True
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 2048
    mask_token_id: int
    pad_token_id: int
    eos_token_id: int
    bos_token_id: int
    shift_logits: bool = False
    decode_block: int | None = None
    draft_ratio: float | None = None
    torch_dtype: str | None = "float32"
    provenance: dict[str, Any] = {}

    def to_model_config(self) -> ModelConfig:
        if self.decode_block is not None and self.decode_block < 1:
            raise ConfigError(f"field decode_block must be >= 1 or null, got {self.decode_block}")
        if self.draft_ratio is not None and not 0.0 <= self.draft_ratio <= 1.0:
            raise ConfigError(f"field draft_ratio must be in [0, 1] or null, got {self.draft_ratio}")
        return ModelConfig(
            family="diffill",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim or self.hidden_size // self.num_attention_heads,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            tie_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            mask_token_id=self.mask_token_id,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            shift_logits=self.shift_logits,
            decode_block=self.decode_block,
            draft_ratio=self.draft_ratio,
            architectures=list(self.architectures),
            torch_dtype=self.torch_dtype,
        )

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, provenance: dict[str, Any] | None = None) -> DiffillDialect:
        assert cfg.mask_token_id is not None and cfg.pad_token_id is not None
        assert cfg.eos_token_id is not None and cfg.bos_token_id is not None
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.rms_norm_eps,
            qkv_bias=cfg.qkv_bias,
            qk_norm=cfg.qk_norm,
            tie_word_embeddings=cfg.tie_embeddings,
            max_position_embeddings=cfg.max_position_embeddings,
            mask_token_id=cfg.mask_token_id,
            pad_token_id=cfg.pad_token_id,
            eos_token_id=cfg.eos_token_id,
            bos_token_id=cfg.bos_token_id,
            shift_logits=cfg.shift_logits,
            decode_block=cfg.decode_block,
            draft_ratio=cfg.draft_ratio,
            torch_dtype=cfg.torch_dtype or "float32",
            provenance=provenance or {},
        )


# model_type / architecture name -> dialect
_BY_MODEL_TYPE: dict[str, type] = {
    "qwen2": Qwen2Dialect,
    "dream": Qwen2Dialect,
    "qwen3": Qwen3Dialect,
    "llama": LlamaDialect,
    "llada": LLaDADialect,
    "diffill": DiffillDialect,
}
_BY_ARCH: dict[str, type] = {
    "Qwen2ForCausalLM": Qwen2Dialect,
    "Qwen2Model": Qwen2Dialect,
    "DreamModel": Qwen2Dialect,
    "Qwen3ForCausalLM": Qwen3Dialect,
    "Qwen3Model": Qwen3Dialect,
    "CoDALanguageModel": Qwen3Dialect,
    "LlamaForCausalLM": LlamaDialect,
    "LLaDAModelLM": LLaDADialect,
    "LLaDAMoEModelLM": LLaDADialect,
    "DiffillForMaskedDiffusion": DiffillDialect,
}

SUPPORTED_FAMILIES = ("qwen2", "qwen3", "llama", "llada", "diffill")


def dialect_for(raw: dict[str, Any], source: str = "config.json") -> type:
    mt = str(raw.get("model_type", "")).lower()
    if mt in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[mt]
    for arch in raw.get("architectures") or []:
        if arch in _BY_ARCH:
            return _BY_ARCH[arch]
    raise ConfigError(
        f"{source}: unknown architecture (model_type={raw.get('model_type')!r}, "
        f"architectures={raw.get('architectures')!r}); supported model_type values: "
        f"{', '.join(sorted(_BY_MODEL_TYPE))}"
    )


def parse_config(raw: dict[str, Any], source: str = "config.json") -> tuple[ModelConfig, Any]:
    """Normalise a decoded config.json. Returns (ModelConfig, dialect struct)."""
    dialect = dialect_for(raw, source)
    try:
        parsed = msgspec.convert(raw, dialect, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {e}") from None
    try:
        cfg = parsed.to_model_config()
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{source}: field {name} must be positive, got {getattr(cfg, name)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(
            f"{source}: num_attention_heads={cfg.num_heads} is not a multiple of "
            f"num_key_value_heads={cfg.num_kv_heads}"
        )
    return cfg, parsed


def read_config(path: str | Path) -> tuple[ModelConfig, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{p}: missing file (a checkpoint folder needs config.json)")
    try:
        raw = msgspec.json.decode(p.read_bytes())
    except msgspec.DecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a JSON object at top level")
    return parse_config(raw, str(p))
