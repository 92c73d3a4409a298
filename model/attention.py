"""The one place that chooses the attention implementation.

``attend`` runs bidirectional (or, for the autoregressive baseline, causal)
multi-head attention with grouped-query heads. It uses flash-attn when the
package imports, the tensors live on CUDA in fp16/bf16 and no key-padding mask
is needed; otherwise torch's scaled_dot_product_attention (SDPA). Tests force
either path with :func:`set_backend` and compare them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

try:  # optional: cannot be built on CPU-only machines
    from flash_attn import flash_attn_func as _flash_attn_func  # type: ignore

    HAVE_FLASH = True
except Exception:  # pragma: no cover - depends on the machine
    _flash_attn_func = None
    HAVE_FLASH = False


def _sdpa_takes_gqa() -> bool:
    """Whether this torch's SDPA takes ``enable_gqa`` (2.5 and later): grouped-query heads
    without a repeated copy of the keys and values. A block step of three rows against a
    690-token context (0.5B shape: 14 query, 2 key/value heads) took 1.6 ms instead of 3.9-5.6
    ms with the copy, the same values bit for bit (BENCHMARKS.md, *The C heap*)."""
    try:
        x = torch.zeros(1, 2, 1, 2)
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


_SDPA_GQA = _sdpa_takes_gqa()

_BACKENDS = ("auto", "sdpa", "flash", "math")
_backend = "auto"


def set_backend(name: str) -> None:
    """Force an attention backend: 'auto' (default), 'sdpa', 'flash' or 'math'
    (the slow explicit-softmax reference)."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"attention backend must be one of {_BACKENDS}, got {name!r}")
    if name == "flash" and not HAVE_FLASH:
        raise RuntimeError("attention backend 'flash' requested but flash_attn is not importable")
    _backend = name


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    old = _backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(old)


def resolved_backend(device: torch.device | str, dtype: torch.dtype) -> str:
    """The backend ``attend`` will use for unpadded inputs on this device/dtype."""
    if _backend != "auto":
        return _backend
    dev = torch.device(device)
    if HAVE_FLASH and dev.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return "flash"
    return "sdpa"


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention over grouped-query heads.

    q: [B, H, T, D]; k, v: [B, Hkv, S, D] with H % Hkv == 0.
    key_mask: [B, S] bool, True where the key is a real token (None: all real).
    Returns [B, H, T, D].
    """
    backend = resolved_backend(q.device, q.dtype)
    if backend == "flash" and key_mask is None and q.is_cuda:
        # flash-attn wants [B, T, H, D] and handles GQA itself.
        out = _flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal
        )
        return out.transpose(1, 2)
    if backend == "math":
        return attend_reference(q, k, v, key_mask, causal)
    mask = None
    if key_mask is not None:
        mask = key_mask[:, None, None, :].to(torch.bool)
        if causal:
            T, S = q.shape[2], k.shape[2]
            mask = mask & torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    h, hkv = q.shape[1], k.shape[1]
    gqa = {}
    if h != hkv:
        if _SDPA_GQA:  # SDPA reads each key/value head for its group of query heads
            gqa = {"enable_gqa": True}
        else:
            rep = h // hkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None and q.shape[2] == k.shape[2],
        **gqa)


def attend_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Slow, obviously correct attention (explicit softmax, fp32)."""
    h, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hkv, dim=1)
    v = v.repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("bhtd,bhsd->bhts", q.float(), k.float()) / q.shape[-1] ** 0.5
    T, S = q.shape[2], k.shape[2]
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :].bool(), float("-inf"))
    if causal:
        allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = scores.softmax(-1)
    return torch.einsum("bhts,bhsd->bhtd", probs, v.float()).to(q.dtype)
