"""The int8 weights cache (model/int8_cache.py): a load from the cache gives the bits a load
from the checkpoint gives; a corrupt, truncated or foreign cache file is logged, ignored and
rewritten; a cache that cannot be written costs nothing but a log line."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from diffill.model import int8_cache, int8_load, quant
from diffill.model.int8_cache import CACHE_ENV, CACHE_MIN_PARAMS, resolve_cache_dir
from diffill.model.loader import load_model
from diffill.model.quant import int8_available
from safetensors.torch import load_file, save_file
from support import tiny_config, write_diffill_checkpoint

pytestmark = pytest.mark.skipif(not int8_available(), reason="no quantized CPU engine")

LOG = "diffill.model"


@pytest.fixture()
def small_pieces(monkeypatch):
    """Pack 16 rows per piece, so the tiny head (64 rows) comes in several pieces."""
    monkeypatch.setattr(quant, "PACK_ROWS", 16)
    monkeypatch.setattr(int8_load, "PACK_ROWS", 16)


def _ckpt(folder: Path, *, bf16: bool = True, **changes) -> Path:
    cfg = tiny_config(max_position_embeddings=64, **changes)
    write_diffill_checkpoint(folder, cfg)
    if bf16:  # as published checkpoints are: the embedding stays bf16 (and is mapped)
        f = folder / "model.safetensors"
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(f)).items()}, str(f))
    return folder


def _logits(lm) -> torch.Tensor:
    ids = torch.randint(4, lm.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        return lm.model(ids)


def _files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.safetensors"))


@pytest.mark.parametrize("changes", [{}, {"tie_embeddings": False, "qkv_bias": True}],
                         ids=["tied", "untied+bias"])
def test_cached_load_is_bit_identical(tmp_path, caplog, small_pieces, changes):
    folder = _ckpt(tmp_path / "ck", **changes)
    cache = tmp_path / "cache"
    caplog.set_level(logging.INFO, logger=LOG)
    plain = load_model(folder, weights="int8", int8_cache=False)
    first = load_model(folder, weights="int8", int8_cache=cache)  # writes the cache
    assert "int8 weights cache written" in caplog.text
    assert len(_files(cache)) == 1 and not list(cache.glob(".*.tmp"))
    caplog.clear()
    second = load_model(folder, weights="int8", int8_cache=cache)  # reads it
    assert "int8 weights read from the cache" in caplog.text
    want = _logits(plain)
    assert torch.equal(_logits(first), want)
    assert torch.equal(_logits(second), want)
    for lm in (first, second):
        assert lm.model.embed_tokens.weight.dtype == torch.bfloat16  # a lookup, as stored
        assert len(lm.model.int8_head._packed) == 4  # 64 rows in pieces of 16
        assert torch.equal(lm.model.int8_head.dequantized(), plain.model.int8_head.dequantized())
        assert lm.num_parameters == plain.num_parameters


def test_same_bits_as_quantizing_the_fp32_model(tmp_path):
    """The loader's int8 model (cached or not) is quantize_model of the fp32 one."""
    folder = _ckpt(tmp_path / "ck", bf16=False)
    fp = load_model(folder, weights="fp32")
    ref = quant.quantize_model(fp.model)
    lm = load_model(folder, weights="int8", int8_cache=tmp_path / "cache")
    again = load_model(folder, weights="int8", int8_cache=tmp_path / "cache")
    ids = torch.randint(4, fp.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want = ref(ids)
        assert torch.equal(lm.model(ids), want)
        assert torch.equal(again.model(ids), want)


def _corrupt_byte(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF  # inside the last tensor's data
    f.write_bytes(bytes(data))


def _truncate(f: Path) -> None:
    with open(f, "r+b") as h:
        h.truncate(f.stat().st_size - 7)


def _garbage(f: Path) -> None:
    f.write_bytes(b"not a safetensors file at all")


def _bad_header(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[8:12] = b"}}}}"
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_corrupt_byte, _truncate, _garbage, _bad_header],
                         ids=["flipped-byte", "truncated", "garbage", "bad-header"])
def test_a_bad_cache_file_is_ignored_and_rebuilt(tmp_path, caplog, small_pieces, damage):
    folder = _ckpt(tmp_path / "ck")
    cache = tmp_path / "cache"
    want = _logits(load_model(folder, weights="int8", int8_cache=cache))
    (f,) = _files(cache)
    damage(f)
    caplog.set_level(logging.INFO, logger=LOG)
    lm = load_model(folder, weights="int8", int8_cache=cache)
    assert "ignored and rebuilt from the checkpoint" in caplog.text
    assert torch.equal(_logits(lm), want)
    assert _files(cache) == [f]  # rewritten in place of the bad one
    caplog.clear()
    again = load_model(folder, weights="int8", int8_cache=cache)
    assert "int8 weights read from the cache" in caplog.text and "ignored" not in caplog.text
    assert torch.equal(_logits(again), want)


def test_a_changed_checkpoint_gets_a_new_file_and_the_old_one_goes(tmp_path):
    folder = _ckpt(tmp_path / "ck")
    cache = tmp_path / "cache"
    load_model(folder, weights="int8", int8_cache=cache)
    (old,) = _files(cache)
    _ckpt(folder)  # rewritten (other weights: same seed, but a new mtime)
    st = (folder / "model.safetensors").stat()
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    load_model(folder, weights="int8", int8_cache=cache)
    (new,) = _files(cache)
    assert new != old


def test_an_unwritable_cache_costs_a_log_line(tmp_path, caplog):
    folder = _ckpt(tmp_path / "ck")
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    caplog.set_level(logging.INFO, logger=LOG)
    lm = load_model(folder, weights="int8", int8_cache=blocker / "int8")
    assert "int8 weights cache not written" in caplog.text
    assert torch.equal(_logits(lm), _logits(load_model(folder, weights="int8", int8_cache=False)))


def test_a_failing_write_leaves_no_file(tmp_path, caplog, monkeypatch):
    """A write error half-way (a full disk): logged, the temporary file removed, the load done."""
    folder = _ckpt(tmp_path / "ck")
    cache = tmp_path / "cache"
    real = int8_cache.CacheWriter._write
    calls = []

    def failing(self, name, t):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, name, t)

    monkeypatch.setattr(int8_cache.CacheWriter, "_write", failing)
    caplog.set_level(logging.INFO, logger=LOG)
    lm = load_model(folder, weights="int8", int8_cache=cache)
    assert "No space left on device" in caplog.text
    assert not list(cache.iterdir())
    assert lm.weights == "int8"


