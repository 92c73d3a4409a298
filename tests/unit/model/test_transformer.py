"""Logit parity of diffill's loader + Transformer with independent references.

* Qwen2 / Qwen3 (tied) / Llama: tiny random models built and saved by
  ``transformers``, run there with a full (all-True) 4-D attention mask, which
  makes them bidirectional; diffill must load the saved folder and give the
  same logits (fp32, CPU, max abs error <= 1e-4).
* LLaDA naming: a checkpoint written by hand with LLaDA tensor names, checked
  against a forward pass computed in this file with explicit torch ops.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from diffill.model import load_model
from diffill.model.attention import use_backend
from safetensors.torch import save_file
from support import write_tokenizer

transformers = pytest.importorskip("transformers")

V = 64  # model and tokenizer vocabulary
ATOL = 1e-4


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere, including norms and biases (HF initialises those
    to ones/zeros, which would hide a swapped or dropped tensor)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))


def _hf_model(kind: str, seed: int = 0):
    common = dict(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(
            **common, rope_theta=5000.0, rms_norm_eps=1e-6, tie_word_embeddings=False
        )
        cls = transformers.Qwen2ForCausalLM
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(
            **common, head_dim=24, rope_theta=20000.0, rms_norm_eps=1e-6, tie_word_embeddings=True
        )
        cls = transformers.Qwen3ForCausalLM
    elif kind == "llama":
        cfg = transformers.LlamaConfig(
            **common, rope_theta=777.0, rms_norm_eps=1e-5, tie_word_embeddings=False
        )
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    _randomise(model, seed)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval()


def _save(model, folder: Path, **kw) -> Path:
    model.save_pretrained(str(folder), **kw)
    write_tokenizer(folder, V)
    return folder


def _full_mask(key_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] key mask -> [B, 1, T, T] additive float mask: every query sees every
    real key (0), none sees a pad (-inf-ish). transformers uses a 4-D mask as
    given; its eager attention *adds* it to the scores, so a bool mask would not
    mask anything there -- hence float."""
    B, T = key_mask.shape
    add = torch.zeros(B, 1, T, T)
    return add.masked_fill(~key_mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)


