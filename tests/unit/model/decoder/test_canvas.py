"""Canvases (diffill.model.decoder.canvas): a padded batch steps as the unpadded one."""

from __future__ import annotations

import pytest
import torch
from support import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_padded_canvas_gives_the_same_steps():
    from diffill.model.decoder.canvas import build_canvas, initial_state, pad_canvas
    from diffill.model.decoder.spec import SpecialIds, StepSpec
    from diffill.model.decoder.step import denoise_step

    model, cfg = tiny_model(0, vocab_size=50, max_position_embeddings=300)
    sp = SpecialIds.from_config(cfg)
    g = torch.Generator().manual_seed(0)
    cv = build_canvas(cfg, torch.randint(4, 50, (7,), generator=g).tolist(),
                      torch.randint(4, 50, (5,), generator=g).tolist(), [6, 3])
    L, T = cv.ids.shape
    N = cv.hole_pos.shape[1]
    pv = pad_canvas(cv, sp.pad, T=T + 9, N=N + 2, L=L + 1)
    spec = StepSpec(sp.mask, sp.pad, sp.terminators, shift=False)  # confidence, fixed, greedy
    a, b = initial_state(cv), initial_state(pv)
    with torch.inference_mode():
        for s in range(4):
            a = denoise_step(model, cv, a, 4 - s, spec)
            b = denoise_step(model, pv, b, 4 - s, spec)
    assert torch.equal(a.ids.gather(1, cv.hole_pos), b.ids[:L].gather(1, pv.hole_pos[:L, :N]))
    assert not b.masked.any() and not b.masked[L:].any()
    assert torch.isfinite(b.logp).all()
    with pytest.raises(ValueError):
        pad_canvas(cv, sp.pad, T=T, N=N + 1)