def test_cache_dir_rule(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_cache_dir(None, params=CACHE_MIN_PARAMS - 1) is None  # small: not cached
    assert resolve_cache_dir(None, params=CACHE_MIN_PARAMS) == tmp_path / "xdg" / "diffill" / "int8"
    assert resolve_cache_dir(False, params=10**9) is None
    assert resolve_cache_dir(tmp_path / "c", params=1) == tmp_path / "c"  # named: any size
    monkeypatch.setenv(CACHE_ENV, "off")
    assert resolve_cache_dir(None, params=10**9) is None
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert resolve_cache_dir(None, params=1) == tmp_path / "env"


def test_the_cache_never_lands_in_the_checkpoint_folder(tmp_path, monkeypatch):
    folder = _ckpt(tmp_path / "ck")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    before = sorted(p.name for p in folder.iterdir())
    load_model(folder, weights="int8")
    assert sorted(p.name for p in folder.iterdir()) == before
    assert len(_files(tmp_path / "env")) == 1


def test_file_embedding_reads_the_rows_it_looks_up(tmp_path):
    """The cached table is looked up from the file (no resident table): the same rows as
    nn.Embedding, the same error past the table, and the map once the file is gone."""
    folder = _ckpt(tmp_path / "ck")
    cache = tmp_path / "cache"
    load_model(folder, weights="int8", int8_cache=cache)
    lm = load_model(folder, weights="int8", int8_cache=cache)
    emb = lm.model.embed_tokens
    assert isinstance(emb, int8_cache.FileEmbedding)
    table = load_file(str(folder / "model.safetensors"))["embed_tokens.weight"]
    ids = torch.tensor([[5, 5, 63, 0], [7, 1, 5, 2]])
    assert torch.equal(emb(ids), torch.nn.functional.embedding(ids, table))
    assert emb(ids[:0]).shape == (0, 4, emb.embedding_dim)
    with pytest.raises(IndexError):
        emb(torch.tensor([64]))
    for f in _files(cache):
        f.unlink()
    assert torch.equal(emb(ids), torch.nn.functional.embedding(ids, table))
