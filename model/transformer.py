"""One bidirectional transformer for every supported family.

Pre-norm blocks: RMSNorm -> attention (rotary, grouped-query heads, optional
qkv bias, optional per-head q/k RMSNorm) -> residual -> RMSNorm -> SwiGLU MLP ->
residual. There is no causal mask: every position sees every other real
position; a key-padding mask handles batched canvases of different lengths.

Parameter names follow the Hugging Face Qwen2/Qwen3/Llama layout (minus the
``model.`` prefix) so that the loader's per-family mapping stays small.

Shapes: B batch, T tokens, D hidden, H heads, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attend
from .config import ModelConfig
from .quant import PACK_ROWS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, 1, T, Dh] (rotate-half convention)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    freqs = positions.float()[..., None] * inv_freq  # [B, T, Dh/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class KVContext:
    """Keys/values of positions computed earlier (e.g. prefix and suffix) that the
    current forward attends to without recomputing them (Fast-dLLM dual cache).

    kv: per layer (k, v), each [B, Hkv, S, Dh], rotary already applied.
    mask: [B, S] bool, True for real keys (None: all real).
    """

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor | None = None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,  # [B, T, D]
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_mask: torch.Tensor | None,  # [B, S_ctx + T] bool or None
        ctx: tuple[torch.Tensor, torch.Tensor] | None = None,
        causal: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        new_kv = (k, v)
        if ctx is not None:
            k = torch.cat((ctx[0], k), dim=2)
            v = torch.cat((ctx[1], v), dim=2)
        out = attend(q, k, v, key_mask, causal=causal)  # [B, H, T, Dh]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), new_kv


MLP_PIECE = 256
"""Tokens a CPU runs through the MLP at a time when an input has more than twice as many
(:meth:`MLP.forward`)."""


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # training: autograd keeps the activation's input
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        # inference: the same values with two [T, intermediate] buffers alive instead of four
        # (a 1088-token context on the 0.5B shape: 42 MB instead of 84 at a step's peak); on a
        # CPU a long input in pieces of MLP_PIECE tokens: 10 MB alive instead of 42 there, in
        # the same time. Each token's values are its own (to rounding), except that int8 weights
        # quantize their input per call, so per piece: a scale fitted to fewer tokens (against
        # fp32, the logits' error was a little lower: BENCHMARKS.md, *The step's memory*)
        if x.device.type != "cpu" or x.shape[:-1].numel() <= 2 * MLP_PIECE:
            return self._inner(x)
        flat = x.reshape(-1, x.shape[-1])
        out = flat.new_empty(flat.shape[0], self.down_proj.out_features)
        for i in range(0, flat.shape[0], MLP_PIECE):
            out[i:i + MLP_PIECE] = self._inner(flat[i:i + MLP_PIECE])
        return out.view(*x.shape[:-1], -1)

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x), inplace=True)
        return self.down_proj(h.mul_(self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, key_mask, ctx=None, causal=False):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, key_mask, ctx, causal)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv


class Transformer(nn.Module):
    """Bidirectional transformer LM.

    ``forward(input_ids [B,T], attention_mask [B,T] | None) -> logits [B,T,V]`` in the
    checkpoint's own convention (for ``cfg.shift_logits`` models the logit predicting
    token i sits at position i-1; the sampler accounts for that, not this module).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        #: an int8 copy of the head (model.quant.quantize_model), used instead when set
        self.int8_head: nn.Module | None = None
        self.weights = "fp32"  # or "int8" (model.quant.quantize_model), "bf16" (the loader)

    # -- pieces ---------------------------------------------------------------------------
    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] -> logits [..., V]. Apply only where logits are needed."""
        if self.int8_head is not None:
            return self.int8_head(hidden)
        return F.linear(hidden, self.head_weight)

    def head_pieces(self, hidden: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]] | None:
        """hidden [M, D] -> the logits by vocabulary pieces, (first id, logits [M, at most
        :data:`~.quant.PACK_ROWS`]) in order, for a scorer that reads them as they come
        (``decoder.step.score_slots``); None where the head is read whole: on an accelerator
        (one kernel over the vocabulary, no host memory at stake) or a vocabulary of one
        piece. On a CPU the whole ``[slots, V]`` logits and their log-probs were the peak of
        a step (two x 33 MB at a 0.5B model's 1024 x 32 x 3 step; BENCHMARKS.md)."""
        w = self.head_weight
        vocab = self.int8_head.out_features if self.int8_head is not None else w.shape[0]
        if hidden.device.type != "cpu" or vocab <= PACK_ROWS:
            return None
        if self.int8_head is not None:
            return self.int8_head.pieces(hidden)
        return ((lo, F.linear(hidden, w[lo:lo + PACK_ROWS])) for lo in range(0, vocab, PACK_ROWS))

    def forward_hidden(
        self,
        input_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, T], 1 = real token
        position_ids: torch.Tensor | None = None,  # [B, T]
        ctx: KVContext | None = None,
        return_kv: bool = False,
        causal: bool = False,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Final-norm hidden states [B, T, D] and, with ``return_kv``, each layer's
        (k, v) for these T positions (rotary applied) so callers can cache them."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        x = self.embed_tokens(input_ids)
        if x.dtype != self.norm.weight.dtype:  # an embedding kept as stored (int8 weights)
            x = x.to(self.norm.weight.dtype)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        key_mask = None
        if attention_mask is not None:
            key_mask = attention_mask.to(torch.bool)
        if ctx is not None and (ctx.mask is not None or key_mask is not None):
            S = ctx.kv[0][0].shape[2]
            cm = ctx.mask if ctx.mask is not None else torch.ones(B, S, dtype=torch.bool, device=x.device)
            km = key_mask if key_mask is not None else torch.ones(B, T, dtype=torch.bool, device=x.device)
            key_mask = torch.cat((cm.to(torch.bool), km), dim=1)
        kvs: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if return_kv else None
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, key_mask, ctx.kv[i] if ctx is not None else None, causal)
            if kvs is not None:
                kvs.append(kv)
        return self.norm(x), kvs

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden, _ = self.forward_hidden(input_ids, attention_mask, position_ids)
        return self.head(hidden)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, seed: int | None = None) -> None:
        """Fresh initialisation for training from scratch."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                scale = std
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    scale = std / (2 * self.config.num_layers) ** 0.5
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