@torch.no_grad()
def _hf_logits(model, ids: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    if key_mask is None:
        key_mask = torch.ones_like(ids)
    return model(input_ids=ids, attention_mask=_full_mask(key_mask)).logits


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def saved(request, tmp_path_factory):
    kind = request.param
    model = _hf_model(kind)
    folder = _save(model, tmp_path_factory.mktemp(kind))
    return kind, model, folder


def test_reference_is_bidirectional(saved):
    """The transformers reference with the 4-D mask really differs from its causal
    forward -- otherwise the parity tests below could not catch a causal diffill."""
    _, model, _ = saved
    ids = torch.randint(4, V, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        causal = model(input_ids=ids).logits
    full = _hf_logits(model, ids)
    assert (causal - full).abs().max() > 1e-2
    # ... and an additive all-zero float mask means the same thing as all-True.
    with torch.no_grad():
        additive = model(input_ids=ids, attention_mask=torch.zeros(2, 1, 11, 11)).logits
    assert torch.allclose(additive, full, atol=1e-6)
    # The 4-D mask is applied as given (transformers 4.56+ and 5.x return a 4-D mask as it is
    # and eager attention adds it): hiding the last key from every query gives, at the other
    # positions, the logits of the sequence without that token.
    hidden = torch.ones(2, 11, dtype=torch.long)
    hidden[:, -1] = 0
    assert torch.allclose(_hf_logits(model, ids, hidden)[:, :-1], _hf_logits(model, ids[:, :-1]),
                          atol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_logits_match_transformers(saved, backend):
    kind, model, folder = saved
    lm = load_model(folder)
    assert lm.config.family == kind
    assert lm.dtype == torch.float32
    assert lm.config.shift_logits is True
    assert lm.config.tie_embeddings == (kind == "qwen3")
    assert lm.num_parameters == sum(p.numel() for p in model.parameters())
    ids = torch.randint(4, V, (3, 13), generator=torch.Generator().manual_seed(2))
    want = _hf_logits(model, ids)
    with use_backend(backend), torch.no_grad():
        got = lm.model(ids)
    assert got.shape == want.shape
    err = (got - want).abs().max().item()
    assert err <= ATOL, f"{kind}/{backend}: max abs error {err}"


def test_padded_batch_matches_unpadded(saved):
    """Right-padded rows with a key-padding mask give the logits of the unpadded
    sequences at real positions (diffill vs itself and vs transformers)."""
    kind, model, folder = saved
    lm = load_model(folder)
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(4, V, (1, 12), generator=gen)
    b = torch.randint(4, V, (1, 7), generator=gen)
    pad = lm.config.pad_token_id
    batch = torch.full((2, 12), pad)
    batch[0] = a[0]
    batch[1, :7] = b[0]
    mask = torch.zeros(2, 12, dtype=torch.long)
    mask[0] = 1
    mask[1, :7] = 1
    with torch.no_grad():
        padded = lm.model(batch, attention_mask=mask)
        alone_a = lm.model(a)
        alone_b = lm.model(b)
        unmasked = lm.model(batch)
    assert (padded[0] - alone_a[0]).abs().max() <= ATOL
    assert (padded[1, :7] - alone_b[0]).abs().max() <= ATOL
    # without the mask the pad tokens leak into the real positions
    assert (unmasked[1, :7] - alone_b[0]).abs().max() > 1e-3
    want = _hf_logits(model, batch, mask)
    assert (padded[1, :7] - want[1, :7]).abs().max() <= ATOL


def test_left_padding_with_position_ids(saved):
    _, _, folder = saved
    lm = load_model(folder)
    b = torch.randint(4, V, (1, 6), generator=torch.Generator().manual_seed(4))
    batch = torch.cat((torch.full((1, 3), lm.config.pad_token_id), b), dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = lm.model(batch, attention_mask=mask, position_ids=pos)
        alone = lm.model(b)
    assert (padded[0, 3:] - alone[0]).abs().max() <= ATOL


def test_sharded_checkpoint_loads(tmp_path):
    model = _hf_model("qwen2", seed=5)
    folder = _save(model, tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    assert not (folder / "model.safetensors").exists()
    lm = load_model(folder)
    assert sorted(lm.files) == shards
    ids = torch.randint(4, V, (2, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (lm.model(ids) - _hf_logits(model, ids)).abs().max() <= ATOL


def test_explicit_bfloat16(saved):
    _, model, folder = saved
    lm = load_model(folder, dtype="bfloat16")
    assert lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    ids = torch.randint(4, V, (1, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got = lm.model(ids).float()
    # bf16 weights: loose agreement only, but the same function
    assert (got - _hf_logits(model, ids)).abs().max() < 0.1


# --------------------------------------------------------------------------- LLaDA


LLADA = dict(
    d_model=32,
    n_heads=4,
    n_kv_heads=2,
    n_layers=2,
    mlp_hidden_size=48,
    rope_theta=500000.0,
    eps=1e-5,
)


def _llada_tensors(vocab: int, *, tied: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    d, nh, nkv, f = (
        LLADA["d_model"],
        LLADA["n_heads"],
        LLADA["n_kv_heads"],
        LLADA["mlp_hidden_size"],
    )
    hd = d // nh
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, base=0.0, scale=0.1):
        return base + scale * torch.randn(shape, generator=gen)

    W = {"model.transformer.wte.weight": rnd(vocab, d, scale=0.5)}
    for i in range(LLADA["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        W[p + "q_proj.weight"] = rnd(d, d)
        W[p + "k_proj.weight"] = rnd(nkv * hd, d)
        W[p + "v_proj.weight"] = rnd(nkv * hd, d)
        W[p + "attn_out.weight"] = rnd(d, d)
        W[p + "ff_proj.weight"] = rnd(f, d, scale=0.2)
        W[p + "up_proj.weight"] = rnd(f, d, scale=0.2)
        W[p + "ff_out.weight"] = rnd(d, f, scale=0.2)
        W[p + "attn_norm.weight"] = rnd(d, base=1.0, scale=0.2)
        W[p + "ff_norm.weight"] = rnd(d, base=1.0, scale=0.2)
    W["model.transformer.ln_f.weight"] = rnd(d, base=1.0, scale=0.2)
    if not tied:
        W["model.transformer.ff_out.weight"] = rnd(vocab, d, scale=0.2)
    return W


def _write_llada(
    folder: Path, vocab: int, *, tied: bool, extra: dict | None = None
) -> dict[str, torch.Tensor]:
    folder.mkdir(parents=True, exist_ok=True)
    W = _llada_tensors(vocab, tied=tied)
    save_file(W, str(folder / "model.safetensors"))
    cfg = {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "rope": True,
        "alibi": False,
        "d_model": LLADA["d_model"],
        "n_heads": LLADA["n_heads"],
        "n_kv_heads": LLADA["n_kv_heads"],
        "n_layers": LLADA["n_layers"],
        "mlp_hidden_size": LLADA["mlp_hidden_size"],
        "mlp_ratio": 4,
        "rope_theta": LLADA["rope_theta"],
        "rms_norm_eps": LLADA["eps"],
        "vocab_size": vocab,
        "embedding_size": vocab,
        "weight_tying": tied,
        "include_bias": False,
        "include_qkv_bias": False,
        "max_sequence_length": 4096,
        "scale_logits": False,
        "input_emb_norm": False,
        "attention_layer_norm": False,
        "block_group_size": 1,
        **(extra or {}),
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(folder, V)
    return W


def _llada_reference(W: dict[str, torch.Tensor], ids: torch.Tensor, tied: bool) -> torch.Tensor:
    """LLaDA's forward written out with explicit float64 ops, one sequence and one
    head at a time: RMSNorm, rotary on (first half, second half) pairs, full
    softmax attention over all positions, MLP ff_out(silu(ff_proj x) * up_proj x)."""
    d, nh, nkv, eps = LLADA["d_model"], LLADA["n_heads"], LLADA["n_kv_heads"], LLADA["eps"]
    hd = d // nh
    W = {k: v.double() for k, v in W.items()}

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def rotate(x, pos):  # x [T, hd]
        half = hd // 2
        freqs = [1.0 / LLADA["rope_theta"] ** (2 * j / hd) for j in range(half)]
        out = torch.empty_like(x)
        for t in range(x.shape[0]):
            for j in range(half):
                c, s = math.cos(pos[t] * freqs[j]), math.sin(pos[t] * freqs[j])
                a, b = x[t, j], x[t, j + half]
                out[t, j] = a * c - b * s
                out[t, j + half] = b * c + a * s
        return out

    outs = []
    for seq in ids:
        T = seq.shape[0]
        pos = list(range(T))
        x = W["model.transformer.wte.weight"][seq]
        for i in range(LLADA["n_layers"]):
            p = f"model.transformer.blocks.{i}."
            h = rms(x, W[p + "attn_norm.weight"])
            q = (h @ W[p + "q_proj.weight"].T).view(T, nh, hd)
            k = (h @ W[p + "k_proj.weight"].T).view(T, nkv, hd)
            v = (h @ W[p + "v_proj.weight"].T).view(T, nkv, hd)
            heads = []
            for hh in range(nh):
                g = hh // (nh // nkv)
                qh, kh = rotate(q[:, hh], pos), rotate(k[:, g], pos)
                att = torch.softmax(qh @ kh.T / math.sqrt(hd), dim=-1)
                heads.append(att @ v[:, g])
            x = x + torch.cat(heads, dim=-1) @ W[p + "attn_out.weight"].T
            h = rms(x, W[p + "ff_norm.weight"])
            gate = h @ W[p + "ff_proj.weight"].T
            up = h @ W[p + "up_proj.weight"].T
            x = x + (gate * torch.sigmoid(gate) * up) @ W[p + "ff_out.weight"].T
        x = rms(x, W["model.transformer.ln_f.weight"])
        head = W["model.transformer.wte.weight"] if tied else W["model.transformer.ff_out.weight"]
        outs.append(x @ head.T)
    return torch.stack(outs).float()


@pytest.mark.parametrize("tied", [False, True])
def test_llada_checkpoint_matches_hand_reference(tmp_path, tied):
    vocab = 72
    W = _write_llada(
        tmp_path,
        vocab,
        tied=tied,
        extra={"mask_token_id": 5, "eos_token_id": 1, "pad_token_id": 2, "bos_token_id": 0},
    )
    lm = load_model(tmp_path)
    cfg = lm.config
    assert cfg.family == "llada" and cfg.shift_logits is False
    assert cfg.tie_embeddings is tied and cfg.num_kv_heads == 2 and cfg.intermediate_size == 48
    assert cfg.rope_theta == LLADA["rope_theta"]
    assert cfg.mask_token_id == 5
    ids = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(8))
    want = _llada_reference(W, ids, tied)
    with torch.no_grad():
        got = lm.model(ids)
    err = (got - want).abs().max().item()
    assert err <= ATOL, f"max abs error {err}"


def test_llada_reference_notices_swapped_gate(tmp_path):
    """The hand reference distinguishes ff_proj (gate, under SiLU) from up_proj:
    a checkpoint with the two swapped gives different logits."""
    vocab = 72
    W = _write_llada(tmp_path, vocab, tied=False, extra={"mask_token_id": 5})
    swapped = dict(W)
    for i in range(LLADA["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        swapped[p + "ff_proj.weight"], swapped[p + "up_proj.weight"] = (
            W[p + "up_proj.weight"],
            W[p + "ff_proj.weight"],
        )
    ids = torch.randint(0, vocab, (1, 6), generator=torch.Generator().manual_seed(9))
    assert (
        _llada_reference(W, ids, False) - _llada_reference(swapped, ids, False)
    ).abs().max() > 1e-3


def test_llada_default_special_ids(tmp_path):
    """Without special ids in config.json a LLaDA checkpoint uses LLaDA's own:
    mask 126336, eos/pad 126081, bos 126080 (needs the full-size embedding)."""
    vocab = 126464
    LL = dict(LLADA)
    try:
        LLADA.update(d_model=8, n_heads=2, n_kv_heads=2, n_layers=1, mlp_hidden_size=8)
        _write_llada(tmp_path, vocab, tied=True)
        lm = load_model(tmp_path)
    finally:
        LLADA.clear()
        LLADA.update(LL)
    assert lm.config.mask_token_id == 126336
    assert lm.tokenizer.mask_id == 126336
    assert (lm.config.eos_token_id, lm.config.pad_token_id, lm.config.bos_token_id) == (
        126081,
        126081,
        126080,
    )
    assert lm.config.shift_logits is False
    assert lm.model.embed_tokens.weight.shape == (vocab, 8)


def test_mlp_in_place_at_inference_gives_the_training_form_bit_for_bit():
    """MLP.forward without grad works in place (two intermediate buffers, not four): the same
    values as the form autograd needs."""
    from diffill.model.transformer import MLP
    from support import tiny_config

    torch.manual_seed(0)
    mlp = MLP(tiny_config(intermediate_size=48))
    x = torch.randn(3, 7, 32)
    with torch.no_grad():
        fast = mlp(x)
    slow = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)).detach()
    assert torch.equal(fast, slow)
    y = mlp(x.requires_grad_())  # with grad: the training form, differentiable
    y.sum().backward()
    assert x.grad is not None


def test_grouped_query_attention_without_repeated_keys_is_the_repeated_one_bit_for_bit(monkeypatch):
    """SDPA's ``enable_gqa`` (torch 2.5+) reads each key/value head for its group of query
    heads; the values are those of the keys and values repeated per head, masked or not."""
    from diffill.model import attention

    if not attention._SDPA_GQA:
        pytest.skip("this torch's SDPA has no enable_gqa")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 6, 5, 8, generator=g)
    k, v = torch.randn(3, 2, 11, 8, generator=g), torch.randn(3, 2, 11, 8, generator=g)
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, -4:] = False
    with attention.use_backend("sdpa"):
        fast = [attention.attend(q, k, v, m) for m in (None, mask)]
        monkeypatch.setattr(attention, "_SDPA_GQA", False)
        slow = [attention.attend(q, k, v, m) for m in (None, mask)]
    assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True))
    assert torch.allclose(fast[1], attention.attend_reference(q, k, v, mask), atol=1e-5)


def test_a_long_input_runs_the_mlp_in_pieces_with_the_same_values():
    """On a CPU an input of more than 2 x MLP_PIECE tokens goes through the MLP in pieces
    (less memory at a long context's step): the same values, to rounding, as one piece."""
    from diffill.model import transformer
    from support import tiny_model

    model, cfg = tiny_model(0)
    mlp = model.layers[0].mlp
    x = torch.randn(2, transformer.MLP_PIECE + 7, cfg.hidden_size,
                    generator=torch.Generator().manual_seed(1))
    calls = []
    hook = mlp.gate_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    with torch.inference_mode():
        got = mlp(x)
        want = mlp._inner(x)
    hook.remove()
    assert calls[:-1] == [transformer.MLP_PIECE, transformer.MLP_PIECE, 14]  # 2 x 263 tokens
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
