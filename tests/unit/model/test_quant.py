"""int8 weights (model/quant.py) against the fp32 model they come from: per-layer and
logits error within tolerances, argmax agreement, the weights rule (int8 / bf16 from the CPU's
facts) and the loader path."""

from __future__ import annotations

import pytest
import torch
from diffill.model import quant
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import SamplerConfig
from diffill.model.loader import load_model
from diffill.model.quant import (
    AUTO_INT8_PARAMS,
    CpuFacts,
    Int8Linear,
    count_parameters,
    int8_available,
    quantize_model,
    quantize_per_channel,
    resolve_weights,
)
from safetensors.torch import load_file, save_file
from support import tiny_config, tiny_model, write_diffill_checkpoint

pytestmark = pytest.mark.skipif(not int8_available(), reason="no quantized CPU engine")


def test_per_channel_codes_reconstruct_the_weight():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 19, generator=g) * torch.linspace(0.01, 3, 37)[:, None]
    w[5] = 0
    q, s = quantize_per_channel(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127 and s[5] == 1
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] / 2 + 1e-7).all())  # half a step per channel at most


def test_int8_linear_is_close_to_fp32():
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(64, 48, generator=g) * 0.1, torch.randn(64, generator=g)
    x = torch.randn(2, 5, 48, generator=g)
    lin = Int8Linear(w, b)
    ref = torch.nn.functional.linear(x, w, b)
    with torch.inference_mode():
        y = lin(x)
    assert y.shape == ref.shape
    assert (y - ref).abs().max() < 0.03 * ref.abs().max()
    assert torch.allclose(lin.dequantized(), w, atol=float(w.abs().amax()) / 127)


