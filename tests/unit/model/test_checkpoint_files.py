"""model/checkpoint_files.py: the meta-device skeleton, and what counts as running out of
memory while the weights files are mapped or read."""

from __future__ import annotations

import errno

import torch
from diffill.model import checkpoint_files
from diffill.model.checkpoint_files import is_out_of_memory
from diffill.model.transformer import Transformer
from support import tiny_config
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
