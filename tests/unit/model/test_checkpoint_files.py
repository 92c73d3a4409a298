"""model/checkpoint_files.py: the meta-device skeleton, what counts as running out of
memory while the weights files are mapped or read, and reads that keep the map (bf16 weights)."""

from __future__ import annotations

import errno
import sys

import pytest
import torch
from diffill.model import checkpoint_files
from diffill.model.checkpoint_files import TensorEntry, is_out_of_memory, read_tensors
from diffill.model.transformer import Transformer
from safetensors.torch import save_file
from support import in_file_map, tiny_config
from torch.overrides import TorchFunctionMode


def test_is_out_of_memory():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert is_out_of_memory(RuntimeError("Error while deserializing header: Cannot allocate memory (os error 12)"))
    assert not is_out_of_memory(OSError(errno.ENOENT, "No such file or directory"))
    assert not is_out_of_memory(RuntimeError("Error while deserializing header: HeaderTooLarge"))


def test_meta_skeleton_skips_initialisers_only_on_meta():
    """The skeleton runs no initialiser (on meta, normal_ is a Python reference that
    imports torch._dynamo: seconds of a load); the same mode leaves real tensors alone."""

    class Probe(TorchFunctionMode):  # outside the skip mode: sees what it lets through
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.add(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    cfg = tiny_config(tie_embeddings=False, qkv_bias=True)
    with Probe() as seen:
        sk = checkpoint_files.skeleton(cfg)
    with Probe() as plain_seen, torch.device("meta"):
        plain = Transformer(cfg)
    assert {t.device.type for t in sk.state_dict().values()} == {"meta"}
    assert {k: v.shape for k, v in sk.state_dict().items()} == {
        k: v.shape for k, v in plain.state_dict().items()}
    inits = {"normal_", "kaiming_uniform_", "uniform_"}
    assert inits <= plain_seen.names  # a plain meta build runs them
    assert "empty" in seen.names and not inits & seen.names  # the skeleton skips them

    real = torch.zeros(4)
    with checkpoint_files._SkipMetaInit():
        torch.nn.init.ones_(real)
        real.add_(1.0)
    assert torch.equal(real, torch.full((4,), 2.0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_mapped_reads_keep_the_files_own_bf16_tensors(tmp_path):
    """``mapped``: a tensor stored in the target dtype, contiguous, is the file's map (no copy);
    one in another dtype is converted into private memory; without ``mapped`` both are copies."""
    path = tmp_path / "w.safetensors"
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 32, generator=g), torch.randn(16, generator=g)
    save_file({"a": a.bfloat16(), "b": b}, str(path))
    plan = {"x": TensorEntry(path, "a", (64, 32)), "y": TensorEntry(path, "b", (16,))}
    out: dict[str, torch.Tensor] = {}
    read_tensors(plan, torch.device("cpu"), torch.bfloat16, out, mapped=True)
    assert in_file_map(out["x"], path) and torch.equal(out["x"], a.bfloat16())
    assert not in_file_map(out["y"], path) and torch.equal(out["y"], b.bfloat16())
    assert {t.dtype for t in out.values()} == {torch.bfloat16}
    copied: dict[str, torch.Tensor] = {}
    read_tensors(plan, torch.device("cpu"), torch.bfloat16, copied)
    assert not any(in_file_map(t, path) for t in copied.values())
    assert torch.equal(copied["x"], out["x"])