@pytest.mark.parametrize("tied", [True, False])
def test_quantized_model_logits_stay_close(tied):
    model, cfg = tiny_model(0, std=0.05, tie_embeddings=tied, qkv_bias=True)
    ref_model, _ = tiny_model(0, std=0.05, tie_embeddings=tied, qkv_bias=True)
    quantize_model(model)
    assert model.weights == "int8" and model.int8_head is not None
    assert not any(isinstance(m, torch.nn.Linear) for m in model.layers.modules())
    assert count_parameters(model) == sum(p.numel() for p in ref_model.parameters())
    ids = torch.randint(4, cfg.vocab_size, (3, 40), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = model(ids)
        want = ref_model(ids)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
    # the sampler runs on it unchanged
    res = infill(model, cfg, [5, 6, 7], [8, 9], SamplerConfig(steps=2, lengths=(4,)))
    assert res and res[0].length == 4


AMX = CpuFacts(amx=True, avx512_bf16=True, mkldnn=True)
AVX512_BF16 = CpuFacts(avx512_bf16=True, mkldnn=True)
AVX2 = CpuFacts(mkldnn=True)


def test_weights_rule():
    assert resolve_weights("fp32", device="cpu", params=10**9) == "fp32"
    assert resolve_weights("int8", device="cpu", params=10) == "int8"
    assert resolve_weights("bf16", device="cpu", params=10, cpu=AVX2) == "bf16"  # forced: any CPU
    for cpu in (AMX, AVX2):  # auto keeps int8 while AUTO_BF16 is off (quant.AUTO_BF16's doc)
        assert resolve_weights("auto", device="cpu", params=AUTO_INT8_PARAMS, cpu=cpu) == "int8"
    assert resolve_weights("auto", device="cpu", params=AUTO_INT8_PARAMS - 1, cpu=AVX2) == "fp32"
    with pytest.raises(ValueError):
        resolve_weights("int4", device="cpu", params=1)
    for w in ("int8", "bf16"):
        with pytest.raises(ValueError, match="CPU only"):
            resolve_weights(w, device="cuda", params=1)


def test_auto_picks_bf16_from_the_cpus_facts(monkeypatch):
    """With AUTO_BF16 on: bf16 only where AMX runs the bf16 linear (oneDNN); avx512_bf16 alone is
    unmeasured and keeps int8; a small model stays fp32 everywhere."""
    monkeypatch.setattr(quant, "AUTO_BF16", True)
    big = AUTO_INT8_PARAMS
    assert resolve_weights("auto", device="cpu", params=big, cpu=AMX) == "bf16"
    assert resolve_weights("auto", device="cpu", params=big, cpu=AVX512_BF16) == "int8"
    assert resolve_weights("auto", device="cpu", params=big, cpu=AVX2) == "int8"
    assert resolve_weights("auto", device="cpu", params=big,
                           cpu=CpuFacts(amx=True, avx512_bf16=True)) == "int8"  # no oneDNN
    assert resolve_weights("auto", device="cpu", params=big - 1, cpu=AMX) == "fp32"
    assert resolve_weights("int8", device="cpu", params=big, cpu=AMX) == "int8"  # forced
    monkeypatch.setenv("DIFFILL_WEIGHTS", "int8")
    assert resolve_weights(None, device="cpu", params=big, cpu=AMX) == "int8"


def test_cpu_facts_read_this_torch():
    facts = quant.cpu_facts()
    assert facts.mkldnn == torch.backends.mkldnn.is_available()
    assert facts.native_bf16 == (facts.amx and facts.mkldnn)


def test_env_names_the_weights(monkeypatch):
    monkeypatch.setenv("DIFFILL_WEIGHTS", "int8")
    assert resolve_weights(None, device="cpu", params=1) == "int8"
    assert resolve_weights("fp32", device="cpu", params=1) == "fp32"  # an explicit one wins
    monkeypatch.setenv("DIFFILL_WEIGHTS", "bf16")
    assert resolve_weights(None, device="cpu", params=1) == "bf16"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loader_makes_int8_from_the_files_own_dtype(tmp_path, dtype):
    """The blocks' weights are quantized from the file as stored (bf16 here too): the result
    equals quantizing the model loaded in fp32, and the small model stays fp32 under auto."""
    cfg = tiny_config(max_position_embeddings=64)
    write_diffill_checkpoint(tmp_path, cfg)
    f = tmp_path / "model.safetensors"
    save_file({k: v.to(dtype) for k, v in load_file(str(f)).items()}, str(f))
    assert load_model(tmp_path).weights == "fp32"  # auto: a few-MB model
    lm = load_model(tmp_path, weights="int8")
    assert lm.weights == "int8" and lm.dtype == torch.float32
    assert lm.model.embed_tokens.weight.dtype == dtype  # a lookup: kept as stored
    assert lm.model.norm.weight.dtype == torch.float32
    fp = load_model(tmp_path, weights="fp32")
    assert lm.num_parameters == fp.num_parameters  # int8 weights still count
    ref = quantize_model(fp.model)
    a = lm.model.layers[0].mlp.up_proj.dequantized()
    b = ref.layers[0].mlp.up_proj.dequantized()
    assert torch.equal(a, b)
    ids = torch.randint(4, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.allclose(lm.model(ids), ref(ids), atol=1e-5)


@pytest.mark.parametrize("int8", [False, True])
def test_a_wide_head_comes_in_vocabulary_pieces_on_a_cpu(int8):
    """Transformer.head_pieces: a vocabulary wider than PACK_ROWS comes as (first id, logits)
    pieces of at most PACK_ROWS ids whose concatenation is head() (the int8 head bit for bit:
    the same packed pieces); one piece (a narrow vocabulary) is None: read whole."""
    model, cfg = tiny_model(0, std=0.05, vocab_size=quant.PACK_ROWS * 2 + 37)
    if int8:
        quantize_model(model)
    h = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        pieces = list(model.head_pieces(h))
        whole = model.head(h)
    assert [lo for lo, _ in pieces] == [0, quant.PACK_ROWS, 2 * quant.PACK_ROWS]
    assert [p.shape for _, p in pieces] == [(5, quant.PACK_ROWS)] * 2 + [(5, 37)]
    if int8:
        assert torch.equal(torch.cat([p for _, p in pieces], 1), whole)
    else:
        torch.testing.assert_close(torch.cat([p for _, p in pieces], 1), whole)
    narrow, _ = tiny_model(0)
    assert narrow.head_pieces(h[:, :narrow.config.hidden_size]) is None


def test_a_step_on_a_wide_vocabulary_scores_by_pieces_as_it_would_whole():
    """One denoise step of an int8 model whose head comes in pieces: the same tokens and
    (to rounding) the same log-probs as the same step scored on the whole logits."""
    from diffill.model.decoder.canvas import build_canvas, initial_state
    from diffill.model.decoder.spec import SpecialIds, StepSpec
    from diffill.model.decoder.step import denoise_step

    model, cfg = tiny_model(0, std=0.3, vocab_size=quant.PACK_ROWS + 300)
    quantize_model(model)
    sp = SpecialIds.from_config(cfg)
    cv = build_canvas(cfg, [5, 6, 7, 8400, 11], [8, 8300, 9], [6, 3], torch.device("cpu"))
    spec = StepSpec(sp.mask, sp.pad, sp.terminators, cfg.shift_logits, vocab=cfg.vocab_size)

    class Whole:  # the model without head_pieces: score_slots reads head() whole
        def __init__(self, m):
            self.m = m

        def forward_hidden(self, *a, **k):
            return self.m.forward_hidden(*a, **k)

        def head(self, h):
            return self.m.head(h)

    with torch.inference_mode():
        got = denoise_step(model, cv, initial_state(cv), 3, spec)
        want = denoise_step(Whole(model), cv, initial_state(cv), 3, spec)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.masked, want.masked)
    torch.testing.assert_close(got.logp, want.logp)
