"""Autoregressive decoding with the same transformer: the latency baseline.

The diffusion/AR time ratio in ``diffill bench`` compares an infill of ``n``
tokens against decoding ``n`` tokens one forward at a time from the same model
and the same context -- how a left-to-right code model would produce them.
The model was not trained left to right, so the tokens themselves are
meaningless; only the time is measured. (Weights do not change the time.)

:func:`generate` is the fast path: one causal prefill that keeps each layer's
keys and values, then one single-token forward per new token attending to the
cache (``ctx=KVContext``). :func:`generate_reference` recomputes the whole
causal forward for every token; tests check both give the same tokens.

Shapes: P prompt tokens, n new tokens; batch 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..model.transformer import KVContext


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _next_token(model: Any, hidden_last: torch.Tensor) -> torch.Tensor:
    """hidden [1, D] -> greedy next token [1, 1]."""
    return model.head(hidden_last).argmax(-1, keepdim=True)


@torch.inference_mode()
def prefill(model: Any, prompt_ids: Sequence[int] | torch.Tensor
            ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Causal forward over the prompt [P]: (last hidden [1, D], per-layer (k, v) [1, Hkv, P, Dh])."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=_device(model)).reshape(1, -1)
    hidden, kv = model.forward_hidden(ids, return_kv=True, causal=True)
    return hidden[:, -1], kv


@torch.inference_mode()
def generate(model: Any, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             stop_id: int | None = None, sync: bool = True) -> list[int]:
    """Greedy decoding with a KV cache: prefill, then one single-token forward per token.

    Produces exactly ``max_new_tokens`` tokens unless ``stop_id`` is given and
    generated (benchmarks leave it None so the output length is fixed). With
    ``sync=False`` the loop never reads a token back to the host until the end
    (then ``stop_id`` is ignored), which is how a fair timing runs.
    """
    if max_new_tokens < 1:
        return []
    hidden_last, kv = prefill(model, prompt_ids)
    P = kv[0][0].shape[2]
    dev = hidden_last.device
    tok = _next_token(model, hidden_last)  # [1, 1]
    out = [tok]
    for i in range(1, max_new_tokens):
        if sync and stop_id is not None and int(tok) == stop_id:
            break
        pos = torch.full((1, 1), P + i - 1, dtype=torch.long, device=dev)
        hidden, new_kv = model.forward_hidden(tok, position_ids=pos, ctx=KVContext(kv),
                                              return_kv=True, causal=True)
        kv = [(torch.cat((k, nk), dim=2), torch.cat((v, nv), dim=2))
              for (k, v), (nk, nv) in zip(kv, new_kv, strict=True)]
        tok = _next_token(model, hidden[:, -1])
        out.append(tok)
    ids = torch.cat(out, dim=1)[0].tolist()
    if stop_id is not None and stop_id in ids:
        ids = ids[: ids.index(stop_id) + 1]
    return ids


@torch.inference_mode()
def generate_reference(model: Any, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int,
                       *, stop_id: int | None = None) -> list[int]:
    """Slow, obviously correct greedy decoding: a full causal forward per token."""
    ids = [int(i) for i in torch.as_tensor(prompt_ids).reshape(-1).tolist()]
    dev = _device(model)
    out: list[int] = []
    for _ in range(max_new_tokens):
        x = torch.tensor([ids + out], dtype=torch.long, device=dev)
        hidden, _ = model.forward_hidden(x, causal=True)
        tok = int(_next_token(model, hidden[:, -1]))
        out.append(tok)
        if stop_id is not None and tok == stop_id:
            break
    return out
