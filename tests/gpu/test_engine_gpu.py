"""Engine fast paths on CUDA: CUDA graphs, the Triton select step, the dual cache,
bf16, against the eager/plain paths (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffill.model.asks import EngineAsk
from diffill.model.cache import infill_cached
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import SamplerConfig
from diffill.model.engine import Engine
from diffill.model.engine_options import EngineOptions
from diffill.model.loader import LoadedModel
from support import one_batch, tiny_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

V = 4099


def make_lm(dtype: torch.dtype, shift: bool = False) -> LoadedModel:
    model, cfg = tiny_model(0, std=0.1, vocab_size=V, hidden_size=256, intermediate_size=512,
                            num_layers=4, num_heads=8, head_dim=32, shift_logits=shift,
                            max_position_embeddings=2048)
    return LoadedModel(model=model.to("cuda", dtype), tokenizer=None, config=cfg, path=Path("."),
                       provenance={}, device=torch.device("cuda"), dtype=dtype)


def prompts(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        pre = torch.randint(4, V, (int(torch.randint(50, 400, (1,), generator=g)),), generator=g)
        suf = torch.randint(4, V, (int(torch.randint(0, 100, (1,), generator=g)),), generator=g)
        out.append((pre.tolist(), suf.tolist(), [(16,), (8, 16, 32), (4, 8)][i % 3]))
    return out


def together(eng: Engine, reqs) -> list:
    return one_batch(eng, [lambda r=r: eng.infill(EngineAsk(r[0], r[1], lengths=r[2])) for r in reqs])


def key(res):
    return [(r.ids, r.length, r.steps) for r in res]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("refresh", [1, 4])
@pytest.mark.parametrize("shift", [False, True])
def test_cuda_graphs_equal_eager(dtype, refresh, shift):
    lm = make_lm(dtype, shift)
    reqs = prompts(4)
    for sc in (SamplerConfig(steps=8), SamplerConfig(steps=8, threshold=0.5)):
        eager = Engine(lm, sc, options=EngineOptions(refresh_every=refresh, buckets=True))
        graphs = Engine(lm, sc, options=EngineOptions(refresh_every=refresh, cuda_graphs=True))
        want = together(eager, reqs)
        for _ in range(2):  # capture, then pure replay
            got = together(graphs, reqs)
            assert [key(r) for r in got] == [key(r) for r in want]
        other = prompts(4, seed=1)
        assert [key(r) for r in together(graphs, other)] == [key(r) for r in together(eager, other)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_select_in_engine_equals_torch_step(dtype):
    lm = make_lm(dtype)
    reqs = prompts(3, seed=2)
    plain = Engine(lm, SamplerConfig(steps=8))
    fused = Engine(lm, SamplerConfig(steps=8), options=EngineOptions(select_impl="auto"))
    for pre, suf, lens in reqs:
        assert key(fused.infill(EngineAsk(pre, suf, lengths=lens))) == key(plain.infill(EngineAsk(pre, suf, lengths=lens)))


def test_dual_cache_refresh_one_equals_sampler_on_cuda():
    lm = make_lm(torch.bfloat16, shift=True)
    for pre, suf, lens in prompts(3, seed=3):
        sc = SamplerConfig(steps=8, lengths=lens)
        assert infill_cached(lm.model, lm.config, pre, suf, sc, refresh_every=1) == infill(
            lm.model, lm.config, pre, suf, sc)
