"""Training: data canvases, the 1/t-weighted loss, schedule, resume, checkpoints."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from diffill.training.data import FIM, PLAIN, BatchMaker, TokenSource
from diffill.training.train import (
    MICRO_TRAIN,
    TrainConfig,
    Trainer,
    ar_loss,
    diffusion_loss,
    lr_at,
    micro_files,
    param_groups,
    reference_loss,
    train_micro_tokenizer,
)
from support import FIXTURES

CORPUS = (FIXTURES / "micro_corpus.py").read_text()


@pytest.fixture(scope="module")
def tok_and_src(tmp_path_factory):
    files = micro_files(CORPUS)
    tok = train_micro_tokenizer(files)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    ids = [tok.encode(f, add_special_tokens=False).ids for f in files]
    src = TokenSource.from_token_lists(ids, tok.token_to_id("<|eos|>"))
    return tok, path, src, files


def tiny_tc(**kw) -> TrainConfig:
    base = asdict(MICRO_TRAIN)
    base.update(d_model=32, layers=1, heads=2, kv_heads=1, ffn=64, threads=1, batch_tokens=768)
    base.update(kw)
    return TrainConfig(**base)


# --------------------------------------------------------------------------- data


def test_micro_files_cover_corpus():
    files = micro_files(CORPUS)
    assert len(files) > 10
    assert "".join(files).replace("\n", "") == CORPUS.replace("\n", "")


def test_fim_rows_have_the_sampler_canvas(tok_and_src):
    tok, _, src, files = tok_and_src
    cfg = MICRO_TRAIN.data_config()
    bm = BatchMaker(src, tok, cfg, 8, seed=3)
    sp = bm.sp
    cases = set()
    for _ in range(300):
        r = bm.fim_row()
        h0, h1 = r.hole
        n, m = h1 - h0, r.middle_len
        cases.add(r.info["case"].split("+")[0])
        assert r.ids[0] == sp.bos and r.ids[-1] == sp.eos
        assert n in cfg.hole_buckets and 0 <= m <= n
        assert len(r.ids) <= cfg.seq_len
        hole = r.ids[h0:h1]
        assert all(t != sp.pad for t in hole[:m]) and hole[m:] == [sp.pad] * (n - m)
        assert all(t not in (sp.pad, sp.mask, sp.bos, sp.eos) for t in r.ids[1:h0] + r.ids[h1:-1])
        assert list(r.target_pos) == list(range(h0, h1))
        # prefix + middle + suffix is a contiguous piece of one corpus file
        text = tok.decode(r.ids[1:h0] + hole[:m] + r.ids[h1:-1])
        assert any(text in f for f in files), text
    assert {"midline", "indent", "linestart", "empty"} <= cases


def test_fim_hole_size_is_mostly_the_tightest_bucket(tok_and_src):
    """p_tight_hole of the rows use the smallest bucket >= m, the rest any bucket >= m."""
    tok, _, src, _ = tok_and_src
    base = MICRO_TRAIN.data_config()
    fracs = {}
    for p_tight in (1.0, 0.5, 0.0):
        bm = BatchMaker(src, tok, replace(base, p_tight_hole=p_tight), 8, seed=11)
        tight = loose = 0
        for _ in range(300):
            r = bm.fim_row()
            if r.info["case"] == "fallback":
                continue
            n = r.hole[1] - r.hole[0]
            smallest = min(b for b in base.hole_buckets if b >= max(r.middle_len, 1))
            assert n >= smallest
            tight += n == smallest
            loose += n != smallest
        fracs[p_tight] = tight / (tight + loose)
    assert fracs[1.0] == 1.0 and fracs[0.0] + 0.1 < fracs[0.5] < 1.0, fracs
    with pytest.raises(ValueError, match="p_tight_hole"):
        replace(base, p_tight_hole=1.5)

def test_copy_rows_put_the_cursor_on_a_line_repeated_nearby(tok_and_src):
    """p_copy_line=1: every FIM row that found a repeated line is marked +copy, and its cursor
    line's stripped text occurs again in the file within copy_max_lines lines; rows without one
    fall back to the usual draw. p_copy_line=0 draws exactly the stream it drew before."""
    from diffill.training.data import _repeated_lines

    tok, _, micro_src, _ = tok_and_src
    files = []  # the micro corpus repeats no line; these files do, a few lines apart
    for k in range(6):
        body = "".join(f"def case_{k}_{j}(x):\n    y = x + {j}\n    assert check(y)\n    return y\n\n"
                       for j in range(8))
        files.append(f"import os\n\n\n{body}")
    src = TokenSource.from_token_lists([tok.encode(f, add_special_tokens=False).ids for f in files],
                                       tok.token_to_id("<|eos|>"))
    base = replace(MICRO_TRAIN.data_config(), p_copy_line=1.0)
    bm = BatchMaker(src, tok, base, 8, seed=5)
    copies = 0
    for _ in range(200):
        r = bm.fim_row()
        if "+copy" not in r.info["case"]:
            continue
        copies += 1
        h0, h1 = r.hole
        prefix = tok.decode(r.ids[1:h0])
        middle = tok.decode(r.ids[h0 : h0 + r.middle_len])
        suffix = tok.decode(r.ids[h1:-1])
        whole = prefix + middle + suffix
        # the canvas is cropped (a line may be cut at either end): judge the file's line,
        # and the twin may lie outside the canvas, never outside the file
        f = next(f for f in files if whole in f)
        flines = f.splitlines(keepends=True)
        fi = f[: f.index(whole)].count("\n") + prefix.count("\n")
        key = flines[fi].strip()
        assert len(key) >= base.copy_min_chars
        assert any(k != fi and abs(k - fi) <= base.copy_max_lines and flines[k].strip() == key
                   for k in range(len(flines)))
    assert copies > 100

    lines = ["a = 1\n", "if x:\n", "    a = 1\n", "\n", "return a\n"]
    assert _repeated_lines(lines, [0, 1, 2, 4], 4, 30) == [0, 2]
    assert _repeated_lines(lines, [0, 1, 2, 4], 4, 1) == []
    assert _repeated_lines(lines, [0, 2], 6, 30) == []  # "a = 1" is 5 characters

    off = replace(MICRO_TRAIN.data_config(), p_copy_line=0.0)
    a = BatchMaker(micro_src, tok, off, 8, seed=9)
    b = BatchMaker(micro_src, tok, MICRO_TRAIN.data_config(), 8, seed=9)
    for _ in range(20):
        assert a.fim_row().ids == b.fim_row().ids
    with pytest.raises(ValueError, match="p_copy_line"):
        replace(base, p_copy_line=-0.1)


def test_batch_masks_only_targets_with_1_over_t_weights(tok_and_src):
    tok, _, src, _ = tok_and_src
    cfg = replace(MICRO_TRAIN.data_config(), fim_ratio=0.5)
    bm = BatchMaker(src, tok, cfg, 16, seed=5)
    rows = bm.rows()
    t = bm.stratified_t(len(rows))
    b = bm.collate(rows, t)
    sp = bm.sp
    assert {PLAIN, FIM} <= set(b.kind.tolist())
    for i, r in enumerate(rows):
        L = len(r.ids)
        masked = b.input_ids[i] == sp.mask
        assert masked.any()
        assert set(np.nonzero(masked)[0]) <= set(r.target_pos.tolist())
        assert (b.weights[i] > 0).tolist() == masked.tolist()
        N = len(r.target_pos)
        tb = max(float(t[i]), 1.0 / N)
        assert np.allclose(b.weights[i][masked], 1.0 / (tb * N), rtol=1e-6)
        assert b.attention_mask[i, :L].all() and not b.attention_mask[i, L:].any()
        assert (b.targets[i, :L] == np.asarray(r.ids)).all()
        unmasked = ~masked[:L]
        assert (b.input_ids[i, :L][unmasked] == np.asarray(r.ids)[unmasked]).all()
        if r.kind == FIM:
            assert r.target_pos[0] == r.hole[0]


def test_weights_estimate_one_per_row(tok_and_src):
    """E[sum_i w_i] = E[|M|] / (t N) = 1: the 1/t weight makes each row an unbiased
    per-token average, whatever t was drawn."""
    tok, _, src, _ = tok_and_src
    bm = BatchMaker(src, tok, replace(MICRO_TRAIN.data_config(), fim_ratio=0.0), 16, seed=7)
    sums = []
    rows = bm.rows()
    for _ in range(300):
        b = bm.collate(rows, np.full(len(rows), 0.3))
        sums.extend(b.weights.sum(1).tolist())
    assert abs(np.mean(sums) - 1.0) < 0.02


def test_stratified_t_is_spread_and_in_range(tok_and_src):
    tok, _, src, _ = tok_and_src
    bm = BatchMaker(src, tok, MICRO_TRAIN.data_config(), 10, seed=1)
    t = np.sort(bm.stratified_t(10))
    assert t.min() >= bm.cfg.t_eps and t.max() < 1.0
    assert np.allclose(np.diff(t), (1 - bm.cfg.t_eps) / 10, atol=1e-9)


def test_batches_are_deterministic_and_resumable(tok_and_src):
    tok, _, src, _ = tok_and_src
    a = BatchMaker(src, tok, MICRO_TRAIN.data_config(), 8, seed=11)
    b = BatchMaker(src, tok, MICRO_TRAIN.data_config(), 8, seed=11)
    a.next_batch()
    state = a.state()
    x = a.next_batch()
    b.set_state(state)
    y = b.next_batch()
    assert (x.input_ids == y.input_ids).all() and (x.weights == y.weights).all()


# --------------------------------------------------------------------------- loss


def test_loss_matches_slow_reference(tok_and_src):
    tok, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(bf16=False), path.parent / "run-ref", path, src, None)
    batch = tr.data.next_batch().torch()
    fast, aux = diffusion_loss(tr.model, batch, bf16=False)
    ref = reference_loss(tr.model, batch)
    assert torch.allclose(fast, ref, rtol=1e-4, atol=1e-5)
    assert torch.allclose(aux["rows"].sum() / len(aux["rows"]), ref, rtol=1e-4)


def test_lr_schedule():
    tc = TrainConfig(lr=1e-3, warmup=10, min_lr_ratio=0.1)
    assert lr_at(0, 0.0, tc) == pytest.approx(1e-4)
    assert lr_at(9, 0.0, tc) == pytest.approx(1e-3)
    assert lr_at(10, 0.0, tc) == pytest.approx(1e-3)
    assert lr_at(50, 0.5, tc) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lr_at(99, 1.0, tc) == pytest.approx(1e-4)
    assert lr_at(99, 2.0, tc) == pytest.approx(1e-4)


def test_no_decay_on_norms_and_embedding(tok_and_src):
    _, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(), path.parent / "run-pg", path, src, None)
    decay, no_decay = param_groups(tr.model, 0.1, decay_embeddings=False)
    names = {id(p): n for n, p in tr.model.named_parameters()}
    dn = {names[id(p)] for p in decay["params"]}
    nn_ = {names[id(p)] for p in no_decay["params"]}
    assert "embed_tokens.weight" in nn_ and "norm.weight" in nn_
    assert "layers.0.self_attn.q_proj.weight" in dn
    assert not any("norm" in n for n in dn)


# --------------------------------------------------------------------------- training


def _fixed_loss(tr: Trainer, batches) -> float:
    tr.model.eval()
    with torch.no_grad():
        return float(sum(diffusion_loss(tr.model, b.torch(), False)[0] for b in batches) / len(batches))


def test_loss_goes_down(tok_and_src):
    tok, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(bf16=False, max_steps=60, lr=5e-3, warmup=5), path.parent / "run-down",
                 path, src, None)
    probe = [BatchMaker(src, tok, tr.dcfg, 16, seed=99).next_batch() for _ in range(3)]
    before = _fixed_loss(tr, probe)
    res = tr.fit()
    after = _fixed_loss(tr, probe)
    assert res.steps == 60
    assert after < before - 1.0, (before, after)
    assert (res.checkpoint / "model.safetensors").is_file()
    assert (path.parent / "run-down" / "latest").resolve() == res.checkpoint.resolve()


@pytest.mark.parametrize("bf16", [False, True])
def test_resume_reproduces_uninterrupted_run(tok_and_src, tmp_path, bf16):
    _, path, src, _ = tok_and_src
    tc = tiny_tc(bf16=bf16, max_steps=8, warmup=3)
    full = Trainer(tc, tmp_path / "full", path, src, None)
    full_losses = [full.train_step(full.data.next_batch()) for _ in range(8)]

    first = Trainer(tc, tmp_path / "split", path, src, None)
    split_losses = [first.train_step(first.data.next_batch()) for _ in range(4)]
    first.save()
    second = Trainer(tc, tmp_path / "split", path, src, None, resume=tmp_path / "split")
    assert second.step == 4
    split_losses += [second.train_step(second.data.next_batch()) for _ in range(4)]

    assert np.allclose(full_losses, split_losses, rtol=1e-5, atol=1e-6), (full_losses, split_losses)
    for (n, p), (_, q) in zip(full.model.named_parameters(), second.model.named_parameters(),
                              strict=True):
        assert torch.allclose(p, q, atol=1e-6), n


def test_checkpoint_is_a_loadable_diffill_folder(tok_and_src, tmp_path):
    _, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(max_steps=2, command="pytest"), tmp_path / "run", path, src, None,
                 meta={"manifest_sha256": "abc"})
    res = tr.fit()
    from diffill.model.config import read_config

    cfg, dialect = read_config(res.checkpoint)
    assert cfg.family == "diffill" and not cfg.shift_logits and cfg.tie_embeddings
    assert cfg.mask_token_id == tr.sp.mask and cfg.pad_token_id == tr.sp.pad
    assert cfg.max_position_embeddings == tr.dcfg.seq_len
    prov = dialect.provenance
    for key in ("corpus_manifest_sha256", "tokenizer_sha256", "parameters", "tokens_seen", "steps",
                "train_loss", "date", "command", "hardware"):
        assert key in prov, key
    assert prov["steps"] == 2 and prov["corpus_manifest_sha256"] == "abc"
    from safetensors.torch import load_file

    sd = load_file(str(res.checkpoint / "model.safetensors"))
    assert set(sd) == set(tr.model.state_dict()) and "lm_head.weight" not in sd
    assert (res.checkpoint / "tokenizer.json").read_bytes() == path.read_bytes()
    try:
        from diffill.model import load_model

        lm = load_model(res.checkpoint)
    except NotImplementedError:  # pragma: no cover - loader not there yet
        return
    ids = torch.tensor([[tr.sp.bos, 10, 11, tr.sp.mask, tr.sp.eos]])
    with torch.no_grad():
        want = tr.model.eval()(ids)
        got = lm.model(ids)
    assert torch.allclose(want, got.float(), atol=1e-5)
    assert math.isfinite(float(got.sum()))


# --------------------------------------------------------------------------- AR warm start


def test_shifted_loss_matches_slow_reference(tok_and_src):
    """shift_logits: slot i is scored from the hidden state at i - 1 (Dream-style head)."""
    _, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(bf16=False, shift_logits=True), path.parent / "run-shift", path, src, None)
    assert tr.model.config.shift_logits
    batch = tr.data.next_batch().torch()
    fast, _ = diffusion_loss(tr.model, batch, bf16=False)
    ref = reference_loss(tr.model, batch)
    assert torch.allclose(fast, ref, rtol=1e-4, atol=1e-5)
    # the same weights read unshifted give another loss
    plain = Trainer(tiny_tc(bf16=False), path.parent / "run-noshift", path, src, None)
    plain.model.load_state_dict(tr.model.state_dict())
    assert not torch.allclose(diffusion_loss(plain.model, batch, bf16=False)[0], fast, rtol=1e-3)


def test_ar_loss_is_causal_next_token_cross_entropy(tok_and_src):
    _, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(bf16=False, objective="ar", shift_logits=True, fim_ratio=0.0),
                 path.parent / "run-ar", path, src, None)
    batch = tr.data.next_batch().torch()
    loss, aux = ar_loss(tr.model, batch, bf16=False)
    x = batch["targets"]
    # slow reference: one causal forward per prefix length, the last position's logit
    # (no autograd graph: the reference only reads values)
    B, T = x.shape
    total, n = 0.0, 0
    with torch.no_grad():
        for b in range(B):
            for i in range(1, T):
                h, _ = tr.model.forward_hidden(x[b : b + 1, :i], None, causal=True)
                logp = tr.model.head(h[0, -1]).float().log_softmax(-1)
                total -= float(logp[x[b, i]])
                n += 1
    assert loss.item() == pytest.approx(total / n, rel=1e-4)
    assert aux["rows"].shape == (B,)
    # causal: a later token cannot change an earlier position's hidden state
    h1, _ = tr.model.forward_hidden(x[:1], None, causal=True)
    y = x[:1].clone()
    y[0, -1] = (y[0, -1] + 1) % tr.cfg.vocab_size
    h2, _ = tr.model.forward_hidden(y, None, causal=True)
    assert torch.allclose(h1[0, :-1], h2[0, :-1], atol=1e-5)


def test_ar_objective_needs_shifted_head(tok_and_src):
    _, path, src, _ = tok_and_src
    with pytest.raises(ValueError, match="shift_logits"):
        Trainer(tiny_tc(objective="ar"), path.parent / "run-ar-bad", path, src, None)
    with pytest.raises(ValueError, match="objective"):
        Trainer(tiny_tc(objective="bert"), path.parent / "run-ar-bad", path, src, None)


def test_ar_warm_start_then_diffusion(tok_and_src, tmp_path):
    """--objective ar then --init-from: weights carry over, the optimiser and schedule
    start fresh, provenance adds up both phases and the result loads as a shift model."""
    _, path, src, _ = tok_and_src
    ar = Trainer(tiny_tc(objective="ar", shift_logits=True, fim_ratio=0.0, max_steps=30, lr=5e-3,
                         warmup=3, bf16=False), tmp_path / "ar", path, src, None)
    probe = [ar.data.next_batch().torch() for _ in range(2)]
    with torch.no_grad():
        before = sum(float(ar_loss(ar.model, b, False)[0]) for b in probe)
    res = ar.fit()
    with torch.no_grad():
        after = sum(float(ar_loss(ar.model, b, False)[0]) for b in probe)
    assert after < before - 1.0, (before, after)

    mdm = Trainer(tiny_tc(shift_logits=True, max_steps=3, bf16=False), tmp_path / "mdm", path, src,
                  None, init_from=res.checkpoint)
    for (n, p), (_, q) in zip(ar.model.named_parameters(), mdm.model.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert mdm.step == 0 and not mdm.opt.state
    out = mdm.fit()
    from diffill.model.config import read_config

    cfg, dialect = read_config(out.checkpoint)
    prov = dialect.provenance
    assert cfg.shift_logits and prov["objective"] == "mdm"
    assert prov["init_from"]["objective"] == "ar" and prov["init_from"]["tokens_seen"] == res.tokens
    assert prov["tokens_seen"] == res.tokens + out.tokens
    # resuming the diffusion phase keeps the warm-start record
    again = Trainer(tiny_tc(shift_logits=True, max_steps=3, bf16=False), tmp_path / "mdm", path,
                    src, None, resume=out.checkpoint)
    assert again.provenance()["init_from"] == prov["init_from"]
    # a checkpoint of another shape is refused by name
    with pytest.raises(ValueError, match="hidden_size"):
        Trainer(tiny_tc(d_model=64, shift_logits=True), tmp_path / "bad", path, src, None,
                init_from=res.checkpoint)
    # a bare model folder (config.json + model.safetensors, as shipped) works too, and the
    # chain of warm starts is kept
    import shutil

    bare = tmp_path / "shipped"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(out.checkpoint / f, bare / f)
    third = Trainer(tiny_tc(shift_logits=True, max_steps=1, bf16=False), tmp_path / "more", path, src,
                    None, init_from=bare)
    p3 = third.provenance()
    assert p3["init_from"]["tokens_seen"] == prov["tokens_seen"]
    assert p3["init_from"]["init_from"] == prov["init_from"]
    with pytest.raises(FileNotFoundError, match="config.json"):
        Trainer(tiny_tc(shift_logits=True), tmp_path / "none", path, src, None, init_from=tmp_path / "nope")


# --------------------------------------------------------------------------- data workers


def test_batch_stream_is_deterministic_per_seed_and_start(tok_and_src):
    from diffill.training.data import BatchStream

    tok, _, src, _ = tok_and_src
    cfg = tiny_tc().data_config()

    def take(start: int, n: int = 4) -> list:
        with BatchStream(src, tok, cfg, 4, seed=3, start_step=start, workers=2) as s:
            return [s.next_batch(timeout=60) for _ in range(n)]

    a, b, c = take(0), take(0), take(7)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.input_ids, y.input_ids) and np.array_equal(x.weights, y.weights)
    assert any(not np.array_equal(x.input_ids, y.input_ids) for x, y in zip(a, c, strict=True))
    assert not np.array_equal(a[0].input_ids, a[1].input_ids)  # two workers, two streams
    for bt in a:  # well-formed: weights only on masked slots
        assert ((bt.weights > 0) == (bt.input_ids == tok.token_to_id("<|mask|>"))).all()


def test_fit_with_data_workers(tok_and_src, tmp_path):
    _, path, src, _ = tok_and_src
    tr = Trainer(tiny_tc(max_steps=6, data_workers=2), tmp_path / "run", path, src, None)
    res = tr.fit()
    assert res.steps == 6 and res.tokens > 0 and math.isfinite(res.train_loss)
